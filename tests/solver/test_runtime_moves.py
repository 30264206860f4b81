"""What a runtime survives on resume (solver.contract.runtimes: Runtime.resumes,
move_problem), where a running job's options are made (the policies) and at
the guard (validate_plan); the micro-batches of a moved plan
(moved_micro_batches); the stages of a plan against the model trained."""

from __future__ import annotations

import pytest
from test_policies import MODEL, table_for

from solver.contract.runtimes import (
    ANY_CHANGE,
    RUNTIMES,
    Change,
    Layout,
    get_runtime,
    move_problem,
    moved_micro_batches,
    plan_problem,
)
from solver.placement import PlacementError, validate_plan
from solver.policies import get_policy
from solver.policies.common import dp_estimate
from solver.types import Cell, ClusterView, JobRequest, NodeView, ParallelPlan, Placement, ScheduleRequest

A100 = frozenset({"a100"})


def test_what_each_runtime_survives_on_resume():
    """The facts of docs/runtimes.md's table (each runtime's resume_basis says where they come from)."""
    assert {name: rt.resumes for name, rt in RUNTIMES.items()} == {
        "ddp": {Change.DP, Change.GPU_TYPE},
        "sharded": ANY_CHANGE,
        "exact": ANY_CHANGE,
        "torchtitan": {Change.TP, Change.PP, Change.GPU_TYPE},
        "megatron": ANY_CHANGE,
        "adaptive": ANY_CHANGE,
    }
    assert all(rt.resume_basis for rt in RUNTIMES.values())


def test_a_move_names_what_the_runtime_cannot_resume_with():
    dp2 = Layout(1, 2, 1, A100)
    titan = get_runtime("torchtitan")
    assert move_problem(titan, dp2, Layout(1, 4, 1, frozenset({"v100"}))) == (
        "runtime torchtitan cannot resume its checkpoint with another dp 2 -> 4 (" + titan.resume_basis + ")"
    )
    assert move_problem(titan, dp2, Layout(2, 2, 2, frozenset({"v100"}))) is None  # tp, pp and the type may change
    megatron = get_runtime("megatron")  # its adapter's checkpoints reshard at any dp, tp and pp
    assert move_problem(megatron, dp2, Layout(2, 1, 2, A100)) is None
    assert move_problem(megatron, dp2, Layout(1, 6, 1, frozenset({"a40"}))) is None
    for name in ("sharded", "exact", "adaptive"):  # into and out of a mixed cell too
        assert move_problem(get_runtime(name), dp2, Layout(4, 1, 2, frozenset({"a40", "a10"}))) is None
    assert move_problem(get_runtime("ddp"), dp2, Layout(1, 3, 1, frozenset({"a40", "a10"}))) is None


def test_layout_changes():
    a = Layout(1, 2, 1, frozenset({"a40", "a10"}))
    assert a.changes(a) == ()
    assert a.changes(Layout(2, 2, 1, frozenset({"a40"}))) == (Change.PP, Change.GPU_TYPE)
    assert a.changes(Layout(1, 3, 2)) == (Change.DP, Change.TP)  # a layout that names no types: not compared


def test_plan_problem_checks_the_stages_against_the_model_and_the_move():
    sharded = get_runtime("sharded")
    assert plan_problem(sharded, pp=4, tp=1, stage_layers=(6, 6, 6, 6), layers=8) == (
        "stage_layers [6, 6, 6, 6] for a model of 8 layers (its stages must hold them all)"
    )
    assert plan_problem(sharded, pp=4, tp=1, stage_layers=(2, 2, 2, 2), layers=8) is None
    assert (
        plan_problem(sharded, pp=9, tp=1, layers=8)
        == "pp=9 stages for a model of 8 layers (its stages must hold them all)"
    )
    titan = get_runtime("torchtitan")
    moved = plan_problem(titan, pp=1, tp=1, dp=4, gpu_types=["a100"], resumed_from=Layout(1, 2, 1, A100))
    assert moved is not None and "dp 2 -> 4" in moved
    assert plan_problem(titan, pp=2, tp=1, dp=2, gpu_types=["a100"] * 4, resumed_from=Layout(1, 2, 1, A100)) is None


@pytest.mark.parametrize(
    ("runtime", "old", "priced", "pp", "per_worker", "same", "want"),
    [
        ("exact", 1, 2, 2, 2, True, 2),  # into a pipeline: 1F1B needs m >= pp (the bug: it kept 1)
        ("exact", 2, 1, 1, 2, True, 2),  # out of it: a virtual worker's work stays the same
        ("exact", 2, 4, 4, 8, True, 4),  # a deeper pipeline: at least pp
        ("exact", 2, 1, 1, 2, False, 1),  # another V: another virtual worker
        ("exact", 3, 1, 1, 2, True, 1),  # 3 micro-batches do not split 2 samples
        ("sharded", 2, 1, 1, 6, True, 1),  # no virtual workers: the new plan's own
        ("adaptive", 1, 2, 2, 2, True, 1),  # the simulator's runtime keeps its count (no 1F1B rule)
    ],
)
def test_the_micro_batches_of_a_moved_plan(runtime, old, priced, pp, per_worker, same, want):
    got = moved_micro_batches(get_runtime(runtime), old, priced, pp=pp, per_worker=per_worker, same_workers=same)
    assert got == want


