"""One fail-safe check against Slurm and the state DB, and the loop around it.

The state DB is only read (StateStore readonly): when a round last completed,
the specs the controller accepted, the jobs it released or parked. The
check decides (`decision.verdict`) before it looks at Slurm, and once more
right before it changes anything, so it stands down as soon as a controller
completes a round. Each job is updated to its static cell
(`hint.release_update`) and released; a job whose update did not stick is
left held.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slurm_ext.backends import Backend, UpdateNotApplied
from slurm_ext.controller import inputs
from slurm_ext.controller.lease import read_record
from slurm_ext.failsafe.decision import Verdict, select, verdict
from slurm_ext.failsafe.hint import HintError, StaticCell, release_update, static_cell
from slurm_ext.records import SlurmJob
from slurm_ext.state import StateStore

log = logging.getLogger("cellsched.failsafe")


@dataclass(frozen=True)
class Released:
    """A job the fail-safe released, and where."""

    job_id: str
    cell: str
    partition: str

    def to_dict(self) -> dict[str, str]:
        return {"job": self.job_id, "cell": self.cell, "partition": self.partition}


@dataclass(frozen=True)
class CheckReport:
    """What one check decided and did."""

    acted: bool
    why: str
    last_round_at: float | None
    released: tuple[Released, ...] = ()
    skipped: Mapping[str, str] = field(default_factory=dict)
    failed: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "acted": self.acted,
            "why": self.why,
            "last_round_at": self.last_round_at,
            "released": [r.to_dict() for r in self.released],
            "skipped": dict(self.skipped),
            "failed": dict(self.failed),
        }


def last_completed(state_path: str, lease_path: str = "") -> float | None:
    """When a controller round last completed ``ok``, read-only (StateError
    when the file is missing or not a state file). With a lease (two
    controllers, slurm_ext.controller.lease), the lease's holder's last round
    counts too: the other host's state DB is not this one."""
    with StateStore(state_path, readonly=True) as state:
        last = state.last_completed_round()
    try:
        rec = read_record(lease_path) if lease_path else None
    except OSError as exc:
        log.warning("lease file unreadable", extra={"fields": {"path": lease_path, "error": str(exc)}})
        rec = None
    times = [t for t in (last, rec.last_round_at if rec else None) if t is not None]
    return max(times) if times else None


def tolerated(exc: Exception, m: inputs.ManagedJob) -> bool:
    """A requeued job shows its old node count until it starts (see
    backends.update_mismatches): an update it only disagrees in that took."""
    return isinstance(exc, UpdateNotApplied) and m.plan is not None and set(exc.mismatches) == {"num_nodes"}


def check(
    state_path: str,
    backend: Backend,
    after_s: float,
    checkpoint_root: str,
    clock: Callable[[], float] = time.time,
    lease_path: str = "",
) -> CheckReport:
    """One check: stand down, or release the qualifying held jobs."""
    last = last_completed(state_path, lease_path)
    first = verdict(last, clock(), after_s)
    if not first.act:
        return CheckReport(False, first.why, last)
    snap = backend.observe()
    listed = [j.job_id for j in snap.jobs]
    with StateStore(state_path, readonly=True) as state:
        known = state.jobs(job_ids=listed)
        released, parked, opens = state.released(listed), state.parked(listed), state.open_plans()
    jobs = inputs.classify(snap, known, opens, released, parked)
    chosen = select(jobs, snap.taken_at, after_s)
    skipped = dict(chosen.skipped)
    cells: dict[str, StaticCell] = {}
    for m in chosen.release:
        try:
            cells[m.job_id] = static_cell(m, snap)
        except HintError as exc:
            skipped[m.job_id] = f"no static cell: {exc}"
    for job_id, why in skipped.items():
        log.info("left held", extra={"fields": {"job": job_id, "why": why}})
    by_id = {m.job_id: m for m in chosen.release if m.job_id in cells}
    if not by_id:
        return CheckReport(True, first.why, last, skipped=skipped)
    again = verdict(last_completed(state_path, lease_path), clock(), after_s)  # a controller may be back meanwhile
    if not again.act:
        return CheckReport(False, again.why, last, skipped=skipped)
    changes = {j: release_update(m, cells[j], checkpoint_root) for j, m in by_id.items()}
    failed: dict[str, str] = {}
    updated: list[str] = []
    for job_id, result in backend.update_many(changes).items():
        if isinstance(result, SlurmJob) or tolerated(result, by_id[job_id]):
            updated.append(job_id)
        else:
            failed[job_id] = f"update failed: {result}"
    not_released = backend.release_many(updated) if updated else {}
    failed.update({j: f"release failed: {exc}" for j, exc in not_released.items()})
    done = tuple(Released(j, cells[j].key(), cells[j].partition) for j in updated if j not in not_released)
    for r in done:
        m = by_id[r.job_id]
        log.warning(
            "released on its static request", extra={"fields": {**r.to_dict(), "user": m.job.user, "why": first.why}}
        )
    for job_id, why in failed.items():
        log.error("not released", extra={"fields": {"job": job_id, "error": why}})
    return CheckReport(True, first.why, last, done, skipped, failed)


def run(
    check_once: Callable[[], CheckReport],
    interval_s: float,
    stop: threading.Event,
    on_report: Callable[[CheckReport], None] | None = None,
) -> None:
    """Check every `interval_s` until `stop` is set; a verdict that changes
    is logged at info (every check's at debug), a failed check as an error."""
    previous: Verdict | None = None
    while not stop.is_set():
        try:
            report = check_once()
        except Exception as exc:  # Slurm away, the state file unreadable: try again next time
            log.error("check failed", extra={"fields": {"error": f"{type(exc).__name__}: {exc}"}})
        else:
            now = Verdict(report.acted, report.why)
            level = logging.INFO if previous is None or previous.act != now.act else logging.DEBUG
            log.log(level, "acting" if now.act else "standing down", extra={"fields": {"why": now.why}})
            previous = now
            if on_report is not None:
                on_report(report)
        stop.wait(interval_s)
