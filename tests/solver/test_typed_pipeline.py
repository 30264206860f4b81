"""Pipelines across GPU types (issue 15): the layer split by speed and memory,
the pricing by hand, and the split carried to another stage order."""

from __future__ import annotations

import pytest

from solver.contract.models import ModelSpec, get_model
from solver.contract.profiles.records import GpuSpec, LayerRecord
from solver.contract.profiles.seed import open_store
from solver.contract.profiles.store import ProfileStore
from solver.estimator import Estimator, EstimatorBase
from solver.mixed import MixedEstimator, mixed_cell, stage_layers_in_order
from solver.types import JobRequest

P = ModelSpec("p", "gpt", num_layers=8, hidden=64, heads=4, seq_len=8, vocab=16, params=1e6)


def gpu(name: str, mem_gb: float) -> GpuSpec:
    return GpuSpec(
        name,
        mem_gb=mem_gb,
        peak_tflops=100.0,
        mem_bw_gbps=1000.0,
        intra_link="nvlink",
        intra_bw_gbps=100.0,
        inter_bw_gbps=10.0,
    )


def profile(name: str, block_s: float) -> list[LayerRecord]:
    """embed, 8 blocks of `block_s` s per sample (1000 B of parameters, 100 B of activations), head."""
    recs = [LayerRecord(P.signature, name, 1, 1, 0, "embed", 0.0, 0.0, 0, 0, 500)]
    recs += [
        LayerRecord(P.signature, name, 1, 1, i, "block", block_s / 4, block_s * 3 / 4, 1000, 100, 500)
        for i in range(1, 9)
    ]
    recs.append(LayerRecord(P.signature, name, 1, 1, 9, "head", 0.0, 0.0, 0, 0, 500))
    return recs


def estimator(slow_mem_gb: float = 80.0) -> MixedEstimator:
    s = ProfileStore(":memory:")
    for spec, t in ((gpu("f", 80.0), 1.0), (gpu("s", slow_mem_gb), 3.0)):
        s.put_gpu(spec)
        s.put_layers(profile(spec.name, t))
    return MixedEstimator(Estimator(s))


def test_layers_split_by_speed_and_priced_by_hand():
    """f is 3x as fast as s: 6 + 2 of the 8 blocks. Batch 2, dp 1: m = 2 micro-batches of 1 sample,
    stages of 6 x 1 s and 2 x 3 s: (m - 1) x 6 + 12, plus the activation and its gradient over the
    network once (2 x (25 us + 500 B at 10 GB/s)), plus the update of the larger stage (3000
    parameters x 32 B at 1000 GB/s)."""
    cell = mixed_cell((("f", 1), ("s", 1)), 1, 2)
    e = estimator().estimate(JobRequest("j", P, 2, 10, runtime="adaptive"), cell)
    assert e.feasible and e.source == "mixed" and e.plan.stage_layers == (6, 2)
    assert (e.plan.pp, e.plan.dp, e.plan.tp, e.plan.micro_batches) == (2, 1, 1, 2)
    want = 6 + 12 + 2 * (2.5e-5 + 500 / 10e9) + 3000 * 32 / 1000e9
    assert e.iter_time_s == pytest.approx(want, rel=1e-9)


class _Scaled(EstimatorBase):
    """An inner estimator whose layers of each GPU type stand on another scale (`layer_scale`):
    the Estimator's estimates and cost model but for that."""

    def __init__(self, inner, scales: dict[str, float]) -> None:
        self.inner, self.scales = inner, scales
        self.settings = inner.settings

    def estimate(self, job, cell):
        return self.inner.estimate(job, cell)

    @property
    def cost_model(self):
        return self

    def layer_scale(self, model, global_batch, cell, tp) -> float:
        return self.scales[cell.gpu_type]

    def pricing(self, runtime):
        return self.inner.pricing(runtime)

    def layer_costs(self, model, gpu_type, tp, b):
        return self.inner.layer_costs(model, gpu_type, tp, b)

    def links_of(self, gpu_type):
        return self.inner.links_of(gpu_type)

    def gpu_spec(self, gpu_type):
        return self.inner.gpu_spec(gpu_type)

    def mem_limit_gb(self, gpu_type):
        return self.inner.mem_limit_gb(gpu_type)

    def plans(self, job, cell):
        return self.inner.plans(job, cell)


