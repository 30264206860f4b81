"""Arena's simulator lookup: the worked examples of Arena's README
(solver/data/arena/README.md), OOM, the 300 s limit, pp > 1, and the
baselines' dp_mem feasibility rule."""

from __future__ import annotations

import json
import math

import pytest

from solver.arena.lookup import ArenaTable, arena_dp_feasible
from solver.contract.models import get_model
from solver.contract.profiles.arena import ArenaFormatError, load_device_specs, shipped_path
from solver.types import Cell, EstimateSource, JobRequest


@pytest.fixture(scope="module")
def table() -> ArenaTable:
    return ArenaTable()


def job(model: str, batch: int) -> JobRequest:
    return JobRequest("j1", get_model(model), batch, 100, runtime="adaptive")


def test_exact_entry_moe_2_4b(table):
    assert table.iter_time("moe__2.4B", 256, "a40", 4, 2) == 6.482
    est = table.estimate(job("moe__2.4B", 256), Cell("a40", 4, 2))
    assert est.feasible and est.iter_time_s == 6.482 and est.source == EstimateSource.ARENA_TABLE == "arena-table"
    assert (est.plan.pp, est.plan.dp, est.plan.tp) == (1, 8, 1)
    assert "best plan" in est.note


def test_relaxed_locality_moe_10b(table):
    # no 4x2 entry; best locality 2x4 = 2.634 s -> 97.183 x 0.9 samples/s
    assert table.iter_time("moe__10B", 256, "a100", 2, 4) == 2.634
    t, how = table.lookup("moe__10B", 256, "a100", 4, 2)
    assert t == 2.927 and "best locality 2x4" in how
    # one more halving of GPUs per node: 0.9^2
    assert table.iter_time("moe__10B", 256, "a100", 8, 1) == round(256 / (97.183 * 0.81), 3)


def test_grown_param_num_wide_resnet_1b(table):
    # the 1B/1024 entry is empty; 2B B=1024 8x2 = 52.155 s -> 19.634 x 1.8
    t, how = table.lookup("wide_resnet__1B", 1024, "a40", 8, 2)
    assert t == 28.975 and "wide_resnet__2B" in how
    est = table.estimate(job("wide-resnet-1b", 1024), Cell("a40", 8, 2))  # alias resolves to the trace name
    assert est.iter_time_s == 28.975


def test_oom_is_infeasible(table):
    assert table.iter_time("bert__15B", 256, "v100", 1, 16) is None
    est = table.estimate(job("bert__15B", 256), Cell("v100", 1, 16))
    assert not est.feasible and math.isinf(est.iter_time_s) and "out of memory" in est.note


def test_over_one_interval_is_rejected(table):
    raw = [
        r
        for r in json.loads(shipped_path("profiles_optimal.json").read_text())["records"]
        if r["trace_model_name"] == "wide_resnet__6.8B"
        and r["batch_size"] == 512
        and r["gpu_type"] == "a40"
        and r["num_nodes"] == 4
    ]
    assert raw[0]["iter_time_s"] > 300
    t, how = table.lookup("wide_resnet__6.8B", 512, "a40", 4, 2)
    assert t is None and "exceeds" in how


def test_unprofiled_model_and_pp_are_infeasible(table):
    assert table.iter_time("gpt-1.3b", 128, "a100", 1, 4) is None
    est = table.estimate(job("moe__2.4B", 256), Cell("a40", 4, 2, pp=2))
    assert not est.feasible and est.plan is None and "pp=2" in est.note


def test_wrong_file_kind_names_the_file(tmp_path):
    bad = tmp_path / "est.json"
    bad.write_text(json.dumps({"records": [{"comm_profile_prefix": 1, "dup_index": 0}]}))
    with pytest.raises(ArenaFormatError, match="est.json"):
        ArenaTable(bad)


def test_device_memory_matches_readme():
    specs = load_device_specs()["simulator_gpu_specs"]
    assert {g: specs[g]["max_mem_gb"] for g in ("a100", "v100", "a40", "a10")} == {
        "a100": 40,
        "v100": 32,
        "a40": 48,
        "a10": 24,
    }


def test_dp_feasibility_rules():
    feasible = arena_dp_feasible()
    wrn = job("wide_resnet__500M", 256)  # 1 GPU: 24.519 GB per GPU
    assert feasible(wrn, Cell("a40", 1, 1))  # 1.2*24.519 = 29.4 <= 0.8*48
    assert not feasible(wrn, Cell("a10", 1, 1))  # 29.4 > 0.8*24 = 19.2
    assert not feasible(job("wide_resnet__500M", 512), Cell("a100", 1, 1))  # recorded -1 (OOM)
    assert not feasible(job("moe__10B", 256), Cell("a100", 2, 4))  # absent from dp_mem
    assert not feasible(wrn, Cell("a40", 3, 1))  # 3 GPUs: not a dp_mem key
    assert feasible(job("wide_resnet__500M", 512), Cell("a100", 1, 2))  # 24.614*1.2 = 29.5 <= 32


def test_preset_aliases_resolve_to_trace_names(table):
    assert table.iter_time("moe-2.4b", 256, "A40", 4, 2) == table.iter_time("moe__2.4B", 256, "a40", 4, 2) == 6.482
    assert table.iter_time("wide-resnet-1b", 1024, "a40", 8, 2) == 28.975
