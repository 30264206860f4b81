"""A user's own Lightning DDP script on the dev cluster: submitted with
``cellsched sbatch --runtime ddp``, run by ``srun cellsched-launch``, made
movable by one ``launch.on_checkpoint`` call (contrib/examples/lightning).
The controller places it on 2 GPUs, grows it to 4 when a blocker leaves
(signal, checkpoint, exit 75, requeue, resume), and it completes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm_ext" / "controller"))  # controller_support

from controller_support import ROOT, wait_until, write_config

from slurm_ext.backends import get_backend
from slurm_ext.config import load
from slurm_ext.controller.inputs import admin_comment_plan
from slurm_ext.controller.progress import read_progress_file
from slurm_ext.controller.round import Controller
from solver import contract

pytestmark = pytest.mark.slurm

EXAMPLE = ROOT / "contrib" / "examples" / "lightning" / "train_lightning.py"
STEPS = 150


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_JOB", "SLURM_STEP", "CELLSCHED_"))}
    return {**env, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}"}


def _job(backend, job_id: str):
    return next((j for j in backend.observe().jobs if j.job_id == job_id), None)


def _log(tmp_path: Path) -> str:
    return "\n".join(p.read_text()[-3000:] for p in tmp_path.glob("job-*.out"))


def _state(backend, job_id, states, timeout, tmp_path):
    def reached():
        j = _job(backend, job_id)
        return j if j is not None and j.state in states else None

    try:
        return wait_until(reached, timeout, f"job {job_id} in {states}")
    except AssertionError:
        raise AssertionError(f"job {job_id}: {_job(backend, job_id)}\n{_log(tmp_path)}") from None


def _checkpoint_dir(backend, job_id: str) -> Path | None:
    plan = admin_comment_plan(_job(backend, job_id).admin_comment)
    return Path(plan.checkpoint_dir) if plan and plan.checkpoint_dir else None


def _steps_done(backend, job_id: str) -> float:
    d = _checkpoint_dir(backend, job_id)
    p = read_progress_file(str(d) if d else None)
    return p.iterations_done if p is not None else 0.0


def _submit(tmp_path: Path) -> str:
    launcher = shutil.which("cellsched-launch", path=_env()["PATH"]) or pytest.fail("cellsched-launch not on PATH")
    script = tmp_path / "train.sh"
    cmd = ["srun", launcher, "--", sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--step-delay", "0.2"]
    cmd += ["--log", str(tmp_path / "runs.jsonl")]
    script.write_text("#!/bin/bash\nexec " + " ".join(f"'{c}'" for c in cmd) + "\n")
    script.chmod(0o755)
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_ext", "sbatch", "--parsable", "--runtime", "ddp", "--model", "gpt-350m"]
        + ["--global-batch", "64", "--iterations", "200000", "--elastic", "--gpu-types", "a40", "--min-gpus", "2"]
        + ["-o", str(tmp_path / "job-%j.out"), "--", str(script)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def _blocker(node: str, partition: str, gpus: int) -> str:
    out = subprocess.run(
        ["sbatch", "--parsable", "-p", partition, "-w", node, "-N1", f"--gres=gpu:{gpus}", "-o", "/dev/null"]
        + ["--wrap", "sleep 600"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.strip().split(";")[0]


def test_lightning_ddp_job_is_placed_dp_only_grown_once_and_completes(slurm_cluster, tmp_path):
    config = write_config(tmp_path / "cellsched.toml", tmp_path / "state.sqlite", checkpoint_wait_s=60.0)
    ctl = Controller(load(config))
    backend = get_backend("cli")
    blocker = _blocker("n5", "a40", 2)
    _state(backend, blocker, ("RUNNING",), 30, tmp_path)
    job = _submit(tmp_path)

    first = ctl.round()
    placed = first.placements[job]
    assert placed["cell"] == "a40:1x2:pp1" and (placed["dp"], placed["tp"]) == (2, 1), first.placements
    plan = json.loads(ctl.state.plans_of(job)[0].plan)
    assert plan["runtime"] == "ddp" and plan.get("pp", 1) == 1 and plan.get("tp", 1) == 1, plan
    _state(backend, job, ("RUNNING",), 60, tmp_path)
    wait_until(lambda: _steps_done(backend, job) >= 3, 120, "three Lightning steps on two GPUs")
    hook = json.loads((_checkpoint_dir(backend, job) / contract.HOOK_FILE).read_text())
    assert hook["job_id"] == job

    subprocess.run(["scancel", blocker], env=_env(), check=True, timeout=30)
    wait_until(lambda: _job(backend, blocker) is None or _job(backend, blocker).finished, 30, "the blocker to end")
    grow = ctl.round()
    moves = [a for a in grow.actions if a["job"] == job]
    assert moves and moves[0]["kind"] == "move" and moves[0]["ok"], grow.actions
    assert grow.placements[job]["cell"] == "a40:2x2:pp1"
    grown = json.loads(ctl.state.plans_of(job)[-1].plan)
    assert (grown["dp"], grown["runtime"], grown.get("tp", 1), grown.get("pp", 1)) == (4, "ddp", 1, 1), grown

    done = _state(backend, job, ("COMPLETED", "FAILED"), 300, tmp_path)
    assert done.state == "COMPLETED", _log(tmp_path)
    ctl.round()
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    # only the grown run reaches the end (the first exits 75 on the signal): it resumed from the checkpoint
    assert len(runs) == 1 and runs[0]["world_size"] == 4 and 3 <= runs[0]["start"] < STEPS, runs
    assert runs[0]["end"] == STEPS
    events = [e["event"] for e in ctl.state.history(job) if e["event"] != "trained"]
    assert events[:2] == ["placed", "signalled"] and events[-1] == "finished", events
