"""The one SQLite helper of both stores: create, version, migrate, refuse."""

import sqlite3

import pytest

from solver.contract import sqlitedb

V1 = sqlitedb.Schema("test file", 1, ("CREATE TABLE t (a INTEGER)",))


def _add_b(db):
    db.execute("ALTER TABLE t ADD COLUMN b INTEGER")


V2 = sqlitedb.Schema(
    "test file", 2, ("CREATE TABLE t (a INTEGER, b INTEGER)",), {2: _add_b}, legacy_version_key="schema"
)


def test_create_then_open_again(tmp_path):
    path = tmp_path / "f.sqlite"
    seen = []
    db = sqlitedb.connect(path, 5.0)
    assert sqlitedb.open_schema(db, V2, str(path), lambda: seen.append("created")) is True
    assert seen == ["created"] and db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert sqlitedb.open_schema(db, V2, str(path), lambda: seen.append("again")) is False and seen == ["created"]
    assert dict(db.execute("SELECT key, value FROM meta")) == {"schema_version": "2"}


def test_migrates_an_older_file_under_its_legacy_version_key(tmp_path):
    path = tmp_path / "f.sqlite"
    db = sqlitedb.connect(path, 5.0)
    sqlitedb.open_schema(db, V1, str(path))
    db.execute("INSERT INTO t VALUES (7)")
    db.execute("UPDATE meta SET key = 'schema'")  # how older files kept their version
    assert sqlitedb.open_schema(db, V2, str(path)) is False
    assert db.execute("SELECT a, b FROM t").fetchall() == [(7, None)]
    assert dict(db.execute("SELECT key, value FROM meta")) == {"schema_version": "2"}


def test_a_failed_migration_leaves_the_file_as_it_was(tmp_path):
    path = tmp_path / "f.sqlite"
    db = sqlitedb.connect(path, 5.0)
    sqlitedb.open_schema(db, V1, str(path))

    def broken(db):
        _add_b(db)
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        sqlitedb.open_schema(db, sqlitedb.Schema("test file", 2, V2.create, {2: broken}), str(path))
    assert [r[1] for r in db.execute("PRAGMA table_info(t)")] == ["a"]
    assert sqlitedb.schema_version(db, V1, str(path)) == 1


def test_refuses_newer_and_foreign_files(tmp_path):
    newer = tmp_path / "newer.sqlite"
    sqlitedb.open_schema(sqlitedb.connect(newer, 5.0), V2, str(newer))
    with pytest.raises(sqlitedb.SchemaError, match="schema version 2, newer than this cellsched understands .1."):
        sqlitedb.open_schema(sqlitedb.connect(newer, 5.0), V1, str(newer))
    with pytest.raises(sqlitedb.SchemaError, match="newer"):
        sqlitedb.check_readable(sqlitedb.connect(newer, 5.0, readonly=True), V1, str(newer))
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE users (name TEXT)")
    with pytest.raises(sqlitedb.SchemaError, match="not a cellsched test file .tables: users."):
        sqlitedb.open_schema(sqlitedb.connect(other, 5.0), V1, str(other))


def test_transaction_rolls_back_and_nests():
    db = sqlitedb.connect(":memory:", 5.0)
    sqlitedb.open_schema(db, V1, ":memory:")
    with pytest.raises(ValueError):
        with sqlitedb.transaction(db):
            db.execute("INSERT INTO t VALUES (1)")
            with sqlitedb.transaction(db):  # joins
                db.execute("INSERT INTO t VALUES (2)")
            raise ValueError
    assert db.execute("SELECT count(*) FROM t").fetchone()[0] == 0 and not db.in_transaction


def test_where():
    assert sqlitedb.where() == ("", ())
    assert sqlitedb.where(a=1, b=None) == (" WHERE a = ?", (1,))
    text, args = sqlitedb.where(("done = 0",), any_of={"id": ["1", "2"], "x": None}, a=3)
    assert text == " WHERE done = 0 AND a = ? AND id IN (SELECT value FROM json_each(?))" and args == (3, '["1", "2"]')
    db = sqlitedb.connect(":memory:", 5.0)
    db.execute("CREATE TABLE j (id TEXT)")
    db.executemany("INSERT INTO j VALUES (?)", [("1",), ("2",), ("3",)])
    text, args = sqlitedb.where(any_of={"id": ["1", "3"]})
    assert db.execute(f"SELECT id FROM j{text} ORDER BY id", args).fetchall() == [("1",), ("3",)]
