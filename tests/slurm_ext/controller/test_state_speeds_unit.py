"""The newest speed rows, which calibration reads every round, are kept
between reads by the state store and brought up to date by its own writes.
Whatever writes the file (this store alone or inside a batch, a batch
rolled back, another connection, a job's rows retired, a clock set back),
they must be what a fresh read of the file answers: the oracle is a second
connection's query, not the store."""

from __future__ import annotations

import dataclasses
import random
import sqlite3

import pytest

from slurm_ext.state import SpeedRow, StateStore

LIMIT = 6
SPEC = '{"global_batch":64,"iterations":10,"model":"gpt-350m","version":1}'


def fresh(path, limit: int) -> list[tuple]:
    """The `limit` newest rows, read by another connection."""
    with sqlite3.connect(path) as db:
        return db.execute(
            "SELECT job_id, gpu_type, user, model, cell, estimated_s, observed_s, ratio, samples, calibrated_s, "
            "updated FROM speeds ORDER BY updated DESC, job_id, gpu_type LIMIT ?",
            (limit,),
        ).fetchall()


def as_tuples(rows: list[SpeedRow]) -> list[tuple]:
    return [dataclasses.astuple(r) for r in rows]


def row(rng: random.Random, now: float) -> SpeedRow:
    job, gpu = str(rng.randrange(10)), rng.choice(("a100", "v100", "a40"))
    ratio = round(rng.uniform(0.5, 2.0), 3)
    return SpeedRow(job, gpu, "u", "gpt-350m", f"{gpu}:1x2:pp1", 1.0, ratio, ratio, rng.randrange(1, 9), None, now)


@pytest.mark.parametrize("seed", range(8))
def test_the_newest_speeds_kept_are_the_files(tmp_path, seed):
    rng = random.Random(seed)
    path = tmp_path / "state.sqlite"
    now = 100.0
    with StateStore(path) as st:
        for j in range(10):
            st.accept_spec(str(j), "u", SPEC, "comment", 1.0)
        kinds = ("own", "own", "own", "batch", "rolled back", "other", "retire", "set back", "limit")
        for step in range(120):
            kind = rng.choice(kinds)
            now += rng.choice((0.0, 1.0, 5.0))  # ties in `updated` too
            rows = [row(rng, now) for _ in range(rng.randrange(0, 4))]
            if kind in ("own", "limit"):
                st.record_speeds(rows)
            elif kind == "batch":
                with st.batch():
                    st.record_speeds(rows)
            elif kind == "rolled back":
                with pytest.raises(RuntimeError), st.batch():
                    st.record_speeds(rows)
                    raise RuntimeError("a later write of the round failed")
            elif kind == "other":
                with sqlite3.connect(path) as db:
                    db.executemany(
                        "INSERT OR REPLACE INTO speeds VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", as_tuples(rows)
                    )
            elif kind == "retire":
                st.retire(str(rng.randrange(10)))
                st.accept_spec(str(rng.randrange(10)), "u", SPEC, "comment", now)
            else:  # a clock set back: rows older than the ones kept
                st.record_speeds([row(rng, now - rng.uniform(50, 500)) for _ in range(2)])
            limit = LIMIT + (step % 3 if kind == "limit" else 0)
            assert as_tuples(st.speeds(limit=limit)) == fresh(path, limit), (step, kind)
            assert as_tuples(st.speeds(limit=limit)) == fresh(path, limit), (step, kind)  # kept, not read