def _cluster(*nodes: tuple[str, str, int]) -> ClusterView:
    views = tuple(NodeView(n, t, g, g, (t,)) for n, t, g in nodes)
    return ClusterView(views, {t: tuple(n for n, tt, _ in nodes if tt == t) for _, t, _ in nodes})


def _running(runtime: str, cell: Cell, plan: ParallelPlan, checkpoint: bool = True) -> JobRequest:
    nodes = (("n1", cell.gpus_per_node),) if cell.num_nodes == 1 else (("n1", 4), ("n2", 4))
    current = Placement("j", cell, nodes, plan, 5.0)
    return JobRequest(
        "j",
        MODEL,
        32,
        100000,
        runtime=runtime,
        elastic=True,
        current=current,
        iterations_done=10.0,
        running_since=0.0,
        resumes_from=Layout(plan.pp, plan.dp, plan.tp, A100) if checkpoint else None,
    )


def _placed(job: JobRequest, cluster: ClusterView, exact_config) -> Placement:
    est = table_for([job], cluster, {("j", "a100"): 1.0})
    req = ScheduleRequest(cluster=cluster, jobs=(job,), previous={}, config=exact_config(), now=100.0)
    return get_policy("cellsched").schedule(req, est).placements["j"]


def test_cellsched_moves_a_running_job_only_where_its_runtime_resumes(exact_config):
    """Two A100 nodes of 4: a torchtitan job on 2 GPUs (dp 2) would go to dp 8;
    with a checkpoint it keeps dp 2 and grows through pp. A megatron job, whose checkpoints
    reshard, goes where the fresh torchtitan job would."""
    cluster = _cluster(("n1", "a100", 4), ("n2", "a100", 4))
    dp2 = (Cell("a100", 1, 2), ParallelPlan(1, 2, 1))
    free = _placed(_running("torchtitan", *dp2, checkpoint=False), cluster, exact_config)
    assert free.plan.dp == 8  # the table's fastest, which its checkpoint would refuse
    bound = _placed(_running("torchtitan", *dp2), cluster, exact_config)
    assert bound.plan.dp == 2 and bound.cell.num_gpus > 2, bound
    megatron = _placed(_running("megatron", Cell("a100", 1, 2), ParallelPlan(1, 2, 1)), cluster, exact_config)
    assert (megatron.plan.pp, megatron.plan.tp, megatron.plan.dp) == (1, 1, 8), megatron


def test_a_running_job_may_stay_with_its_own_plan_where_the_estimate_prefers_another(exact_config):
    """Its cell's estimate is dp 4 (refused: it runs dp 2 x tp 2); staying keeps the plan it runs."""
    cell = Cell("a100", 1, 4)
    job = _running("torchtitan", cell, ParallelPlan(1, 2, 2))
    stay = _placed(job, _cluster(("n1", "a100", 4)), exact_config)
    assert stay.cell == cell and stay.plan == ParallelPlan(1, 2, 2), stay


def test_the_baselines_dp_plans_keep_to_the_move_rule():
    cluster = _cluster(("n1", "a100", 4), ("n2", "a100", 4))
    job = _running("torchtitan", Cell("a100", 1, 2), ParallelPlan(1, 2, 1))
    est = table_for([job], cluster, {("j", "a100"): 1.0})
    assert dp_estimate(job, Cell("a100", 1, 2), est, None) is not None
    assert dp_estimate(job, Cell("a100", 1, 4), est, None) is None
    assert dp_estimate(_running("megatron", Cell("a100", 1, 2), ParallelPlan(1, 2, 1)), Cell("a100", 1, 4), est, None)


def test_the_guard_refuses_a_move_the_runtime_cannot_resume_from_and_stages_the_model_cannot_take():
    cluster = _cluster(("n1", "a100", 4))
    job = _running("torchtitan", Cell("a100", 1, 2), ParallelPlan(1, 2, 1))
    dp4 = Placement("j", Cell("a100", 1, 4), (("n1", 4),), ParallelPlan(1, 4, 1), 1.0)
    with pytest.raises(
        PlacementError, match=r"job j: runtime torchtitan cannot resume its checkpoint with another dp 2 -> 4"
    ):
        validate_plan(cluster, {"j": dp4}, {"j": job})
    tp2 = Placement("j", Cell("a100", 1, 4), (("n1", 4),), ParallelPlan(1, 2, 2), 1.0)
    validate_plan(cluster, {"j": tp2}, {"j": job})
    pp4 = ParallelPlan(4, 1, 1, micro_batches=4, stage_layers=(6, 6, 6, 6))  # MODEL has 4 layers
    wrong = Placement("j", Cell("a100", 1, 4, pp=4), (("n1", 4),), pp4, 1.0)
    with pytest.raises(PlacementError, match=r"stage_layers \[6, 6, 6, 6\] for a model of 4 layers"):
        validate_plan(cluster, {"j": wrong}, {"j": _running("sharded", Cell("a100", 1, 2), ParallelPlan(1, 2, 1))})
