"""A round's reads of the state file cost what the round's jobs hold, not
what the file has kept of every job it ever saw: a site's state file grows
by every job its controller ran (the simulated month: 13 history rows and
3 plans a job), and a read that scans a whole table each round makes every
round slower as the months go by.

The oracle is SQLite's own query planner: every statement the controller
ran in a simulation with moves (each one captured as SQLite ran it, its
parameters bound) is explained on the run's state file, and none may scan
a table of the jobs' history without an index, nor read every event of a
job to find those of one or two kinds (a job moved often has hundreds)."""

from __future__ import annotations

import random
import re
import sqlite3

import pytest

from slurm_ext.sim.engine import SimOptions, Simulator
from slurm_ext.state import HistoryEvent, JobStatus, StateStore
from solver.contract import sqlitedb
from tests.slurm_ext.sim.test_engine import ONE_NODE, Table, job

#: the tables that grow by every job the controller ever saw
HISTORY_TABLES = ("jobs", "plans", "cell_history", "speeds")
#: a plan step that reads a whole one of them: "SCAN t" with no index (a "SCAN t USING INDEX i"
#: walks `i`: the open jobs' partial index, or the newest speeds under a LIMIT)
WHOLE_TABLE = re.compile(rf"SCAN ({'|'.join(HISTORY_TABLES)})$")
#: a plan step that reads the jobs' events of the kinds asked for alone (the index by job and event)
BY_JOB_AND_EVENT = re.compile(r"SEARCH (cell_history|h) USING (COVERING )?INDEX \w+ \(job_id=\? AND event=\?\)")


@pytest.fixture
def statements(monkeypatch):
    """Every statement SQLite runs on the connections opened from here on."""
    ran: list[str] = []
    connect = sqlitedb.connect

    def traced(*args, **kwargs):
        db = connect(*args, **kwargs)
        db.set_trace_callback(ran.append)
        return db

    monkeypatch.setattr(sqlitedb, "connect", traced)
    return ran


def run_with_moves(tmp_path) -> None:
    """A long job beside short ones on one node of 8 GPUs, 8 twice as fast
    as 4: cellsched grows the long job once the short ones are gone
    (checkpoint, requeue, resume: every kind of history a round reads)."""
    trace = [job("long", 0.0, 20_000, 4), job("short", 0.0, 200, 4), job("later", 300.0, 100, 4)]
    options = SimOptions(restart_per_gpu_s=0.0, restart_max_s=0.0)
    table = Table({("a100", 1): 4.0, ("a100", 2): 2.0, ("a100", 4): 1.0, ("a100", 8): 0.5})
    sim = Simulator(
        trace, ONE_NODE, "cellsched", speed=table.speed, estimator=table, options=options, state_dir=tmp_path
    )
    assert sim.run().jobs


def test_no_read_of_a_round_scans_the_whole_history(tmp_path, statements):
    run_with_moves(tmp_path)
    ran = list(statements)  # the run's (the checks below read the file too)
    path = tmp_path / "state-cellsched.sqlite"
    with StateStore(path, readonly=True) as state:
        moved = {e["event"] for j in state.jobs() for e in state.history(j)}
    assert {HistoryEvent.SIGNALLED, HistoryEvent.REQUEUED, HistoryEvent.RESUMED} <= moved  # it did move jobs
    db = sqlite3.connect(path)
    reads = {s for s in ran if s.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE"))}
    assert any("FROM cell_history" in s for s in reads)
    scans, every_event = {}, {}
    for sql in reads:
        if sql.startswith("UPDATE rounds SET status = 'interrupted'"):
            continue  # once, when the controller starts: rounds left running by a crash
        steps = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + sql)]
        whole = [s for s in steps if WHOLE_TABLE.match(s)]
        if whole:
            scans[sql[:160]] = whole
        if "FROM cell_history" in sql and "event" in sql and "job_id IN" in sql:  # some kinds of some jobs' events
            if not any(BY_JOB_AND_EVENT.match(s) for s in steps):
                every_event[sql[:160]] = steps
    db.close()
    assert scans == {}
    assert every_event == {}


