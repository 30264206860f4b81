"""JSON parsers on recorded real output: Slurm 22.05 (openapi v0.0.38) and 24.11 (data_parser v0.0.40 to v0.0.42)."""

import dataclasses
import json

import pytest

from slurm_ext.parse import json_output as J
from slurm_ext.parse.values import ParseError
from slurm_ext.records import SlurmJob, expand_hostlist


def by_id(jobs):
    return {j.job_id: j for j in jobs}


def test_squeue_22_05_jobs(sample):
    jobs = by_id(J.parse_jobs(sample("squeue.json")))
    assert sorted(jobs, key=int) == [str(i) for i in range(1, 10)]
    # running, typed, 3 GPUs per node on n[1-2]
    j6 = jobs["6"]
    assert (j6.state, j6.nodes, j6.num_nodes, j6.gpus_per_node, j6.gpu_type) == ("RUNNING", ("n1", "n2"), 2, 3, "a100")
    assert (j6.comment, j6.batch_host, j6.exit_code, j6.end_time) == ("ctl:placed", "n1", None, None)
    # held by the user (priority 0, JobHeldUser), untyped gres with a feature constraint
    j9 = jobs["9"]
    assert (j9.state, j9.held, j9.reason, j9.gpus_per_node, j9.gpu_type, j9.features) == (
        "PENDING",
        True,
        "JobHeldUser",
        2,
        None,
        "v100",
    )
    # pending for resources: not held
    assert (jobs["8"].held, jobs["8"].reason, jobs["8"].num_nodes) == (False, "Resources", 2)
    # exit codes decoded from raw wait status: exit(3) -> 768, SIGTERM -> 15
    assert (jobs["4"].state, jobs["4"].exit_code) == ("FAILED", 3)
    assert (jobs["3"].state, jobs["3"].exit_code) == ("CANCELLED", 143)
    assert jobs["5"].exit_code == 0
    # a job cancelled while held is not "held" any more
    assert (jobs["2"].state, jobs["2"].held, jobs["2"].comment) == ("CANCELLED", False, "keep")
    assert jobs["1"].nodes == ("n1", "n2", "n3", "n4")
    assert jobs["1"].submit_time == 1795232892.0
    assert all(j.time_limit is None and j.user == "root" for j in jobs.values())


def test_restd_job_and_partitions(sample):
    (job,) = J.parse_jobs(sample("restd_v0.0.38_job_1.json"))
    assert (job.job_id, job.state, job.comment, job.gpu_type, job.gpus_per_node) == (
        "1",
        "CANCELLED",
        "changed",
        "a100",
        1,
    )
    parts = {p.name: p for p in J.parse_partitions(sample("restd_v0.0.38_partitions.json"))}
    assert parts["all"].default and not parts["a100"].default
    assert parts["v100"].nodes == ("n3", "n4")
    assert parts["all"].nodes == ("n1", "n2", "n3", "n4")
    assert all(p.max_time is None and p.state == "UP" for p in parts.values())


def test_sinfo_22_05_nodes(sample):
    nodes = {n.name: n for n in J.parse_nodes(sample("sinfo.json"))}
    assert {n: (x.gpu_type, x.gpus_total, x.gpus_alloc) for n, x in nodes.items()} == {
        "n1": ("a100", 4, 3),
        "n2": ("a100", 4, 3),
        "n3": ("v100", 4, 2),
        "n4": ("v100", 4, 0),
    }
    n1 = nodes["n1"]
    assert (n1.address, n1.port, n1.partitions, n1.features, n1.state) == (
        "127.0.0.1",
        17001,
        ("a100", "all"),
        ("a100",),
        "mixed",
    )
    assert (n1.cpus_total, n1.cpus_alloc, n1.memory_mb, n1.available) == (4, 1, 4000, True)
    assert nodes["n4"].state == "idle" and nodes["n4"].gpus_free == 4


def _text_rows(text):
    return [line.split("|") for line in text.splitlines() if line.strip()]


def test_sinfo_json_agrees_with_sinfo_text(sample):
    """sinfo -N -h -O 'NodeList,Partition,StateLong,Gres,GresUsed,Features,CPUsState,Memory' recorded alongside."""
    nodes = {n.name: n for n in J.parse_nodes(sample("sinfo.json"))}
    rows = _text_rows(sample("sinfo_-N_-h_-O.txt"))
    assert len(rows) == 8
    for name, part, state, gres, used, feat, cpus, mem in rows:
        node = nodes[name]
        assert part.rstrip("*") in node.partitions
        assert state == node.state
        assert f"gpu:{node.gpu_type}:{node.gpus_total}" == gres
        assert used.startswith(f"gpu:{node.gpu_type}:{node.gpus_alloc}(")
        assert feat == ",".join(node.features)
        assert int(cpus.split("/")[0]) == node.cpus_alloc and int(cpus.split("/")[-1]) == node.cpus_total
        assert int(mem) == node.memory_mb


