"""The profile store: one SQLite file of cell times, layer profiles,
communication tables and GPU specs.

Safe for one writer and many readers: files use WAL, every connection waits
on a busy timeout, every write is one transaction and an upsert (a re-import
replaces rows instead of duplicating them). The store fills nothing itself:
``solver.contract.profiles.seed.open_store`` seeds a new one.

In the ``cells`` table a plan of ``pp = dp = tp = 0`` stands for "best plan /
plan unknown" (SQLite keys treat NULLs as distinct, so 0 keeps upserts exact);
records read back carry ``None`` there.
"""

from __future__ import annotations

import contextlib
import math
import os
import pathlib
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import fields
from typing import Any

from solver.contract import sqlitedb
from solver.contract.errors import SolverError
from solver.contract.profiles.records import CellRecord, CommRecord, GpuSpec, LayerRecord, ProfileSource

BUSY_TIMEOUT_S = 30.0
ENV_VAR = "CELLSCHED_PROFILES"

#: Which record wins when several sources hold the same cell (lowest first).
SOURCE_PREFERENCE = (ProfileSource.MEASURED, ProfileSource.ARENA_OPTIMAL, ProfileSource.ARENA_ESTIMATED)

_CREATE = (
    """CREATE TABLE cells (
        model TEXT NOT NULL, global_batch INTEGER NOT NULL, gpu_type TEXT NOT NULL,
        num_nodes INTEGER NOT NULL, gpus_per_node INTEGER NOT NULL,
        pp INTEGER NOT NULL, dp INTEGER NOT NULL, tp INTEGER NOT NULL,
        source TEXT NOT NULL, iter_time_s REAL,
        PRIMARY KEY (model, global_batch, gpu_type, num_nodes, gpus_per_node, pp, dp, tp, source)
    ) WITHOUT ROWID""",
    "CREATE INDEX cells_by_gpu ON cells (gpu_type, model)",
    """CREATE TABLE layers (
        model_sig TEXT NOT NULL, gpu_type TEXT NOT NULL, tp INTEGER NOT NULL,
        micro_batch INTEGER NOT NULL, layer INTEGER NOT NULL, kind TEXT NOT NULL,
        fwd_s REAL NOT NULL, bwd_s REAL NOT NULL, param_bytes INTEGER NOT NULL,
        act_bytes INTEGER NOT NULL, out_bytes INTEGER NOT NULL,
        PRIMARY KEY (model_sig, gpu_type, tp, micro_batch, layer)
    ) WITHOUT ROWID""",
    """CREATE TABLE comm (
        link TEXT NOT NULL, op TEXT NOT NULL, nranks INTEGER NOT NULL,
        nbytes INTEGER NOT NULL, time_s REAL NOT NULL,
        PRIMARY KEY (link, op, nranks, nbytes)
    ) WITHOUT ROWID""",
    """CREATE TABLE gpus (
        name TEXT PRIMARY KEY, mem_gb REAL NOT NULL, peak_tflops REAL NOT NULL,
        mem_bw_gbps REAL NOT NULL, intra_link TEXT NOT NULL,
        intra_bw_gbps REAL NOT NULL, inter_bw_gbps REAL NOT NULL
    )""",
)

SCHEMA = sqlitedb.Schema("profile store", 1, _CREATE)
_CELL_COLS = "model, global_batch, gpu_type, num_nodes, gpus_per_node, pp, dp, tp, source, iter_time_s"
_LAYER_COLS = "model_sig, gpu_type, tp, micro_batch, layer, kind, fwd_s, bwd_s, param_bytes, act_bytes, out_bytes"
_COMM_COLS = "link, op, nranks, nbytes, time_s"
_GPU_COLS = "name, mem_gb, peak_tflops, mem_bw_gbps, intra_link, intra_bw_gbps, inter_bw_gbps"
_SOURCE_ORDER = (
    "CASE source "
    + " ".join(f"WHEN '{s}' THEN {i}" for i, s in enumerate(SOURCE_PREFERENCE))
    + f" ELSE {len(SOURCE_PREFERENCE)} END, source"
)


class ProfileStoreError(SolverError):
    """The store cannot be opened or used (bad file, newer schema)."""


class InvalidRecordError(ProfileStoreError, ValueError):
    """A record handed to the store has a bad field (the message names it)."""


