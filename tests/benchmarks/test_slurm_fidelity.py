"""benchmarks/slurm_fidelity.py: its measures against hand-worked numbers, and
`slurm-multifactor` against what a real slurmctld did with two slices of 60 jobs (the recorded
sacct exports in benchmarks/results/slurm_fidelity/, made by the benchmark on the dev
cluster with accounting: benchmarks/results/slurm_fidelity.md says how)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from types import ModuleType

import pytest
from support import ROOT

SCRIPT = ROOT / "benchmarks" / "slurm_fidelity.py"
RECORDINGS = ROOT / "benchmarks" / "results" / "slurm_fidelity"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("slurm_fidelity_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


def test_the_measures_by_hand():
    bench = load()
    # recorded (submit, start): waits 10, 20, 30 -> mean 20, median 20
    rec = {"1": (0.0, 10.0), "2": (0.0, 20.0), "3": (5.0, 35.0)}
    # simulated: waits 10, 30, 35 -> mean 25 (25% off), median 30 (50% off); start order 1, 2, 3 kept
    # except that 3 (40) now starts after 2 (30): same order -> tau 1
    sim = {"1": (0.0, 10.0), "2": (0.0, 30.0), "3": (5.0, 40.0), "4": (0.0, None)}
    got = bench.compare("p", rec, sim)
    assert (got["jobs"], got["mean_wait_err_pct"], got["median_wait_err_pct"]) == (3, 25.0, 50.0)
    assert got["start_order_tau"] == 1.0
    assert got["job_wait_mae_s"] == pytest.approx((0 + 10 + 5) / 3, abs=0.01)
    # one pair swapped of three: tau = (2 - 1) / 3
    sim["1"] = (0.0, 35.0)
    assert bench.compare("p", rec, sim)["start_order_tau"] == pytest.approx(1 / 3, abs=1e-4)


def test_the_pair_count_is_scipys_tau_b():
    bench = load()
    scipy_stats = pytest.importorskip("scipy.stats")
    x = [1.0, 2.0, 2.0, 3.0, 5.0, 4.0, 7.0, 7.0, 0.5]
    y = [2.0, 1.0, 3.0, 3.0, 6.0, 6.0, 5.0, 8.0, 0.0]
    assert bench.kendall_tau_b(x, y) == pytest.approx(scipy_stats.kendalltau(x, y).statistic, abs=1e-12)
    assert bench.kendall_tau_b([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == -1.0


@pytest.mark.slow  # two 60-job simulations: 20 s idle, minutes on a loaded machine
@pytest.mark.parametrize("slice_", ["philly-200", "philly-400"])  # tuned on, held out
def test_slurm_multifactor_is_faithful_to_the_recorded_slurmctld(slice_: str):
    bench = load()
    recorded = RECORDINGS / f"{slice_}.sacct.txt"
    args = argparse.Namespace(cluster=str(bench.CLUSTER), interval=1.0)
    got = bench.compare(
        "slurm-multifactor", bench.recorded_waits(recorded), bench.simulate("slurm-multifactor", recorded, args)
    )
    assert got["jobs"] == 60
    # the bar: mean wait within 15% of the recorded, start order tau at least 0.8
    assert got["mean_wait_err_pct"] <= 15.0
    assert got["start_order_tau"] >= 0.8
