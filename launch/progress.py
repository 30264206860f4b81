"""The progress channel to the controller: ``<checkpoint_dir>/progress.json``.

Rank 0 rewrites it atomically as training goes; the controller reads
``iterations_done`` (falling back to ``step``) to know how much work is left
(and estimates from the run time when the file is missing), and
``first_step_at`` (when this process first reported a step: the end of a
restart) to measure what a move cost the job, and ``iter_time_s`` (the
seconds per iteration over this process's last `WINDOW` reports, start-up
left out) to correct its estimates. Stdlib only.
"""

from __future__ import annotations

import collections
import json
import os
import time
from pathlib import Path

from solver.contract import PROGRESS_FILE

_first_step_at: float | None = None
#: reports the iteration time is taken over
WINDOW = 20
_recent: collections.deque[tuple[float, float]] = collections.deque(maxlen=WINDOW + 1)  # (iterations done, time)


def iter_time(recent: collections.deque[tuple[float, float]] | list[tuple[float, float]]) -> float | None:
    """Seconds per iteration between the first and last of `recent` reports."""
    if len(recent) < 2:
        return None
    (d0, t0), (d1, t1) = recent[0], recent[-1]
    return (t1 - t0) / (d1 - d0) if d1 > d0 and t1 > t0 else None


def write_progress(
    checkpoint_dir: str | os.PathLike[str], step: int, iterations_done: float | None = None, **extra: object
) -> Path:
    """Record that `step` iterations are done (atomically: temp file + rename)."""
    global _first_step_at
    now = time.time()
    if _first_step_at is None:
        _first_step_at = now
    done = step if iterations_done is None else iterations_done
    if _recent and done <= _recent[-1][0]:
        _recent.clear()  # a new count (a restart from a checkpoint): speed is measured afresh
    _recent.append((float(done), now))
    speed = iter_time(_recent)
    d = Path(checkpoint_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / PROGRESS_FILE
    record = {
        "step": step,
        "iterations_done": done,
        "time": now,
        "first_step_at": _first_step_at,
        **({"iter_time_s": round(speed, 6)} if speed else {}),
        **extra,
    }
    tmp = path.with_name(f".{PROGRESS_FILE}.tmp.{os.getpid()}")
    tmp.write_text(json.dumps(record, separators=(",", ":")))
    os.replace(tmp, path)
    return path
