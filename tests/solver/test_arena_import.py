"""Arena data: import counts and values match the shipped source files."""

from __future__ import annotations

import csv
import json

import pytest

from solver.contract.profiles.arena import (
    ArenaFormatError,
    load_cluster_spec,
    load_dp_mem,
    load_sim_constants,
    shipped_path,
)
from solver.contract.profiles.arena_import import import_arena
from solver.contract.profiles.records import ProfileSource
from solver.contract.profiles.store import ProfileStore


@pytest.fixture
def store():
    with ProfileStore(":memory:") as s:
        yield s


def test_optimal_import_matches_source(store):
    source = json.loads(shipped_path("profiles_optimal.json").read_text())["records"]
    report = import_arena(store, shipped_path("profiles_optimal.json"))
    assert (report.kind, report.imported, report.skipped) == (ProfileSource.ARENA_OPTIMAL, 329, {})
    recs = store.cells()
    assert len(recs) == len(source) == 329
    assert sum(r.oom for r in recs) == sum(r["status"] == "oom" for r in source) == 11
    assert all(r.source == ProfileSource.ARENA_OPTIMAL and r.pp is None for r in recs)
    moe = store.cell("moe__2.4B", 256, "a40", 4, 2)
    assert moe.iter_time_s == pytest.approx(6.482, abs=5e-4)
    # kept as is even though over one 300 s scheduling interval
    assert store.cell("wide_resnet__6.8B", 512, "a40", 4, 2).iter_time_s == pytest.approx(357.2306, abs=1e-3)
    assert store.cell("moe__10B", 256, "a100", 2, 4).iter_time_s == pytest.approx(2.634, abs=5e-4)


def test_estimated_import_keeps_simulator_convention(store):
    report = import_arena(store, shipped_path("profiles_plans_estimated.json"))
    assert report.kind == ProfileSource.ARENA_ESTIMATED
    assert report.imported == 1944
    assert report.skipped == {
        "comm_profile_prefix != num_nodes": 104,
        "duplicate plan (dup_index > 0)": 180,
        "unlabelled infeasible": 8,
    }
    recs = store.cells()
    assert len(recs) == 1944
    assert all(r.pp * r.dp * r.tp == r.num_gpus and r.source == ProfileSource.ARENA_ESTIMATED for r in recs)
    assert not {r.gpu_type for r in recs} & {"v100"}
    assert store.cell("moe__2.4B", 512, "a100", 1, 2, plan=(1, 2, 1)).iter_time_s == pytest.approx(9.242, abs=5e-4)
    assert store.cell("moe__2.4B", 512, "a100", 1, 2, plan=(1, 1, 2)).iter_time_s == pytest.approx(11.661, abs=5e-4)
    assert store.cell("moe__2.4B", 512, "a100", 1, 2) is None  # no best-plan record from this file


def test_import_is_idempotent(store):
    first = [import_arena(store, shipped_path(n)) for n in ("profiles_optimal.json", "profiles_plans_estimated.json")]
    count = store.counts()["cells"]
    second = [import_arena(store, shipped_path(n)) for n in ("profiles_optimal.json", "profiles_plans_estimated.json")]
    assert first == second
    assert store.counts()["cells"] == count == 329 + 1944


def test_bad_arena_files_are_named(store, tmp_path):
    bad = tmp_path / "opt.json"
    rec = json.loads(shipped_path("profiles_optimal.json").read_text())["records"][0]
    del rec["batch_size"]
    bad.write_text(json.dumps({"records": [rec]}))
    with pytest.raises(ArenaFormatError, match=r"records\[0\]: missing field 'batch_size'"):
        import_arena(store, bad)
    bad.write_text(json.dumps({"records": [{"foo": 1}]}))
    with pytest.raises(ArenaFormatError, match="not an Arena profile file"):
        import_arena(store, bad)
    bad.write_text("{\n  oops")
    with pytest.raises(ArenaFormatError, match="line 2"):
        import_arena(store, bad)
    assert store.cells() == []


def test_loaders():
    dp = load_dp_mem()
    assert dp[("wide_resnet__500M", 256)][1] == pytest.approx(24.519)
    assert dp[("wide_resnet__500M", 512)][1] is None
    assert load_cluster_spec() == {"a100": (80, 4), "v100": (20, 16), "a40": (160, 2), "a10": (160, 2)}
    consts = load_sim_constants()
    assert consts["SCHEDULING_INTERVAL"] == 300 and consts["PARAM_NUM_SCALE_FACTOR"] == 1.8
    with open(shipped_path("traces/simulate_trace_philly.csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 1938 and rows[0]["model_name"] == "bert__2.6B"
    assert "NOTICE" in shipped_path("README.md").read_text().splitlines()[0]
    assert shipped_path("LICENSE-arena").stat().st_size > 10_000
    with pytest.raises(FileNotFoundError, match="nope.json"):
        shipped_path("nope.json")
