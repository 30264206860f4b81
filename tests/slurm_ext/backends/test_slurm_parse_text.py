"""scontrol text parsers on recorded 22.05 output; they agree with the JSON ones."""

import pytest

from slurm_ext.parse import json_output as J
from slurm_ext.parse import scontrol_text as T
from slurm_ext.parse.values import ParseError


def test_one_line_and_detailed_jobs_agree(sample, utc):
    one = T.parse_jobs(sample("scontrol_show_-o_job.txt"))
    detailed = T.parse_jobs(sample("scontrol_-d_show_job.txt"))
    assert len(one) == 9 and one == detailed


def test_text_jobs_match_json_jobs(sample, utc):
    text = {j.job_id: j for j in T.parse_jobs(sample("scontrol_show_-o_job.txt"))}
    js = {j.job_id: j for j in J.parse_jobs(sample("squeue.json"))}
    assert text.keys() == js.keys()
    for jid in text:
        assert text[jid] == js[jid], jid


def test_text_job_fields(sample, utc):
    jobs = {j.job_id: j for j in T.parse_jobs(sample("scontrol_show_-o_job.txt"))}
    assert (jobs["9"].held, jobs["9"].num_nodes, jobs["9"].features, jobs["9"].gpus_per_node) == (True, 1, "v100", 2)
    assert (jobs["8"].num_nodes, jobs["8"].gpu_type) == (2, "a100")  # NumNodes=2-2
    assert (jobs["3"].exit_code, jobs["4"].exit_code) == (143, 3)  # ExitCode=0:15, 3:0
    assert jobs["6"].nodes == ("n1", "n2") and jobs["6"].comment == "ctl:placed"
    assert jobs["1"].start_time == jobs["1"].eligible_time == 1795232892.0
    assert (jobs["1"].user, jobs["1"].uid) == ("root", 0)  # UserId=root(0)
    assert (jobs["1"].num_tasks, jobs["1"].tasks_per_node, jobs["1"].work_dir) == (4, None, "/tmp/devcluster")


def test_nodes_detailed_have_gpu_use(sample):
    nodes = {n.name: n for n in T.parse_nodes(sample("scontrol_-d_show_node.txt"))}
    assert {n: (x.gpus_total, x.gpus_alloc) for n, x in nodes.items()} == {
        "n1": (4, 3),
        "n2": (4, 3),
        "n3": (4, 2),
        "n4": (4, 0),
    }
    assert nodes == {n.name: n for n in J.parse_nodes(sample("sinfo.json"))}


def test_nodes_one_line_without_detail_lack_gpu_use(sample):
    """`scontrol show -o node` prints no GresUsed: the backend uses -d."""
    nodes = {n.name: n for n in T.parse_nodes(sample("scontrol_show_-o_node.txt"))}
    assert nodes["n1"].gpus_total == 4 and nodes["n1"].gpus_alloc == 0
    assert nodes["n3"].address == "127.0.0.1" and nodes["n3"].port == 17003


def test_partitions(sample):
    parts = T.parse_partitions(sample("scontrol_show_-o_partition.txt"))
    assert parts == J.parse_partitions(sample("restd_v0.0.38_partitions.json"))
    assert [p.name for p in parts if p.default] == ["all"]


def test_fields_with_spaces_and_drain_reason():
    line = (
        "NodeName=g1 Arch=x86_64 CPUAlloc=2 CPUTot=8 AvailableFeatures=a40 ActiveFeatures=a40 Gres=gpu:a40:2 "
        "GresUsed=gpu:a40:1(IDX:0) NodeAddr=10.1.1.1 Port=6818 OS=Linux 6.1 #1 SMP PREEMPT_DYNAMIC "
        "RealMemory=1000 State=MIXED+DRAIN Partitions=a40,all Reason=fan broken [root@2026-11-21T03:48:12]"
    )
    (node,) = T.parse_nodes(line)
    assert (node.state, node.flags, node.reason, node.available, node.gpus_alloc) == (
        "mixed",
        ("DRAIN",),
        "fan broken",
        False,
        1,
    )


def test_empty_and_bad_text():
    assert T.parse_jobs("No jobs in the system\n") == ()
    with pytest.raises(ParseError, match="expected a line starting with JobId="):
        T.parse_jobs("garbage here")
    with pytest.raises(ParseError, match="job 5: missing field JobState"):
        T.parse_jobs("JobId=5 JobName=x")
    with pytest.raises(ParseError, match="job 5: not a time"):
        T.parse_jobs("JobId=5 JobState=PENDING SubmitTime=yesterday")
