"""A plan written for one node order runs on a step whose nodes Slurm lists
in another: each task keeps its node's role, so stage_layers, batch_shares
and state_shares are re-listed for the step's order (any pp), or the
launcher refuses with a clear error."""

import json
import sys

import pytest
from srun_local import task_envs
from test_cli import SHOW_ENV, child_env, launch

from launch.layout import Layout, LayoutError, in_step_order, plan_ranks

MASTER = {"CELLSCHED_MASTER_ADDR": "127.0.0.1"}


def test_plan_ranks_keep_each_nodes_role():
    assert plan_ranks(("n6", "n1"), ("n1", "n6"), (2, 2)) == (2, 3, 0, 1)
    assert plan_ranks(("n1", "n6"), ("n1", "n6"), (2, 2)) == (0, 1, 2, 3)
    # uneven tasks per node: every node keeps its count, its block moves
    assert plan_ranks(("n2", "n1", "n3"), ("n1", "n2", "n3"), (2, 1, 1)) == (1, 2, 0, 3)
    assert plan_ranks(("n1", "n7"), ("n1", "n6"), (2, 2)) is None  # other nodes
    assert plan_ranks((), ("n1",), (2,)) is None
    assert plan_ranks(("n1", "n1"), ("n1", "n1"), (1, 1)) is None


def test_stage_layers_follow_the_nodes_of_each_stage():
    # plan: stage 0 (1 layer) on a10 node n6, stage 1 (3 layers) on a100 node n1; the step lists n1 first
    ranks = plan_ranks(("n6", "n1"), ("n1", "n6"), (2, 2))
    for dp, tp in ((1, 2), (2, 1)):
        assert in_step_order((1, 3), Layout(2, dp, tp), ranks, "pp", "stage_layers") == (3, 1)
    # three stages over three nodes, rotated
    ranks = plan_ranks(("n3", "n1", "n2"), ("n1", "n2", "n3"), (1, 1, 1))
    assert in_step_order((2, 1, 5), Layout(3, 1, 1), ranks, "pp", "stage_layers") == (1, 5, 2)


def test_per_dp_rank_shares_follow_the_nodes_with_pipelines():
    # pp 2 dp 2 tp 1 on four nodes, one task each: plan ranks (pp, dp) = n4 (0,0), n6 (0,1), n5 (1,0), n3 (1,1)
    ranks = plan_ranks(("n4", "n6", "n5", "n3"), ("n3", "n4", "n5", "n6"), (1, 1, 1, 1))
    assert ranks == (3, 0, 2, 1)
    # step: n3 (0,0) held dp 1, n4 (0,1) dp 0, n5 (1,0) dp 0, n6 (1,1) dp 1: dp 0 mixes plan dp 1 and dp 0
    with pytest.raises(LayoutError, match=r"'state_shares' cannot follow.*step dp rank 0.*dp rank 0 \(48\).*dp rank 1"):
        in_step_order((48, 24), Layout(2, 2, 1), ranks, "dp", "state_shares")
    assert in_step_order((5, 5), Layout(2, 2, 1), ranks, "dp", "batch_shares") == (5, 5)  # equal values: fine
    # pp 1, tp 2: one dp rank per node, three nodes in reverse
    ranks = plan_ranks(("n6", "n5", "n4"), ("n4", "n5", "n6"), (2, 2, 2))
    assert in_step_order((24, 48, 48), Layout(1, 3, 2), ranks, "dp", "state_shares") == (48, 48, 24)


def test_a_stage_across_plan_stages_is_refused():
    # plan nodes n2 (1 task), n1 (2), n3 (1): stage 0 = n2 + n1's first, stage 1 = n1's second + n3
    ranks = plan_ranks(("n2", "n1", "n3"), ("n1", "n2", "n3"), (2, 1, 1))
    with pytest.raises(
        LayoutError, match=r"'stage_layers' cannot follow.*step stage 0.*stage 0 \(3\) and stage 1 \(1\)"
    ):
        in_step_order((3, 1), Layout(2, 2, 1), ranks, "pp", "stage_layers")
    assert in_step_order((2, 2), Layout(2, 2, 1), ranks, "pp", "stage_layers") == (2, 2)


def _plans_seen(plan: dict, ntasks: int, nnodes: int, only: int | None = None) -> list[dict]:
    """The plan each task's command sees (only task ONLY's when given)."""
    tasks = task_envs(ntasks, nnodes=nnodes)
    return [
        json.loads(
            child_env(launch(["--", sys.executable, "-c", SHOW_ENV], t, plan=plan, extra=MASTER))["CELLSCHED_PLAN"]
        )
        for t in (tasks if only is None else [tasks[only]])
    ]


def test_launcher_relists_a_pipeline_plan_for_the_step():
    # the step runs on n1, n2 (in that order); the plan put stage 0 (1 layer, sharded state 24 per
    # dp rank) on n2 and stage 1 (3 layers) on n1
    plan = {
        "pp": 2,
        "dp": 2,
        "tp": 1,
        "nodes": ["n2", "n1"],
        "stage_layers": [1, 3],
        "batch_shares": [1, 1],
        "state_sharding": "memory",
        "state_shares": [48, 24],
    }
    seen = _plans_seen(plan, 4, 2)
    assert len(seen) == 4
    for p in seen:
        assert p["nodes"] == ["n1", "n2"]
        assert p["stage_layers"] == [3, 1]
        assert p["state_shares"] == [48, 24]  # dp rank d sits on both nodes in both orders
        assert p["batch_shares"] == [1, 1] and p["state_sharding"] == "memory"
    # the same order, or other nodes: the plan as written
    for nodes in (["n1", "n2"], ["n7", "n8"]):
        (p,) = _plans_seen({**plan, "nodes": nodes}, 4, 2, only=3)
        assert p["nodes"] == nodes and p["stage_layers"] == [1, 3]


def test_launcher_relists_state_shares_for_the_step():
    plan = {"pp": 1, "dp": 3, "tp": 1, "nodes": ["n3", "n1", "n2"], "state_shares": [24, 48, 48]}
    seen = _plans_seen(plan, 3, 3)
    assert {tuple(p["state_shares"]) for p in seen} == {(48.0, 48.0, 24.0)}
    assert {tuple(p["nodes"]) for p in seen} == {("n1", "n2", "n3")}


def test_launcher_refuses_a_plan_the_step_order_breaks():
    plan = {"pp": 2, "dp": 2, "tp": 1, "nodes": ["n2", "n1", "n3"], "stage_layers": [3, 1]}
    r = launch(["--", sys.executable, "-c", SHOW_ENV], task_envs(4, nnodes=3)[0], plan=plan, extra=MASTER)
    assert r.returncode == 2, r.stdout
    msg = r.stderr.strip()
    assert msg.startswith("cellsched-launch: error: plan field 'stage_layers' cannot follow the step's node order")
    assert "plan nodes n2,n1,n3, step nodes n1,n2,n3, tasks per node 2,1,1" in msg, msg
    assert len(msg.splitlines()) == 1
