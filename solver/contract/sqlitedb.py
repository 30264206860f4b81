"""The SQLite files of cellsched (the profile store, the controller's state):
one way to open them, version them, migrate them and write to them.

* ``connect``: autocommit connection with a busy timeout; files use WAL. A
  read-only connection also works for users who may read but not write the
  file's directory.
* ``open_schema``: creates a new file's tables (and a ``meta`` table whose
  ``schema_version`` row holds the version), refuses a file from a newer
  cellsched or one that is not ours, and runs the migrations from an older
  version, each under the write lock.
* ``transaction``: ``BEGIN IMMEDIATE`` ... ``COMMIT`` (ROLLBACK on error);
  nested use joins the open one.
* ``where``: a WHERE clause from equality filters and membership lists.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solver.contract.errors import SolverError

VERSION_KEY = "schema_version"
_META = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"


class SchemaError(SolverError):
    """The file is not ours, is from a newer cellsched, or its version row is broken."""


@dataclass(frozen=True)
class Schema:
    """What a file of one kind holds at ``version``.

    kind: names the file in messages ("profile store", "state file").
    create: the statements that make a new file's tables at ``version``.
    migrations: ``{v: fn}``, fn brings a file of version v - 1 to v.
    legacy_version_key: a meta key older files kept their version under.
    """

    kind: str
    version: int
    create: tuple[str, ...]
    migrations: Mapping[int, Callable[[sqlite3.Connection], None]] = field(default_factory=dict)
    legacy_version_key: str | None = None


def connect(path: str | Path, busy_timeout_s: float, *, readonly: bool = False) -> sqlite3.Connection:
    """An autocommit connection to PATH (or ``":memory:"``)."""
    path = str(path)
    if readonly and path != ":memory:":
        return _connect_readonly(path, busy_timeout_s)
    db = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
    db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    if path != ":memory:":
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
    return db


def _wal_files(path: str | Path) -> tuple[Path, Path]:
    """The write-ahead log and shared-memory index beside a WAL-mode database."""
    return Path(f"{path}-wal"), Path(f"{path}-shm")


def remove(path: str | Path) -> None:
    """Remove a database file and its WAL files (none there: nothing to do)."""
    for f in (Path(path), *_wal_files(path)):
        f.unlink(missing_ok=True)


def restore(path: str | Path, image: bytes, busy_timeout_s: float) -> sqlite3.Connection:
    """A connection to PATH holding `image` (``Connection.serialize()``,
    e.g. out of a simulation's checkpoint): the file, and any WAL files it
    had, replaced; ``":memory:"`` holds the image in memory."""
    path = str(path)
    if path == ":memory:":
        db = connect(path, busy_timeout_s)
        db.deserialize(image)
        return db
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    for stale in _wal_files(path):
        stale.unlink(missing_ok=True)
    tmp = Path(f"{path}.restoring")
    tmp.write_bytes(image)
    tmp.replace(path)
    return connect(path, busy_timeout_s)


def _connect_readonly(path: str, busy_timeout_s: float) -> sqlite3.Connection:
    """While a writer runs, its WAL files exist and plain read-only access
    sees everything; once it has stopped (WAL checkpointed into the file and
    removed), a user who cannot write the directory cannot create the WAL
    index, so the file is read as it is on disk (``immutable``), which is then
    complete."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=busy_timeout_s, isolation_level=None)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError:
        db.close()
        db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True, timeout=busy_timeout_s, isolation_level=None)
    db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    return db


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One write transaction; joins the open one when nested."""
    if db.in_transaction:
        yield
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def schema_version(db: sqlite3.Connection, schema: Schema, where: str) -> int | None:
    """The file's version; None for a new (empty) file. SchemaError for a
    database that is not a file of this kind, or a broken version row."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "meta" not in tables:
        if tables - {"sqlite_sequence"}:
            raise SchemaError(
                f"{where} is an SQLite database but not a cellsched {schema.kind} (tables: {', '.join(sorted(tables))})"
            )
        return None
    keys = (VERSION_KEY,) + ((schema.legacy_version_key,) if schema.legacy_version_key else ())
    for key in keys:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        if row is not None:
            try:
                return int(row[0])
            except ValueError:
                raise SchemaError(f"{schema.kind} {where}: bad {key} {row[0]!r}") from None
    raise SchemaError(f"{schema.kind} {where}: meta table has no {VERSION_KEY}")


def set_meta(db: sqlite3.Connection, key: str, value: str) -> None:
    db.execute(
        "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


def open_schema(
    db: sqlite3.Connection, schema: Schema, where: str, on_create: Callable[[], None] | None = None
) -> bool:
    """Bring the file to ``schema.version``: create it when new (then call
    ``on_create`` in the same transaction), migrate it when older. True when
    it was created now."""
    created = False
    version = schema_version(db, schema, where)
    if version is None or version < schema.version:
        with transaction(db):  # re-read under the write lock: another process may have won
            version = schema_version(db, schema, where)
            if version is None:
                db.execute(_META)
                for stmt in schema.create:
                    db.execute(stmt)
                set_meta(db, VERSION_KEY, str(schema.version))
                created = True
                if on_create is not None:
                    on_create()
            elif version < schema.version:
                for v in range(version + 1, schema.version + 1):
                    schema.migrations[v](db)
                set_meta(db, VERSION_KEY, str(schema.version))
                if schema.legacy_version_key:
                    db.execute("DELETE FROM meta WHERE key = ?", (schema.legacy_version_key,))
            version = schema.version if version is None else max(version, schema.version)
    if version > schema.version:
        raise SchemaError(
            f"{schema.kind} {where} has schema version {version}, newer than this cellsched "
            f"understands ({schema.version}); upgrade cellsched"
        )
    return created


def check_readable(db: sqlite3.Connection, schema: Schema, where: str) -> None:
    """A read-only open: the file must be of this kind and not newer."""
    version = schema_version(db, schema, where)
    if version is not None and version > schema.version:
        raise SchemaError(
            f"{schema.kind} {where} has schema version {version}, newer than this cellsched "
            f"understands ({schema.version}); upgrade cellsched"
        )


def where(
    conditions: Iterable[str] = (), *, any_of: Mapping[str, Iterable[Any] | None] | None = None, **equals: Any
) -> tuple[str, tuple[Any, ...]]:
    """`` WHERE ...`` (with a leading space; "" when nothing is asked) and its
    parameters: the raw `conditions`, ``column = ?`` for each of `equals` that
    is not None, and ``column IN (...)`` for each of `any_of` that is not None
    (one JSON parameter, any count)."""
    parts, args = list(conditions), []
    for column, value in equals.items():
        if value is not None:
            parts.append(f"{column} = ?")
            args.append(value)
    for column, values in (any_of or {}).items():
        if values is not None:
            parts.append(f"{column} IN (SELECT value FROM json_each(?))")
            args.append(json.dumps(list(values)))
    return (" WHERE " + " AND ".join(parts) if parts else ""), tuple(args)
