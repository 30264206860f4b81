"""The safety net under every restart: a managed job whose run ended before
it trained is run again from its checkpoint.

A run can die before its first step for reasons that are not the job's:
slurmd refusing a revoked credential, a launch that failed on a node, a
restart whose start-up crashed. Such a run leaves no new step in the job's
progress record (its ``first_step_at`` is older than the run's start). The
controller then requeues the job held and places it again, like a
checkpointed one; the failure is recorded against the cell it ran in (a
"run-failed" event, which counts towards ``max_cell_failures``, so a cell
that keeps failing is avoided) and is shown by ``cellsched status
--history``. After ``max_relaunches`` such failures (`counted`: the first
failure in each size of cell is free) a job that never trained is left to
end FAILED, with a reason that says so. One that has trained is never
given up: its failures are mostly the cells' (which are excluded, but never
a cell it has trained in: round.excluded_cells), so it is relaunched until
its runs have failed more than ``max_relaunches`` times (`counted`) since it
last trained (its newest first step, `trained_at`) or was last parked; then
it is PARKED: requeued held (``scontrol requeuehold``: a user hold its owner
lifts with ``scontrol release``), never failed or cancelled, and left held,
with a reason in ``cellsched status`` and the log, until someone releases
it. Released, it is managed again and its count starts over. A run that
trained and then failed is the program's own failure and is left alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from slurm_ext.controller import inputs as inp
from slurm_ext.controller.progress import FROM_FILE, ProgressReader, Unreadable
from slurm_ext.state import JobStatus
from solver.types import size_key_of

#: Slurm end states of a run that may have died before training
FAILED_STATES = ("FAILED", "BOOT_FAIL", "OUT_OF_MEMORY")


@dataclass(frozen=True)
class RunFailure:
    """A run of a managed job that ended before its first step."""

    job_id: str
    cell: str
    end_time: float
    new: bool  #: not recorded before this round
    relaunch: bool  #: requeue and place again (else: given up, or parked)
    reason: str
    park: bool = False  #: requeue held and leave it held until someone releases it


def trained(job_start: float | None, first_step_at: float | None) -> bool:
    """Did the run that started at `job_start` report a step (its first at `first_step_at`)?"""
    if first_step_at is None:
        return False
    return job_start is None or first_step_at >= job_start


def trained_jobs(statuses: Mapping[str, JobStatus]) -> set[str]:
    """The jobs whose own progress reports (not the controller's estimate
    from run time: a broken job runs too) counted iterations done."""
    return {j for j, s in statuses.items() if s.progress_source == FROM_FILE and (s.iterations_done or 0) > 0}


def counted(failures: Sequence[tuple[float, str]]) -> int:
    """The failures that count towards max_relaunches: all but the first in
    each size of cell (solver.types.size_key_of). A failure in a size the job
    had not failed in says something about that size (it does not fit), and
    the controller keeps the job out of it (round.excluded_cells); one that
    repeats says something about the job."""
    sizes = {size_key_of(cell) or cell for _, cell in failures}
    return len(failures) - max(0, len(sizes) - 1)


def review(
    jobs: Sequence[inp.ManagedJob],
    read: ProgressReader,
    recorded: Mapping[str, Sequence[tuple[float, str]]],
    max_relaunches: int,
    trained_before: Collection[str] = (),
    trained_at: Mapping[str, float] | None = None,
    parked: Collection[str] = (),
) -> dict[str, RunFailure]:
    """The managed jobs whose last run failed before training, by job id.

    `recorded`: the (end time, cell key) of each job's run failures recorded
    so far (a failure seen in an earlier round is not read again); `read`:
    the progress reader (only a new failure's progress record is read).
    `trained_before`: jobs that have trained (`trained_jobs`): their runs'
    failures say something about the cells they failed in, not about the
    job, so they are never given up (the failed cells and sizes are
    excluded, round.excluded_cells, except the cells the job has trained in:
    it always keeps somewhere to run); only the failures that ended after
    `trained_at` (when the controller last saw the job train, or parked or
    released it) and after the first step in its progress record count, and
    a new failure that makes them more than `max_relaunches` parks the job.
    `parked`: jobs parked before and not released since (their failure
    stays parked).
    """
    out: dict[str, RunFailure] = {}
    for m in jobs:
        job = m.job
        if m.phase != inp.Phase.FINISHED or m.spec is None or m.plan is None or job.state not in FAILED_STATES:
            continue
        if m.plan.job_id not in (None, m.job_id) or job.end_time is None:
            continue
        cell = m.plan.cell or ""
        past = list(recorded.get(m.job_id, ()))
        new = job.end_time not in [t for t, _ in past]
        since = (trained_at or {}).get(m.job_id, -math.inf)
        if new:
            try:
                report = read(m)
            except Unreadable:
                report = None  # no word of a step: relaunched, at most max_relaunches times
            first = report.first_step_at if report is not None else None
            if trained(job.start_time, first):
                continue
            since = max(since, first if first is not None else -math.inf)
            past.append((job.end_time, cell))
        exit_text = f"{job.state.lower()}, exit {job.exit_code}"
        if m.job_id in trained_before or m.job_id in parked:
            out[m.job_id] = _review_trained(m, past, since, new, m.job_id in parked, max_relaunches, exit_text)
            continue
        out[m.job_id] = _review_untrained(m, past, new, max_relaunches, exit_text)
    return out


def _review_untrained(
    m: inp.ManagedJob, past: Sequence[tuple[float, str]], new: bool, max_relaunches: int, exit_text: str
) -> RunFailure:
    """The verdict on a failed run of a job that has never trained:
    relaunched while its failures count at most `max_relaunches`, else
    given up."""
    assert m.plan is not None and m.job.end_time is not None
    cell = m.plan.cell or ""
    count = counted(past)
    if count > max_relaunches:
        reason = (
            f"its run failed before training {len(past)} times (last: {exit_text} in {cell}); "
            f"not requeued again (max_relaunches = {max_relaunches})"
        )
        return RunFailure(m.job_id, cell, m.job.end_time, new, False, reason)
    reason = (
        f"its run failed before training ({exit_text} in {cell}, failure {count} of "
        f"{max_relaunches} allowed); requeued from its checkpoint"
    )
    return RunFailure(m.job_id, cell, m.job.end_time, new, True, reason)


def _review_trained(
    m: inp.ManagedJob,
    past: Sequence[tuple[float, str]],
    since: float,
    new: bool,
    parked: bool,
    max_relaunches: int,
    exit_text: str,
) -> RunFailure:
    """The verdict on a failed run of a job that has trained: relaunched
    while its failures since `since` count at most `max_relaunches`, else
    parked. Only a new failure parks a job, and a parked one stays parked
    (its requeue failed: tried again), so a failure's verdict never changes."""
    assert m.plan is not None and m.job.end_time is not None
    cell = m.plan.cell or ""
    streak = [(t, c) for t, c in past if t > since]
    count = counted(streak)
    if (parked and not new) or (new and count > max_relaunches):
        reason = (
            f"parked: its run failed before training {len(streak)} times in a row since it last trained "
            f"(last: {exit_text} in {cell}; max_relaunches = {max_relaunches}); requeued held, not failed: "
            f"fix the cause and release it (scontrol release {m.job_id}) to continue from its checkpoint"
        )
        return RunFailure(m.job_id, cell, m.job.end_time, new, False, reason, park=True)
    reason = (
        f"its run failed before training ({exit_text} in {cell}, failure {count} of "
        f"{max_relaunches} allowed since it last trained); requeued from its checkpoint"
    )
    return RunFailure(m.job_id, cell, m.job.end_time, new, True, reason)


def apply_review(jobs: Sequence[inp.ManagedJob], failures: Mapping[str, RunFailure]) -> tuple[inp.ManagedJob, ...]:
    """The jobs with the verdicts in: relaunched ones CHECKPOINTED (requeued
    held and placed again), parked ones PARKED (requeued held, not placed),
    given-up ones FINISHED with the reason."""
    out = []
    for m in jobs:
        f = failures.get(m.job_id)
        if f is None:
            out.append(m)
        elif f.relaunch:
            out.append(dataclasses.replace(m, phase=inp.Phase.CHECKPOINTED, reason=f.reason))
        elif f.park:
            out.append(dataclasses.replace(m, phase=inp.Phase.PARKED, reason=f.reason))
        else:
            out.append(dataclasses.replace(m, reason=f.reason))
    return tuple(out)
