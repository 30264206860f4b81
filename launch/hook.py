"""``launch.on_checkpoint(save_fn)``: one call that makes any script movable.

The controller moves or resizes a running job by sending it SIGUSR1 (see
``solver.contract``): every task must save and exit ``EXIT_CHECKPOINTED``
(75). ``cellsched-launch`` keeps SIGUSR1, and SIGTERM (Slurm's, when it
preempts the job: docs/preemption.md), blocked until a script says it can do
that; a job whose runtime checkpoints only through this hook (``ddp``) is
never signalled until then (it stays static, not killed).

``hook = launch.on_checkpoint(save_fn)``:

1. installs handlers for SIGUSR1 and SIGTERM and unblocks them;
2. on rank 0 writes ``<checkpoint_dir>/HOOK_FILE`` (JSON ``{"job_id", "time"}``,
   atomically), which tells the controller that this job can be moved;
3. when a signal comes, ``save_fn()`` runs on every rank and the rank exits 75.

When ``save_fn`` runs depends on how the script uses the hook:

- **At a step boundary (safe; recommended).** A script that calls
  ``hook.step()`` after each optimizer step (or ``hook.should_stop()``), or
  gives Lightning ``hook.lightning_callback()``, runs ``save_fn`` there
  (``poll=True`` says so at registration, so that a signal that comes before
  the first poll waits for it too): the
  ranks agree on the signal with one all-reduce of a flag (when
  torch.distributed is initialized), so every rank saves the same step, then
  exits 75. ``save_fn`` may therefore be collective (Lightning's
  ``trainer.save_checkpoint``, DCP); it must have finished writing when it
  returns.
- **From the signal handler (one call, nothing else changed).** Until the
  script first polls, the handler itself runs ``save_fn`` in the main thread,
  wherever the script was, then exits 75 at once (``os._exit``). The state may
  then be mid-step, and ranks are not in step with each other: ``save_fn``
  should write what it keeps consistent itself (e.g. the last state it
  copied) from one rank, and must not be a collective.

Stdlib only at import (``import launch`` stays light); torch and lightning
are imported when used.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from solver import contract

SIGNALS = tuple(signal.Signals[f"SIG{name}"] for name in contract.CHECKPOINT_SIGNALS)


def checkpoint_dir_from_env(env: Mapping[str, str]) -> str | None:
    """The job's checkpoint folder: CELLSCHED_CHECKPOINT_DIR, else the plan's."""
    d = env.get(contract.ENV_CHECKPOINT_DIR, "").strip()
    if d:
        return d
    try:
        plan = contract.plan_from_env(env)
    except ValueError:
        return None
    return plan.checkpoint_dir if plan is not None else None


def write_hook_file(directory: str | os.PathLike[str], job_id: str, now: float | None = None) -> Path:
    """``<directory>/HOOK_FILE`` naming JOB_ID, written to a temporary name and renamed into place."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / contract.HOOK_FILE
    tmp = d / f".{contract.HOOK_FILE}.tmp.{os.getpid()}"
    tmp.write_text(json.dumps({"job_id": job_id, "time": time.time() if now is None else now}) + "\n")
    os.replace(tmp, path)
    return path


class CheckpointHook:
    """The script's answer to the checkpoint signal (see the module doc)."""

    def __init__(self, save_fn: Callable[[], object], checkpoint_dir: str | None = None, poll: bool = False) -> None:
        self.save_fn = save_fn
        self.checkpoint_dir = checkpoint_dir
        self.signalled = False
        self.polled = poll  #: the script polls: save at its step boundary, never in the handler

    def install(self, env: Mapping[str, str]) -> CheckpointHook:
        for s in SIGNALS:
            signal.signal(s, self._on_signal)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(SIGNALS))
        job_id = env.get("SLURM_JOB_ID", "").strip()
        if self.checkpoint_dir and job_id and env.get("RANK", "0").strip() in ("", "0"):
            write_hook_file(self.checkpoint_dir, job_id)
        elif not self.checkpoint_dir:
            print(
                "cellsched: on_checkpoint: the job has no checkpoint_dir, so the controller cannot learn that it "
                "is movable (it stays where it is)",
                file=sys.stderr,
            )
        return self

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signalled = True
        if not self.polled:
            self.save_fn()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(contract.EXIT_CHECKPOINTED)

    def should_stop(self) -> bool:
        """True on every rank when any rank has seen the signal: a collective
        (all-reduce of a flag) when torch.distributed is initialized, so call
        it on every rank at the same point, e.g. after each step."""
        self.polled = True
        if "torch" not in sys.modules:
            return self.signalled
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self.signalled
        flag = torch.tensor([1 if self.signalled else 0], dtype=torch.int32)
        if "nccl" in str(dist.get_backend()):
            flag = flag.cuda()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def save_and_exit(self) -> NoReturn:
        """Run save_fn, then end the process with EXIT_CHECKPOINTED at once
        (``os._exit``: an interpreter shutdown with a live process group can
        abort in its C++ destructors, which would turn 75 into a crash).
        save_fn must have finished writing when it returns."""
        self.save_fn()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(contract.EXIT_CHECKPOINTED)

    def step(self, done: int | None = None) -> None:
        """At a step boundary, on every rank: save and exit 75 when a signal
        came. DONE (iterations done so far): rank 0 also reports it in
        ``<checkpoint_dir>/progress.json`` (``launch.progress``), how the
        controller follows the job."""
        if done is not None and self.checkpoint_dir and os.environ.get("RANK", "0").strip() in ("", "0"):
            from launch.progress import write_progress

            write_progress(self.checkpoint_dir, done)
        if self.should_stop():
            self.save_and_exit()

    def lightning_callback(self) -> Any:
        """A Lightning callback that calls ``step()`` after every training batch."""
        self.polled = True
        from launch._lightning import hook_callback

        return hook_callback(self)


def on_checkpoint(
    save_fn: Callable[[], object], *, checkpoint_dir: str | None = None, poll: bool = False
) -> CheckpointHook:
    """Make this script movable: see the module doc. CHECKPOINT_DIR defaults
    to the job's (CELLSCHED_CHECKPOINT_DIR, set by cellsched-launch). POLL:
    the script will poll (``step``, ``should_stop``, the Lightning callback),
    so a signal that comes before its first poll waits for it instead of
    running save_fn from the handler."""
    if not callable(save_fn):
        raise TypeError(f"on_checkpoint needs a function to call, got {type(save_fn).__name__}")
    env = os.environ
    return CheckpointHook(save_fn, checkpoint_dir or checkpoint_dir_from_env(env), poll).install(env)
