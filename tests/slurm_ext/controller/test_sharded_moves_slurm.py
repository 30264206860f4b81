"""A sharded-runtime job moved by the controller across plans on the real dev cluster.

The job (``cellsched sbatch --runtime sharded``) trains minigpt at >= 20M
float32 parameters through srun cellsched-launch. A scripted policy (the
test decides where the job goes; the controller does the rest: signal,
checkpoint wait, requeue, new plan in the AdminComment, release) moves it
dp4 on 4 A100s -> pp2 x tp2 on 4 other A100s -> dp3 on 3 V100s, so dp, tp,
pp and the GPU count all change; each plan has its own micro-batches (a
runtime without virtual workers keeps none of an earlier plan's), at least
pp in the pipeline. Each run resumes the last one's
DCP checkpoint; the checkpoint of every plan holds one shard per rank, none
over 1.5x the even share, and the losses follow the unmoved
single-process run within docs/runtime-sharded.md's 1e-5 (relative).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from controller_support import ROOT, find_job, job_logs, submit_training, wait_until, write_config
from minigpt.model import GPTConfig, build_full_model
from minigpt.trainer import TrainConfig, keyed_reference_losses

from slurm_ext.backends import get_backend
from slurm_ext.config import load
from slurm_ext.controller.inputs import admin_comment_plan
from slurm_ext.controller.progress import read_progress_file
from slurm_ext.controller.round import Controller
from solver.types import Cell, ParallelPlan, Placement, ScheduleReply, SolverStatus

pytestmark = pytest.mark.slurm

TRAIN = ROOT / "contrib" / "examples" / "train_gpt.py"
SHAPE = GPTConfig(layers=4, hidden=672, heads=4)  #: 21.8M parameters
#: lr 3e-4: at the reference trainer's 3e-3 this model's loss climbs (4.3 -> 5.1 in 5 steps) and the
#: unstable run amplifies rounding past 1e-5 (measured 1.2e-5); docs/runtime-sharded.md
LR = 3e-4
FLAGS = ("--layers", "4", "--hidden", "672", "--heads", "4", "--lr", str(LR))
BATCH, STEPS = 12, 8
TOL = 1e-5  #: docs/runtime-sharded.md
#: the test's moves: (cell, nodes, plan); each run trains until the step after which the next move comes
MOVES = (
    (Cell("a100", 1, 4), (("n1", 4),), ParallelPlan(pp=1, dp=4, tp=1), "a100"),
    (Cell("a100", 1, 4, pp=2), (("n2", 4),), ParallelPlan(pp=2, dp=1, tp=2, micro_batches=2), "a100"),
    (Cell("v100", 1, 3), (("n3", 3),), ParallelPlan(pp=1, dp=3, tp=1), "v100"),
)


class Scripted:
    """A policy that puts the job where the test says (``self.move``)."""

    name = "scripted"

    def __init__(self) -> None:
        self.move = 0

    def schedule(self, request, estimator):
        cell, nodes, plan, partition = MOVES[self.move]
        placements = {
            j.job_id: Placement(j.job_id, cell, nodes, plan, iter_time_s=5.0, partition=partition) for j in request.jobs
        }
        return ScheduleReply(placements, SolverStatus.FEASIBLE)


def _submit(tmp_path: Path) -> str:
    train = [str(TRAIN), *FLAGS, "--global-batch", str(BATCH), "--steps", str(STEPS), "--step-delay", "1"]
    train += ["--out", str(tmp_path / "losses.json")]
    sbatch = ["--runtime", "sharded", "--model", "gpt-350m", "--global-batch", str(BATCH), "--iterations", str(STEPS)]
    return submit_training(tmp_path, train, [*sbatch, "--gpu-types", "a100,v100", "--elastic"])


def _shard_sizes(step_dir: Path) -> list[int]:
    return [p.stat().st_size for p in sorted(step_dir.glob("*.distcp"))]


def test_sharded_job_moved_across_dp_tp_pp_and_gpu_count_continues_its_loss_curve(slurm_cluster, tmp_path):
    assert sum(p.numel() for p in build_full_model(SHAPE, 0).parameters()) >= 20_000_000
    policy = Scripted()
    config = write_config(tmp_path / "cellsched.toml", tmp_path / "state.sqlite", checkpoint_wait_s=300.0)
    ctl = Controller(load(config), policy=policy)
    backend = get_backend("cli")
    job = _submit(tmp_path)

    def steps_done() -> float:
        j = find_job(backend, job)
        plan = admin_comment_plan(j.admin_comment) if j else None
        prog = read_progress_file(plan.checkpoint_dir if plan else None)
        return prog.iterations_done if prog is not None else 0.0

    def wait_steps(n: int) -> None:
        try:
            wait_until(lambda: steps_done() >= n, 600, f"job {job} at step {n}")
        except AssertionError:
            raise AssertionError(f"{find_job(backend, job)}\n{job_logs(tmp_path)}") from None

    first = ctl.round()
    assert [a["kind"] for a in first.actions if a["job"] == job] == ["place"], first.actions
    plan = admin_comment_plan(find_job(backend, job).admin_comment)
    assert (plan.runtime, plan.pp, plan.dp, plan.tp) == ("sharded", 1, 4, 1), plan
    ckpt = Path(plan.checkpoint_dir)
    wait_steps(2)
    for move in (1, 2):
        policy.move = move
        report = ctl.round()
        assert [a["kind"] for a in report.actions if a["job"] == job] == ["move"], report.actions
        wait_steps(steps_done() + 2 if move == 1 else STEPS)

    def ended():
        j = find_job(backend, job)
        return j if j is not None and j.finished else None

    done = wait_until(ended, 600, f"job {job} to finish")
    assert done.state == "COMPLETED", job_logs(tmp_path)
    ctl.round()

    plans = [json.loads(p.plan) for p in ctl.state.plans_of(job)]
    assert [(p["runtime"], p["pp"], p["dp"], p["tp"]) for p in plans] == [
        ("sharded", 1, 4, 1),
        ("sharded", 2, 1, 2),
        ("sharded", 1, 3, 1),
    ], plans
    # one shard per rank of the plan that wrote it, none over 1.5x the even share
    worlds = sorted({len(_shard_sizes(d)) for d in ckpt.glob("step-*")})
    assert worlds == [3, 4], worlds
    for d in sorted(ckpt.glob("step-*")):
        sizes = _shard_sizes(d)
        assert max(sizes) <= 1.5 * sum(sizes) / len(sizes), (d.name, sizes)
    losses = json.loads((tmp_path / "losses.json").read_text())["losses"]
    ref = keyed_reference_losses(SHAPE, TrainConfig(global_batch=BATCH, lr=LR), STEPS)
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref, strict=True))
    print(f"\nlosses {losses}\nreference {ref}")
    assert worst < TOL, (worst, losses, ref)
    print(f"\nsharded moves dp4 -> pp2xtp2 -> dp3: worst relative loss deviation {worst:.2e}")
