"""A job priced as one model while its script trains another, grown by the controller on the real dev cluster.

The job is submitted as ``--model gpt-350m`` (24 layers) and ``--runtime
sharded`` while its script, the reference trainer, trains 8 layers. The
policy (`Grow`) says where the job goes: two A40s, then four in a pipeline of
4 stages, the move the controller made on its own in the issue that found
this; the plan inside each cell is the one the controller's estimator prices
for the job as the round's request describes it. Before the job has
reported, that is the model it was submitted as; from its first progress
report on, the trainer's own shape (progress.json's "model"), which the
controller keeps in its state DB. So the pipeline's stages split 8 layers,
not 24 (a split of 24 killed both runs of the grown job before training),
the job completes with no failed run, and its losses follow the unmoved
single-process run within docs/runtime-sharded.md's 1e-5.
"""

from __future__ import annotations

import json

import controller_support
import pytest
from controller_support import ROOT, find_job, job_logs, submit_training, wait_job_state, wait_until, write_config
from minigpt.model import GPTConfig
from minigpt.trainer import TrainConfig, keyed_reference_losses

from slurm_ext.backends import get_backend
from slurm_ext.config import load
from slurm_ext.controller.inputs import admin_comment_plan
from slurm_ext.controller.progress import read_progress_file
from slurm_ext.controller.round import Controller
from slurm_ext.records import FINISHED
from slurm_ext.state import HistoryEvent
from solver.contract.models import ModelShape, get_model
from solver.types import Cell, Placement, ScheduleReply, SolverStatus

pytestmark = pytest.mark.slurm

TRAIN = ROOT / "contrib" / "examples" / "train_gpt.py"
SHAPE = GPTConfig(layers=8)  #: what the script trains (hidden 32, 4 heads, seq 16, vocab 64)
BATCH, STEPS = 12, 12
TOL = 1e-5  #: docs/runtime-sharded.md (float32)
#: (cell, nodes) of each round's placement: two A40s, then four in 4 pipeline stages
CELLS = ((Cell("a40", 1, 2), (("n4", 2),)), (Cell("a40", 2, 2, pp=4), (("n4", 2), ("n5", 2))))


class Grow:
    """Puts the job in CELLS[self.grow], with the plan the controller's
    estimator prices there for the job of the request; remembers the
    model each round priced (`priced`)."""

    name = "grow"

    def __init__(self) -> None:
        self.grow, self.priced = 0, []

    def schedule(self, request, estimator):
        cell, nodes = CELLS[self.grow]
        placements = {}
        for job in request.jobs:
            self.priced.append(job.model)
            est = estimator.estimate(job, cell)
            assert est.feasible and est.plan is not None, est
            placements[job.job_id] = Placement(job.job_id, cell, nodes, est.plan, 0.05, "a40")
        return ScheduleReply(placements, SolverStatus.FEASIBLE)


def test_a_job_is_grown_into_a_pipeline_of_the_model_it_trains_not_the_one_it_was_priced_as(slurm_cluster, tmp_path):
    config = write_config(tmp_path / "cellsched.toml", tmp_path / "state.sqlite", checkpoint_wait_s=300.0)
    policy = Grow()
    ctl = Controller(load(config), policy=policy)
    backend = get_backend("cli")
    train = [str(TRAIN), "--layers", str(SHAPE.layers), "--global-batch", str(BATCH), "--steps", str(STEPS)]
    train += ["--step-delay", "2.0", "--out", str(tmp_path / "losses.json")]  # time to see a step and move it
    sbatch = ["--runtime", "sharded", "--model", "gpt-350m", "--global-batch", str(BATCH), "--iterations", str(STEPS)]
    job = submit_training(tmp_path, train, [*sbatch, "--gpu-types", "a40", "--elastic"])

    def progress():
        j = find_job(backend, job)
        if j is None or j.finished:
            raise AssertionError(f"job {job} ended: {j}\n{job_logs(tmp_path)}")
        plan = admin_comment_plan(j.admin_comment)
        prog = read_progress_file(plan.checkpoint_dir if plan else None)
        return j, plan, prog

    def trained(pp: int) -> bool:
        j, plan, prog = progress()
        ran = prog is not None and prog.first_step_at is not None and prog.first_step_at >= (j.start_time or 0)
        return j.state == "RUNNING" and plan is not None and plan.pp == pp and ran

    first = controller_support.answered_round(ctl)
    assert [a["kind"] for a in first.actions] == ["place"], first.actions
    wait_until(lambda: trained(1), 300, f"job {job} to train on two A40s")
    # the trainer's word, as the controller reads it
    assert progress()[2].model == ModelShape(8, 32, 4, 16, 64)
    policy.grow = 1
    report = controller_support.answered_round(ctl)
    assert [a["kind"] for a in report.actions] == ["move"], report.actions
    wait_until(lambda: trained(4), 300, f"job {job} to train in a pipeline of 4 stages")

    done = wait_job_state(backend, job, tuple(FINISHED), 300, tmp_path)
    assert done.state == "COMPLETED", job_logs(tmp_path)
    controller_support.answered_round(ctl)

    gpt350m = get_model("gpt-350m")
    assert policy.priced[0] == gpt350m  # before its first report: the model it was submitted as
    trained_as = policy.priced[1]
    assert (trained_as.num_layers, trained_as.hidden, trained_as.heads, trained_as.seq_len, trained_as.vocab) == (
        8,
        32,
        4,
        16,
        64,
    )
    assert json.loads(ctl.state.jobs()[job].model_shape) == ModelShape(8, 32, 4, 16, 64).to_dict()  # kept once
    plans = [json.loads(p.plan) for p in ctl.state.plans_of(job)]
    assert [(p["pp"], p["dp"], p.get("stage_layers")) for p in plans] == [(1, 2, None), (4, 1, [2, 2, 2, 2])], plans
    events = [e["event"] for e in ctl.state.history(job)]
    assert HistoryEvent.RUN_FAILED not in events, events
    losses = json.loads((tmp_path / "losses.json").read_text())["losses"]
    ref = keyed_reference_losses(SHAPE, TrainConfig(global_batch=BATCH), STEPS)
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref, strict=True))
    print(f"\npriced as {trained_as.name}; worst relative loss deviation {worst:.1e}")
    assert worst < TOL, (worst, losses, ref)
