"""benchmarks/scenarios.py: scenarios that nobody picked by hand, generated from
a seed, that the simulator accepts, and ratios taken over the jobs both runs
finished.

Oracles: the simulator's own cluster loader, the shipped Philly trace read
here with csv, and ratios and quantiles worked out by hand."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from support import ROOT

from slurm_ext.sim.clusterspec import load_cluster_spec
from solver.contract.profiles.arena import TRACE_FILE, shipped_path

SCRIPT = ROOT / "benchmarks" / "scenarios.py"


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scenarios", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["scenarios"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


S = _benchmark()


def test_a_seed_gives_one_scenario_and_the_held_out_seeds_give_thirty_different_ones():
    assert S.generate(1003) == S.generate(1003)
    held = [S.generate(s) for s in S.HELD_OUT]
    assert len(held) == 30 and len({(s.groups, s.nic_gbps, s.jobs, s.load) for s in held}) == 30
    assert not set(S.HELD_OUT) & set(range(100))  # tuning seeds stay below


@pytest.mark.parametrize("seed", [1000, 1007, 1013, 1021, 7])
def test_the_generated_cluster_loads_and_the_trace_fits_it(seed, tmp_path: Path):
    scn = S.generate(seed)
    (tmp_path / "c.toml").write_text(scn.cluster_toml())
    spec = load_cluster_spec(tmp_path / "c.toml")
    assert spec.total_gpus == scn.total_gpus
    assert 2 <= len({g.gpu_type for g in spec.groups}) <= 4
    assert all(g.nic_gbps == scn.nic_gbps for g in spec.groups) or scn.nic_gbps is None
    with open(shipped_path(TRACE_FILE), newline="") as f:
        philly = {r["job_id"]: r for r in csv.DictReader(f)}
    rows, share = S.trace_rows(scn, S.philly())
    assert len(rows) == scn.jobs and 0 < share <= 1
    times = [float(r["submission_time"]) for r in rows]
    assert times == sorted(times)
    per_type = {
        t: sum(g.count * g.gpus_per_node for g in spec.groups if g.gpu_type == t)
        for t in {g.gpu_type for g in spec.groups}
    }
    for r in rows:
        orig = philly[r["job_id"]]
        assert r["model_name"] == orig["model_name"] and r["num_iteration"] == orig["num_iteration"]
        assert r["gpu_type"] in per_type and 1 <= int(r["num_gpu"]) <= min(
            int(orig["num_gpu"]), per_type[r["gpu_type"]]
        )


def _doc(on: dict[str, float | None], off: dict[str, float | None]) -> dict:
    def jobs(jct: dict[str, float | None]) -> list[dict]:
        return [{"job_id": j, "jct": t, "finished": t is not None, "cells": ["a100:2x4:pp1"]} for j, t in jct.items()]

    return {"runs": {"cellsched": {"jobs": jobs(on)}, S.FEATURES["calibration"]: {"jobs": jobs(off)}}}


def test_a_ratio_is_over_the_jobs_both_runs_finished():
    scn = S.generate(1000)
    # on: a 10, b 30, c unfinished; off: a 20, b 20, c 1000 -> common a, b: (10 + 30) / (20 + 20)
    (row,) = S.ratios(scn, _doc({"a": 10.0, "b": 30.0, "c": None}, {"a": 20.0, "b": 20.0, "c": 1000.0}))
    assert row["feature"] == "calibration" and row["ratio"] == 1.0 and row["jobs_common"] == 2
    (row,) = S.ratios(scn, _doc({"a": 10.0, "b": 10.0}, {"a": 20.0, "b": 20.0}))
    assert row["ratio"] == 0.5 and row["multi_node"] is True


def test_noise_seeds_pool_the_pairs_both_runs_finished_and_contention_rows_give_the_loss_to_links():
    scn = S.generate(1000)
    assert [S.noise_seed(scn, k) for k in range(3)] == [1000, 101000, 201000]
    first = _doc({"a": 10.0, "b": None}, {"a": 20.0, "b": 40.0})
    second = _doc({"a": 30.0, "b": 50.0}, {"a": 20.0, "b": 20.0})
    # pairs both finished: (1, a), (2, a), (2, b): (10 + 30 + 50) / (20 + 20 + 20)
    (row,) = S.ratios(scn, [first, second])
    assert row["ratio"] == 1.5 and row["jobs_common"] == 3 and row["noise_seeds"] == 2
    assert row["finished_on"] == 3 and row["finished_off"] == 4

    def jobs(jct: dict[str, tuple[float, float]]) -> list[dict]:
        return [
            {"job_id": j, "jct": t, "finished": True, "cells": ["a100:2x4:pp1"], "contended_s": c}
            for j, (t, c) in jct.items()
        ]

    doc = {
        "runs": {
            "cellsched": {"jobs": jobs({"a": (100.0, 5.0), "b": (300.0, 15.0)})},
            S.FEATURES["contention"]: {"jobs": jobs({"a": (100.0, 20.0), "b": (100.0, 0.0)})},
        }
    }
    (row,) = S.ratios(scn, doc)
    assert row["feature"] == "contention" and row["ratio"] == 2.0
    assert row["contended_on"] == 0.05 and row["contended_off"] == 0.1  # 20 of 400 s; 20 of 200 s
    by = {s["feature"]: s for s in S.summary([row])}
    assert by["contention"]["lost_to_links_off_median"] == 0.1
    # results of a simulator that did not record the loss give none
    (row,) = S.ratios(scn, _doc({"a": 1.0}, {"a": 1.0}))
    assert "contended_off" not in row and S.lost_share([(1.0, float("nan"))]) is None


def test_quantiles_and_the_summary_by_hand():
    assert S.pct([4.0, 1.0, 3.0, 2.0, 5.0], 0.1) == pytest.approx(1.4)  # 0.1 x 4 = 0.4 of the way from 1 to 2
    assert S.pct([1.0, 2.0], 0.9) == pytest.approx(1.9)
    rows = [
        {"feature": "contention", "ratio": r, "nic_gbps": nic, "multi_node": True}
        for r, nic in [(0.9, 10.0), (1.02, 100.0), (1.0, 25.0)]
    ]
    by = {s["feature"]: s for s in S.summary(rows)}
    assert by["contention"]["median"] == 1.0 and by["contention"]["worst"] == 1.02
    assert by["contention"]["worse_than_off_by_1pct"] == 1
    slow = by["contention (10-25 Gb/s, multi-node)"]
    assert slow["scenarios"] == 2 and slow["median"] == pytest.approx(0.95) and slow["worst"] == 1.0


def test_seed_ranges_and_unknown_features(capsys):
    assert S.seeds_of("1000-1002,7") == [1000, 1001, 1002, 7]
    with pytest.raises(SystemExit):
        S.main(["--out", "/nonexistent", "--features", "speed"])
    assert "unknown feature 'speed'" in capsys.readouterr().err


def test_all_runs_every_feature_but_the_null_change():
    scn = S.generate(1000)
    assert S.FEATURES["null"] not in S.variants(scn, list(S.ALL))
    assert S.variants(scn, ["null"]) == ["cellsched", "cellsched:age_scale_s=3601"]
