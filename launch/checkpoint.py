"""Checkpoints the controller can trigger and wait for.

Contract with the controller (a resize is: signal, wait, requeue):

The constants are ``solver.contract``'s.

- Trigger: send SIGUSR1 (or SIGTERM) to the job's tasks, e.g.
  ``scancel --signal=USR1 --full JOBID``. Every rank sets a flag; at the next
  step boundary the ranks agree (one all-reduce) and save together, so
  ranks that saw the signal at different steps still save the same step.
- Layout: ``<checkpoint_dir>/step-<NNNNNNNN>.pt`` holds the whole training
  state in a layout-independent form (full tensors by parameter name), so a
  job may resume with other pp/dp/tp degrees. Each file is written to a
  temporary name and renamed into place.
- Marker: ``<checkpoint_dir>/LATEST`` holds the step number of the newest
  complete checkpoint, followed by a newline. It is replaced atomically after
  the checkpoint file is in place, so a controller may poll it and treat any
  step >= the one it is waiting for as done.
- Exit: after a signal-triggered checkpoint every rank exits with
  ``EXIT_CHECKPOINTED`` (75, EX_TEMPFAIL: "stopped on purpose, run me again").
- Resume: on start the trainer loads the step named by LATEST, if any.

Periodic checkpoints (``plan.checkpoint_every``) follow the same layout.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch
import torch.distributed as dist

from solver.contract import CHECKPOINT_SIGNALS

LATEST = "LATEST"
SIGNALS = tuple(signal.Signals[f"SIG{name}"] for name in CHECKPOINT_SIGNALS)


def checkpoint_path(directory: str | os.PathLike[str], step: int) -> Path:
    return Path(directory) / f"step-{step:08d}.pt"


def _replace_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(directory: str | os.PathLike[str], step: int, state: dict[str, Any]) -> Path:
    """Write STATE as checkpoint STEP, then point LATEST at it (call on one rank)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(d, step)
    _replace_atomically(path, lambda f: torch.save(state, f))
    mark_latest(d, step)
    return path


def mark_latest(directory: str | os.PathLike[str], step: int) -> None:
    """Point LATEST at checkpoint STEP (once it is complete), durably."""
    d = Path(directory)
    _replace_atomically(d / LATEST, lambda f: f.write(f"{step}\n".encode()))
    try:  # make the renames durable
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def latest_step(directory: str | os.PathLike[str]) -> int | None:
    """The step LATEST names, or None when there is no checkpoint yet."""
    try:
        text = (Path(directory) / LATEST).read_text().strip()
    except FileNotFoundError:
        return None
    if not text.isdigit():
        raise ValueError(f"{Path(directory) / LATEST} holds {text!r}, not a step number")
    return int(text)


def load_latest(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The newest complete checkpoint's state, or None."""
    step = latest_step(directory)
    if step is None:
        return None
    if not checkpoint_path(directory, step).is_file():
        raise ValueError(f"{directory}: step {step} is not a whole-state checkpoint (a sharded DCP one?)")
    state: dict[str, Any] = torch.load(checkpoint_path(directory, step), map_location="cpu", weights_only=True)
    return state


class StopRequest:
    """Remembers SIGUSR1/SIGTERM; ``agreed()`` tells all ranks at once.

    Create it first thing: it installs the handlers, then unblocks SIGUSR1 and
    SIGTERM (``cellsched-launch`` blocks them so that a request during start-up,
    the controller's or Slurm's preemption, waits instead of killing the
    process); a request that came before is seen now."""

    def __init__(self) -> None:
        self._seen = False
        for s in SIGNALS:
            signal.signal(s, self._on_signal)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(SIGNALS))

    def _on_signal(self, signum: int, frame: object) -> None:
        self._seen = True

    def agreed(self, group: dist.ProcessGroup | None = None, device: torch.device | str = "cpu") -> bool:
        """True on every rank when any rank has seen a signal (collective).

        DEVICE: where the backend communicates (a CUDA device for nccl).
        """
        flag = torch.tensor([1 if self._seen else 0], dtype=torch.int32, device=device)
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return bool(flag.item())
