"""The controller's state: one SQLite file (WAL), enough for `status` and
for a restart to carry on where the last run stopped.

Tables: ``jobs`` (the spec as first accepted, or why it was refused, the
shape of the model it first said it trains, plus what the last round saw
of the job), ``plans`` (every plan issued, with its
apply status: an intent is written before Slurm is touched and marked after,
so a round cut short is finished by the next one), ``cell_history`` (per-job
placements and ends) and ``rounds`` (timings, objective, actions).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from slurm_ext.errors import CellschedError
from solver.contract import sqlitedb

BUSY_TIMEOUT_S = 10.0


class PlanStatus(StrEnum):
    """Where a plan is on its way into Slurm."""

    INTENT = "intent"  # written, Slurm not yet touched
    SIGNALLED = "signalled"  # a running job was asked to checkpoint for this plan
    REQUEUED = "requeued"  # the job was requeued held
    UPDATED = "updated"  # the job carries the plan, not yet released
    RELEASED = "released"  # applied
    FAILED = "failed"
    SUPERSEDED = "superseded"  # a newer plan of the job replaced it
    ABANDONED = "abandoned"  # the job was found released with another plan
    GONE = "gone"  # the job ended (or vanished) first


class RoundStatus(StrEnum):
    """How a round ended (``running`` while it runs)."""

    RUNNING = "running"
    OK = "ok"
    UNAVAILABLE = "slurm-unavailable"  # Slurm could not be reached
    ERROR = "error"  # something else failed
    INTERRUPTED = "interrupted"  # the controller stopped during it
    STANDBY = "standby"  # another controller holds the lease: this one changed nothing in Slurm


class HistoryEvent(StrEnum):
    """What ``cell_history`` records of a job."""

    PLACED = "placed"  # released with a plan (cell, nodes)
    SIGNALLED = "signalled"  # asked to checkpoint for a move
    REQUEUED = "requeued"
    RESUMED = "resumed"  # its first progress after a (re)start; value: the measured restart cost (s)
    RUN_FAILED = "run-failed"  # a run ended in failure in this cell; value: when
    TRAINED = "trained"  # a run reported a step in this cell (once per job and cell)
    PARKED = "parked"  # requeued held after its runs kept failing (controller.relaunch); cell: the last failed
    UNPARKED = "unparked"  # a parked job seen released (or run again): managed again, its failure count reset
    FINISHED = "finished"  # cell: the Slurm state it ended in
    #: Slurm preempted it (docs/preemption.md); value: its PreemptTime
    SLURM_PREEMPTED = "slurm-preempted"
    #: Slurm requeued it itself (preempted, or its node failed); value: the submit time Slurm gave the requeue
    SLURM_REQUEUED = "slurm-requeued"
    YIELDED = "yielded"  # preempted to zero by cellsched (asked to checkpoint, then requeued held); cell: for which job


#: the statuses of a plan not yet carried out, in the order a plan passes them
OPEN = (PlanStatus.INTENT, PlanStatus.SIGNALLED, PlanStatus.REQUEUED, PlanStatus.UPDATED)
_ENDS = (PlanStatus.RELEASED, PlanStatus.FAILED, PlanStatus.SUPERSEDED, PlanStatus.ABANDONED, PlanStatus.GONE)
#: status -> the statuses it may change to: an open plan moves on (never back) or ends; an ended one stays
TRANSITIONS: dict[PlanStatus, frozenset[PlanStatus]] = {
    **{s: frozenset(OPEN[i + 1 :] + _ENDS) for i, s in enumerate(OPEN)},
    **{s: frozenset() for s in _ENDS},
}
_OPEN_SQL = "(" + ", ".join(f"'{s}'" for s in OPEN) + ")"

_SPEEDS = """CREATE TABLE speeds (
  job_id TEXT NOT NULL,
  gpu_type TEXT NOT NULL,
  user TEXT NOT NULL DEFAULT '',
  model TEXT NOT NULL DEFAULT '',
  cell TEXT NOT NULL DEFAULT '',
  estimated_s REAL NOT NULL,
  observed_s REAL NOT NULL,
  ratio REAL NOT NULL,
  samples INTEGER NOT NULL,
  calibrated_s REAL,
  updated REAL NOT NULL,
  PRIMARY KEY (job_id, gpu_type)
)"""

#: indexes of the reads every round makes, so that they cost what the round's jobs hold, not what the
#: file has kept of every job since it was made (a site's state file grows by every job it ever ran):
#: the open jobs, the newest speeds (calibration's, in a total order), and each job's history by
#: event, covering what the rounds' reads of it take (a job moved often has hundreds of events, and
#: a round asks for one or two kinds of them about ten times)
_READ_INDEXES = (
    "CREATE INDEX IF NOT EXISTS jobs_open ON jobs (job_id) WHERE finished = 0",
    "CREATE INDEX IF NOT EXISTS speeds_newest ON speeds (updated DESC, job_id, gpu_type)",
    "CREATE INDEX IF NOT EXISTS history_job_event ON cell_history (job_id, event, id, time, value)",
)

_CREATE = (
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
  updated REAL NOT NULL,
  model_shape TEXT
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
    """CREATE INDEX plans_job ON plans (job_id, id)""",
    """CREATE INDEX plans_status ON plans (status)""",
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
    """CREATE INDEX cell_history_job ON cell_history (job_id, id)""",
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
    _SPEEDS,
    *_READ_INDEXES,
)


class StateError(RuntimeError, CellschedError):
    """The state file cannot be opened or is from a newer cellsched."""


@dataclass(frozen=True)
class PlanRow:
    id: int
    job_id: str
    round_id: int | None
    cell: str
    nodes: tuple[tuple[str, int], ...]
    partition: str
    plan: str
    admin_comment: str
    status: PlanStatus
    error: str | None
    created: float
    applied_at: float | None

    @property
    def applied(self) -> bool:
        return self.status == PlanStatus.RELEASED


@dataclass(frozen=True)
class JobStatus:
    """What one round saw of a managed job (stored for `status`)."""

    job_id: str
    user: str
    slurm_state: str
    phase: str
    reason: str
    submit_time: float | None
    start_time: float | None
    end_time: float | None
    exit_code: int | None
    iterations_done: float | None
    progress_source: str | None
    finished: bool


@dataclass(frozen=True)
class JobRow(JobStatus):
    """A managed job as the state DB keeps it: the last status seen, plus
    its spec as first accepted (or why it was refused). `progress_at`: when
    `iterations_done` was counted (`updated` moves on every round);
    `model_shape`: the model the job first reported it trains."""

    spec: str | None
    spec_source: str | None
    bad_reason: str | None
    first_seen: float
    updated: float
    progress_at: float | None = None
    #: the shape of the model the job first said it trains (solver.contract.models.ModelShape, JSON)
    model_shape: str | None = None


@dataclass(frozen=True)
class SpeedRow:
    """A job's iteration time on one GPU type: the estimate of its cell (the
    uncalibrated one the ratio is taken against), what it reached, the
    ratio's running mean over `samples` rounds (solver.calibration.running_ratio),
    and the calibrated estimate of that round."""

    job_id: str
    gpu_type: str
    user: str
    model: str
    cell: str
    estimated_s: float
    observed_s: float
    ratio: float
    samples: int
    calibrated_s: float | None
    updated: float


#: its columns, in the table's order
_SPEED_FIELDS = dataclasses.fields(SpeedRow)


def _newest_first(row: SpeedRow) -> tuple[float, str, str]:
    """The order of ``StateStore.speeds`` (and of the index speeds_newest)."""
    return (-row.updated, row.job_id, row.gpu_type)


@dataclass(frozen=True)
class _NewestSpeeds:
    """The `limit` newest speed rows, as the file held them when its data
    version (``PRAGMA data_version``: other connections' commits) was `version`."""

    limit: int
    version: int
    rows: tuple[SpeedRow, ...]

    def after(self, written: list[SpeedRow]) -> _NewestSpeeds | None:
        """The newest rows once this store has written `written` (None: read
        them again). Every row the file holds beyond these ranks after all
        of them, so the newest of these and the written ones are the newest
        of the file, unless a written row ranks after the last one kept
        (a clock set back) while more rows lie beyond it."""
        if not written:
            return self
        if len(self.rows) >= self.limit and max(map(_newest_first, written)) > _newest_first(self.rows[-1]):
            return None
        merged = {(r.job_id, r.gpu_type): r for r in self.rows}
        merged.update(((r.job_id, r.gpu_type), r) for r in written)
        rows = sorted(merged.values(), key=_newest_first)[: self.limit]
        return dataclasses.replace(self, rows=tuple(rows))


class _SpeedsTable:
    """The speeds table through one connection. Its `limit` newest rows are
    kept between reads (calibration reads them every round), brought up to
    date by this connection's own writes, and read again after any other
    connection's (``PRAGMA data_version``), a write inside a batch (which
    may yet roll back), or a job's rows retired (`forget`)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._newest: _NewestSpeeds | None = None

    def forget(self) -> None:
        self._newest = None

    def record(self, rows: Iterable[SpeedRow]) -> None:
        rows = list(rows)
        newest, self._newest = self._newest, None
        alone = not self._db.in_transaction  # committed (or raised) when the block ends
        with sqlitedb.transaction(self._db):
            self._db.executemany(
                "INSERT OR REPLACE INTO speeds (job_id, gpu_type, user, model, cell, estimated_s, observed_s, "
                "ratio, samples, calibrated_s, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [tuple(getattr(r, f.name) for f in _SPEED_FIELDS) for r in rows],  # astuple deep-copies: slow
            )
        if newest is not None and alone:
            self._newest = newest.after(rows)

    def read(self, job_ids: Iterable[str] | None, limit: int | None) -> list[SpeedRow]:
        keep = limit if job_ids is None else None  # the newest of all are kept
        if keep is not None:
            version = self._db.execute("PRAGMA data_version").fetchone()[0]
            newest = self._newest
            if newest is not None and newest.limit == keep and newest.version == version:
                return list(newest.rows)
        where, args = sqlitedb.where(any_of={"job_id": job_ids})
        tail = f" LIMIT {int(limit)}" if limit is not None else ""
        cols = ", ".join(f.name for f in _SPEED_FIELDS)
        order = "ORDER BY updated DESC, job_id, gpu_type"  # the index speeds_newest's order: the newest read first
        rows = [SpeedRow(*r) for r in self._db.execute(f"SELECT {cols} FROM speeds {where} {order}{tail}", args)]
        if keep is not None:
            self._newest = _NewestSpeeds(int(keep), version, tuple(rows))
        return rows


def _nodes_text(nodes: Iterable[tuple[str, int]]) -> str:
    return ",".join(f"{n}:{g}" for n, g in nodes)


def _inserted_id(cur: sqlite3.Cursor) -> int:
    """The row id of the row an INSERT made (sqlite3 sets it after every INSERT)."""
    rowid = cur.lastrowid
    assert rowid is not None
    return rowid


def _nodes_parse(text: str) -> tuple[tuple[str, int], ...]:
    out = []
    for part in filter(None, text.split(",")):
        name, _, g = part.rpartition(":")
        out.append((name, int(g)))
    return tuple(out)


def _add_history_value(db: sqlite3.Connection) -> None:
    if "value" not in {r[1] for r in db.execute("PRAGMA table_info(cell_history)")}:
        db.execute("ALTER TABLE cell_history ADD COLUMN value REAL")


def _add_progress_at(db: sqlite3.Connection) -> None:
    if "progress_at" not in {r[1] for r in db.execute("PRAGMA table_info(jobs)")}:
        db.execute("ALTER TABLE jobs ADD COLUMN progress_at REAL")


def _add_speeds(db: sqlite3.Connection) -> None:
    db.execute(_SPEEDS.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))


def _add_model_shape(db: sqlite3.Connection) -> None:
    if "model_shape" not in {r[1] for r in db.execute("PRAGMA table_info(jobs)")}:
        db.execute("ALTER TABLE jobs ADD COLUMN model_shape TEXT")


def _add_read_indexes(db: sqlite3.Connection) -> None:
    for stmt in _READ_INDEXES:
        db.execute(stmt)


#: version 2: cell_history.value (the measured restart cost of "resumed" events); 3: jobs.progress_at;
#: 4: the speeds table (observed against estimated iteration times, for calibration); 5: jobs.model_shape;
#: 6: the indexes of the rounds' reads (_READ_INDEXES); 7: the history's by job and event (the same)
SCHEMA = sqlitedb.Schema(
    "state file",
    7,
    _CREATE,
    {
        2: _add_history_value,
        3: _add_progress_at,
        4: _add_speeds,
        5: _add_model_shape,
        6: _add_read_indexes,
        7: _add_read_indexes,
    },
    legacy_version_key="schema",
)


class StateStore:
    """The state DB. `readonly` opens an existing file for `status` / `plan`."""

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = str(path)
        self.readonly = readonly
        try:
            if readonly:
                if self.path != ":memory:" and not Path(self.path).exists():
                    raise StateError(f"state file {self.path} does not exist (has the controller run yet?)")
                self._db = sqlitedb.connect(self.path, BUSY_TIMEOUT_S, readonly=True)
                sqlitedb.check_readable(self._db, SCHEMA, self.path)
            else:
                if self.path != ":memory:":
                    Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlitedb.connect(self.path, BUSY_TIMEOUT_S)
                sqlitedb.open_schema(self._db, SCHEMA, self.path)
                self._db.execute(
                    "UPDATE rounds SET status = ? WHERE status = ?", (RoundStatus.INTERRUPTED, RoundStatus.RUNNING)
                )
        except sqlitedb.SchemaError as exc:
            raise StateError(str(exc)) from None
        except sqlite3.Error as exc:
            raise StateError(f"state file {self.path}: {exc}") from exc
        self._speeds = _SpeedsTable(self._db)

    def close(self) -> None:
        self._db.close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with its whole content (a simulation's checkpoint); unpickling writes it back to `path`."""
        return {"path": self.path, "readonly": self.readonly, "image": self._db.serialize()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path, self.readonly = state["path"], state["readonly"]
        self._db = sqlitedb.restore(self.path, state["image"], BUSY_TIMEOUT_S)
        if not self.readonly:  # a checkpoint an older cellsched wrote: brought up to date as its file would be
            sqlitedb.open_schema(self._db, SCHEMA, self.path)
        self._speeds = _SpeedsTable(self._db)

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tx(self) -> Any:
        return sqlitedb.transaction(self._db)

    def batch(self) -> Any:
        """One transaction for the writes inside ``with state.batch():`` (a
        round's intents, or one step's status changes, commit together)."""
        return self._tx()

    # --- jobs -------------------------------------------------------------

    def jobs(self, *, include_finished: bool = True, job_ids: Iterable[str] | None = None) -> dict[str, JobRow]:
        """The stored jobs (only those of `job_ids` when given)."""
        where, args = sqlitedb.where(("finished = 0",) if not include_finished else (), any_of={"job_id": job_ids})
        cur = self._db.execute(f"SELECT * FROM jobs {where} ORDER BY CAST(job_id AS INTEGER)", args)
        cols = [d[0] for d in cur.description]
        out = {}
        for r in cur:
            row = dict(zip(cols, r, strict=True))
            row["finished"] = bool(row["finished"])
            out[row["job_id"]] = JobRow(**row)
        return out

    def accept_spec(self, job_id: str, user: str, spec_json: str, source: str, now: float) -> None:
        """Keep the first accepted spec of a job (a later one never replaces it)."""
        with self._tx():
            self._db.execute(
                "INSERT INTO jobs (job_id, user, spec, spec_source, first_seen, updated) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (job_id) DO UPDATE SET spec = COALESCE(jobs.spec, excluded.spec), "
                "spec_source = COALESCE(jobs.spec_source, excluded.spec_source), bad_reason = NULL",
                (job_id, user, spec_json, source, now, now),
            )

    def observe_model(self, job_id: str, shape_json: str) -> bool:
        """Keep the first model shape a job reports it trains (a later one
        never replaces it); True when this one was kept."""
        with self._tx():
            cur = self._db.execute(
                "UPDATE jobs SET model_shape = ? WHERE job_id = ? AND model_shape IS NULL", (shape_json, job_id)
            )
        return cur.rowcount > 0

    def mark_bad(self, job_id: str, user: str, reason: str, now: float) -> None:
        with self._tx():
            self._db.execute(
                "INSERT INTO jobs (job_id, user, bad_reason, first_seen, updated) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (job_id) DO UPDATE SET bad_reason = excluded.bad_reason",
                (job_id, user, reason, now, now),
            )

    def save_statuses(self, statuses: Iterable[JobStatus], now: float) -> None:
        """Record what this round saw of each managed job (and which ended)."""
        rows = [
            (
                s.user,
                s.slurm_state,
                s.phase,
                s.reason,
                s.submit_time,
                s.start_time,
                s.end_time,
                s.exit_code,
                s.iterations_done,
                s.progress_source,
                s.iterations_done,
                now,
                int(s.finished),
                now,
                s.job_id,
            )
            for s in statuses
        ]
        with self._tx():
            self._db.executemany(
                "UPDATE jobs SET user = ?, slurm_state = ?, phase = ?, reason = ?, submit_time = ?, start_time = ?, "
                "end_time = ?, exit_code = ?, iterations_done = COALESCE(?, iterations_done), "
                "progress_source = COALESCE(?, progress_source), "
                "progress_at = CASE WHEN ? IS NULL THEN progress_at ELSE ? END, finished = ?, updated = ? "
                "WHERE job_id = ?",
                rows,
            )

    def mark_vanished(self, live_ids: Iterable[str], now: float) -> list[str]:
        """Jobs Slurm no longer lists are finished; returns their ids."""
        live = set(live_ids)
        gone = [j for (j,) in self._db.execute("SELECT job_id FROM jobs WHERE finished = 0") if j not in live]
        with self._tx():
            for j in gone:
                self._db.execute(
                    "UPDATE jobs SET finished = 1, phase = 'finished', reason = 'no longer listed by Slurm', "
                    "updated = ? WHERE job_id = ?",
                    (now, j),
                )
                self._db.execute("UPDATE plans SET status = 'gone' WHERE job_id = ? AND status IN " + _OPEN_SQL, (j,))
        return gone

    def retire(self, job_id: str) -> None:
        """Move an earlier job's rows out of the way of a new job with the same id."""
        row = self._db.execute("SELECT first_seen FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        if row is None:
            return
        old = f"{job_id}~{int(row[0])}"
        with self._tx():
            self._db.execute("UPDATE jobs SET job_id = ?, finished = 1 WHERE job_id = ?", (old, job_id))
            self._db.execute(
                "UPDATE plans SET job_id = ?, status = CASE WHEN status IN "
                + _OPEN_SQL
                + " THEN ? ELSE status END WHERE job_id = ?",
                (old, PlanStatus.GONE, job_id),
            )
            self._db.execute("UPDATE cell_history SET job_id = ? WHERE job_id = ?", (old, job_id))
            self._db.execute("UPDATE OR REPLACE speeds SET job_id = ? WHERE job_id = ?", (old, job_id))
            self._speeds.forget()

    # --- plans ------------------------------------------------------------

    def begin_plan(
        self,
        job_id: str,
        round_id: int | None,
        cell: str,
        nodes: Iterable[tuple[str, int]],
        partition: str,
        plan_json: str,
        admin_comment: str,
        now: float,
    ) -> int:
        """Write an intent (before Slurm is touched); older open plans of the job are superseded."""
        with self._tx():
            self._db.execute(
                "UPDATE plans SET status = ? WHERE job_id = ? AND status IN " + _OPEN_SQL,
                (PlanStatus.SUPERSEDED, job_id),
            )
            cur = self._db.execute(
                "INSERT INTO plans (job_id, round_id, cell, nodes, partition, plan, admin_comment, status, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    round_id,
                    cell,
                    _nodes_text(nodes),
                    partition,
                    plan_json,
                    admin_comment,
                    PlanStatus.INTENT,
                    now,
                ),
            )
            return _inserted_id(cur)

    def set_plan_status(self, plan_id: int, status: PlanStatus, now: float, error: str | None = None) -> None:
        """Move a plan on; StateError when TRANSITIONS does not allow it."""
        status = PlanStatus(status)
        with self._tx():
            row = self._db.execute("SELECT status FROM plans WHERE id = ?", (plan_id,)).fetchone()
            if row is None:
                raise StateError(f"no plan {plan_id}")
            if status not in TRANSITIONS[PlanStatus(row[0])]:
                raise StateError(f"plan {plan_id}: {row[0]} -> {status} is not a status change a plan makes")
            self._db.execute(
                "UPDATE plans SET status = ?, error = ?, applied_at = CASE WHEN ? THEN ? ELSE applied_at END "
                "WHERE id = ?",
                (status, error, status == PlanStatus.RELEASED, now, plan_id),
            )
            if status == PlanStatus.RELEASED:
                row = self._db.execute(
                    "SELECT job_id, round_id, cell, nodes FROM plans WHERE id = ?", (plan_id,)
                ).fetchone()
                self._db.execute(
                    "INSERT INTO cell_history (job_id, time, round_id, event, cell, nodes) VALUES (?, ?, ?, ?, ?, ?)",
                    (row[0], now, row[1], HistoryEvent.PLACED, row[2], row[3]),
                )

    def _plans(self, where: str, args: tuple[object, ...] = ()) -> list[PlanRow]:
        rows = self._db.execute(f"SELECT * FROM plans {where}", args).fetchall()
        return [
            PlanRow(r[0], r[1], r[2], r[3], _nodes_parse(r[4]), r[5], r[6], r[7], PlanStatus(r[8]), r[9], r[10], r[11])
            for r in rows
        ]

    def open_plans(self) -> dict[str, PlanRow]:
        """The newest unfinished intent of each job."""
        return {p.job_id: p for p in self._plans("WHERE status IN " + _OPEN_SQL + " ORDER BY id")}

    def latest_plans(self, *, applied_only: bool = True, job_ids: Iterable[str] | None = None) -> dict[str, PlanRow]:
        """The newest (applied) plan of each job (of `job_ids` when given)."""
        where, args = sqlitedb.where(status=PlanStatus.RELEASED if applied_only else None, any_of={"job_id": job_ids})
        newest = f"WHERE id IN (SELECT MAX(id) FROM plans {where} GROUP BY job_id) ORDER BY id"
        return {p.job_id: p for p in self._plans(newest, args)}

    def newest_plan_times(self, job_ids: Iterable[str]) -> dict[str, float]:
        """job (of `job_ids`) -> when its newest plan was journalled (no entry: no plan)."""
        where, args = sqlitedb.where(any_of={"job_id": sorted(set(job_ids))})
        return dict(self._db.execute(f"SELECT job_id, MAX(created) FROM plans{where} GROUP BY job_id", args))

    def released(self, job_ids: Iterable[str]) -> set[str]:
        """Jobs (of `job_ids`) whose newest plan the controller released and
        that it has not requeued held since: held again, they are an operator's."""
        ids = sorted(set(job_ids))
        latest = self.latest_plans(applied_only=False, job_ids=ids)
        return {j for j, p in latest.items() if p.status == PlanStatus.RELEASED} - self._requeued_since_release(ids)

    def _requeued_since_release(self, job_ids: list[str]) -> set[str]:
        """Jobs (of `job_ids`) the controller requeued held after it last
        released them: held by the controller, not by an operator. "After"
        is by the order of the events (a release writes a "placed" event),
        not their times: a requeue in the same second as the release (or the
        same simulated instant: a run that fails as it starts) is after it."""
        return self._newest_after(job_ids, HistoryEvent.REQUEUED, HistoryEvent.PLACED)

    def _newest_after(self, job_ids: Iterable[str], event: str, other: str) -> set[str]:
        """Jobs (of `job_ids`) with an `event` newer than their newest `other`
        event (if any), by the order the events were written."""
        where, args = sqlitedb.where(["event IN (?, ?)"], any_of={"job_id": sorted(set(job_ids))})
        sql = (
            "SELECT job_id, MAX(CASE WHEN event = ? THEN id END), MAX(CASE WHEN event = ? THEN id END) "
            f"FROM cell_history{where} GROUP BY job_id"
        )
        rows = self._db.execute(sql, (event, other, event, other, *args))
        return {job_id for job_id, newest, before in rows if newest is not None and (before or 0) < newest}

    def plans_of(self, job_id: str) -> list[PlanRow]:
        return self._plans("WHERE job_id = ? ORDER BY id", (job_id,))

    def cell_failures(self, job_ids: Iterable[str]) -> dict[str, dict[str, int]]:
        """job (of `job_ids`) -> cell key -> failed applies and runs that failed before training."""
        out: dict[str, dict[str, int]] = {}
        ids = sorted(set(job_ids))
        for table, (where, args) in (
            ("plans", sqlitedb.where(status=PlanStatus.FAILED, any_of={"job_id": ids})),
            ("cell_history", sqlitedb.where(event=HistoryEvent.RUN_FAILED, any_of={"job_id": ids})),
        ):
            for job_id, cell, n in self._db.execute(
                f"SELECT job_id, cell, COUNT(*) FROM {table}{where} GROUP BY job_id, cell", args
            ):
                out.setdefault(job_id, {})[cell] = out.get(job_id, {}).get(cell, 0) + n
        return out

    def trained_cells(self, job_ids: Iterable[str]) -> dict[str, frozenset[str]]:
        """job (of `job_ids`) -> the cell keys it has trained in (the "trained" events)."""
        out: dict[str, set[str]] = {}
        where, args = sqlitedb.where(event=HistoryEvent.TRAINED, any_of={"job_id": sorted(set(job_ids))})
        for job_id, cell in self._db.execute(f"SELECT DISTINCT job_id, cell FROM cell_history{where}", args):
            out.setdefault(job_id, set()).add(cell)
        return {j: frozenset(c) for j, c in out.items()}

    def run_failures(self, job_ids: Iterable[str]) -> dict[str, list[tuple[float, str]]]:
        """job -> (end time, cell key) of its runs that failed before training (the "run-failed" events)."""
        out: dict[str, list[tuple[float, str]]] = {}
        where, args = sqlitedb.where(event=HistoryEvent.RUN_FAILED, any_of={"job_id": sorted(set(job_ids))})
        for job_id, value, cell in self._db.execute(
            f"SELECT job_id, value, cell FROM cell_history{where} ORDER BY id", args
        ):
            out.setdefault(job_id, []).append((value, cell))
        return out

    def event_values(self, event: HistoryEvent, job_ids: Iterable[str]) -> dict[str, set[float]]:
        """job (of `job_ids`) -> the values of its `event` events."""
        out: dict[str, set[float]] = {}
        where, args = sqlitedb.where(event=event, any_of={"job_id": sorted(set(job_ids))})
        for job_id, value in self._db.execute(f"SELECT job_id, value FROM cell_history{where}", args):
            out.setdefault(job_id, set()).add(value)
        return out

    def parked(self, job_ids: Iterable[str]) -> set[str]:
        """Jobs (of `job_ids`) parked and not seen released since (their
        newest "parked" event is after their newest "unparked" one)."""
        return self._newest_after(job_ids, HistoryEvent.PARKED, HistoryEvent.UNPARKED)

    def trained_or_parked_at(self, job_ids: Iterable[str]) -> dict[str, float]:
        """job (of `job_ids`) -> when it was last seen training ("trained",
        "resumed"), parked or released from parking: the failures of its
        runs that count towards parking it (controller.relaunch) ended after."""
        events = (HistoryEvent.TRAINED, HistoryEvent.RESUMED, HistoryEvent.PARKED, HistoryEvent.UNPARKED)
        where, args = sqlitedb.where(["event IN (?, ?, ?, ?)"], any_of={"job_id": sorted(set(job_ids))})
        sql = f"SELECT job_id, MAX(time) FROM cell_history{where} GROUP BY job_id"
        return dict(self._db.execute(sql, (*events, *args)))

    def history(self, job_id: str) -> list[dict[str, Any]]:
        """The job's events: placed (cell, nodes), signalled, requeued,
        resumed (value = measured restart cost, s), run-failed (a run that
        ended before training; value = its end time), trained, parked,
        unparked, slurm-preempted (value = its PreemptTime), slurm-requeued
        (value = the requeue's submit time), finished."""
        cols = ("time", "round_id", "event", "cell", "nodes", "value")
        return [
            dict(zip(cols, r, strict=True))
            for r in self._db.execute(
                f"SELECT {', '.join(cols)} FROM cell_history WHERE job_id = ? ORDER BY id", (job_id,)
            )
        ]

    def add_history(
        self,
        job_id: str,
        event: HistoryEvent,
        now: float,
        round_id: int | None = None,
        cell: str = "",
        nodes: str = "",
        value: float | None = None,
    ) -> None:
        with self._tx():
            self._db.execute(
                "INSERT INTO cell_history (job_id, time, round_id, event, cell, nodes, value) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (job_id, now, round_id, event, cell, nodes, value),
            )

    def yielding(self, job_ids: Iterable[str]) -> dict[str, tuple[float, str]]:
        """job (of `job_ids`) -> (when, for which job) of its preemption by
        cellsched, for the jobs preempted and not requeued since (a
        "yielded" event newer than their newest "requeued" one): they
        checkpoint to give their GPUs away."""
        ids = sorted(set(job_ids))
        open_ = self._newest_after(ids, HistoryEvent.YIELDED, HistoryEvent.REQUEUED)
        return {j: last for j, (last, _) in self.preemptions(open_).items()}

    def preemptions(self, job_ids: Iterable[str]) -> dict[str, tuple[tuple[float, str], frozenset[str]]]:
        """job (of `job_ids`) -> ((when, for which job) of its last preemption
        by cellsched, every job it was preempted for), for the jobs ever preempted."""
        out: dict[str, tuple[tuple[float, str], frozenset[str]]] = {}
        where, args = sqlitedb.where(event=HistoryEvent.YIELDED, any_of={"job_id": sorted(set(job_ids))})
        for job_id, t, by in self._db.execute(f"SELECT job_id, time, cell FROM cell_history{where} ORDER BY id", args):
            out[job_id] = ((t, by), out.get(job_id, ((0.0, ""), frozenset()))[1] | {by})
        return out

    def preempted_for(self, job_id: str) -> list[tuple[float, str]]:
        """(when, which job) of each preemption by cellsched for `job_id`."""
        return list(
            self._db.execute(
                "SELECT time, job_id FROM cell_history WHERE event = ? AND cell = ? ORDER BY id",
                (HistoryEvent.YIELDED, job_id),
            )
        )

    def restart_counts(self, job_ids: Iterable[str] | None = None) -> dict[str, int]:
        """job (of `job_ids`; else every job the state knows) -> how often the
        controller requeued it to run again ("requeued" events: moves,
        resizes, preemptions, checkpointed or failed runs placed again); 0
        for a job never requeued."""
        ids = None if job_ids is None else sorted(set(job_ids))
        out = {j: 0 for j in ids} if ids is not None else {j: 0 for (j,) in self._db.execute("SELECT job_id FROM jobs")}
        where, args = sqlitedb.where(event=HistoryEvent.REQUEUED, any_of={"job_id": ids})
        for job_id, n in self._db.execute(f"SELECT job_id, COUNT(*) FROM cell_history{where} GROUP BY job_id", args):
            if job_id in out:
                out[job_id] = n
        return out

    def pending_restarts(self, job_ids: Iterable[str]) -> dict[str, float]:
        """job (of `job_ids`, unfinished) -> time it was asked to checkpoint, for
        jobs whose restart has not been measured yet (no "resumed" event after
        the last signal)."""
        where, args = sqlitedb.where(
            ["event IN (?, ?)", "job_id IN (SELECT job_id FROM jobs WHERE finished = 0)"],
            any_of={"job_id": sorted(set(job_ids))},
        )
        newest = (
            "SELECT MAX(CASE WHEN event = ? THEN id END) AS signalled, MAX(CASE WHEN event = ? THEN id END) AS resumed "
            f"FROM cell_history{where} GROUP BY job_id"
        )
        sql = (
            f"SELECT h.job_id, h.time FROM cell_history h JOIN ({newest}) n ON h.id = n.signalled "
            "WHERE n.resumed IS NULL OR n.resumed < n.signalled"
        )
        events = (HistoryEvent.SIGNALLED, HistoryEvent.RESUMED)
        return dict(self._db.execute(sql, (*events, *events, *args)))

    def restart_costs(self, job_ids: Iterable[str]) -> dict[str, float]:
        """job (of `job_ids`) -> its last measured restart cost (signal to first step after resume), s."""
        where, args = sqlitedb.where(
            ["value IS NOT NULL"], event=HistoryEvent.RESUMED, any_of={"job_id": sorted(set(job_ids))}
        )
        newest = f"SELECT MAX(id) FROM cell_history{where} GROUP BY job_id"
        return dict(self._db.execute(f"SELECT job_id, value FROM cell_history WHERE id IN ({newest})", args))

    # --- speeds (calibration) ----------------------------------------------

    def record_speeds(self, rows: Iterable[SpeedRow]) -> None:
        """Store these speeds (one row per job and GPU type: the newest replaces)."""
        self._speeds.record(rows)

    def speeds(self, *, job_ids: Iterable[str] | None = None, limit: int | None = None) -> list[SpeedRow]:
        """Stored speeds (of `job_ids`; the `limit` most recently updated), newest first."""
        return self._speeds.read(job_ids, limit)

    # --- rounds -----------------------------------------------------------

    def begin_round(self, now: float) -> int:
        with self._tx():
            return _inserted_id(
                self._db.execute("INSERT INTO rounds (started, status) VALUES (?, ?)", (now, RoundStatus.RUNNING))
            )

    def finish_round(
        self,
        round_id: int,
        *,
        status: str,
        duration_s: float,
        observe_s: float | None = None,
        solve_s: float | None = None,
        apply_s: float | None = None,
        objective: float | None = None,
        solver_status: str | None = None,
        num_jobs: int | None = None,
        actions: Iterable[Mapping[str, Any]] = (),
        error: str | None = None,
    ) -> None:
        with self._tx():
            self._db.execute(
                "UPDATE rounds SET status = ?, duration_s = ?, observe_s = ?, solve_s = ?, apply_s = ?, objective = ?, "
                "solver_status = ?, num_jobs = ?, actions = ?, error = ? WHERE id = ?",
                (
                    status,
                    duration_s,
                    observe_s,
                    solve_s,
                    apply_s,
                    objective,
                    solver_status,
                    num_jobs,
                    json.dumps(list(actions), separators=(",", ":")),
                    error,
                    round_id,
                ),
            )

    def last_completed_round(self) -> float | None:
        """When the newest round that ended ``ok`` ended (its start plus its
        duration); None when no round has. Read-only safe: the fail-safe
        (slurm_ext.failsafe) asks it without trusting the controller."""
        row = self._db.execute(
            "SELECT started + COALESCE(duration_s, 0) FROM rounds WHERE status = ? ORDER BY id DESC LIMIT 1",
            (RoundStatus.OK,),
        ).fetchone()
        return None if row is None else float(row[0])

    def rounds(self, limit: int = 20) -> list[dict[str, Any]]:
        cur = self._db.execute("SELECT * FROM rounds ORDER BY id DESC LIMIT ?", (limit,))
        cols = [d[0] for d in cur.description]
        out = []
        for r in cur.fetchall():
            d = dict(zip(cols, r, strict=True))
            d["actions"] = json.loads(d["actions"]) if d["actions"] else []
            out.append(d)
        return out


__all__ = [
    "JobRow",
    "JobStatus",
    "OPEN",
    "PlanRow",
    "PlanStatus",
    "StateError",
    "StateStore",
    "TRANSITIONS",
    "HistoryEvent",
    "RoundStatus",
]


def restart_stats(counts: Collection[int]) -> dict[str, float]:
    """mean, p99 (nearest rank) and max of restarts per job; 0 for no job."""
    v = sorted(counts)
    if not v:
        return {"mean": 0.0, "p99": 0.0, "max": 0.0}
    return {"mean": sum(v) / len(v), "p99": float(v[max(0, math.ceil(0.99 * len(v)) - 1)]), "max": float(v[-1])}
