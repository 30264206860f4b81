"""benchmarks/multitenant.py's measures on a hand-made run record: largest
deviation of used from entitled share, Jain's index, JCT over the jobs every
policy finished and per account, and the target's verdict."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from support import ROOT

SCRIPT = ROOT / "benchmarks" / "multitenant.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("multitenant_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def site(used: tuple[float, float], entitled: tuple[float, float]) -> dict:
    return {
        a: {
            "share": 0.5,
            "peak_gpus": 4,
            "held_back_starts": 0,
            "used_frac": u,
            "entitled_frac": e,
            "entitled_gpu_s": e,
        }
        for a, u, e in zip(("a", "b"), used, entitled, strict=True)
    }


def job(jid: str, jct: float | None) -> dict:
    return {"job_id": jid, "finished": jct is not None, "jct": jct}


def test_measures_of_a_run(tmp_path: Path):
    mt = load()
    assert mt.jain([1.0, 1.0, 1.0]) == 1.0
    assert mt.jain([2.0, 0.0]) == 0.5  # (2 + 0)^2 / (2 * 4)
    doc = {
        "meta": {"wall_s": 1.0},
        "summary": {"cellsched": {"restarts": 3}, "slurm-multifactor": {"restarts": 0}},
        "runs": {
            # used 0.6 / 0.4 against 0.5 / 0.5: deviation 0.1, Jain (1.2 + 0.8)^2 / (2 (1.44 + 0.64)) = 4 / 4.16
            "cellsched": {"meta": {"site": site((0.6, 0.4), (0.5, 0.5))}, "jobs": [job("1", 10), job("2", 30)]},
            "slurm-multifactor": {
                "meta": {"site": site((0.8, 0.2), (0.5, 0.5))},
                "jobs": [job("1", 50), job("2", None)],
            },
        },
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    rows, summary = mt.numbers(path, {"1": "a", "2": "b"})
    cs, sm = rows
    assert cs["max_share_deviation"] == pytest.approx(0.1) and sm["max_share_deviation"] == pytest.approx(0.3)
    assert cs["jain"] == pytest.approx(round(4 / 4.16, 4))
    assert (cs["avg_jct_s"], cs["avg_jct_common_s"], sm["avg_jct_common_s"]) == (20.0, 10.0, 50.0)
    assert cs["accounts"]["b"]["avg_jct_s"] == 30.0 and sm["accounts"]["b"]["avg_jct_s"] is None
    assert summary["jct_ratio_cellsched_vs_slurm"] == 0.2 and summary["target_met"] is True
    assert "| cellsched | 2/2 | 20 | 10 | 0.100 |" in mt.markdown(rows)


def test_the_summary_of_a_run_with_the_rigid_variant(tmp_path: Path):
    """`cellsched:rigid=true` is a row of its own; the summary compares plain
    cellsched when given, else the rigid variant, and gives each variant's ratio."""
    mt = load()
    runs = {
        "cellsched": {"meta": {"site": site((0.5, 0.5), (0.5, 0.5))}, "jobs": [job("1", 10)]},
        "cellsched:rigid=true": {"meta": {"site": site((0.6, 0.4), (0.5, 0.5))}, "jobs": [job("1", 45)]},
        "slurm-multifactor": {"meta": {"site": site((0.8, 0.2), (0.5, 0.5))}, "jobs": [job("1", 50)]},
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"meta": {}, "summary": {p: {"restarts": 0} for p in runs}, "runs": runs}))
    _, both = mt.numbers(path, {"1": "a"})
    assert (both["cellsched_row"], both["jct_ratio_cellsched_vs_slurm"]) == ("cellsched", 0.2)
    assert both["jct_ratios_vs_slurm"] == {"cellsched": 0.2, "cellsched:rigid=true": 0.9}
    del runs["cellsched"]
    path.write_text(json.dumps({"meta": {}, "summary": {p: {"restarts": 0} for p in runs}, "runs": runs}))
    rows, rigid = mt.numbers(path, {"1": "a"})
    assert [r["policy"] for r in rows] == ["cellsched:rigid=true", "slurm-multifactor"]
    assert (rigid["cellsched_row"], rigid["jct_ratio_cellsched_vs_slurm"], rigid["target_met"]) == (
        "cellsched:rigid=true",
        0.9,
        False,
    )
    assert rigid["deviation_at_most_slurms"] is True
