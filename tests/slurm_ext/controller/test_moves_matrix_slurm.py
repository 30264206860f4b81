"""Every move the `exact` and `sharded` runtimes allow, carried out by the controller on the real dev cluster.

Two jobs of the reference trainer (``cellsched sbatch --runtime exact`` and
``--runtime sharded``, a 4-layer minigpt) run side by side under one
controller whose policy puts each where the test says (`Scripted`); the
controller does the rest of each move: signal, checkpoint wait, requeue, the
new plan in the AdminComment, release. Each job goes through one chain of
plans, every hop a case of the matrix:

    dp2 -> pp2 x dp2 (into a pipeline: m 1 -> 2) -> dp2 (out of it) -> dp2 x tp2 (tp 1 -> 2)
        -> dp3 (dp 2 -> 3) -> dp3 on V100s (another GPU type) -> dp4 on a mixed-type cell -> dp2 on A100s

Each run trains until it has reported a step, then the next move comes;
after the last the job completes its steps. The micro-batches of each plan
are the controller's (reconcile.job_plan): the old count where the runtime
keeps it, at least pp in a pipeline. The losses must follow an unmoved
run's within the runtimes' stated tolerances: `exact` (float64, V = 6)
agrees with the single-process run of its virtual workers to rounding
(docs/runtime-exact.md), `sharded` (float32) within 1e-5 relative
(docs/runtime-sharded.md).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import controller_support
import pytest
from controller_support import ROOT, find_job, job_logs, submit_training, wait_job_state, wait_until, write_config
from minigpt.model import GPTConfig
from minigpt.trainer import TrainConfig, keyed_reference_losses, reference_losses

from slurm_ext.backends import get_backend
from slurm_ext.config import load
from slurm_ext.controller.inputs import admin_comment_plan
from slurm_ext.controller.progress import read_progress_file
from slurm_ext.controller.round import Controller
from slurm_ext.records import FINISHED
from solver.mixed import parse_key
from solver.types import Cell, ParallelPlan, Placement, ScheduleReply, SolverStatus

pytestmark = pytest.mark.slurm

TRAIN = ROOT / "contrib" / "examples" / "train_gpt.py"
SHAPE = GPTConfig()  #: minigpt's default: 4 layers, hidden 32, 4 heads
BATCH, V, STEPS = 12, 6, 60  #: V: the exact job's virtual workers, 2 samples each
STEP_DELAY = 3.0  #: seconds each step waits
#: exact: rounding in float64 (docs/runtime-exact.md; the chaos test measured <= 8e-16 over 45 steps);
#: sharded: docs/runtime-sharded.md's float32 claim
TOL = {"exact": 1e-14, "sharded": 1e-5}
DTYPE = {"exact": "float64", "sharded": "float32"}
A40_A10 = parse_key("a40x1+a10x1:2x2:pp1")
A100_V100 = parse_key("a100x1+v100x1:2x2:pp1")


def _hop(cell: Cell, nodes: tuple[tuple[str, int], ...], plan: ParallelPlan, partition: str) -> Placement:
    # iter_time_s: the estimate a job's reported progress is checked against (a tiny model steps fast)
    return Placement("", cell, nodes, plan, iter_time_s=0.05, partition=partition)


def _chain(a100: str, mixed: Cell, mixed_nodes: tuple[tuple[str, int], ...]) -> tuple[Placement, ...]:
    """One job's plans, each a case: the job starts on `a100`'s GPUs and enters the `mixed` cell on `mixed_nodes`."""
    return (
        _hop(Cell("a100", 1, 2), ((a100, 2),), ParallelPlan(1, 2, 1), "a100"),
        _hop(Cell("a100", 1, 4, pp=2), ((a100, 4),), ParallelPlan(2, 2, 1, micro_batches=2), "a100"),
        _hop(Cell("a100", 1, 2), ((a100, 2),), ParallelPlan(1, 2, 1), "a100"),
        _hop(Cell("a100", 1, 4), ((a100, 4),), ParallelPlan(1, 2, 2), "a100"),
        _hop(Cell("a100", 1, 3), ((a100, 3),), ParallelPlan(1, 3, 1), "a100"),
        _hop(Cell("v100", 1, 3), (("n3", 3),), ParallelPlan(1, 3, 1), "v100"),
        # 2 samples a virtual worker: the first type's ranks run 2 of them, the second's 1
        _hop(mixed, mixed_nodes, ParallelPlan(1, 4, 1, shares=(4, 2)), "all"),
        _hop(Cell("a100", 1, 2), ((a100, 2),), ParallelPlan(1, 2, 1), "a100"),
    )


CHAINS = {
    "exact": _chain("n1", A40_A10, (("n4", 2), ("n6", 2))),
    "sharded": _chain("n2", A100_V100, (("n2", 2), ("n3", 2))),
}
#: what each hop changes (the matrix's cases)
CASES = (
    "pp 1->2",
    "pp 2->1",
    "tp 1->2",
    "dp 2->3 (tp 2->1)",
    "another GPU type",
    "into a mixed cell (dp 3->4)",
    "out of a mixed cell (dp 4->2)",
)


class Scripted:
    """A policy that puts each job where the test says: hop `self.move` of its runtime's chain."""

    name = "scripted"

    def __init__(self, runtimes: dict[str, str]) -> None:
        self.runtimes, self.move = runtimes, 0

    def schedule(self, request, estimator):
        placements = {}
        for j in request.jobs:
            hop = CHAINS[self.runtimes[j.job_id]][self.move]
            placements[j.job_id] = Placement(j.job_id, hop.cell, hop.nodes, hop.plan, hop.iter_time_s, hop.partition)
        return ScheduleReply(placements, SolverStatus.FEASIBLE)


