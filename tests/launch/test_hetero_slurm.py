"""Issue 15's runtime on the real dev cluster: one job across GPU types under
``srun cellsched-launch``, its plan given explicitly in the AdminComment as
the controller writes it (``hetero_runs.explicit_plan``; a controller-driven
source fits the same ``run_job``).

- A pipeline across types: pp 2, stage 0 on an a100 node (n1), stage 1 on
  the a10 node (n6), tp 2 within each, uneven ``stage_layers`` (the faster
  type takes 3 of gpt-tiny's 4 layers).
- Optimizer state sharded across types: dp 6 over the a40 nodes (n4, n5) and
  the a10 node (n6), ``state_sharding="memory"`` with ``state_shares`` by
  GPU memory (a40 48 GB, a10 24 GB) and batch shares by speed.

Each runs twice: with ``plan.nodes`` in Slurm's task order (what the
controller writes), and listed in another order, which the launcher must
re-list for the step (the a10 node keeps the small share and the short stage).
Losses match the single-process reference within 1e-15 (float64), as
docs/submitting.md states.
"""

from __future__ import annotations

import pytest
from hetero_runs import Training, check_losses, check_stages, check_state, explicit_plan, run_job

from solver.contract.plan import JobPlan

pytestmark = pytest.mark.slurm

PIPELINE = Training(steps=8, global_batch=8, virtual_workers=1)
#: plan.nodes and stage_layers: in task order, or the a10 node (1 layer) listed first
PIPELINE_ORDERS = {"task-order": (("n1", "n6"), (3, 1)), "other-order": (("n6", "n1"), (1, 3))}
PIPELINE_WHERE = ("-N2", "-n4", "--ntasks-per-node=2", "-w", "n1,n6", "--gres=gpu:2", "-p", "all", "-J", "cs-pipe")

SHARDED = Training(steps=8, global_batch=24, virtual_workers=24)  # one sample per virtual worker
A40, A10 = {"batch": 5.0, "state": 48.0}, {"batch": 2.0, "state": 24.0}  # samples by speed, state by GB
SHARDED_ORDERS = {"task-order": ("n4", "n5", "n6"), "other-order": ("n6", "n4", "n5")}
SHARDED_WHERE = ("-N3", "-n6", "--ntasks-per-node=2", "-w", "n[4-6]", "--gres=gpu:2", "-p", "all", "-J", "cs-shard")


def pipeline_plan(nodes: tuple[str, ...], stage_layers: tuple[int, ...]) -> JobPlan:
    """pp 2 x tp 2, one stage per node, as the controller writes it."""
    return JobPlan(
        pp=2,
        dp=1,
        tp=2,
        micro_batches=2,
        global_batch=PIPELINE.global_batch,
        virtual_workers=PIPELINE.virtual_workers,
        gpu_types=("a10", "a100"),
        nodes=nodes,
        gpus_per_node=2,
        stage_layers=stage_layers,
    )


def sharded_plan(nodes: tuple[str, ...]) -> JobPlan:
    """dp 6, two ranks per node, batch and state shares by the node's type, as the controller writes it."""
    per_rank = [A10 if n == "n6" else A40 for n in nodes for _ in range(2)]
    return JobPlan(
        pp=1,
        dp=6,
        tp=1,
        micro_batches=1,
        global_batch=SHARDED.global_batch,
        virtual_workers=SHARDED.virtual_workers,
        gpu_types=("a10", "a40"),
        nodes=nodes,
        gpus_per_node=2,
        batch_shares=tuple(r["batch"] for r in per_rank),
        state_sharding="memory",
        state_shares=tuple(r["state"] for r in per_rank),
    )


@pytest.fixture(scope="module")
def pipeline_reference():
    return PIPELINE.reference()


@pytest.fixture(scope="module")
def sharded_reference():
    return SHARDED.reference()


@pytest.mark.parametrize("order", list(PIPELINE_ORDERS))
def test_pipeline_across_gpu_types(slurm_cluster, tmp_path, pipeline_reference, order):
    plan = pipeline_plan(*PIPELINE_ORDERS[order])
    run = run_job(tmp_path, PIPELINE, explicit_plan(plan, PIPELINE_WHERE))
    assert (run.plan.nodes, run.plan.stage_layers) == (plan.nodes, plan.stage_layers), run.plan
    stages = sorted(set(check_stages(run, PIPELINE.config.layers)))
    assert stages == [("n1", 3), ("n6", 1)], stages  # the a100 node runs 3 layers, the a10 node 1
    worst = check_losses(run, pipeline_reference)
    print(f"\npipeline a100+a10 ({order}): (node, layers) {stages}, worst relative loss error {worst:.2e}")


@pytest.mark.parametrize("order", list(SHARDED_ORDERS))
def test_state_sharded_across_gpu_types(slurm_cluster, tmp_path, sharded_reference, order):
    plan = sharded_plan(SHARDED_ORDERS[order])
    run = run_job(tmp_path, SHARDED, explicit_plan(plan, SHARDED_WHERE))
    assert (run.plan.nodes, run.plan.state_shares) == (plan.nodes, plan.state_shares), run.plan
    state = check_state(run)  # each rank's slice follows its node's share
    a10 = [s for n, s in state if n == "n6"]
    a40 = [s for n, s in state if n != "n6"]
    assert len(a10) == 2 and len(a40) == 4 and max(a10) < min(a40), state
    full = 2 * run.states[0]["param_numel"]  # AdamW's moments of the whole model: one unsharded rank's state
    assert max(a40) <= full / 4, (state, full)  # an a40 rank holds a fifth
    for info in run.ranks:  # batch shares followed the nodes too: an a10 rank runs 2 samples, an a40 rank 5
        assert info["batch"][1] == (2 if info["node"] == "n6" else 5), info
    worst = check_losses(run, sharded_reference)
    print(f"\nstate sharded a40+a10 ({order}): (node, state elements) {state}, worst relative loss error {worst:.2e}")