def test_each_types_layers_are_priced_on_the_inner_estimators_scale():
    """layer_scale 2 on both types: the same plan, twice the time. s's layers twice as slow as
    profiled (6 s a block): f takes 7 of the 8 blocks, stages 7 x 1 s and 1 x 6 s; the transfers
    and the update count at the larger scale (2), as the slowest type's cells would."""
    cell, j = mixed_cell((("f", 1), ("s", 1)), 1, 2), JobRequest("j", P, 2, 10, runtime="adaptive")
    inner = estimator().inner
    base = MixedEstimator(_Scaled(inner, {"f": 1.0, "s": 1.0})).estimate(j, cell)
    assert base == estimator().estimate(j, cell)  # profiled layers: the Estimator's own scale is 1
    double = MixedEstimator(_Scaled(inner, {"f": 2.0, "s": 2.0})).estimate(j, cell)
    assert double.plan == base.plan and double.iter_time_s == pytest.approx(2 * base.iter_time_s, rel=1e-12)
    slow = MixedEstimator(_Scaled(inner, {"f": 1.0, "s": 2.0})).estimate(j, cell)
    assert slow.plan.stage_layers == (7, 1) and slow.plan.micro_batches == 2
    want = 7 + (7 + 6) + 2 * (2 * (2.5e-5 + 500 / 10e9) + 3500 * 32 / 1000e9)
    assert slow.iter_time_s == pytest.approx(want, rel=1e-9)


def test_memory_caps_the_slow_stage():
    """s holds one block: 1000 B / 2 x 16 B + 100 B x 2 micro-batches in flight = 8200 B of 9000 B."""
    cell = mixed_cell((("f", 1), ("s", 1)), 1, 2)
    e = estimator(slow_mem_gb=1e-5).estimate(JobRequest("j", P, 2, 10, runtime="adaptive"), cell)
    assert e.feasible and e.plan.stage_layers == (7, 1)
    assert e.iter_time_s == pytest.approx(7 + 7 + 3 + 2 * (2.5e-5 + 500 / 10e9) + 3500 * 32 / 1000e9, rel=1e-9)
    none = estimator(slow_mem_gb=5e-6).estimate(JobRequest("j", P, 2, 10, runtime="adaptive"), cell)
    assert not none.feasible  # not even one block fits the slow stage


def test_split_follows_the_stage_order_of_the_task_layout():
    cell = mixed_cell((("f", 1), ("s", 1)), 1, 2)
    assert stage_layers_in_order(cell, (6, 2), ("s", "f")) == (2, 6)
    assert stage_layers_in_order(cell, (6, 2), ("f", "s")) == (6, 2)
    four = mixed_cell((("f", 2), ("s", 2)), 1, 4)
    assert stage_layers_in_order(four, (3, 3, 1, 1), ("s", "f", "s", "f")) == (1, 3, 1, 3)
    with pytest.raises(ValueError):
        stage_layers_in_order(cell, (6, 2), ("f", "f"))


def test_dev_cluster_pipeline_across_a100_and_a10():
    """The issue's case: a pipeline over an a100 node and an a10 node (gpt-tiny, one GPU each)."""
    est = MixedEstimator(Estimator(open_store(":memory:")))
    model = get_model("gpt-tiny")
    cell = mixed_cell((("a100", 1), ("a10", 1)), 1, 2)
    e = est.estimate(JobRequest("j", model, 8, 10, runtime="adaptive"), cell)
    assert (
        e.feasible and sum(e.plan.stage_layers) == model.num_layers and e.plan.stage_layers[0] >= e.plan.stage_layers[1]
    )
