"""The controller's side of a mixed-GPU-type cell, without Slurm."""

import json
from dataclasses import replace

import pytest

from slurm_ext.config import Config
from slurm_ext.controller import inputs as inp
from slurm_ext.controller.reconcile import ActionKind, decide
from slurm_ext.records import ClusterSnapshot, SlurmJob, SlurmNode, SlurmPartition
from solver.contract.jobspec import JobSpec
from solver.contract.plan import JobPlan
from solver.mixed import mixed_cell
from solver.types import Cell, ClusterView, NodeView, ParallelPlan, Placement

SPEC = JobSpec(model="gpt-tiny", global_batch=24, iterations=10, gpu_types=("a40", "a10"), min_gpus=6)
NODES = (("n4", "a40"), ("n5", "a40"), ("n6", "a10"))


def snapshot(*jobs: SlurmJob) -> ClusterSnapshot:
    nodes = tuple(
        SlurmNode(name=n, gpu_type=t, gpus_total=2, gpus_alloc=0, state="idle", partitions=(t, "all")) for n, t in NODES
    )
    parts = (
        SlurmPartition(name="a40", nodes=("n4", "n5")),
        SlurmPartition(name="a10", nodes=("n6",)),
        SlurmPartition(name="all", nodes=("n4", "n5", "n6")),
    )
    return ClusterSnapshot(nodes=nodes, partitions=parts, jobs=jobs, taken_at=1000.0)


def decided(p: Placement):
    """The controller's one action for held job 7 given placement `p`."""
    job = SlurmJob(
        job_id="7",
        user="alice",
        state="PENDING",
        held=True,
        reason="JobHeldUser",
        partition="a40",
        comment=SPEC.to_comment(),
        submit_time=900.0,
        gpus_per_node=2,
    )
    snap = snapshot(job)
    jobs = inp.classify(snap, {}, {})
    view = inp.build_request(snap, jobs, {}, Config().solver).view
    (a,) = decide(jobs, {"7": p}, view, "/ck")
    return a


def test_a_mixed_placement_is_released_as_one_ordinary_job():
    cell = mixed_cell((("a10", 1), ("a40", 2)), 2)
    p = Placement("7", cell, (("n6", 2), ("n5", 2), ("n4", 2)), ParallelPlan(1, 6, 1, 1, (6, 3)), 0.5)
    a = decided(p)
    u = a.update
    assert a.kind == ActionKind.PLACE and (u.partition, u.features, u.num_nodes, u.gres_per_node) == ("all", "", 3, 2)
    assert (u.req_nodes, u.num_tasks, u.tasks_per_node) == (("n4", "n5", "n6"), 6, 2)
    plan = JobPlan.from_dict(json.loads(u.admin_comment)["plan"])
    assert plan.nodes == ("n4", "n5", "n6") and plan.gpu_types == ("a10", "a40") and plan.cell == cell.key()
    assert plan.batch_shares == (3, 3, 3, 3, 6, 6)  # per dp rank in task order: a40 ranks 3, a10 ranks 6
    again = inp.placement_of("7", plan)  # read back from the AdminComment once it runs
    assert again is not None and again.cell == cell and again.same_resources(p)


# ---- issue 15: stage_layers and state sharding in the plan ---------------------------------------------------


def placed(p: Placement) -> JobPlan:
    a = decided(p)
    return JobPlan.from_dict(json.loads(a.update.admin_comment)["plan"])


def test_single_type_plans_carry_stage_layers_and_even_sharding():
    cell = Cell("a40", 2, 2, 2)
    p = Placement("7", cell, (("n4", 2), ("n5", 2)), ParallelPlan(2, 2, 1, 4, stage_layers=(3, 1)), 0.5)
    plan = placed(p)
    assert plan.stage_layers == (3, 1) and plan.state_sharding is None and plan.state_shares is None
    again = inp.placement_of("7", plan)
    assert again.plan.stage_layers == (3, 1) and not again.plan.sharded
    sharded = placed(replace(p, plan=ParallelPlan(2, 2, 1, 4, stage_layers=(2, 2), state_shares=(1.0,))))
    assert sharded.state_sharding == "even" and sharded.state_shares is None and sharded.stage_layers == (2, 2)
    assert inp.placement_of("7", sharded).plan.sharded
    flat = placed(replace(p, cell=Cell("a40", 2, 2, 1), plan=ParallelPlan(1, 4, 1, 4)))
    # a plan without them is the JSON of before: no stage_layers, no sharding keys
    assert flat.stage_layers is None and "stage_layers" not in flat.to_json() and "state_" not in flat.to_json()


def test_mixed_plan_carries_state_shares_per_dp_rank_in_task_order():
    cell = mixed_cell((("a10", 1), ("a40", 2)), 2)
    plan = ParallelPlan(1, 6, 1, 1, (6, 3), state_shares=(2.5, 20.0))
    out = placed(Placement("7", cell, (("n6", 2), ("n5", 2), ("n4", 2)), plan, 0.5))
    assert out.nodes == ("n4", "n5", "n6") and out.batch_shares == (3, 3, 3, 3, 6, 6)
    assert out.state_sharding == "memory" and out.state_shares == (20.0, 20.0, 20.0, 20.0, 2.5, 2.5)


def test_pipeline_across_types_gets_the_split_for_its_task_order():
    """Priced in part order (a10 stage first: 1 layer; a40 stages: 2 and 1), written for the
    task order n4 n5 (a40) then n6 (a10): the a40 stages first."""
    cell = mixed_cell((("a10", 1), ("a40", 2)), 2, 3)
    plan = ParallelPlan(3, 2, 1, 2, stage_layers=(1, 2, 1), state_shares=(1.0, 1.0))
    out = placed(Placement("7", cell, (("n6", 2), ("n5", 2), ("n4", 2)), plan, 0.5))
    assert out.nodes == ("n4", "n5", "n6") and out.batch_shares is None
    assert out.stage_layers == (2, 1, 1) and sum(out.stage_layers) == 4
    assert out.state_sharding == "memory" and out.state_shares == (1.0, 1.0)
    assert out.cell == "a10x1+a40x2:3x2:pp3"
    again = inp.placement_of("7", out)
    assert again is not None and again.cell == cell and again.plan.pp == 3


def test_a_pipeline_stage_spanning_types_in_task_order_is_rejected():
    """Stages of 4 GPUs on 2-GPU nodes: in the cluster's order a40 a10 a40 a10 the first stage
    would hold an a40 and an a10 node; in the order a40 a40 a10 a10 every stage is one type."""
    from solver.placement import PlacementError, validate_plan

    cell = mixed_cell((("a10", 2), ("a40", 2)), 2, 2)
    plan = ParallelPlan(2, 4, 1, 1, stage_layers=(2, 2))
    p = Placement("7", cell, (("m1", 2), ("m2", 2), ("m3", 2), ("m4", 2)), plan, 0.5)
    grouped = ClusterView(
        tuple(NodeView(n, t, 2, 2) for n, t in (("m1", "a40"), ("m3", "a40"), ("m2", "a10"), ("m4", "a10")))
    )
    validate_plan(grouped, {"7": p})
    interleaved = ClusterView(
        tuple(NodeView(n, t, 2, 2) for n, t in (("m1", "a40"), ("m2", "a10"), ("m3", "a40"), ("m4", "a10")))
    )
    with pytest.raises(PlacementError, match="span GPU types"):
        validate_plan(interleaved, {"7": p})
