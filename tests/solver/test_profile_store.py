"""The SQLite profile store: round-trips, lookups, concurrency, schema, seeding."""

from __future__ import annotations

import sqlite3

import pytest

from solver.contract.profiles.records import CellRecord, CommRecord, GpuSpec, LayerRecord
from solver.contract.profiles.seed import open_store
from solver.contract.profiles.store import InvalidRecordError, ProfileStore, ProfileStoreError

CELL = CellRecord("gpt-1.3b", 64, "a100", 2, 4, 1.25, source="measured")


@pytest.fixture
def store():
    with ProfileStore(":memory:") as s:
        yield s


def test_cell_round_trip_and_upsert(store):
    plan = CellRecord("gpt-1.3b", 64, "a100", 2, 4, 1.5, pp=2, dp=2, tp=2, source="measured")
    oom = CellRecord("gpt-1.3b", 64, "a10", 1, 1, None, source="measured")
    assert store.put_cells([CELL, plan, oom]) == 3
    assert store.cell("gpt-1.3b", 64, "a100", 2, 4) == CELL
    assert store.cell("gpt-1.3b", 64, "a100", 2, 4, plan=(2, 2, 2)) == plan
    assert store.cell("gpt-1.3b", 64, "a100", 2, 4, plan=(1, 4, 2)) is None
    assert store.cell("gpt-1.3b", 64, "a10", 1, 1).oom
    store.put_cells([CellRecord("gpt-1.3b", 64, "a100", 2, 4, 1.0, source="measured")])
    assert store.cell("gpt-1.3b", 64, "a100", 2, 4).iter_time_s == 1.0
    assert len(store.cells()) == 3
    assert [r.gpu_type for r in store.cells(gpu_type="a10")] == ["a10"]
    assert store.cells(model="other") == []


def test_best_plan_prefers_measured_unless_source_given(store):
    arena = CellRecord("bert__1.3B", 128, "a40", 1, 2, 12.75, source="arena-optimal")
    store.put_cells([arena])
    assert store.cell("bert__1.3B", 128, "a40", 1, 2) == arena
    measured = CellRecord("bert__1.3B", 128, "a40", 1, 2, 11.0, source="measured")
    store.put_cells([measured])
    assert store.cell("bert__1.3B", 128, "a40", 1, 2) == measured
    assert store.cell("bert__1.3B", 128, "a40", 1, 2, source="arena-optimal") == arena
    assert len(store.cells(model="bert__1.3B")) == 2


def test_layers_comm_gpus_round_trip(store):
    layers = [LayerRecord("sig", "a100", 2, 4, i, "block", 0.01 * (i + 1), 0.02, 10, 20, 30) for i in (2, 0, 1)]
    assert store.put_layers(layers) == 3
    assert store.layers("sig", "a100", 2, 4) == sorted(layers, key=lambda r: r.layer)
    assert store.layers("sig", "a100", 1, 4) == []
    store.put_layers([LayerRecord("sig", "v100", 1, 8, 0, "embed", 0.1, 0.2, 1, 2, 3)])
    assert store.layer_keys("sig") == [("a100", 2, 4), ("v100", 1, 8)]
    assert store.layer_models() == ["sig"]

    comm = [CommRecord("nvlink", "allreduce", 4, n, n / 1e11) for n in (1 << 20, 1 << 10, 1 << 30)]
    comm.append(CommRecord("nvlink", "allreduce", 8, 1 << 10, 1e-5))
    assert store.put_comm(comm) == 4
    got = store.comm("nvlink", "allreduce", 4)
    assert [r.nbytes for r in got] == [1 << 10, 1 << 20, 1 << 30] and got[0] == comm[1]
    assert len(store.comm("nvlink", "allreduce")) == 4
    assert store.comm("net", "allreduce") == []
    assert store.comm_keys() == [("nvlink", "allreduce")]

    spec = GpuSpec("x1", 24.0, 100.0, 900.0, "pcie", 32.0, 12.5)
    store.put_gpu(spec)
    assert store.gpu("x1") == spec and store.gpus() == {"x1": spec}
    assert store.gpu("nope") is None
    assert store.counts() == {"cells": 0, "layers": 4, "comm": 4, "gpus": 1}


