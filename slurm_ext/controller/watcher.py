"""When the daemon's next round starts: after the interval, or earlier
when a job was submitted, ended or stopped running (Slurm requeued it), or
the kick file was touched.

Changes count from what the last round saw: one that happened while the
round ran counts (a job that arrived or ended while it waited for a
checkpoint), one the round made itself does not (the jobs it moved or
requeued: what they are after the round is their starting point)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Collection, Iterable
from pathlib import Path

from slurm_ext.backends import Backend
from slurm_ext.records import ClusterSnapshot, SlurmJob

log = logging.getLogger("cellsched.controller")


def wait_unless_stopped(stop: threading.Event, seconds: float) -> None:
    """Wait `seconds` (none when negative), less when `stop` is set."""
    stop.wait(max(0.0, seconds))


class Watcher:
    """Decides when the next round starts: after `interval`, or earlier (but
    not before `min_gap` after the last round began) when a job was submitted
    or ended, or the kick file was touched."""

    def __init__(self, backend: Backend, kick_file: str) -> None:
        self.backend = backend
        self.kick = Path(kick_file) if kick_file else None
        if self.kick is not None and self.kick.parent.is_dir() and not self.kick.exists():
            try:  # anyone may touch it to ask for an early round
                self.kick.touch()
                self.kick.chmod(0o666)
            except OSError:
                pass
        self.kick_mtime = self._kick_mtime()
        self.known: dict[str, tuple[bool, bool]] | None = None  # job id -> (finished, holds resources)

    def _kick_mtime(self) -> float | None:
        try:
            return os.stat(self.kick).st_mtime if self.kick else None
        except OSError:
            return None

    def _jobs_changed(self, seen: ClusterSnapshot | None = None, acted: Collection[str] = ()) -> bool:
        """A job was submitted, ended, or stopped running without ending
        (Slurm requeued it: preempted, or its node failed; the controller
        holds such a job before Slurm starts it again by itself), since
        the last look, or (given `seen`) since the round that saw `seen`,
        other than by its actions on the jobs `acted`."""
        try:
            jobs = _states(self.backend.observe().jobs)
        except Exception:
            return False  # the round will see (and log) it
        before, self.known = self.known, jobs
        if seen is not None:
            before = {j: s for j, s in _states(seen.jobs).items() if j not in acted}
            before.update((j, jobs[j]) for j in acted if j in jobs)  # what it did to them is no change
        if before is None:
            return False
        new = set(jobs) - set(before)
        ended = {j for j, (fin, _) in before.items() if not fin and (jobs.get(j) is None or jobs[j][0])}
        stopped = {j for j, (_, ran) in before.items() if ran and j in jobs and not jobs[j][1]}
        return bool(new or ended or stopped)

    def wait(
        self,
        stop: threading.Event,
        interval: float,
        watch: float,
        min_gap: float,
        since: float,
        seen: ClusterSnapshot | None = None,
        acted: Collection[str] = (),
    ) -> None:
        """Until the next round is due (module doc): `since` is when the last
        round began, `seen` what it saw of Slurm (None: changes count from now
        on), `acted` the jobs it acted on."""
        deadline = since + interval
        next_watch = time.monotonic() + watch
        trigger = "jobs while the round ran" if self._jobs_changed(seen, acted) else ""
        while not trigger and not stop.is_set():
            now = time.monotonic()
            if now >= deadline:
                return
            mtime = self._kick_mtime()
            if mtime != self.kick_mtime:
                self.kick_mtime = mtime
                trigger = "kick"
            if not trigger and now >= next_watch:
                next_watch = now + watch
                trigger = "jobs" if self._jobs_changed() else ""
            if not trigger:
                wait_unless_stopped(stop, min(0.5, max(0.0, deadline - now), max(0.05, next_watch - now)))
        if trigger:
            log.info("early round", extra={"fields": {"trigger": trigger}})
            wait_unless_stopped(stop, since + min_gap - time.monotonic())


def _states(jobs: Iterable[SlurmJob]) -> dict[str, tuple[bool, bool]]:
    """Job id -> (finished, holds resources): what the watcher compares."""
    return {j.job_id: (j.finished, j.holds_resources) for j in jobs}
