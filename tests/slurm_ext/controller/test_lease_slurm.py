"""Active and standby on the real dev cluster: two controller daemons, each
with its own state file, share one lease file. Over 30 rounds only one acts
at a time (their state files' rounds, which say who acted when, never
overlap), and every job submitted is placed exactly once and completes.
SIGKILLed (no release), the active one is replaced by the standby within two
intervals, which places a job submitted after the kill. Every wait is for an
event (a round recorded, a job done), never a fixed time."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from controller_support import log_lines, start_daemon, stop, submit_managed, write_config
from support import wait_for

from slurm_ext.backends import get_backend

pytestmark = pytest.mark.slurm

#: long enough that a loaded CI machine still takes over within two of them
#: (lease 1 s + a standby retry of 0.5 s + settle 0.1 s leave 1.4 s to spare)
INTERVAL_S = 1.5


def rounds(state: Path) -> list[tuple[float, float, str]]:
    """(started, ended, status) of every finished round in a state file."""
    if not state.exists():
        return []
    with sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=10) as db:
        rows = db.execute(
            "SELECT started, started + COALESCE(duration_s, 0), status FROM rounds "
            "WHERE status != 'running' ORDER BY id"
        ).fetchall()
    return [(float(a), float(b), str(s)) for a, b, s in rows]


def acting(state: Path) -> list[tuple[float, float]]:
    return [(a, b) for a, b, s in rounds(state) if s != "standby"]


def placed(*logs: Path) -> Counter:
    return Counter(ln["job"] for log in logs for ln in log_lines(log) if ln["msg"] == "placed")


def done(path: Path) -> set[str]:
    return set(path.read_text().split()) if path.exists() else set()


def test_one_controller_acts_and_the_standby_takes_over_after_a_sigkill(slurm_cluster, tmp_path):
    lease = tmp_path / "shared" / "lease"
    lease.parent.mkdir()
    names = ("a", "b")
    states = {n: tmp_path / n / "state.sqlite" for n in names}
    logs = {n: tmp_path / n / "controller.log" for n in names}
    procs: dict[str, subprocess.Popen] = {}
    for n in names:
        (tmp_path / n).mkdir()
        write_config(
            tmp_path / n / "c.toml",
            states[n],
            interval_s=INTERVAL_S,
            lease_path=str(lease),
            lease_s=1.0,
            lease_settle_s=0.1,
        )
    for n in names:  # started together
        procs[n] = start_daemon(tmp_path / n / "c.toml", logs[n])
    finished = tmp_path / "done"
    backend = get_backend("cli")
    try:
        jobs = [submit_managed("gpt-350m", tmp_path, done_file=finished, sleep=1) for _ in range(3)]
        wait_for(lambda: sum(len(rounds(s)) for s in states.values()) >= 15, timeout=60, what="15 rounds")
        jobs += [submit_managed("gpt-350m", tmp_path, done_file=finished, sleep=1) for _ in range(3)]
        wait_for(
            lambda: max(len(acting(s)) for s in states.values()) >= 30 and done(finished) >= set(jobs),
            timeout=120,
            what=f"30 acting rounds and jobs {jobs} done",
        )
        by = {n: acting(states[n]) for n in names}
        active = max(names, key=lambda n: len(by[n]))
        standby = next(n for n in names if n != active)
        # one acts at a time: no round of one overlaps a round of the other
        for a0, a1 in by[active]:
            for b0, b1 in by[standby]:
                assert a1 <= b0 or b1 <= a0, (active, (a0, a1), standby, (b0, b1))
        assert sum(s == "standby" for *_, s in rounds(states[standby])) >= 10, rounds(states[standby])
        counts = placed(*logs.values())
        assert {j: counts[j] for j in jobs} == dict.fromkeys(jobs, 1), counts

        # a job the active one placed still runs when it dies: the standby leaves it be (its state file
        # has never seen the job; it takes the spec from the AdminComment)
        running = submit_managed("gpt-350m", tmp_path, done_file=finished, sleep=8)
        wait_for(lambda: backend.job(running).state == "RUNNING", timeout=60, what=f"job {running} to run")

        # the one that placed it is the one acting now: on a loaded machine the lease may have changed
        # hands since (a renewal that stalls past lease_s loses it, and the other one takes it over)
        holder = wait_for(
            lambda: [n for n in names if placed(logs[n])[running]], timeout=30, what=f"job {running} placed"
        )[0]
        other = next(n for n in names if n != holder)

        # the holder dies without releasing the lease; the other one takes over and places a new job
        killed_at = time.time()
        os.kill(procs[holder].pid, signal.SIGKILL)
        procs[holder].wait(timeout=30)
        late = submit_managed("gpt-350m", tmp_path, done_file=finished, sleep=1)
        first = wait_for(
            lambda: [a for a, _ in acting(states[other]) if a >= killed_at][:1],
            timeout=30,
            what=f"controller {other} to act after {holder} was killed",
        )[0]
        assert first - killed_at <= 2 * INTERVAL_S, (first - killed_at, rounds(states[other])[-10:])
        wait_for(lambda: {late, running} <= done(finished), timeout=90, what=f"jobs {running} and {late} to complete")
        assert placed(logs[other])[late] == 1 and placed(logs[holder])[late] == 0
        assert placed(logs[holder])[running] == 1 and placed(logs[other])[running] == 0
        everyone = [*jobs, running, late]
        counts = placed(*logs.values())
        assert {j: counts[j] for j in everyone} == dict.fromkeys(everyone, 1), counts
        assert all(backend.job(j).state == "COMPLETED" for j in everyone)
        taken = [ln for ln in log_lines(logs[other]) if ln["msg"] == "lease taken"]
        assert taken and taken[-1]["epoch"] >= 2, taken
    finally:
        for p in procs.values():
            stop(p)
    for n in names:
        assert "Traceback" not in logs[n].read_text(), logs[n].read_text()[-3000:]
