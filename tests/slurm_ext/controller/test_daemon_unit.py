"""The daemon around the rounds (slurm_ext.controller.daemon, watcher):
one round with `once`, backoff while Slurm is away, early rounds on the
kick file; no Slurm, a stand-in controller."""

from __future__ import annotations

import os
import threading
import time

from slurm_ext.config import from_dict
from slurm_ext.controller import daemon
from slurm_ext.controller.report import RoundReport
from slurm_ext.controller.watcher import Watcher
from slurm_ext.records import ClusterSnapshot, SlurmJob
from slurm_ext.state import RoundStatus


class _Backend:
    name = "still"

    def observe(self) -> ClusterSnapshot:
        return ClusterSnapshot(nodes=(), partitions=(), jobs=(), taken_at=0.0)


class _Rounds:
    """What daemon.run uses of a Controller; its rounds report `statuses` in turn."""

    def __init__(self, tmp_path, statuses, interval_s=0.05):
        self.config = from_dict(
            {"controller": {"state_path": str(tmp_path / "s.sqlite"), "interval_s": interval_s, "kick_file": ""}}
        )
        self.backend = _Backend()
        self.observed = None  # what the last round saw of Slurm (Controller.observed)
        self.stop = threading.Event()
        self.statuses = list(statuses)
        self.calls: list[bool] = []

    def round(self, *, dry_run: bool = False) -> RoundReport:
        self.calls.append(dry_run)
        return RoundReport(len(self.calls), self.statuses.pop(0), 0.0)


def test_once_runs_one_round_and_shares_the_stop_event(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    ctl = _Rounds(tmp_path, [RoundStatus.OK, RoundStatus.OK])
    stop = threading.Event()
    report = daemon.run(ctl, once=True, dry_run=True, stop=stop)
    assert (report.round_id, report.status, ctl.calls, ctl.stop is stop) == (1, RoundStatus.OK, [True], True)


def test_rounds_go_on_until_stopped_and_back_off_while_slurm_is_away(tmp_path, monkeypatch):
    """After the n-th round in a row that found Slurm away the daemon waits
    2 ** (n - 1) s (1, 2, 4, ...), never more than interval_s; a round that
    reaches Slurm ends the back-off (the next failure waits 1 s again) and
    the next wait is the watcher's. The waits are recorded, not slept."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    away, ok = RoundStatus.UNAVAILABLE, RoundStatus.OK
    statuses = [away, away, away, away, ok, away, ok]
    ctl = _Rounds(tmp_path, statuses, interval_s=3.0)
    waits: list[tuple[int, str, float]] = []  # (rounds so far, which wait, seconds)
    monkeypatch.setattr(daemon, "wait_unless_stopped", lambda stop, s: waits.append((len(ctl.calls), "back-off", s)))
    monkeypatch.setattr(
        Watcher, "wait", lambda self, stop, interval, *_a, **_k: waits.append((len(ctl.calls), "watch", interval))
    )
    seen: list[str] = []

    def on_round(r: RoundReport) -> None:
        seen.append(r.status)
        if len(seen) == len(statuses):
            ctl.stop.set()

    last = daemon.run(ctl, on_round=on_round)
    assert seen == statuses and last.round_id == len(statuses)
    assert waits == [
        (1, "back-off", 1.0),
        (2, "back-off", 2.0),
        (3, "back-off", 3.0),  # 4 s, capped at interval_s
        (4, "back-off", 3.0),
        (5, "watch", 3.0),
        (6, "back-off", 1.0),  # Slurm was back in between: from 1 s again
        (7, "watch", 3.0),
    ]


def test_a_touched_kick_file_ends_the_wait_early(tmp_path):
    kick = tmp_path / "kick"
    watcher = Watcher(_Backend(), str(kick))
    assert kick.exists()  # made for anyone to touch
    st = kick.stat()
    os.utime(kick, (st.st_atime, st.st_mtime + 10))
    t0 = time.monotonic()
    watcher.wait(threading.Event(), interval=30.0, watch=30.0, min_gap=0.0, since=t0)
    assert time.monotonic() - t0 < 5.0


def test_without_a_change_the_wait_lasts_the_interval(tmp_path):
    watcher = Watcher(_Backend(), "")
    t0 = time.monotonic()
    watcher.wait(threading.Event(), interval=0.3, watch=0.1, min_gap=0.0, since=t0)
    assert 0.3 <= time.monotonic() - t0 < 5.0


class _Jobs:
    """A backend whose jobs change between observations: each call returns the next list (the last one stays)."""

    name = "changing"

    def __init__(self, *states: tuple[SlurmJob, ...]) -> None:
        self.states = list(states)

    def observe(self) -> ClusterSnapshot:
        jobs = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return ClusterSnapshot(nodes=(), partitions=(), jobs=jobs, taken_at=0.0)


def test_a_job_that_stops_running_without_ending_starts_a_round_early():
    """Slurm requeued a running job (preempted, or its node failed): the
    round that holds it comes at once, not after the interval (Slurm starts
    it again by itself cred_expire later: docs/preemption.md)."""
    running, requeued = SlurmJob("1", state="RUNNING"), SlurmJob("1", state="PENDING", reason="BeginTime")
    watcher = Watcher(_Jobs((running,), (running,), (requeued,)), "")
    t0 = time.monotonic()
    watcher.wait(threading.Event(), interval=30.0, watch=0.05, min_gap=0.0, since=t0)
    assert time.monotonic() - t0 < 5.0
    still = Watcher(_Jobs((running,), (SlurmJob("1", state="COMPLETING"),)), "")  # completing: not yet
    t0 = time.monotonic()
    still.wait(threading.Event(), interval=0.3, watch=0.05, min_gap=0.0, since=t0)
    assert time.monotonic() - t0 >= 0.3


def _waited(watcher: Watcher, **kw) -> float:
    t0 = time.monotonic()
    watcher.wait(threading.Event(), interval=0.3, watch=0.05, min_gap=0.0, since=t0, **kw)
    return time.monotonic() - t0


def test_changes_while_the_round_ran_count_but_not_the_rounds_own():
    """Given what the round saw: a job that arrived, or ended, while it ran
    starts the next round at once; a job the round itself requeued (it saw
    it running, it is pending now) does not, nor does a job it started."""
    running, pending = SlurmJob("1", state="RUNNING"), SlurmJob("1", state="PENDING", reason="JobHeldUser")
    seen = ClusterSnapshot(nodes=(), partitions=(), jobs=(running, SlurmJob("2", state="RUNNING")), taken_at=0.0)
    after = (pending, SlurmJob("2", state="RUNNING"))
    assert _waited(Watcher(_Jobs(after), ""), seen=seen, acted={"1"}) >= 0.3
    assert _waited(Watcher(_Jobs(after), ""), seen=seen) < 0.3  # not its own: Slurm requeued it
    arrived = (*after, SlurmJob("3", state="PENDING"))
    assert _waited(Watcher(_Jobs(arrived), ""), seen=seen, acted={"1"}) < 0.3
    ended = (pending, SlurmJob("2", state="COMPLETED"))
    assert _waited(Watcher(_Jobs(ended), ""), seen=seen, acted={"1"}) < 0.3
    started = ClusterSnapshot(nodes=(), partitions=(), jobs=(SlurmJob("4", state="PENDING"),), taken_at=0.0)
    assert _waited(Watcher(_Jobs((SlurmJob("4", state="RUNNING"),)), ""), seen=started, acted={"4"}) >= 0.3
