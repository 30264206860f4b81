"""The daemon around the rounds: a round every interval (earlier when the
watcher sees a change), backoff while Slurm is away, systemd notifications,
SIGTERM / SIGINT ending it within a grace period, and with a lease
(active/standby, slurm_ext.controller.lease) its keeper thread and its release
on a clean stop."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from slurm_ext.controller.lease import LeaseKeeper
from slurm_ext.controller.notify import sd_notify
from slurm_ext.controller.report import RoundReport
from slurm_ext.controller.watcher import Watcher, wait_unless_stopped
from slurm_ext.state import RoundStatus

if TYPE_CHECKING:
    from slurm_ext.controller.round import Controller

log = logging.getLogger("cellsched.controller")

#: SIGTERM / SIGINT end the daemon within this many seconds, whatever it is doing
STOP_GRACE_S = 4.0


def run(
    controller: Controller,
    *,
    once: bool = False,
    dry_run: bool = False,
    stop: threading.Event | None = None,
    on_round: Callable[[RoundReport], None] | None = None,
) -> RoundReport | None:
    """Rounds until `stop` is set (or one with `once`); the last round's report."""
    stop = controller.stop = stop or controller.stop
    cc = controller.config.controller
    sd_notify("READY=1", "STATUS=starting")
    watcher = Watcher(controller.backend, cc.kick_file)
    lease = None if dry_run else getattr(controller, "lease", None)
    if lease is not None and not once:
        LeaseKeeper(lease, stop).start()
    try:
        return _rounds(controller, watcher, stop, once, dry_run, on_round)
    finally:
        if lease is not None:
            lease.release()
        sd_notify("STOPPING=1")


def _rounds(
    controller: Controller,
    watcher: Watcher,
    stop: threading.Event,
    once: bool,
    dry_run: bool,
    on_round: Callable[[RoundReport], None] | None,
) -> RoundReport | None:
    cc = controller.config.controller
    failures = 0
    report = None
    while not stop.is_set():
        report = controller.round(dry_run=dry_run)
        if on_round:
            on_round(report)
        sd_notify(
            "WATCHDOG=1",
            f"STATUS=round {report.round_id}: {report.status}, {report.num_jobs} jobs, "
            f"{len(report.actions)} actions, {report.total_s:.2f} s",
        )
        if once:
            return report
        if report.status == RoundStatus.UNAVAILABLE:
            failures += 1
            delay = min(cc.interval_s, 2.0 ** (failures - 1))
            log.info("backing off", extra={"fields": {"delay_s": delay, "failures": failures}})
            wait_unless_stopped(stop, delay)
            continue
        if failures:
            log.info("slurm available again", extra={"fields": {"after_failures": failures}})
        failures = 0
        if report.status == RoundStatus.STANDBY:  # try the lease again soon: take-over within 1.5 lease_s
            wait_unless_stopped(stop, min(cc.interval_s, cc.lease_s / 2))
            continue
        watcher.wait(
            stop,
            cc.interval_s,
            cc.watch_s,
            cc.min_gap_s,
            since=time.monotonic() - report.total_s,
            seen=controller.observed,
            acted=report.acted_on,
        )
    return report


def stop_within(stop: threading.Event, grace_s: float = STOP_GRACE_S) -> None:
    """Ask the loop to stop (the round in progress finishes its current
    action and stops waiting); if the process still runs `grace_s` later (a
    Slurm command or a read that hangs), end it: every action is journalled
    before it is taken, and the next start finishes a round cut short."""
    stop.set()
    time.sleep(grace_s)
    log.warning("stopping now", extra={"fields": {"grace_s": grace_s}})
    os._exit(0)


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT start `stop_within(stop)` (call from the main thread)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        # set from another thread: Event.set() inside a handler can deadlock
        # with the main thread's Event.wait() holding the same lock
        signal.signal(sig, lambda *_: threading.Thread(target=stop_within, args=(stop,), daemon=True).start())