def test_squeue_json_agrees_with_squeue_text(sample):
    """squeue -h -t all -o '%i|%j|%P|%T|%r|%D|%b|%f|%N|%k|%Q|%V|%S' recorded alongside."""
    jobs = by_id(J.parse_jobs(sample("squeue.json")))
    rows = _text_rows(sample("squeue_-h_-o.txt"))
    assert len(rows) == len(jobs)
    for jid, name, part, state, reason, nnodes, tres, feat, nodelist, comment, prio, _submit, _start in rows:
        job = jobs[jid]
        assert (job.name, job.partition, job.state) == (name, part, state)
        assert job.reason == ("" if reason == "None" else reason)
        assert job.num_nodes == int(nnodes)
        assert job.gpus_per_node == (int(tres.rsplit(":", 1)[1]) if tres != "N/A" else None)
        assert job.features == ("" if feat == "(null)" else feat)
        assert job.comment == ("" if comment == "(null)" else comment)
        assert job.held == (prio == "0" and state == "PENDING")
        assert job.nodes == expand_hostlist(nodelist)


#: the data_parser versions Slurm 24.11.5 offered (`squeue --json=list`), each recorded
V24 = ("v0.0.40", "v0.0.41", "v0.0.42")
R24 = "24.11/"


def recorded_ids(sample):
    """job name -> id on the recorded 24.11 cluster (record_outputs.sh made one job of each kind)."""
    return dict(line.split("=") for line in sample(R24 + "ids.txt").split())


def test_every_offered_data_parser_is_recorded(sample):
    assert tuple(sample(R24 + "data_parsers.txt").split()) == V24
    assert sample(R24 + "version.txt").strip() == "slurm-wlm 24.11.5"


@pytest.mark.parametrize("version", V24)
@pytest.mark.parametrize("command", ["squeue", "scontrol_show_job"])
def test_24_11_jobs_agree_with_squeue_text(sample, utc, version, command):
    """The JSON jobs of real 24.11 output at each data_parser version against
    `squeue -h -t all -o '%i|%j|%P|%T|%r|%D|%b|%f|%N|%k|%Q|%V|%S'` recorded with them."""
    text = sample(f"{R24}{command}_{version}.json")
    assert J.slurm_version(text) == (24, 11, 5)
    jobs = by_id(J.parse_jobs(text))
    rows = _text_rows(sample(R24 + "squeue_-h_-t_all_-o.txt"))
    assert sorted(jobs) == sorted(r[0] for r in rows)
    for jid, name, part, state, reason, nnodes, tres, feat, nodelist, comment, prio, _submit, start in rows:
        job = jobs[jid]
        assert (job.name, job.partition, job.state, job.num_nodes) == (name, part, state, int(nnodes))
        assert job.reason == ("" if reason == "None" else reason)
        gtype, _, count = tres.removeprefix("gres/gpu").rpartition(":")
        assert job.gpus_per_node == (int(count) if tres != "N/A" else None)
        assert job.gpu_type == (gtype.lstrip(":") or None)
        assert job.features == ("" if feat == "(null)" else feat)
        assert job.comment == ("" if comment == "(null)" else comment)
        assert job.held == (prio == "0")
        assert job.nodes == expand_hostlist(nodelist)
        if state == "PENDING":  # squeue prints the expected start, or N/A when none is known
            assert job.start_time == (None if start == "N/A" else J.epoch(start))


@pytest.mark.parametrize("version", V24)
def test_24_11_job_fields_the_text_does_not_show(sample, version):
    """NO_VAL numbers as {set, infinite, number}, exit codes as objects, job_state lists."""
    ids = recorded_ids(sample)
    jobs = by_id(J.parse_jobs(sample(f"{R24}squeue_{version}.json")))
    run, held, requeued = jobs[ids["run"]], jobs[ids["held"]], jobs[ids["requeued"]]
    assert (run.time_limit, run.num_tasks, run.tasks_per_node, run.batch_host) == (60, 8, 4, "n1")
    assert run.admin_comment == '{"cell":"a100:2x4:pp1"}' and run.required_nodes == ("n1", "n2")
    assert run.end_time == run.start_time + 3600
    assert (held.time_limit, held.start_time, held.eligible_time, held.end_time) == (None, None, None, None)
    assert requeued.excluded_nodes == ("n5",) and requeued.eligible_time is not None
    assert (jobs[ids["failed"]].exit_code, jobs[ids["done"]].exit_code) == (3, 0)
    assert jobs[ids["cancelled"]].exit_code == 128 + 15  # killed by SIGTERM
    assert {j.user for j in jobs.values()} == {"root"}


