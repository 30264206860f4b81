"""The pyslurm backend's pure mapping, on objects carrying pyslurm's
attribute names (types.SimpleNamespace stands in for pyslurm.Job / Node /
Partition: these are test data for a pure function, not a mock of Slurm)."""

from types import SimpleNamespace

import pytest

from slurm_ext.backends import pyslurm_backend as P
from slurm_ext.backends.base import JobUpdate, SubmitRequest


def pyslurm_job(**over):
    base = dict(
        id=42,
        name="train",
        user_name="alice",
        state="PENDING",
        state_reason="JobHeldAdmin",
        partition="all",
        allocated_nodes=None,
        num_nodes=1,
        gres_per_node={"gpu": 2},
        priority=0,
        constraints=[],
        required_nodes=None,
        excluded_nodes=None,
        comment="c",
        admin_comment="",
        submit_time=1732000000,
        start_time=None,
        end_time=None,
        exit_code=0,
        exit_code_signal=0,
        time_limit=None,
        batch_host=None,
    )
    base.update(over)
    return SimpleNamespace(**base)


def test_held_job():
    job = P.job_record(pyslurm_job())
    assert (job.job_id, job.state, job.held, job.gpus_per_node, job.gpu_type, job.exit_code) == (
        "42",
        "PENDING",
        True,
        2,
        None,
        None,
    )
    assert (job.user, job.comment, job.submit_time, job.nodes, job.features) == ("alice", "c", 1732000000.0, (), "")


def test_running_typed_job():
    job = P.job_record(
        pyslurm_job(
            state="RUNNING",
            state_reason="None",
            allocated_nodes="n[1-2]",
            num_nodes=2,
            gres_per_node={"gpu:a100": 4},
            priority=4294901700,
            constraints=["a100"],
            required_nodes="n[1-2]",
            time_limit=60,
            start_time=1732000100,
            end_time=1732003700,
            batch_host="n1",
            admin_comment='{"cell":"x"}',
        )
    )
    assert (job.state, job.held, job.reason, job.nodes, job.gpus_per_node, job.gpu_type) == (
        "RUNNING",
        False,
        "",
        ("n1", "n2"),
        4,
        "a100",
    )
    assert (job.features, job.required_nodes, job.time_limit, job.end_time, job.batch_host) == (
        "a100",
        ("n1", "n2"),
        60,
        1732003700.0,
        "n1",
    )


@pytest.mark.parametrize(
    "state, code, sig, expected", [("FAILED", 3, 0, 3), ("CANCELLED", 0, 15, 143), ("COMPLETED", 0, 0, 0)]
)
def test_finished_exit_codes(state, code, sig, expected):
    assert (
        P.job_record(pyslurm_job(state=state, exit_code=code, exit_code_signal=sig, priority=1)).exit_code == expected
    )


def test_node_and_partition():
    node = P.node_record(
        SimpleNamespace(
            name="n3",
            address="127.0.0.1",
            slurmd_port=17003,
            partitions=["v100", "all"],
            active_features=["v100"],
            available_features=["v100"],
            configured_gres={"gpu:v100": 8},
            allocated_gres={"gpu:v100": {"count": 3, "indexes": "0-2"}},
            total_cpus=8,
            allocated_cpus=3,
            real_memory=16000,
            state="MIXED+DRAIN",
            reason="maint",
        )
    )
    assert (node.gpu_type, node.gpus_total, node.gpus_alloc, node.state, node.flags, node.available) == (
        "v100",
        8,
        3,
        "mixed",
        ("DRAIN",),
        False,
    )
    assert (node.port, node.partitions, node.cpus_alloc, node.memory_mb) == (17003, ("v100", "all"), 3, 16000)
    part = P.partition_record(SimpleNamespace(name="all", nodes="n[1-6]", state="UP", is_default=True, max_time=None))
    assert (part.nodes, part.default, part.max_time) == (("n1", "n2", "n3", "n4", "n5", "n6"), True, None)


def test_gres_dicts():
    assert P.gres_dict_gpus({"gpu:a100": 4, "shard": 8}) == ("a100", 4)
    assert P.gres_dict_gpus({"gpu": {"count": 2}}) == (None, 2)
    assert P.gres_dict_gpus({}) == (None, 0)


def test_update_fields():
    change = JobUpdate(
        partition="a40",
        features="a40",
        num_nodes=2,
        req_nodes=("n4", "n5"),
        gres_per_node=2,
        admin_comment="p",
        start_soon=True,
    )
    assert P.update_fields(change) == {
        "partitions": "a40",
        "constraints": "a40",
        "nodes": "2-2",
        "required_nodes": "n[4-5]",
        "gres_per_node": {"gpu": 2},
        "admin_comment": "p",
        "begin_time": "now+1",
    }
    assert P.update_fields(JobUpdate(admin_comment="only")) == {"admin_comment": "only"}


def test_submit_fields(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\necho hi\n")
    kw = P.submit_fields(
        SubmitRequest(script=str(script), gres_per_node=2, nodes=1, hold=True, job_name="t", env={"A": "1"})
    )
    assert kw == {
        "script": "#!/bin/bash\necho hi\n",
        "script_args": [],
        "name": "t",
        "nodes": 1,
        "gres_per_node": {"gpu": 2},
        "priority": 0,
        "environment": {"A": "1"},
    }
    with pytest.raises(ValueError, match="extra_args"):
        P.submit_fields(SubmitRequest(script=str(script), extra_args=("--exclusive",)))


def test_version_of_module():
    assert P.pyslurm_version(SimpleNamespace(version=lambda: "25.11.0")) == (25, 11)
    assert P.pyslurm_version(SimpleNamespace(__version__="24.5.1")) == (24, 5)
    assert P.pyslurm_version(SimpleNamespace()) is None