@pytest.mark.parametrize(
    "rec, field",
    [
        (CellRecord("m", 0, "a100", 1, 1, 1.0), "global_batch"),
        (CellRecord("m", 8, "", 1, 1, 1.0), "gpu_type"),
        (CellRecord("m", 8, "a100", 1, 1, -1.0), "iter_time_s"),
        (CellRecord("m", 8, "a100", 1, 2, 1.0, pp=1, dp=1, tp=1), "pp"),
        (CellRecord("m", 8, "a100", 1, 2, 1.0, pp=1, dp=None, tp=2), "dp"),
        (LayerRecord("s", "a100", 0, 1, 0, "b", 0.1, 0.1, 1, 1, 1), "tp"),
        (LayerRecord("s", "a100", 1, 1, 0, "b", float("nan"), 0.1, 1, 1, 1), "fwd_s"),
        (CommRecord("nvlink", "p2p", 2, -1, 0.1), "nbytes"),
        (GpuSpec("g", 0.0, 1.0, 1.0), "mem_gb"),
    ],
)
def test_bad_records_name_their_field_and_write_nothing(store, rec, field):
    put = {
        CellRecord: store.put_cells,
        LayerRecord: store.put_layers,
        CommRecord: store.put_comm,
        GpuSpec: lambda r: store.put_gpu(r[0]),
    }[type(rec)]
    with pytest.raises(InvalidRecordError, match=rf"\.{field}:"):
        put([rec])
    assert store.counts() == {"cells": 0, "layers": 0, "comm": 0, "gpus": 0}


def test_failed_batch_writes_nothing(store):
    with pytest.raises(InvalidRecordError):
        store.put_cells([CELL, CellRecord("m", 8, "a100", 1, 1, 0.0)])
    assert store.cells() == []


def test_reader_reads_while_writer_writes(tmp_path):
    path = tmp_path / "p.sqlite"
    with ProfileStore(path) as writer, ProfileStore(path) as reader:
        writer.put_cells([CELL])
        with writer.transaction():
            writer.put_cells([CellRecord("gpt-1.3b", 128, "a100", 2, 4, 2.5)])
            # the open write transaction neither blocks the reader nor shows it half-done
            assert reader.cells() == [CELL]
        assert len(reader.cells()) == 2
        assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_rejects_newer_schema_and_foreign_files(tmp_path):
    path = tmp_path / "p.sqlite"
    ProfileStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(ProfileStoreError, match="schema version 99"):
        open_store(path)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(ProfileStoreError, match="not a cellsched profile store"):
        open_store(other)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ProfileStoreError, match="junk.sqlite"):
        open_store(junk)
    with pytest.raises(ProfileStoreError, match="does not exist"):
        open_store(tmp_path / "missing" / "p.sqlite")


def test_seeds_a_new_store_once(tmp_path):
    path = tmp_path / "p.sqlite"
    with open_store(path) as store:
        assert store.seeded_now
        assert "arena-optimal=329" in store.meta()["seeded"]
        counts = store.counts()
        assert counts["cells"] == 329 + 1944
        assert set(store.gpus()) == {"a100", "v100", "a40", "a10", "h100", "h200", "cpu"}
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM cells")
    with open_store(path) as store:  # emptied on purpose: stays empty
        assert not store.seeded_now
        assert store.cells() == []
    with ProfileStore(tmp_path / "bare.sqlite") as bare:
        assert bare.counts()["cells"] == 0 and "seeded" not in bare.meta()


def test_seeded_gpu_specs():
    with open_store(":memory:") as store:
        a100, a40 = store.gpu("a100"), store.gpu("a40")
    assert (a100.mem_gb, a100.mem_bw_gbps, a100.peak_tflops, a100.intra_link) == (40.0, 1935.0, 312.0, "nvlink")
    assert (a40.mem_gb, a40.peak_tflops, a40.intra_link, a40.inter_bw_gbps) == (48.0, 149.7, "pcie", 12.5)


def test_default_path_honours_env(tmp_path, monkeypatch):
    target = tmp_path / "sub" / "x.sqlite"
    monkeypatch.setenv("CELLSCHED_PROFILES", str(target))
    assert ProfileStore.default_path() == target and target.parent.is_dir()
    monkeypatch.delenv("CELLSCHED_PROFILES")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ProfileStore.default_path() == tmp_path / ".local/share/cellsched/profiles.sqlite"
