"""Whether the fail-safe acts, and on which jobs (pure functions).

It acts when no controller round has completed ``ok`` within `after_s`
(or none ever has). It then releases only held jobs that the controller
would place itself: managed, with a spec that parses, held waiting for their
first placement or a new one (inputs.Phase.HELD). Never a job the controller
parked (its runs kept failing: held until its user releases it), nor one held
again after the controller released it (its user's or an operator's hold),
nor one whose spec cannot be parsed. A job qualifies once it has waited
`after_s` since its submission (or requeue), so that a controller gets that
long to place each job, also when none has ever completed a round.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from slurm_ext.controller.inputs import ManagedJob, Phase

#: why a held managed job in another phase is left alone
LEFT_HELD: dict[Phase, str] = {
    Phase.PARKED: "parked by the controller (its runs kept failing): held until its user releases it",
    Phase.OPERATOR_HOLD: "held again after cellsched released it: its user's or an operator's hold",
    Phase.BAD: "its spec cannot be used",
}


@dataclass(frozen=True)
class Verdict:
    """Act or stand down, and why (one line for the log)."""

    act: bool
    why: str


def verdict(last_completed: float | None, now: float, after_s: float) -> Verdict:
    """Act when no round completed within `after_s` of `now`."""
    if last_completed is None:
        return Verdict(True, "no controller round has ever completed")
    age = now - last_completed
    if age < after_s:
        return Verdict(False, f"a controller round completed {age:.1f} s ago (within {after_s:g} s): standing down")
    return Verdict(True, f"no controller round has completed for {age:.1f} s (>= {after_s:g} s)")


@dataclass(frozen=True)
class Selection:
    """The jobs to release, and the held managed jobs left alone with why."""

    release: tuple[ManagedJob, ...]
    skipped: dict[str, str]


def select(jobs: Iterable[ManagedJob], now: float, after_s: float) -> Selection:
    """The held jobs the fail-safe releases (see the module's docstring)."""
    release: list[ManagedJob] = []
    skipped: dict[str, str] = {}
    for m in jobs:
        if not m.job.held or m.job.finished:
            continue
        if m.phase != Phase.HELD or m.spec is None or m.spec_json is None:
            why = LEFT_HELD.get(m.phase, f"{m.phase}: not waiting for a placement")
            skipped[m.job_id] = f"{why} ({m.reason})" if m.reason else why
            continue
        waited = None if m.job.submit_time is None else now - m.job.submit_time
        if waited is not None and waited < after_s:
            skipped[m.job_id] = f"submitted {waited:.1f} s ago: a controller has {after_s:g} s to place it"
            continue
        release.append(m)
    return Selection(tuple(release), skipped)