class ProfileStore:
    """Cached profiles in one SQLite file (or ``":memory:"``)."""

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, on_create: Callable[[ProfileStore], str] | None = None
    ) -> None:
        """Open (or create) the store at `path` (None: ``default_path()``).
        `on_create` fills a new store in the transaction that creates it and
        returns what it put there (kept as the ``seeded`` meta row);
        ``solver.contract.profiles.seed.open_store`` seeds that way."""
        self.path = str(self.default_path() if path is None else path)
        self.seeded_now = False
        if self.path != ":memory:":
            parent = pathlib.Path(self.path).expanduser().resolve().parent
            if not parent.is_dir():
                raise ProfileStoreError(f"profile store {self.path}: directory {parent} does not exist")
            self.path = str(pathlib.Path(self.path).expanduser())
        try:
            self._conn = sqlitedb.connect(self.path, BUSY_TIMEOUT_S)
            self._open(on_create)
        except sqlite3.DatabaseError as exc:
            with contextlib.suppress(Exception):
                self._conn.close()
            raise ProfileStoreError(f"profile store {self.path}: {exc}") from exc
        except BaseException:
            with contextlib.suppress(Exception):
                self._conn.close()
            raise

    @staticmethod
    def default_path() -> pathlib.Path:
        """``$CELLSCHED_PROFILES`` if set, else ~/.local/share/cellsched/profiles.sqlite."""
        env = os.environ.get(ENV_VAR)
        path = (
            pathlib.Path(env).expanduser()
            if env
            else (pathlib.Path.home() / ".local" / "share" / "cellsched" / "profiles.sqlite")
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    # ---- lifecycle -------------------------------------------------------

    def _open(self, on_create: Callable[[ProfileStore], str] | None) -> None:
        def create() -> None:
            if on_create is not None:
                sqlitedb.set_meta(self._conn, "seeded", on_create(self))
                self.seeded_now = True

        try:
            sqlitedb.open_schema(self._conn, SCHEMA, self.path, create)
        except sqlitedb.SchemaError as exc:
            raise ProfileStoreError(f"{exc} (use another --db)") from None

    def meta(self) -> dict[str, str]:
        """The store's meta rows (schema_version, and seeded: what seeded it)."""
        return dict(self._conn.execute("SELECT key, value FROM meta ORDER BY key"))

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """One write transaction: several puts commit together or not at all
        (joins the open one when nested)."""
        return sqlitedb.transaction(self._conn)

    def version(self) -> tuple[int, int]:
        """Changes when the store's contents may have: commits of other
        connections (SQLite's data_version) and rows this one changed."""
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0]), self._conn.total_changes

    def close(self) -> None:
        self._conn.close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a simulation's checkpoint) as its path, reopened there
        when unpickled: a file store is a cache that outlives any one run;
        an in-memory store travels with its content."""
        image = self._conn.serialize() if self.path == ":memory:" else None
        return {"path": self.path, "seeded_now": self.seeded_now, "image": image}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path, self.seeded_now = state["path"], state["seeded_now"]
        if state["image"] is not None:
            self._conn = sqlitedb.restore(self.path, state["image"], BUSY_TIMEOUT_S)
        else:
            self._conn = sqlitedb.connect(self.path, BUSY_TIMEOUT_S)

    def __enter__(self) -> ProfileStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ProfileStore({self.path!r})"

    # ---- (a) cell-level --------------------------------------------------

    def put_cells(self, recs: Iterable[CellRecord]) -> int:
        """Insert or replace cell records; returns how many were written."""
        rows = []
        for rec in recs:
            _check_cell(rec)
            plan = (rec.pp, rec.dp, rec.tp) if rec.pp is not None else (0, 0, 0)
            rows.append(
                (
                    rec.model,
                    rec.global_batch,
                    rec.gpu_type,
                    rec.num_nodes,
                    rec.gpus_per_node,
                    *plan,
                    rec.source,
                    rec.iter_time_s,
                )
            )
        with self.transaction():
            self._conn.executemany(
                f"INSERT INTO cells ({_CELL_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT (model, global_batch, gpu_type, num_nodes, gpus_per_node, pp, dp, tp, source) "
                "DO UPDATE SET iter_time_s = excluded.iter_time_s",
                rows,
            )
        return len(rows)

    def cells(
        self, model: str | None = None, global_batch: int | None = None, gpu_type: str | None = None
    ) -> list[CellRecord]:
        """All cell records matching the given filters, in key order."""
        where, args = sqlitedb.where(model=model, global_batch=global_batch, gpu_type=gpu_type)
        rows = self._conn.execute(
            f"SELECT {_CELL_COLS} FROM cells{where} ORDER BY "
            "model, global_batch, gpu_type, num_nodes, gpus_per_node, pp, dp, tp, source",
            args,
        )
        return [_cell(r) for r in rows]

    def cell(
        self,
        model: str,
        global_batch: int,
        gpu_type: str,
        num_nodes: int,
        gpus_per_node: int,
        *,
        plan: tuple[int, int, int] | None = None,
        source: str | None = None,
    ) -> CellRecord | None:
        """One cell's record: the best-plan record (plan=None) or the per-plan
        record of plan=(pp, dp, tp); from `source`, or else the preferred
        source (measured, then arena-optimal, then arena-estimated, then others)."""
        pp, dp, tp = plan if plan is not None else (0, 0, 0)
        where, args = sqlitedb.where(
            model=model,
            global_batch=global_batch,
            gpu_type=gpu_type,
            num_nodes=num_nodes,
            gpus_per_node=gpus_per_node,
            pp=pp,
            dp=dp,
            tp=tp,
            source=source,
        )
        row = self._conn.execute(
            f"SELECT {_CELL_COLS} FROM cells{where} ORDER BY {_SOURCE_ORDER} LIMIT 1", args
        ).fetchone()
        return None if row is None else _cell(row)

    # ---- (b) layer-level and communication -------------------------------

    def put_layers(self, recs: Iterable[LayerRecord]) -> int:
        """Insert or replace layer records; returns how many were written."""
        rows = []
        for rec in recs:
            _check_layer(rec)
            rows.append(tuple(getattr(rec, f.name) for f in fields(LayerRecord)))
        with self.transaction():
            self._conn.executemany(
                f"INSERT INTO layers ({_LAYER_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT (model_sig, gpu_type, tp, micro_batch, layer) DO UPDATE SET "
                "kind = excluded.kind, fwd_s = excluded.fwd_s, bwd_s = excluded.bwd_s, "
                "param_bytes = excluded.param_bytes, act_bytes = excluded.act_bytes, "
                "out_bytes = excluded.out_bytes",
                rows,
            )
        return len(rows)

    def layers(self, model_sig: str, gpu_type: str, tp: int, micro_batch: int) -> list[LayerRecord]:
        """A model's layer profiles on one GPU type at (tp, micro_batch), by layer."""
        rows = self._conn.execute(
            f"SELECT {_LAYER_COLS} FROM layers WHERE model_sig = ? AND gpu_type = ? AND tp = ? "
            "AND micro_batch = ? ORDER BY layer",
            (model_sig, gpu_type, tp, micro_batch),
        )
        return [LayerRecord(*r) for r in rows]

    def layer_keys(self, model_sig: str) -> list[tuple[str, int, int]]:
        """The (gpu_type, tp, micro_batch) combinations profiled for a model."""
        rows = self._conn.execute(
            "SELECT DISTINCT gpu_type, tp, micro_batch FROM layers WHERE model_sig = ? "
            "ORDER BY gpu_type, tp, micro_batch",
            (model_sig,),
        )
        return [tuple(r) for r in rows]

    def layer_models(self) -> list[str]:
        """Model signatures that have layer profiles."""
        return [r[0] for r in self._conn.execute("SELECT DISTINCT model_sig FROM layers ORDER BY model_sig")]

    def put_comm(self, recs: Iterable[CommRecord]) -> int:
        """Insert or replace communication records; returns how many were written."""
        rows = []
        for rec in recs:
            _check_comm(rec)
            rows.append((rec.link, rec.op, rec.nranks, rec.nbytes, rec.time_s))
        with self.transaction():
            self._conn.executemany(
                f"INSERT INTO comm ({_COMM_COLS}) VALUES (?,?,?,?,?) "
                "ON CONFLICT (link, op, nranks, nbytes) DO UPDATE SET time_s = excluded.time_s",
                rows,
            )
        return len(rows)

    def comm(self, link: str, op: str, nranks: int | None = None) -> list[CommRecord]:
        """Timings of one op over one link (optionally among `nranks`), by size."""
        where, args = sqlitedb.where(link=link, op=op, nranks=nranks)
        rows = self._conn.execute(f"SELECT {_COMM_COLS} FROM comm{where} ORDER BY nbytes, nranks", args)
        return [CommRecord(*r) for r in rows]

    def comm_keys(self) -> list[tuple[str, str]]:
        """The (link, op) pairs with communication timings."""
        return [tuple(r) for r in self._conn.execute("SELECT DISTINCT link, op FROM comm ORDER BY link, op")]

    # ---- (c) GPU specs ---------------------------------------------------

    def put_gpu(self, spec: GpuSpec) -> None:
        """Insert or replace one GPU type's datasheet numbers."""
        _check_gpu(spec)
        with self.transaction():
            self._conn.execute(
                f"INSERT INTO gpus ({_GPU_COLS}) VALUES (?,?,?,?,?,?,?) ON CONFLICT (name) DO UPDATE SET "
                "mem_gb = excluded.mem_gb, peak_tflops = excluded.peak_tflops, "
                "mem_bw_gbps = excluded.mem_bw_gbps, intra_link = excluded.intra_link, "
                "intra_bw_gbps = excluded.intra_bw_gbps, inter_bw_gbps = excluded.inter_bw_gbps",
                tuple(getattr(spec, f.name) for f in fields(GpuSpec)),
            )

    def gpu(self, name: str) -> GpuSpec | None:
        row = self._conn.execute(f"SELECT {_GPU_COLS} FROM gpus WHERE name = ?", (name,)).fetchone()
        return None if row is None else GpuSpec(*row)

    def gpus(self) -> dict[str, GpuSpec]:
        return {r[0]: GpuSpec(*r) for r in self._conn.execute(f"SELECT {_GPU_COLS} FROM gpus ORDER BY name")}

    # ---- summary ---------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Rows per table: cells, layers, comm, gpus."""
        return {
            t: self._conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            for t in ("cells", "layers", "comm", "gpus")
        }


