"""JSON parsers on recorded 22.05 output and on the newer data_parser schema."""

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


def test_newer_schema_jobs(sample):
    """data_parser v0.0.41 (Slurm 24.05): NO_VAL objects, state arrays, exit-code objects."""
    text = sample("squeue_v0.0.41.json")
    assert J.slurm_version(text) == (24, 5, 4)
    jobs = by_id(J.parse_jobs(text))
    held = jobs["101"]
    assert (held.state, held.held, held.gpus_per_node, held.gpu_type, held.time_limit, held.start_time) == (
        "PENDING",
        True,
        2,
        None,
        None,
        None,
    )
    run = jobs["102"]
    assert (run.state, run.nodes, run.gpus_per_node, run.gpu_type, run.time_limit) == (
        "RUNNING",
        ("gn01", "gn02"),
        4,
        "a100",
        60,
    )
    assert run.admin_comment == '{"cell":"a100:2x4:pp1"}'
    assert run.required_nodes == ("gn01", "gn02") and run.end_time == 1732003620.0
    requeued = jobs["103"]
    assert (requeued.state, requeued.reason, requeued.held, requeued.excluded_nodes) == (
        "PENDING",
        "BeginTime",
        False,
        ("gv03",),
    )
    assert (requeued.eligible_time, held.eligible_time) == (1732000030.0, None)  # when a requeued job may start again
    assert (held.user, held.uid) == ("alice", 1000)
    assert (jobs["104"].state, jobs["104"].exit_code) == ("FAILED", 3)
    assert (jobs["105"].state, jobs["105"].exit_code, jobs["105"].gpus_per_node) == ("CANCELLED", 143, None)


def test_newer_schema_nodes_and_partitions(sample):
    nodes = {n.name: n for n in J.parse_nodes(sample("scontrol_show_node_v0.0.41.json"))}
    assert (nodes["gn01"].state, nodes["gn01"].gpus_total, nodes["gn01"].gpus_alloc, nodes["gn01"].available) == (
        "allocated",
        4,
        4,
        True,
    )
    gv = nodes["gv03"]
    assert (gv.state, gv.flags, gv.reason, gv.available, gv.gpus_total, gv.gpu_type) == (
        "idle",
        ("DRAIN",),
        "bad gpu 3",
        False,
        8,
        "v100",
    )
    assert (nodes["ga7"].state, nodes["ga7"].available) == ("down", False)
    parts = {p.name: p for p in J.parse_partitions(sample("scontrol_show_partition_v0.0.41.json"))}
    assert parts["a100"].max_time == 2880 and parts["all"].max_time is None
    assert parts["all"].default and not parts["v100"].default
    assert parts["all"].nodes == ("gn01", "gn02", "gv03", "ga7")


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
