"""Measurements name no runtime, so they price every runtime's job: a
cell-level record gives the runtime its own best plan at the measured time,
a per-plan record prices that plan wherever the runtime runs it (the
numbers asserted are the records' own, not a model's)."""

from __future__ import annotations

import pytest

from solver.contract.models import get_model
from solver.contract.profiles.arena import load_device_specs
from solver.contract.profiles.gpus import default_gpu_specs
from solver.contract.profiles.records import CellRecord
from solver.contract.profiles.store import ProfileStore
from solver.estimator import Estimator
from solver.types import Cell, EstimateSource

MODEL = get_model("gpt-350m")


def _estimator(*recs: CellRecord) -> Estimator:
    store = ProfileStore(":memory:")
    for spec in default_gpu_specs(load_device_specs()["simulator_gpu_specs"]).values():
        store.put_gpu(spec)
    store.put_cells(recs)
    return Estimator(store)


@pytest.mark.parametrize("runtime", ["adaptive", "ddp", "exact", "sharded", "megatron", "torchtitan"])
def test_a_cell_record_prices_every_runtime_at_its_time(runtime):
    est = _estimator(CellRecord(MODEL.name, 8, "a10", 1, 1, 0.2))
    e = est.estimate_model(MODEL, 8, Cell("a10", 1, 1, 1), runtime=runtime)
    assert e.feasible and e.source == EstimateSource.MEASURED, e
    assert e.iter_time_s == 0.2 and (e.plan.pp, e.plan.dp, e.plan.tp) == (1, 1, 1), e


def test_a_cell_record_gives_a_named_runtime_a_plan_it_runs():
    """4 A100s measured at 0.3 s: ddp (data parallelism only) gets dp=4 at
    that time, whatever plan the measured run had."""
    est = _estimator(CellRecord(MODEL.name, 64, "a100", 1, 4, 0.3))
    e = est.estimate_model(MODEL, 64, Cell("a100", 1, 4, 1), runtime="ddp")
    assert e.feasible and e.iter_time_s == 0.3 and e.source == EstimateSource.MEASURED, e
    assert (e.plan.pp, e.plan.dp, e.plan.tp) == (1, 4, 1), e


def test_an_out_of_memory_record_holds_for_a_named_runtime():
    est = _estimator(CellRecord(MODEL.name, 8, "a10", 1, 1, None))
    e = est.estimate_model(MODEL, 8, Cell("a10", 1, 1, 1), runtime="exact")
    assert not e.feasible and e.note.startswith("OOM"), e


def test_a_plan_record_prices_that_plan_for_a_runtime_that_runs_it():
    """A per-plan measurement far faster than any model: ddp picks that plan at its time."""
    est = _estimator(CellRecord(MODEL.name, 64, "a100", 1, 2, 0.001, pp=1, dp=2, tp=1))
    e = est.estimate_model(MODEL, 64, Cell("a100", 1, 2, 1), runtime="ddp")
    assert e.iter_time_s == 0.001 and e.source == EstimateSource.MEASURED, e
    assert (e.plan.pp, e.plan.dp, e.plan.tp) == (1, 2, 1), e