def _submit(tmp_path: Path, runtime: str) -> str:
    out = tmp_path / runtime
    out.mkdir()
    # STEPS x STEP_DELAY: the time the eight runs share to report a step before the job ends (a busy machine is slow
    # to see each and to move it)
    train = [str(TRAIN), "--global-batch", str(BATCH), "--steps", str(STEPS), "--step-delay", str(STEP_DELAY)]
    train += ["--dtype", DTYPE[runtime], "--out", str(out / "losses.json")]
    sbatch = ["--runtime", runtime, "--model", "gpt-tiny", "--global-batch", str(BATCH), "--iterations", str(STEPS)]
    sbatch += ["--gpu-types", "a100,v100,a40,a10", "--elastic"]
    if runtime == "exact":
        sbatch += ["--virtual-workers", str(V)]
    return submit_training(out, train, sbatch)


def test_every_move_the_runtimes_allow_runs_and_continues_the_loss_curve(slurm_cluster, tmp_path):
    t0 = time.monotonic()
    config = write_config(tmp_path / "cellsched.toml", tmp_path / "state.sqlite", checkpoint_wait_s=300.0)
    jobs = {_submit(tmp_path, rt): rt for rt in CHAINS}
    policy = Scripted(jobs)
    ctl = Controller(load(config), policy=policy)
    backend = get_backend("cli")

    def logs() -> str:
        return "\n".join(f"{rt}:\n{job_logs(tmp_path / rt)}" for rt in CHAINS)

    def trained_in_this_run(job: str) -> bool:
        """The job runs the plan of the current hop and its current run has reported a step."""
        j = find_job(backend, job)
        if j is None or j.finished:
            raise AssertionError(f"job {job} ({jobs[job]}) ended: {j}\n{logs()}")
        plan = admin_comment_plan(j.admin_comment)
        want = CHAINS[jobs[job]][policy.move].plan
        if j.state != "RUNNING" or plan is None or (plan.pp, plan.dp, plan.tp) != (want.pp, want.dp, want.tp):
            return False
        prog = read_progress_file(plan.checkpoint_dir)
        return prog is not None and prog.first_step_at is not None and prog.first_step_at >= (j.start_time or 0)

    def each_trained() -> None:
        wait_until(lambda: all(trained_in_this_run(j) for j in jobs), 600, f"hop {policy.move} to train")

    first = controller_support.answered_round(ctl)
    assert sorted(a["kind"] for a in first.actions) == ["place", "place"], first.actions
    each_trained()
    hops = [time.monotonic()]
    for move, case in enumerate(CASES, start=1):
        policy.move = move
        report = controller_support.answered_round(ctl)
        assert sorted(a["kind"] for a in report.actions) == ["move", "move"], (case, report.actions)
        assert all(a["ok"] for a in report.actions), (case, report.actions)
        each_trained()
        hops.append(time.monotonic())
        print(f"hop {move} ({case}): {hops[-1] - hops[-2]:.1f} s")

    for job, rt in jobs.items():
        done = wait_job_state(backend, job, tuple(FINISHED), 600, tmp_path / rt)
        assert done.state == "COMPLETED", logs()
    controller_support.answered_round(ctl)
    print(f"matrix: {time.monotonic() - t0:.1f} s in all, the moves {hops[-1] - hops[0]:.1f} s")

    for job, rt in jobs.items():
        plans = [json.loads(p.plan) for p in ctl.state.plans_of(job)]
        chain = CHAINS[rt]
        assert [(p["cell"], p["pp"], p["dp"], p["tp"]) for p in plans] == [
            (h.cell.key(), h.plan.pp, h.plan.dp, h.plan.tp) for h in chain
        ], plans
        # the micro-batches: a pipeline gets at least pp (the one a pp=1 plan had would not do); exact keeps
        # a virtual worker's count where that holds, sharded takes the new plan's own
        assert [p["micro_batches"] for p in plans] == [
            1,
            2,
            2 if rt == "exact" else 1,
            *[2 if rt == "exact" else 1] * 5,
        ]
        if rt == "exact":
            assert {p["virtual_workers"] for p in plans} == {V}
        mixed = plans[6]
        assert mixed["batch_shares"] == [4.0, 4.0, 2.0, 2.0], mixed
        losses = json.loads((tmp_path / rt / "losses.json").read_text())["losses"]
        tc = TrainConfig(global_batch=BATCH, dtype=DTYPE[rt])
        ref = (
            reference_losses(SHAPE, tc, STEPS, virtual_workers=V)
            if rt == "exact"
            else keyed_reference_losses(SHAPE, tc, STEPS)
        )
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref, strict=True))
        print(f"{rt}: {len(plans)} plans, worst relative loss deviation from an unmoved run {worst:.1e}")
        assert worst <= TOL[rt], (rt, worst, losses, ref)
