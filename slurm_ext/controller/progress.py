"""How far a running job is: its own progress file, else an estimate.

The file is the job's own word, so it is checked (`doubt`): progress
never goes back and never passes the job's iterations, it may not run
faster than `rate_factor` times its cell's estimate, and its first step
must lie within its run. A report that fails is not used: the job is
scheduled on the estimate, and its status says why.
"""

from __future__ import annotations

import json
import math
import os
import pwd
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeGuard, TypeVar

from slurm_ext.controller import inputs as inp
from slurm_ext.controller.userfiles import BoundedReader, Refused, read_owned_file
from slurm_ext.errors import CellschedError
from solver.contract import PROGRESS_FILE
from solver.contract.models import ModelShape, ModelSpecError


@dataclass(frozen=True)
class JobProgress:
    """How far a job is: iterations done and, when known, when the first
    step of its current run ended (the end of a restart), the seconds per
    iteration it reaches now and the shape of the model it trains (`model`;
    `model_note`: why a shape it gave is not used)."""

    iterations_done: float
    first_step_at: float | None = None
    iter_time_s: float | None = None
    model: ModelShape | None = None
    model_note: str = ""


T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class RoundReader(Protocol[T_co]):
    """What the controller reads of each job, round after round: a job's
    record (None: there is none yet); `start_round` when a round begins (a
    real cluster's files get their time budget again)."""

    def __call__(self, m: inp.ManagedJob) -> T_co | None: ...

    def start_round(self) -> None: ...


class EachCall(Generic[T]):
    """A RoundReader of a plain function (the simulator's own counters, a
    test's answers): nothing to start per round."""

    def __init__(self, read: Callable[[inp.ManagedJob], T | None]) -> None:
        self.read = read

    def __call__(self, m: inp.ManagedJob) -> T | None:
        return self.read(m)

    def start_round(self) -> None:
        pass


#: how the controller learns a job's progress: the job's progress file on a
#: real cluster (ProgressFiles); the simulated backend's own counter in the simulator
ProgressReader = RoundReader["JobProgress"]

#: where a job's count of iterations done came from: its own progress report,
#: or the controller's estimate from its run time
FROM_FILE, FROM_ESTIMATE = "file", "estimate"

#: a progress file is small; anything larger is ignored
MAX_BYTES = 65536
#: a reported iteration time above this (s) is not one
MAX_ITER_TIME_S = 86400.0


def default_checkpoint_dir(job_id: str, user: str, work_dir: str | None, root: str) -> str:
    """``<work dir>/.cellsched/<job id>``; ``<root>/<user>/<job id>`` when the
    working directory is unknown."""
    if work_dir:
        return os.path.join(work_dir, ".cellsched", job_id)
    return os.path.join(root, user or "unknown", job_id)


def read_progress(checkpoint_dir: str | None) -> float | None:
    """Iterations done from ``<checkpoint_dir>/progress.json``
    ({"step", "iterations_done", "time", "first_step_at", "iter_time_s"}); None when absent
    or unreadable."""
    p = read_progress_file(checkpoint_dir)
    return None if p is None else p.iterations_done


def read_progress_file(checkpoint_dir: str | None) -> JobProgress | None:
    """The whole progress record of ``<checkpoint_dir>/progress.json`` (a
    regular file, not a link, of at most MAX_BYTES; None otherwise)."""
    if not checkpoint_dir:
        return None
    try:
        raw = read_owned_file(os.path.join(checkpoint_dir, PROGRESS_FILE), None, MAX_BYTES)
        return None if raw is None else parse_progress(raw)
    except (Refused, Unreadable):
        return None


class Unreadable(CellschedError):
    """A job's progress record exists but cannot be used (the message says why)."""


