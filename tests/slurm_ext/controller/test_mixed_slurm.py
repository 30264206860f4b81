"""A job whose cell spans two GPU types, on the real dev cluster.

No single allowed type can hold it (6 GPUs of a40 + a10; the cluster has 4
a40 and 2 a10), so the solver gives it a mixed cell; the controller releases
it as ONE ordinary job (Partition=all, no feature constraint, untyped
Gres=gpu:2 per node, ReqNodeList of both types). The trainer runs under srun
cellsched-launch with the batch shares the controller priced by type, and its
losses must match the single-process reference within 1e-5 relative.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from controller_support import ROOT, find_job, job_env, job_logs, submit_training, wait_until, write_config
from minigpt.model import GPTConfig
from minigpt.trainer import TrainConfig, reference_losses

from slurm_ext.backends import get_backend
from slurm_ext.config import load
from slurm_ext.controller.inputs import admin_comment_plan
from slurm_ext.controller.round import Controller
from solver.contract.models import get_model
from solver.mixed import parse_key
from solver.types import JobRequest

pytestmark = pytest.mark.slurm

TRAIN = ROOT / "contrib" / "examples" / "train_gpt.py"
STEPS, BATCH, VIRTUAL_WORKERS = 20, 24, 24  # one sample per virtual worker: shares can differ by type
CELL = "a10x1+a40x2:3x2:pp1"


def _submit(tmp_path: Path) -> str:
    train = [str(TRAIN), "--model", "gpt-tiny", "--dtype", "float64", "--global-batch", str(BATCH)]
    train += ["--steps", str(STEPS), "--out", str(tmp_path / "losses.json"), "--report", str(tmp_path / "report")]
    # the reference trainer's runtime: any plan, moved on the checkpoint signal
    sbatch = ["--runtime", "exact", "--model", "gpt-tiny", "--global-batch", str(BATCH), "--iterations", str(STEPS)]
    sbatch += ["--gpu-types", "a40,a10", "--min-gpus", "6", "--virtual-workers", str(VIRTUAL_WORKERS)]
    return submit_training(tmp_path, train, sbatch)


def test_job_spanning_two_gpu_types_trains_like_the_reference(slurm_cluster, tmp_path):
    config = write_config(tmp_path / "cellsched.toml", tmp_path / "state.sqlite")
    with config.open("a") as f:
        f.write("max_pp = 1\n")
    ctl = Controller(load(config))
    backend = get_backend("cli")
    job = _submit(tmp_path)

    report = ctl.round()
    assert report.placements[job]["cell"] == CELL, report.placements
    placed = [a for a in report.actions if a["job"] == job]
    assert placed and placed[0]["kind"] == "place" and placed[0]["ok"], report.actions
    assert placed[0]["partition"] == "all"

    pending = find_job(backend, job)
    assert pending.features == "" and pending.partition == "all" and pending.gpus_per_node == 2, pending
    plan = admin_comment_plan(pending.admin_comment)
    assert plan.cell == CELL and plan.gpu_types == ("a10", "a40") and (plan.pp, plan.dp) == (1, 6), plan
    assert plan.nodes == ("n4", "n5", "n6"), plan  # Slurm's task order
    shares = plan.batch_shares
    assert shares is not None and len(set(shares[:4])) == 1 and len(set(shares[4:])) == 1, shares
    # each rank's share is what the controller's estimator priced for its type (cell parts: a10, a40), the
    # faster a40 never less than the a10 (gpt-tiny with one sample per virtual worker: the fixed cost of a
    # virtual worker's micro-batch dominates, so they may be even)
    probe = JobRequest(
        "probe", get_model("gpt-tiny"), BATCH, STEPS, virtual_workers=VIRTUAL_WORKERS, runtime="adaptive"
    )
    priced = ctl.estimator.estimate(probe, parse_key(CELL)).plan.shares
    assert (shares[0], shares[4]) == (priced[1], priced[0]) and priced[1] >= priced[0], (shares, priced)

    def ended():
        j = find_job(backend, job)
        return j if j is not None and j.finished else None

    try:
        done = wait_until(ended, 240, f"job {job} to finish")
    except AssertionError:
        raise AssertionError(f"{find_job(backend, job)}\n{job_logs(tmp_path)}") from None
    assert done.state == "COMPLETED", job_logs(tmp_path)
    assert sorted(done.nodes) == ["n4", "n5", "n6"]
    detail = subprocess.run(
        ["scontrol", "-d", "show", "job", job], env=job_env(), capture_output=True, text=True, timeout=30
    ).stdout
    assert "JOB_GRES=gpu:a40:4,gpu:a10:2" in detail, detail  # one job, the GPUs of both types

    sizes = [json.loads((tmp_path / "report" / f"rank-{r}.json").read_text())["batch"][1] for r in range(6)]
    total = sum(shares)
    assert sizes == [BATCH * s / total for s in shares], (sizes, shares)

    losses = json.loads((tmp_path / "losses.json").read_text())["losses"]
    ref = reference_losses(
        GPTConfig.from_preset("gpt-tiny"),
        TrainConfig(global_batch=BATCH, dtype="float64"),
        STEPS,
        virtual_workers=VIRTUAL_WORKERS,
    )
    assert len(losses) == STEPS
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref, strict=True))
    assert worst <= 1e-5, f"losses differ from the single-process reference by {worst:.2e} (relative)"
    print(f"\nmixed cell {CELL}: shares {shares}, rank batches {sizes}, worst relative loss error {worst:.2e}")
    ctl.round()
    assert [e["event"] for e in ctl.state.history(job)][-1] == "finished"
