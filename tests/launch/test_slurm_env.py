import pytest
from hypothesis import given
from hypothesis import strategies as st
from srun_local import task_envs

from launch.slurm_env import SlurmEnv, SlurmEnvError, expand_hostlist, expand_tasks_per_node


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("n1", ("n1",)),
        ("n[1-3,5]", ("n1", "n2", "n3", "n5")),
        ("gpu-[08-11],cpu1", ("gpu-08", "gpu-09", "gpu-10", "gpu-11", "cpu1")),
        ("r[1-2]n[01-02]", ("r1n01", "r1n02", "r2n01", "r2n02")),
        ("a[9-10]", ("a9", "a10")),
        ("x[007]", ("x007",)),
    ],
)
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("bad", ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]", "n1,,n2", ""])
def test_bad_hostlist_is_named(bad):
    with pytest.raises(SlurmEnvError, match="host list"):
        expand_hostlist(bad)


@given(st.lists(st.integers(0, 999), min_size=1, max_size=20, unique=True), st.integers(1, 4))
def test_hostlist_ranges_roundtrip(numbers, width):
    numbers = sorted(numbers)
    text = "n[" + ",".join(str(n).zfill(width) for n in numbers) + "]"
    assert expand_hostlist(text) == tuple("n" + str(n).zfill(width) for n in numbers)


@pytest.mark.parametrize("text, counts", [("4", (4,)), ("4(x2),2", (4, 4, 2)), ("1,2(x3)", (1, 2, 2, 2))])
def test_tasks_per_node(text, counts):
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("bad", ["4(2)", "x", "4(x)", ""])
def test_bad_tasks_per_node_is_named(bad):
    with pytest.raises(SlurmEnvError, match="tasks per node"):
        expand_tasks_per_node(bad)


def test_from_environ_reads_a_step():
    env = task_envs(ntasks=6, nnodes=2)[4]
    s = SlurmEnv.from_environ(env)
    assert (s.procid, s.localid, s.nodeid, s.ntasks, s.nnodes) == (4, 1, 1, 6, 2)
    assert s.nodelist == ("n1", "n2") and s.tasks_per_node == (3, 3) and s.local_ntasks == 3


def test_step_values_win_over_job_values():
    env = {**task_envs(2)[0], "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_TASKS_PER_NODE": "2(x4)"}
    assert SlurmEnv.from_environ(env).nodelist == ("n1",)


def test_missing_or_inconsistent_variables_are_named():
    env = task_envs(2)[1]
    with pytest.raises(SlurmEnvError, match="SLURM_PROCID"):
        SlurmEnv.from_environ({k: v for k, v in env.items() if k != "SLURM_PROCID"})
    with pytest.raises(SlurmEnvError, match="SLURM_LOCALID='x'"):
        SlurmEnv.from_environ({**env, "SLURM_LOCALID": "x"})
    with pytest.raises(SlurmEnvError, match="do not add up"):
        SlurmEnv.from_environ({**env, "SLURM_STEP_TASKS_PER_NODE": "3"})
