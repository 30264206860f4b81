"""Upgrading the controller's state file: a file of an earlier schema
(version 3, its tables written out as version 3 made them: version 4 added
`speeds`; version 4: version 5 added `jobs.model_shape`; version 5:
version 6 added the indexes of the rounds' reads; version 6, the one
before the current: version 7 added the history's index by job and event)
is opened by StateStore, migrated in place, and used: its old rows read
back, the new table and column take values, it has a new file's tables and
indexes, its version says 7."""

from __future__ import annotations

import sqlite3

import pytest

from slurm_ext.state import (
    SCHEMA,
    HistoryEvent,
    PlanStatus,
    RoundStatus,
    SpeedRow,
    StateStore,
    _add_model_shape,
    _add_speeds,
)

#: the state file's tables at version 3, as that cellsched created them (no `speeds`)
V3_TABLES = (
    """CREATE TABLE jobs (
  job_id TEXT PRIMARY KEY,
  user TEXT NOT NULL DEFAULT '',
  spec TEXT,
  spec_source TEXT,
  bad_reason TEXT,
  first_seen REAL NOT NULL,
  slurm_state TEXT NOT NULL DEFAULT '',
  phase TEXT NOT NULL DEFAULT '',
  reason TEXT NOT NULL DEFAULT '',
  submit_time REAL,
  start_time REAL,
  end_time REAL,
  exit_code INTEGER,
  iterations_done REAL,
  progress_source TEXT,
  progress_at REAL,
  finished INTEGER NOT NULL DEFAULT 0,
  updated REAL NOT NULL
)""",
    """CREATE TABLE plans (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL,
  round_id INTEGER,
  cell TEXT NOT NULL,
  nodes TEXT NOT NULL,
  partition TEXT NOT NULL,
  plan TEXT NOT NULL,
  admin_comment TEXT NOT NULL,
  status TEXT NOT NULL,
  error TEXT,
  created REAL NOT NULL,
  applied_at REAL
)""",
    "CREATE INDEX plans_job ON plans (job_id, id)",
    "CREATE INDEX plans_status ON plans (status)",
    """CREATE TABLE cell_history (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL,
  time REAL NOT NULL,
  round_id INTEGER,
  event TEXT NOT NULL,
  cell TEXT NOT NULL DEFAULT '',
  nodes TEXT NOT NULL DEFAULT '',
  value REAL
)""",
    "CREATE INDEX cell_history_job ON cell_history (job_id, id)",
    """CREATE TABLE rounds (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  started REAL NOT NULL,
  duration_s REAL,
  observe_s REAL,
  solve_s REAL,
  apply_s REAL,
  objective REAL,
  solver_status TEXT,
  status TEXT NOT NULL,
  num_jobs INTEGER,
  actions TEXT,
  error TEXT
)""",
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
)
#: the indexes version 6 added (version 7 added the history's by job and event)
V6_INDEXES = (
    "CREATE INDEX jobs_open ON jobs (job_id) WHERE finished = 0",
    "CREATE INDEX speeds_newest ON speeds (updated DESC, job_id, gpu_type)",
)
SPEC = '{"global_batch":64,"iterations":100,"model":"gpt-350m","version":1}'


def columns(path) -> dict[str, list[tuple]]:
    """table -> its columns (name, type, not null, default, primary key), indexes by name."""
    with sqlite3.connect(path) as db:
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'index') ORDER BY 1")]
        return {n: [tuple(r[1:]) for r in db.execute(f"PRAGMA table_info('{n}')")] for n in names}


