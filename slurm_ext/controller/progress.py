"""How far a running job is: its own progress file, else an estimate."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Callable, Collection

from slurm_ext.controller import inputs as inp

#: how the controller learns a job's iterations done: the job's progress file
#: on a real cluster; the simulated backend's own counter in the simulator
ProgressReader = Callable[["inp.ManagedJob"], "float | None"]

PROGRESS_FILE = "progress.json"
#: a progress file is small; anything larger is ignored
MAX_BYTES = 65536


def default_checkpoint_dir(job_id: str, user: str, work_dir: str | None, root: str) -> str:
    """``<work dir>/.cellsched/<job id>``; ``<root>/<user>/<job id>`` when the
    working directory is unknown."""
    if work_dir:
        return os.path.join(work_dir, ".cellsched", job_id)
    return os.path.join(root, user or "unknown", job_id)


def read_progress(checkpoint_dir: str | None) -> float | None:
    """Iterations done from ``<checkpoint_dir>/progress.json``
    ({"step", "iterations_done", "time"}); None when absent or unreadable."""
    if not checkpoint_dir:
        return None
    path = Path(checkpoint_dir) / PROGRESS_FILE
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            return None
        data = json.loads(raw)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    value = data.get("iterations_done", data.get("step"))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def estimate_done(start_time: float | None, now: float, iter_time_s: float | None, iterations: int) -> float:
    """Iterations a job has probably done from its run time; 0 when unknown."""
    if start_time is None or not iter_time_s or iter_time_s <= 0 or not math.isfinite(iter_time_s):
        return 0.0
    return min(float(iterations), max(0.0, (now - start_time) / iter_time_s))


def progress_file(m: inp.ManagedJob) -> float | None:
    """The ProgressReader of a real cluster: ``<checkpoint_dir>/progress.json``."""
    return read_progress(m.plan.checkpoint_dir) if m.plan else None


def collect_progress(jobs: tuple[inp.ManagedJob, ...], now: float, ended: Collection[str] = (),
                     read: ProgressReader = progress_file) -> tuple[dict[str, float], dict[str, str]]:
    """Iterations done per job and where the number came from ("file" or
    "estimate"): what `read` reports (the job's progress file), else
    (running) an estimate from its run time. Jobs that just ended are read
    once more; `ended` were read before."""
    done: dict[str, float] = {}
    src: dict[str, str] = {}
    for m in jobs:
        if m.spec is None or not (m.phase in inp.SCHEDULED or (m.phase == inp.FINISHED and m.job_id not in ended)):
            continue
        value = read(m)
        if value is not None:
            done[m.job_id], src[m.job_id] = value, "file"
        elif m.phase == inp.RUNNING and m.current is not None:
            done[m.job_id] = estimate_done(m.job.start_time, now, m.current.iter_time_s, m.spec.iterations)
            src[m.job_id] = "estimate"
    return done, src
