"""benchmarks/mixed_real.py asks the simulator's mixed-cell composition for
the plans it then runs. Without running them (that needs root and minutes):
the plans are the ones the composition prices, and its times obey the
arithmetic of a step that waits for its slowest rank."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest
from support import ROOT

SCRIPT = ROOT / "benchmarks" / "mixed_real.py"


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mixed_real", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mixed_real"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("runtime", ["exact", "sharded"])
def test_the_composition_prices_the_plans_the_benchmark_runs(runtime: str) -> None:
    mr = _benchmark()
    fast, slow = 1.0, 2.0  # one rank of each type alone with the whole batch of 8
    got = mr.plans_and_predictions({"cpufast": fast, "cpuslow": slow}, runtime)
    assert set(got) == {"dp-balanced", "dp-even", "pipeline"}
    even_plan, even = got["dp-even"]
    assert even_plan["batch_shares"] == (1.0, 1.0) and even_plan["nodes"] == (mr.FAST, mr.SLOW)
    # the slow rank computes 4 of 8 samples: at least half its time alone, and the sync is small here
    assert slow / 2 * 0.9 <= even <= slow / 2 * 1.1
    bal_plan, balanced = got["dp-balanced"]
    shares = bal_plan["batch_shares"]
    assert sum(shares) == mr.BATCH and shares[0] > shares[1]  # the fast rank takes more
    # no rank computes less than its share of its time alone; balancing beats even shares
    assert balanced >= max(fast * shares[0], slow * shares[1]) / mr.BATCH * 0.9 and balanced < even
    pipe_plan, pipe = got["pipeline"]
    assert sum(pipe_plan["stage_layers"]) == mr.SHAPE["layers"] and pipe_plan["pp"] == 2
    assert pipe_plan["stage_layers"][0] > pipe_plan["stage_layers"][1]  # more layers on the fast stage
    assert pipe is not None and fast / 2 < pipe < slow


def test_the_table_holds_only_the_measured_one_gpu_cells() -> None:
    mr = _benchmark()
    table = mr.MeasuredTable({"cpufast": 1.0, "cpuslow": 2.0})
    name = mr.model_spec().name
    assert table.iter_time(name, mr.BATCH, "cpuslow", 1, 1) == 2.0
    assert table.iter_time(name, mr.BATCH, "cpuslow", 2, 1) is None
    assert table.iter_time(name, mr.BATCH * 2, "cpufast", 1, 1) is None
