"""The progress channel to the controller: ``<checkpoint_dir>/progress.json``.

Rank 0 rewrites it atomically as training goes; the controller reads
``iterations_done`` (falling back to ``step``) to know how much work is left
(and estimates from the run time when the file is missing), and
``first_step_at`` (when this process first reported a step: the end of a
restart) to measure what a move cost the job. Stdlib only.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from solver.contract import PROGRESS_FILE

_first_step_at: float | None = None


def write_progress(
    checkpoint_dir: str | os.PathLike, step: int, iterations_done: float | None = None, **extra: object
) -> Path:
    """Record that `step` iterations are done (atomically: temp file + rename)."""
    global _first_step_at
    if _first_step_at is None:
        _first_step_at = time.time()
    d = Path(checkpoint_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / PROGRESS_FILE
    record = {
        "step": step,
        "iterations_done": step if iterations_done is None else iterations_done,
        "time": time.time(),
        "first_step_at": _first_step_at,
        **extra,
    }
    tmp = path.with_name(f".{PROGRESS_FILE}.tmp.{os.getpid()}")
    tmp.write_text(json.dumps(record, separators=(",", ":")))
    os.replace(tmp, path)
    return path