# ---- helpers ---------------------------------------------------------------


def _cell(row: tuple[Any, ...]) -> CellRecord:
    model, batch, gpu, nodes, per_node, pp, dp, tp, source, t = row
    if pp == 0:
        pp = dp = tp = None
    return CellRecord(model, batch, gpu, nodes, per_node, t, pp, dp, tp, source)


def _bad(rec: object, field: str, why: str) -> InvalidRecordError:
    return InvalidRecordError(f"{type(rec).__name__}.{field}: {why}, got {getattr(rec, field)!r} in {rec!r}")


def _need(rec: object, cls: type) -> None:
    if not isinstance(rec, cls):
        raise InvalidRecordError(f"expected a {cls.__name__}, got {type(rec).__name__}: {rec!r}")


def _text(rec: object, *names: str) -> None:
    for name in names:
        value = getattr(rec, name)
        if not isinstance(value, str) or not value:
            raise _bad(rec, name, "must be a non-empty string")


def _ints(rec: object, *names: str, minimum: int = 1) -> None:
    for name in names:
        value = getattr(rec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _bad(rec, name, f"must be an integer >= {minimum}")


def _reals(rec: object, *names: str, positive: bool = False) -> None:
    for name in names:
        value = getattr(rec, name)
        ok = (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (value > 0 if positive else value >= 0)
        )
        if not ok:
            raise _bad(rec, name, "must be a finite number " + ("> 0" if positive else ">= 0"))


def _check_cell(rec: CellRecord) -> None:
    _need(rec, CellRecord)
    _text(rec, "model", "gpu_type", "source")
    _ints(rec, "global_batch", "num_nodes", "gpus_per_node")
    if rec.iter_time_s is not None:
        _reals(rec, "iter_time_s", positive=True)
    pp, dp, tp = rec.pp, rec.dp, rec.tp
    if pp is not None or dp is not None or tp is not None:
        _ints(rec, "pp", "dp", "tp")
        assert pp is not None and dp is not None and tp is not None  # _ints refused a None
        if pp * dp * tp != rec.num_gpus:
            raise _bad(rec, "pp", f"pp*dp*tp = {pp * dp * tp} must equal the cell's {rec.num_gpus} GPUs")


def _check_layer(rec: LayerRecord) -> None:
    _need(rec, LayerRecord)
    _text(rec, "model_sig", "gpu_type", "kind")
    _ints(rec, "tp", "micro_batch")
    _ints(rec, "layer", "param_bytes", "act_bytes", "out_bytes", minimum=0)
    _reals(rec, "fwd_s", "bwd_s")


def _check_comm(rec: CommRecord) -> None:
    _need(rec, CommRecord)
    _text(rec, "link", "op")
    _ints(rec, "nranks")
    _ints(rec, "nbytes", minimum=0)
    _reals(rec, "time_s")


def _check_gpu(spec: GpuSpec) -> None:
    _need(spec, GpuSpec)
    _text(spec, "name", "intra_link")
    _reals(spec, "mem_gb", "peak_tflops", "mem_bw_gbps", "intra_bw_gbps", "inter_bw_gbps", positive=True)