@pytest.mark.parametrize("version", V24)
def test_24_11_one_job_and_jobs_asked_for(sample, version):
    """24.11 answers `squeue --jobs` with those jobs only, and `scontrol show job ID` with that one."""
    ids = recorded_ids(sample)
    asked = by_id(J.parse_jobs(sample(f"{R24}squeue_--jobs_{version}.json")))
    everything = by_id(J.parse_jobs(sample(f"{R24}squeue_{version}.json")))
    assert sorted(asked) == sorted([ids["run"], ids["failed"]])
    assert all(asked[j] == everything[j] for j in asked)
    (one,) = J.parse_jobs(sample(f"{R24}scontrol_show_job_run_{version}.json"))
    assert one == everything[ids["run"]]


@pytest.mark.parametrize("version", V24)
def test_24_11_nodes_agree_with_sinfo_text(sample, version):
    """`scontrol --json show node` against `sinfo -N -h -o '%N|%P|%T|%G|%f|%C|%m|%o|%E'`."""
    nodes = {n.name: n for n in J.parse_nodes(sample(f"{R24}scontrol_show_node_{version}.json"))}
    rows = _text_rows(sample(R24 + "sinfo_-N_-h_-o.txt"))
    assert sorted(nodes) == sorted({r[0] for r in rows})
    for name, part, state, gres, feat, cpus, mem, addr, reason in rows:
        node = nodes[name]
        assert part.rstrip("*") in node.partitions
        assert f"gpu:{node.gpu_type}:{node.gpus_total}" == gres
        assert feat == ",".join(node.features) and addr == node.address
        alloc, _idle, _other, total = (int(c) for c in cpus.split("/"))
        assert (node.cpus_alloc, node.cpus_total, node.memory_mb) == (alloc, total, int(mem))
        assert node.reason == ("" if reason == "none" else reason)
        if state == "drained":
            assert (node.state, node.flags, node.available) == ("idle", ("DRAIN",), False)
        else:
            assert (node.state, node.available) == (state, True)
    # the running job's 4 GPUs on each of n1, n2: what the text output does not show
    assert [nodes[n].gpus_alloc for n in sorted(nodes)] == [4, 4, 0, 0, 0, 0]


@pytest.mark.parametrize("version", V24)
def test_24_11_partitions_agree_with_scontrol_text(sample, version):
    """Every field but one agrees with `scontrol -o show partition`: 24.11's JSON does not
    say which partition is the default (so the cli backend reads partitions as text)."""
    from slurm_ext.parse import scontrol_text

    shown = {p.name: p for p in scontrol_text.parse_partitions(sample(R24 + "scontrol_-o_show_partition.txt"))}
    parts = {p.name: p for p in J.parse_partitions(sample(f"{R24}scontrol_show_partition_{version}.json"))}
    assert shown["a100"].max_time == 2880 and shown["all"].max_time is None and shown["all"].default
    assert {n: dataclasses.replace(p, default=False) for n, p in shown.items()} == parts


def test_bad_documents_raise_clear_errors():
    with pytest.raises(ParseError, match="not JSON"):
        J.parse_jobs("{")
    with pytest.raises(ParseError, match="no 'jobs' list"):
        J.parse_jobs("{}")
    with pytest.raises(ParseError, match="Slurm reported errors: Invalid job id"):
        J.parse_jobs(json.dumps({"errors": [{"error": "x", "description": "Invalid job id"}], "jobs": []}))
    with pytest.raises(ParseError, match="job record has no 'job_id'"):
        J.parse_jobs(json.dumps({"jobs": [{"name": "x"}]}))
    with pytest.raises(ParseError, match="job 7: .*job_state"):
        J.parse_jobs(json.dumps({"jobs": [{"job_id": 7}]}))
    with pytest.raises(ParseError, match="node n1"):
        J.parse_nodes(json.dumps({"nodes": [{"name": "n1", "state": "idle", "port": "abc"}]}))


def test_records_are_frozen(sample):
    job = J.parse_jobs(sample("squeue.json"))[0]
    assert isinstance(job, SlurmJob)
    with pytest.raises(AttributeError):
        job.state = "RUNNING"
