"""How far a running job is: its own progress file, else an estimate."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection

from slurm_ext.controller import inputs as inp


@dataclass(frozen=True)
class JobProgress:
    """How far a job is: iterations done and, when known, when the first
    step of its current run ended (the end of a restart)."""

    iterations_done: float
    first_step_at: float | None = None


#: how the controller learns a job's progress: the job's progress file on a
#: real cluster; the simulated backend's own counter in the simulator
ProgressReader = Callable[["inp.ManagedJob"], "JobProgress | None"]

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
    ({"step", "iterations_done", "time", "first_step_at"}); None when absent
    or unreadable."""
    p = read_progress_file(checkpoint_dir)
    return None if p is None else p.iterations_done


def read_progress_file(checkpoint_dir: str | None) -> JobProgress | None:
    """The whole progress record of ``<checkpoint_dir>/progress.json``."""
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
    if not _number(value):
        return None
    first = data.get("first_step_at")
    return JobProgress(float(value), float(first) if _number(first) else None)


def _number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


def estimate_done(start_time: float | None, now: float, iter_time_s: float | None, iterations: int) -> float:
    """Iterations a job has probably done from its run time; 0 when unknown."""
    if start_time is None or not iter_time_s or iter_time_s <= 0 or not math.isfinite(iter_time_s):
        return 0.0
    return min(float(iterations), max(0.0, (now - start_time) / iter_time_s))


def progress_file(m: inp.ManagedJob) -> JobProgress | None:
    """The ProgressReader of a real cluster: ``<checkpoint_dir>/progress.json``."""
    return read_progress_file(m.plan.checkpoint_dir) if m.plan else None


@dataclass(frozen=True)
class Progress:
    """One round's progress of the managed jobs: iterations done, where the
    number came from ("file" or "estimate"), and first-step times."""

    done: dict[str, float]
    source: dict[str, str]
    first_step_at: dict[str, float]


def collect_progress(jobs: tuple[inp.ManagedJob, ...], now: float, ended: Collection[str] = (),
                     read: ProgressReader = progress_file) -> Progress:
    """Iterations done per job: what `read` reports (the job's progress
    file), else (running) an estimate from its run time. Jobs that just
    ended are read once more; `ended` were read before."""
    done: dict[str, float] = {}
    src: dict[str, str] = {}
    first: dict[str, float] = {}
    for m in jobs:
        if m.spec is None or not (m.phase in inp.SCHEDULED or (m.phase == inp.FINISHED and m.job_id not in ended)):
            continue
        p = read(m)
        if p is not None:
            done[m.job_id], src[m.job_id] = p.iterations_done, "file"
            if p.first_step_at is not None:
                first[m.job_id] = p.first_step_at
        elif m.phase == inp.RUNNING and m.current is not None:
            done[m.job_id] = estimate_done(m.job.start_time, now, m.current.iter_time_s, m.spec.iterations)
            src[m.job_id] = "estimate"
    return Progress(done, src, first)