def parse_progress(raw: bytes) -> JobProgress:
    """A progress record from the file's bytes; Unreadable when it is not
    one (a model shape that is not one is left out, `model_note` says why)."""
    try:
        data = json.loads(raw)
    except ValueError:
        raise Unreadable("not JSON") from None
    value = data.get("iterations_done", data.get("step")) if isinstance(data, dict) else None
    if not _number(value):
        raise Unreadable("no iterations_done (a number >= 0)")
    first = data.get("first_step_at")
    speed = data.get("iter_time_s")
    model, note = None, ""
    if "model" in data:
        try:
            model = ModelShape.from_dict(data["model"])
        except ModelSpecError as exc:
            note = f"its model shape is not used: {exc}"
    return JobProgress(
        float(value),
        float(first) if _number(first) else None,
        float(speed) if _number(speed) and 0 < speed <= MAX_ITER_TIME_S else None,
        model,
        note,
    )


class JobFiles(Generic[T]):
    """A file `name` of each job's checkpoint directory on a real cluster,
    read as slurm_ext.controller.userfiles says (a regular file of the job's
    user, at most `max_bytes`, never followed or waited for), each read
    within `timeout_s` and all of a round's (from `start_round`) within
    `budget_s`, and parsed by `parse`. Raises Unreadable for a file it will
    not use; None for a job without a checkpoint directory or file."""

    def __init__(
        self, name: str, parse: Callable[[bytes], T], max_bytes: int, timeout_s: float = 0.5, budget_s: float = 5.0
    ) -> None:
        self.name, self.parse = name, parse
        self.reader = BoundedReader(timeout_s, budget_s, max_bytes)

    def start_round(self) -> None:
        self.reader.reset()

    def __call__(self, m: inp.ManagedJob) -> T | None:
        if m.plan is None or not m.plan.checkpoint_dir:
            return None
        uid = m.job.uid if m.job.uid is not None else _uid_of(m.job.user)
        if uid is None:
            raise Unreadable(f"the uid of user {m.job.user!r} is unknown")
        got = self.reader.read(os.path.join(m.plan.checkpoint_dir, self.name), uid)
        if got.error:
            raise Unreadable(got.error)
        return None if got.data is None else self.parse(got.data)


class ProgressFiles(JobFiles[JobProgress]):
    """The ProgressReader of a real cluster: ``<checkpoint_dir>/progress.json`` (JobFiles)."""

    def __init__(self, timeout_s: float = 0.5, budget_s: float = 5.0) -> None:
        super().__init__(PROGRESS_FILE, parse_progress, MAX_BYTES, timeout_s, budget_s)


def _uid_of(user: str) -> int | None:
    try:
        return pwd.getpwnam(user).pw_uid if user else None
    except KeyError:
        return None


def _number(value: object) -> TypeGuard[float]:
    """A finite number >= 0 (an int or a float, not a bool)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


def estimate_done(start_time: float | None, now: float, iter_time_s: float | None, iterations: int) -> float:
    """Iterations a job has probably done from its run time; 0 when unknown."""
    if start_time is None or not iter_time_s or iter_time_s <= 0 or not math.isfinite(iter_time_s):
        return 0.0
    return min(float(iterations), max(0.0, (now - start_time) / iter_time_s))


#: how far (s) a reported first step may lie outside the job's run (clocks differ)
CLOCK_SLACK_S = 60.0


@dataclass(frozen=True)
class Progress:
    """One round's progress of the managed jobs: iterations done, where the
    number came from ("file" or "estimate"), first-step times, the seconds
    per iteration jobs report (`iter_time`), the model shapes they report
    (`models`), and why a job's own report was not used (`notes`)."""

    done: dict[str, float]
    source: dict[str, str]
    first_step_at: dict[str, float]
    notes: dict[str, str]
    iter_time: dict[str, float] = field(default_factory=dict)
    #: the shape of the model each job says it trains (JobProgress.model)
    models: dict[str, ModelShape] = field(default_factory=dict)


