"""The progress channel to the controller: ``<checkpoint_dir>/progress.json``.

Rank 0 rewrites it atomically as training goes; the controller reads
``iterations_done`` (falling back to ``step``) to know how much work is left
(and estimates from the run time when the file is missing), and
``first_step_at`` (when this process first reported a step: the end of a
restart) to measure what a move cost the job, and ``iter_time_s`` (the
seconds per iteration over this process's last `WINDOW` reports, start-up
left out, or the framework's own figure where it prints one) to correct its
estimates. Written by the trainer and the hook (`write_progress`) and, for a
framework that prints its steps, by the launcher (``launch.relay``). Stdlib only.
"""

from __future__ import annotations

import collections
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

from solver.contract import PROGRESS_FILE

#: reports the iteration time is taken over
WINDOW = 20


def iter_time(recent: collections.deque[tuple[float, float]] | list[tuple[float, float]]) -> float | None:
    """Seconds per iteration between the first and last of `recent` reports."""
    if len(recent) < 2:
        return None
    (d0, t0), (d1, t1) = recent[0], recent[-1]
    return (t1 - t0) / (d1 - d0) if d1 > d0 and t1 > t0 else None


class ProgressWriter:
    """One process's reports: when it first reported a step, and its last
    `WINDOW` + 1 counts with their times (the iteration time)."""

    def __init__(self) -> None:
        self.first_step_at: float | None = None
        self.recent: collections.deque[tuple[float, float]] = collections.deque(maxlen=WINDOW + 1)

    def write(
        self,
        checkpoint_dir: str | os.PathLike[str],
        step: int,
        iterations_done: float | None = None,
        *,
        now: float | None = None,
        iter_time_s: float | None = None,
        extra: Mapping[str, object] | None = None,
    ) -> Path:
        """Record that `step` iterations are done (atomically: temp file +
        rename), as of `now` (default: the clock). `iter_time_s`: the
        framework's own seconds per iteration, reported instead of the
        window's. The same count again (Lightning reports every batch of a
        gradient accumulation) leaves the window as it is; a lower one is a
        new count (a restart from a checkpoint): speed is measured afresh.
        `extra`: more fields of the record (the trainer's loss)."""
        now = time.time() if now is None else now
        if self.first_step_at is None:
            self.first_step_at = now
        done = step if iterations_done is None else iterations_done
        if self.recent and done < self.recent[-1][0]:
            self.recent.clear()
        if not self.recent or done > self.recent[-1][0]:
            self.recent.append((float(done), now))
        speed = iter_time(self.recent) if iter_time_s is None else iter_time_s
        d = Path(checkpoint_dir)
        d.mkdir(parents=True, exist_ok=True)
        path = d / PROGRESS_FILE
        record = {
            "step": step,
            "iterations_done": done,
            "time": now,
            "first_step_at": self.first_step_at,
            **({"iter_time_s": round(speed, 6)} if speed else {}),
            **(extra or {}),
        }
        tmp = path.with_name(f".{PROGRESS_FILE}.tmp.{os.getpid()}")
        tmp.write_text(json.dumps(record, separators=(",", ":")))
        os.replace(tmp, path)
        return path


_process = ProgressWriter()


def write_progress(
    checkpoint_dir: str | os.PathLike[str], step: int, iterations_done: float | None = None, **extra: object
) -> Path:
    """`ProgressWriter.write` of this process's reports (the trainer's and the hook's)."""
    return _process.write(checkpoint_dir, step, iterations_done, extra=extra)
