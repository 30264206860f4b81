"""Bring your own code (issue 38): an unmodified torchrun-style DDP script
(contrib/examples/ddp/train.py, no cellsched import) submitted with
``--runtime ddp`` under ``srun cellsched-launch`` on the dev cluster is
offered and given data-parallel plans only (pp = tp = 1, one GPU type, even
batches), is never moved (it registers no checkpoint hook: static), and
trains to completion.

The job asks for 4 to 8 A100s with a global batch of 64 of gpt-350m: there
the reference trainer's runtime (exact) is offered a pipeline (checked here
first), so a ddp job that got one would fail this test."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from controller_support import ROOT, submit_training, wait_until, write_config

from slurm_ext.backends import get_backend
from slurm_ext.config import load
from slurm_ext.controller.hooks import STATIC_REASON
from slurm_ext.controller.round import Controller
from slurm_ext.view import to_cluster_view
from solver import contract
from solver.contract.models import get_model
from solver.contract.plan import JobPlan
from solver.types import JobRequest, ScheduleRequest

pytestmark = pytest.mark.slurm

DDP_SCRIPT = ROOT / "contrib" / "examples" / "ddp" / "train.py"
STEPS = 30
SPEC = ("--model", "gpt-350m", "--global-batch", "64", "--iterations", str(STEPS))
SPEC += ("--gpu-types", "a100", "--min-gpus", "4", "--max-gpus", "8", "--elastic")


def _submit(tmp_path: Path) -> str:
    train = [str(DDP_SCRIPT), "--steps", str(STEPS), "--out", str(tmp_path / "losses.json")]
    return submit_training(tmp_path, train, ["--runtime", "ddp", *SPEC])


def _offered_to_exact(ctl: Controller) -> tuple[int, int]:
    """(pp, tp) the policy gives the same job with the exact runtime on the empty cluster."""
    view = to_cluster_view(ctl.backend.observe(), ())
    job = JobRequest(
        "probe", get_model("gpt-350m"), 64, STEPS, gpu_types=("a100",), min_gpus=4, max_gpus=8, runtime="exact"
    )
    reply = ctl.policy.schedule(ScheduleRequest(view, (job,), config=ctl.config.solver), ctl.estimator)
    p = reply.placements["probe"]
    return p.plan.pp, p.plan.tp


def test_an_unmodified_ddp_script_is_placed_only_in_data_parallel_cells_and_trains(slurm_cluster, tmp_path):
    config = write_config(tmp_path / "cellsched.toml", tmp_path / "state.sqlite")
    ctl = Controller(load(config))
    assert _offered_to_exact(ctl) != (1, 1)  # the control: here an unconstrained runtime gets pp or tp
    backend = get_backend("cli")
    job_id = _submit(tmp_path)
    shown: list[dict] = []  # every placement any round chose for the job
    written: list[JobPlan] = []  # every plan the controller wrote into its AdminComment
    statuses: list[str] = []
    kinds: list[str] = []
    deadline = time.monotonic() + 300
    while True:
        report = ctl.round()
        assert report.status == "ok", report
        if job_id in report.placements:
            shown.append(report.placements[job_id])
        kinds += [a["kind"] for a in report.actions if a["job"] == job_id]
        statuses += [s.reason for s in report.jobs if s.job_id == job_id and s.phase == "running"]
        job = backend.observe().job(job_id)
        plan = contract.admin_comment_plan(job.admin_comment, strict=False)
        if plan is not None and plan not in written:
            written.append(plan)
        if job.finished:
            break
        assert time.monotonic() < deadline, (job, "\n".join(p.read_text()[-2000:] for p in tmp_path.glob("job-*")))
        time.sleep(1.0)
    log = "\n".join(p.read_text()[-3000:] for p in tmp_path.glob("job-*.out"))
    assert (job.state, job.exit_code) == ("COMPLETED", 0), log
    stored = [JobPlan.from_json(r.plan) for r in ctl.state.plans_of(job_id)]
    assert shown and written and stored
    for p in shown:
        assert (p["pp"], p["tp"]) == (1, 1) and p["cell"].startswith("a100:"), shown
    for plan in written + stored:
        assert (plan.pp, plan.tp, plan.gpu_types, plan.runtime) == (1, 1, ("a100",), "ddp"), plan
        assert plan.batch_shares is None and plan.stage_layers is None and 64 % plan.dp == 0, plan
        assert plan.checkpoint_dir, plan
    assert "move" not in kinds, kinds  # no hook registered: static, never signalled
    assert statuses and all(r == STATIC_REASON for r in statuses), statuses
    # it trained: every step, on as many ranks as its plan's dp
    result = json.loads((tmp_path / "losses.json").read_text())
    assert len(result["losses"]) == STEPS and result["world_size"] == written[-1].dp, (result, log)
    wait_until(lambda: backend.observe().job(job_id).finished, 10, "the job to be gone")
    ctl.state.close()