def doubt(
    p: JobProgress,
    m: inp.ManagedJob,
    prev: tuple[float, float] | None,
    now: float,
    rate_factor: float,
    iter_s: float | None = None,
) -> str:
    """Why job `m`'s report `p` is not believed ("" when it is). `prev`:
    the iterations the controller last took as done and when; `iter_s`: the
    fastest estimated iteration time of the cells it ran in since (default:
    its current cell's)."""
    total = m.spec.iterations if m.spec is not None else math.inf
    if p.iterations_done > total:
        return f"reports {p.iterations_done:g} iterations, beyond the job's {total}"
    if iter_s is None:
        iter_s = m.current.iter_time_s if m.current is not None else None
    base, since = prev if prev is not None else (0.0, m.job.start_time)
    if since is None and p.iterations_done > 0:
        return f"reports {p.iterations_done:g} iterations before it ever ran"
    if iter_s and iter_s > 0 and since is not None:
        allowed = base + rate_factor * max(0.0, now - since) / iter_s + 1
        if p.iterations_done > allowed:
            return (
                f"reports {p.iterations_done:g} iterations, more than {rate_factor:g} times "
                f"its cell's estimate allows ({allowed:.0f})"
            )
    first = p.first_step_at
    start = m.job.start_time if m.job.start_time is not None else -math.inf
    if first is not None and not start - CLOCK_SLACK_S <= first <= now + CLOCK_SLACK_S:
        return f"its first step ({first:.0f}) lies outside its run"
    return ""


def _estimate(m: inp.ManagedJob, prev: tuple[float, float] | None, now: float) -> float | None:
    """The controller's own count: the last one plus the estimated iterations
    since (while running), or, never counted, the estimate of this run."""
    assert m.spec is not None
    running = m.current if m.phase == inp.Phase.RUNNING else None
    if prev is not None:
        gain = estimate_done(prev[1], now, running.iter_time_s, m.spec.iterations) if running is not None else 0.0
        return min(float(m.spec.iterations), prev[0] + gain)
    if running is not None:
        return estimate_done(m.job.start_time, now, running.iter_time_s, m.spec.iterations)
    return None


def collect_progress(
    jobs: tuple[inp.ManagedJob, ...],
    now: float,
    ended: Collection[str],
    read: ProgressReader,
    *,
    previous: Mapping[str, tuple[float, float]] | None = None,
    rate_factor: float = 10.0,
    iter_times: Mapping[str, float] | None = None,
) -> Progress:
    """Iterations done per job: what `read` reports (the job's progress
    file) when it is believed (`doubt`; never less than `previous`, the
    last count and its time; `iter_times`: the fastest estimated iteration
    time of each job's cells since then), else the estimate. An infinite
    `rate_factor` trusts the reports as they are (the simulator's own
    counts). Jobs that just ended are read once more; `ended` were read before."""
    previous, iter_times = previous or {}, iter_times or {}
    done: dict[str, float] = {}
    src: dict[str, str] = {}
    first: dict[str, float] = {}
    notes: dict[str, str] = {}
    speed: dict[str, float] = {}
    models: dict[str, ModelShape] = {}
    for m in jobs:
        if m.spec is None or not (
            m.phase in inp.SCHEDULED or (m.phase == inp.Phase.FINISHED and m.job_id not in ended)
        ):
            continue
        prev = previous.get(m.job_id)
        try:
            p = read(m)
        except Unreadable as exc:
            p, notes[m.job_id] = None, f"progress file not read: {exc}"
        if p is not None and math.isfinite(rate_factor):
            why = doubt(p, m, prev, now, rate_factor, iter_times.get(m.job_id))
            if why:
                p, notes[m.job_id] = None, f"progress file ignored: {why}"
        if p is not None:
            floor = prev[0] if prev and math.isfinite(rate_factor) else 0.0
            done[m.job_id], src[m.job_id] = max(p.iterations_done, floor), FROM_FILE
            if p.first_step_at is not None:
                first[m.job_id] = p.first_step_at
            if p.iter_time_s is not None:
                speed[m.job_id] = p.iter_time_s
            if p.model is not None:
                models[m.job_id] = p.model
            if p.model_note:
                notes[m.job_id] = p.model_note
            continue
        estimate = _estimate(m, prev, now)
        if estimate is not None:
            done[m.job_id], src[m.job_id] = estimate, FROM_ESTIMATE
    return Progress(done, src, first, notes, speed, models)