def test_the_reads_by_job_answer_for_those_jobs_only(tmp_path):
    """cell_failures, restart_costs and pending_restarts, asked for some
    jobs, answer what they answered for every job, restricted to those."""
    with StateStore(tmp_path / "s.sqlite") as st:
        for j in ("1", "2", "3"):
            st.accept_spec(j, "u", '{"global_batch":64,"iterations":10,"model":"gpt-350m","version":1}', "c", 1.0)
        st.add_history("1", HistoryEvent.RUN_FAILED, 5.0, cell="a100:1x2:pp1", value=5.0)
        st.add_history("2", HistoryEvent.RUN_FAILED, 6.0, cell="a40:1x2:pp1", value=6.0)
        st.add_history("2", HistoryEvent.RUN_FAILED, 7.0, cell="a40:1x2:pp1", value=7.0)
        for j, t, cost in (("1", 10.0, 30.0), ("1", 20.0, 40.0), ("3", 30.0, 50.0)):
            st.add_history(j, HistoryEvent.SIGNALLED, t - 5.0)
            st.add_history(j, HistoryEvent.RESUMED, t, value=cost)
        st.add_history("2", HistoryEvent.SIGNALLED, 50.0)  # not resumed yet
        assert st.cell_failures(["2", "3"]) == {"2": {"a40:1x2:pp1": 2}}
        assert st.cell_failures(["1", "2", "3"]) == {"1": {"a100:1x2:pp1": 1}, "2": {"a40:1x2:pp1": 2}}
        assert st.restart_costs(["1", "2"]) == {"1": 40.0}  # the newest measure
        assert st.restart_costs(["3"]) == {"3": 50.0}
        assert st.pending_restarts(["1", "2", "3"]) == {"2": 50.0}
        assert st.pending_restarts(["1", "3"]) == {}
        assert st.cell_failures([]) == {} and st.restart_costs([]) == {} and st.pending_restarts([]) == {}


@pytest.mark.parametrize("seed", range(6))
def test_the_newest_restart_reads_answer_as_a_walk_of_the_events_in_order(tmp_path, seed):
    """pending_restarts and restart_costs take each job's newest events:
    the oracle walks every event of the job in the order written (what
    they did before they read by job and event), on random histories
    with ties in time, resumes without a measured cost, other events
    between, and finished jobs (which have no pending restart)."""
    rng = random.Random(seed)
    kinds = (HistoryEvent.SIGNALLED, HistoryEvent.RESUMED, HistoryEvent.REQUEUED, HistoryEvent.TRAINED)
    with StateStore(tmp_path / "s.sqlite") as st:
        jobs = [str(j) for j in range(12)]
        for j in jobs:
            st.accept_spec(j, "u", '{"global_batch":64,"iterations":10,"model":"gpt-350m","version":1}', "c", 1.0)
        written: list[tuple[str, str, float, float | None]] = []
        for _ in range(300):
            j, kind, t = rng.choice(jobs), rng.choice(kinds), float(rng.randrange(100))
            value = rng.choice((None, float(rng.randrange(1, 90)))) if kind == HistoryEvent.RESUMED else None
            st.add_history(j, kind, t, value=value)
            written.append((j, kind, t, value))
        finished = set(rng.sample(jobs, 3))
        st.save_statuses(
            [JobStatus(j, "u", "COMPLETED", "done", "", None, None, None, 0, None, None, True) for j in finished], 200.0
        )
        pending: dict[str, float] = {}
        costs: dict[str, float] = {}
        for j, kind, t, value in written:  # the walk, in the order written
            if kind == HistoryEvent.SIGNALLED:
                pending[j] = t
            elif kind == HistoryEvent.RESUMED:
                pending.pop(j, None)
                if value is not None:
                    costs[j] = value
        asked = rng.sample(jobs, 8)
        assert st.pending_restarts(asked) == {j: t for j, t in pending.items() if j in asked and j not in finished}
        assert st.restart_costs(asked) == {j: v for j, v in costs.items() if j in asked}