def old_file(path, version_key: str, version: int = 3) -> None:
    """A state file as version 3 (or 4, 5 or 6) left it, with a job, its plan, history and two rounds."""
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode = WAL")
        for stmt in V3_TABLES:
            db.execute(stmt)
        if version >= 4:
            _add_speeds(db)  # what the upgrade to version 4 added
        if version >= 5:
            _add_model_shape(db)  # ... and to version 5
        if version >= 6:
            for stmt in V6_INDEXES:  # ... and to version 6
                db.execute(stmt)
        db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (version_key, str(version)))
        db.execute(
            "INSERT INTO jobs (job_id, user, spec, spec_source, first_seen, slurm_state, phase, iterations_done, "
            "progress_at, updated) "
            "VALUES ('7', 'alice', ?, 'comment', 100.0, 'RUNNING', 'running', 40.0, 150.0, 160.0)",
            (SPEC,),
        )
        db.execute(
            "INSERT INTO plans (job_id, round_id, cell, nodes, partition, plan, admin_comment, status, created, "
            "applied_at) VALUES ('7', 1, 'a100:1x2:pp1', 'n1:2', 'a100', '{\"pp\":1,\"dp\":2,\"tp\":1}', '{}', "
            "'released', 101.0, 102.0)"
        )
        db.execute(
            "INSERT INTO cell_history (job_id, time, round_id, event, cell, nodes, value) "
            "VALUES ('7', 102.0, 1, 'placed', 'a100:1x2:pp1', 'n1:2', NULL), "
            "('7', 140.0, 2, 'resumed', 'a100:1x2:pp1', '', 12.5)"
        )
        db.execute(
            "INSERT INTO rounds (started, duration_s, status, num_jobs, actions) VALUES "
            "(100.0, 2.0, 'ok', 1, '[]'), (130.0, 1.0, 'error', 1, '[]')"
        )
    with sqlite3.connect(path) as db:
        assert {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")} >= {"jobs", "rounds"}


# "schema": the key of files older than solver.contract.sqlitedb
@pytest.mark.parametrize(
    ("version_key", "version"),
    [("schema_version", 3), ("schema", 3), ("schema_version", 4), ("schema_version", 5), ("schema_version", 6)],
)
def test_an_earlier_state_file_is_migrated_and_used(tmp_path, version_key, version):
    assert SCHEMA.version == 7, "a new schema version needs its own upgrade test (from the version before it)"
    path = tmp_path / "state.sqlite"
    old_file(path, version_key, version)
    with StateStore(path) as st:
        job = st.jobs()["7"]
        assert (job.user, job.spec, job.iterations_done, job.progress_at, job.phase) == (
            "alice",
            SPEC,
            40.0,
            150.0,
            "running",
        )
        (plan,) = st.plans_of("7")
        assert (plan.status, plan.nodes, plan.applied) == (PlanStatus.RELEASED, (("n1", 2),), True)
        assert st.released(["7"]) == {"7"} and st.restart_costs(["7"]) == {"7": 12.5}
        assert [e["event"] for e in st.history("7")] == [HistoryEvent.PLACED, HistoryEvent.RESUMED]
        assert st.last_completed_round() == 102.0
        assert [r["status"] for r in st.rounds()] == [RoundStatus.ERROR, RoundStatus.OK]
        row = SpeedRow("7", "a100", "alice", "gpt-350m", "a100:1x2:pp1", 0.5, 0.6, 1.2, 1, 0.6, 170.0)
        st.record_speeds([row])  # the table version 4 added
        assert st.speeds() == [row]
        assert job.model_shape is None
        assert st.observe_model("7", '{"layers":8}') and not st.observe_model("7", '{"layers":4}')  # version 5's
        assert st.jobs()["7"].model_shape == '{"layers":8}'  # the first kept
        r = st.begin_round(200.0)
        st.finish_round(r, status=RoundStatus.OK, duration_s=1.0)
    with sqlite3.connect(path) as db:
        assert dict(db.execute("SELECT key, value FROM meta")) == {"schema_version": "7"}
    StateStore(tmp_path / "new.sqlite").close()
    assert columns(path) == columns(tmp_path / "new.sqlite")  # migrated: the tables of a new file
    with StateStore(path, readonly=True) as ro:  # what `status` and the fail-safe open
        assert ro.speeds(job_ids=["7"]) == [row] and ro.last_completed_round() == 201.0


def test_a_checkpoint_of_an_earlier_state_is_migrated_when_restored(tmp_path):
    """A simulation's checkpoint pickles its state file whole; one written
    by an earlier cellsched (version 5) is brought to this version as it is
    restored, with a new file's tables and indexes."""
    path = tmp_path / "state.sqlite"
    old_file(path, "schema_version", 5)
    image = sqlite3.connect(path).serialize()
    st = StateStore.__new__(StateStore)
    st.__setstate__({"path": str(path), "readonly": False, "image": image})  # what unpickling one does
    assert st.restart_costs(["7"]) == {"7": 12.5}
    st.close()
    with sqlite3.connect(path) as db:
        assert dict(db.execute("SELECT key, value FROM meta")) == {"schema_version": "7"}
    StateStore(tmp_path / "new.sqlite").close()
    assert columns(path) == columns(tmp_path / "new.sqlite")
