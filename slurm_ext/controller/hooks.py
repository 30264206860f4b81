"""May a running job be moved? Its checkpoint hook (solver.contract.HOOK_FILE).

A runtime that checkpoints only through a hook the script registers
(``solver.contract.runtimes.Checkpoint.HOOK``: ``ddp``) cannot answer the checkpoint
signal until the script has called ``launch.on_checkpoint(save_fn)``; the
launcher's rank 0 then writes ``<checkpoint_dir>/checkpoint-hook.json``,
``{"job_id": "...", "time": t}``. Such a job is *movable* (may be signalled,
resized or moved) only while that file names its job id and was written in
its current run (`time` no earlier than the run's start, less the clock
slack the progress file gets); until then it is *static*: the controller
never signals, requeues or moves it, so it never waits out
``checkpoint_timeout_s`` and never loses work. A runtime that answers the
signal itself (``Checkpoint.SIGNAL``) is never static for this reason.

The file is the job's own word and is read like its progress file
(slurm_ext.controller.userfiles: never followed, never waited for, a regular
file of the job's user, at most `MAX_BYTES`); a file that cannot be used
means "not movable", and its note is logged once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_ext.controller import inputs as inp
from slurm_ext.controller.progress import CLOCK_SLACK_S, JobFiles, RoundReader, Unreadable
from solver.contract import HOOK_FILE
from solver.contract.runtimes import RUNTIMES, Checkpoint

#: a hook record is tiny; anything larger is not one
MAX_BYTES = 4096
#: the status of a job that is static for want of its hook
STATIC_REASON = "static: its script has not registered launch.on_checkpoint yet (not moved until it does)"


@dataclass(frozen=True)
class Hook:
    """A parsed hook record: the job it names and when it was written."""

    job_id: str
    time: float


#: how the controller learns whether a job registered its hook: the job's
#: hook file on a real cluster (`HookFiles`); raises Unreadable for a file it
#: will not use, None when there is none
HookReader = RoundReader["Hook"]


def parse_hook(raw: bytes) -> Hook:
    """A hook record from the file's bytes; Unreadable when it is not one."""
    try:
        data = json.loads(raw)
    except ValueError:
        raise Unreadable("not JSON") from None
    if not isinstance(data, dict):
        raise Unreadable("not a JSON object")
    job_id, t = data.get("job_id"), data.get("time")
    if not isinstance(job_id, str) or not job_id or len(job_id) > 64:
        raise Unreadable("no job_id (a string)")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise Unreadable("no time (a number >= 0)")
    return Hook(job_id, float(t))


class HookFiles(JobFiles[Hook]):
    """The HookReader of a real cluster: ``<checkpoint_dir>/HOOK_FILE`` (progress.JobFiles)."""

    def __init__(self, timeout_s: float = 0.5, budget_s: float = 5.0) -> None:
        super().__init__(HOOK_FILE, parse_hook, MAX_BYTES, timeout_s, budget_s)


def needs_hook(m: inp.ManagedJob) -> bool:
    """Does the job's runtime checkpoint only through the script's hook?"""
    runtime = RUNTIMES.get(m.spec.runtime) if m.spec is not None else None
    return runtime is not None and runtime.checkpoint == Checkpoint.HOOK


def registered(m: inp.ManagedJob, hook: Hook | None) -> str:
    """Why `hook` does not make job `m` movable ("" when it does)."""
    if hook is None:
        return "no hook file"
    if hook.job_id != m.job_id:
        return f"the hook file names job {hook.job_id!r}"
    if m.job.start_time is not None and hook.time < m.job.start_time - CLOCK_SLACK_S:
        return "the hook file is from an earlier run"
    return ""


@dataclass(frozen=True)
class Movability:
    """One round's answer: `static`, the running jobs that may not be
    signalled, resized or moved; `notes`, why a hook file was not used."""

    static: frozenset[str]
    notes: Mapping[str, str]


def collect_movability(
    jobs: tuple[inp.ManagedJob, ...], read: HookReader, seen: Mapping[str, float | None] | None = None
) -> tuple[Movability, dict[str, float | None]]:
    """Which running jobs are static (`Movability`), and the jobs whose hook
    is registered in their current run by start time (pass it back as `seen`
    next round: a registered run is not read again)."""
    seen = seen or {}
    static: set[str] = set()
    notes: dict[str, str] = {}
    now_seen: dict[str, float | None] = {}
    for m in jobs:
        if m.phase != inp.Phase.RUNNING or not needs_hook(m):
            continue
        if m.job_id in seen and seen[m.job_id] == m.job.start_time:
            now_seen[m.job_id] = m.job.start_time
            continue
        try:
            why = registered(m, read(m))
        except Unreadable as exc:
            why = notes[m.job_id] = f"checkpoint hook file not read: {exc}"
        if why:
            static.add(m.job_id)
        else:
            now_seen[m.job_id] = m.job.start_time
    return Movability(frozenset(static), notes), now_seen
