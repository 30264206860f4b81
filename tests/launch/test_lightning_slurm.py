"""A user's own Lightning DDP script on the dev cluster: submitted with
``cellsched sbatch --runtime ddp``, run by ``srun cellsched-launch``, made
movable by one ``launch.on_checkpoint`` call (contrib/examples/lightning).
The controller places it on 2 GPUs, grows it to 4 when a blocker leaves
(signal, checkpoint, exit 75, requeue, resume), and it completes. Its
progress and speed, which the hook's Lightning callback writes, show in
``cellsched status`` before it is grown."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm_ext" / "controller"))  # controller_support

from controller_support import (
    ROOT,
    end_blocker,
    fast_job_controller,
    find_job,
    job_logs,
    job_progress,
    status_row,
    submit_training,
    wait_job_state,
    wait_until,
)

from slurm_ext.controller.inputs import admin_comment_plan
from solver import contract

pytestmark = pytest.mark.slurm

EXAMPLE = ROOT / "contrib" / "examples" / "lightning" / "train_lightning.py"
STEPS = 150


def _checkpoint_dir(backend, job_id: str) -> Path | None:
    plan = admin_comment_plan(find_job(backend, job_id).admin_comment)
    return Path(plan.checkpoint_dir) if plan and plan.checkpoint_dir else None


def _steps_done(backend, job_id: str) -> float:
    p = job_progress(backend, job_id)
    return p.iterations_done if p is not None else 0.0


def _submit(tmp_path: Path) -> str:
    train = [str(EXAMPLE), "--steps", str(STEPS), "--step-delay", "0.2", "--log", str(tmp_path / "runs.jsonl")]
    sbatch = ["--runtime", "ddp", "--model", "gpt-350m", "--global-batch", "64", "--iterations", "200000"]
    return submit_training(tmp_path, train, [*sbatch, "--elastic", "--gpu-types", "a40", "--min-gpus", "2"])


def test_lightning_ddp_job_is_placed_dp_only_grown_once_and_completes(slurm_cluster, tmp_path):
    # the job is scheduled as a gpt-350m (2.8 s a step on two A40s) but takes 0.2 s a step: more than the
    # default 10 times its estimate, beyond which the controller stops believing its progress file
    config, ctl, backend, blocker = fast_job_controller(tmp_path)
    job = _submit(tmp_path)

    first = ctl.round()
    placed = first.placements[job]
    assert placed["cell"] == "a40:1x2:pp1" and (placed["dp"], placed["tp"]) == (2, 1), first.placements
    plan = json.loads(ctl.state.plans_of(job)[0].plan)
    assert plan["runtime"] == "ddp" and plan.get("pp", 1) == 1 and plan.get("tp", 1) == 1, plan
    wait_job_state(backend, job, ("RUNNING",), 60, tmp_path)
    wait_until(lambda: _steps_done(backend, job) >= 3, 120, "three Lightning steps on two GPUs")
    hook = json.loads((_checkpoint_dir(backend, job) / contract.HOOK_FILE).read_text())
    assert hook["job_id"] == job
    wait_until(lambda: (p := job_progress(backend, job)) is not None and p.iter_time_s, 60, "Lightning's step time")
    ctl.round()  # its report: progress, and its speed into the calibration
    row = status_row(config, job)
    assert row["progress_source"] == "file" and row["progress"] == f"{int(row['iterations_done'])}/200000", row
    # a step sleeps 0.2 s (--step-delay); DDP's all-reduce and the hook's poll on 2 CPU ranks add little
    assert 0.2 <= row["iter_s_observed"] <= 0.3, row
    print(f"Lightning: {row['iter_s_observed']} s/step observed, {row['iter_s_profile']} s/step estimated")

    end_blocker(backend, blocker)
    grow = ctl.round()
    moves = [a for a in grow.actions if a["job"] == job]
    assert moves and moves[0]["kind"] == "move" and moves[0]["ok"], grow.actions
    assert grow.placements[job]["cell"] == "a40:2x2:pp1"
    grown = json.loads(ctl.state.plans_of(job)[-1].plan)
    assert (grown["dp"], grown["runtime"], grown.get("tp", 1), grown.get("pp", 1)) == (4, "ddp", 1, 1), grown

    done = wait_job_state(backend, job, ("COMPLETED", "FAILED"), 300, tmp_path)
    assert done.state == "COMPLETED", job_logs(tmp_path)
    ctl.round()
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    # only the grown run reaches the end (the first exits 75 on the signal): it resumed from the checkpoint
    assert len(runs) == 1 and runs[0]["world_size"] == 4 and 3 <= runs[0]["start"] < STEPS, runs
    assert runs[0]["end"] == STEPS
    events = [e["event"] for e in ctl.state.history(job) if e["event"] != "trained"]
    assert events[:2] == ["placed", "signalled"] and events[-1] == "finished", events
