"""Virtual workers (EasyScale): a job's fixed V in the estimator, mixed
cells, cell enumeration and the baselines. Expected numbers are worked out
by hand from the hand-made profile of test_estimator (4 layers taking
1, 2, 3, 2 s per micro-batch of 2 at tp 1, i.e. 4 s per sample; a quarter of
that at tp 2) or were recorded from the code before V existed."""

from __future__ import annotations

import math

import pytest
from test_estimator import HAND, hand_store

from solver.cells import enumerate_cells
from solver.contract.models import get_model
from solver.contract.plan import largest_remainder, virtual_worker_counts
from solver.contract.profiles.records import CellRecord
from solver.contract.profiles.seed import open_store
from solver.estimator import Estimator, busiest_factor
from solver.mixed import MixedEstimator, mixed_cell, split_batch
from solver.mixed.dp import part_step
from solver.policies import get_policy
from solver.policies.common import dp_estimate
from solver.types import Cell, ClusterView, JobRequest, NodeView, ScheduleRequest, SolverConfig

# Update of the hand model's one stage: 6000 fp16 parameters x 32 B at 1000 GB/s.
UPDATE = 6000 * 32 / 1e12


def hand_job(batch: int = 8, vw: int | None = None, **kw) -> JobRequest:
    return JobRequest("j", HAND, batch, 10, virtual_workers=vw, **{"runtime": "adaptive", **kw})


# ---- V = None: exactly the estimates recorded before virtual workers existed ---------------

HAND_BEFORE = [  # (batch, cell, (pp, dp, tp, m), time, memory GB, source)
    (8, Cell("g", 1, 2, 1), (1, 1, 2, 1), 8.096000192, 9.92e-05, "composed"),
    (12, Cell("g", 1, 2, 2), (2, 1, 1, 12), 31.650000096, 4.83e-05, "composed"),
    (16, Cell("g", 1, 4, 2), (2, 1, 2, 16), 10.627000096000002, 4.83e-05, "composed"),
    (8, Cell("g2", 1, 2, 1), (1, 2, 1, 1), 16.012000192, 9.76e-05, "composed"),
]


@pytest.mark.parametrize("batch, cell, plan, time_s, mem, source", HAND_BEFORE)
def test_no_virtual_workers_is_unchanged_hand(batch, cell, plan, time_s, mem, source):
    e = Estimator(hand_store()).estimate(hand_job(batch), cell)
    assert (e.plan.pp, e.plan.dp, e.plan.tp, e.plan.micro_batches) == plan
    assert (e.iter_time_s, e.mem_per_gpu_gb, e.source) == (time_s, mem, source)


@pytest.fixture(scope="module")
def shipped() -> MixedEstimator:
    return MixedEstimator(Estimator(open_store(":memory:")))


SHIPPED_BEFORE = [  # (model, batch, cell, (pp, dp, tp, m, shares), time, source)
    ("moe__2.4B", 256, Cell("a40", 4, 2, 4), (4, 2, 1, 64, ()), 6.481967449188232, "measured"),
    ("moe__2.4B", 256, Cell("a40", 4, 2, 1), (1, 8, 1, 16, ()), 9.323505031180776, "measured+pp"),
    ("bert__760M", 128, Cell("a100", 1, 4, 1), (1, 4, 1, 8, ()), 1.7485484376022737, "analytic+calibrated"),
    ("gpt-1.3b", 256, Cell("a100", 1, 4, 1), (1, 4, 1, 64, ()), 9.220204295965715, "analytic"),
    # recorded again when a mixed cell's shares came to follow its parts' compute only (issue 15)
    ("bert__760M", 128, mixed_cell((("a100", 1), ("a40", 4)), 2), (1, 10, 1, 4, (16, 12)), 1.700180515773759, "mixed"),
]


@pytest.mark.parametrize("name, batch, cell, plan, time_s, source", SHIPPED_BEFORE)
def test_no_virtual_workers_is_unchanged_shipped(shipped, name, batch, cell, plan, time_s, source):
    e = shipped.estimate(JobRequest("j", get_model(name), batch, 10, min_gpus=cell.num_gpus, runtime="adaptive"), cell)
    assert (e.plan.pp, e.plan.dp, e.plan.tp, e.plan.micro_batches, e.plan.shares) == plan
    assert (e.iter_time_s, e.source) == (time_s, source)


# ---- the estimator under V ------------------------------------------------------------------


def test_three_ranks_run_four_virtual_workers_priced_by_the_busiest():
    est = Estimator(hand_store())
    cell = Cell("g", 1, 3, 1)  # tp 3 does not divide the 4 heads: dp 3 only
    assert not est.estimate(hand_job(8), cell).feasible  # without V, dp 3 does not divide the batch of 8
    e = est.estimate(hand_job(8, 4), cell)
    # V=4 of 2 samples each over dp 3: ranks run 2, 1, 1; the busiest runs 2 x (1 micro-batch of 2 at 4 s/sample
    # = 8 s), then one all-reduce of 12000 B among 3 ranks (nvlink curve at 2 ranks, bytes x (4/3) / 1:
    # 16000 B = 0.016 s) and one update
    assert virtual_worker_counts(4, 3) == (2, 1, 1)
    assert (e.plan.pp, e.plan.dp, e.plan.tp, e.plan.micro_batches) == (1, 3, 1, 1)
    assert e.iter_time_s == pytest.approx(2 * 8.0 + 0.016 + UPDATE, rel=1e-12)
    assert e.source == "composed"
    # every candidate: m divides B/V = 2, and the time is 2 x (m micro-batches of 2/m) + sync + update
    plans = est.plans(JobRequest("j", HAND, 8, 1, virtual_workers=4, state_sharding=False, runtime="adaptive"), cell)
    assert sorted(p.micro_batches for p, _, _ in plans) == [1, 2]
    assert all(t == pytest.approx(16.016 + UPDATE, rel=1e-12) for _, t, _ in plans)


def test_eight_gpus_with_four_virtual_workers_keep_dp_at_most_four():
    est = Estimator(hand_store())
    for cell in (Cell("g", 1, 8, 1), Cell("g", 1, 8, 2), Cell("g", 2, 4, 1)):
        free = est.plans(JobRequest("j", HAND, 8, 1, state_sharding=False, runtime="adaptive"), cell)
        assert any(p.dp == 8 for p, _, _ in free) == (cell.pp == 1)  # without V, dp 8 at pp 1 tp 1
        plans = est.plans(
            JobRequest("j", HAND, 8, 1, virtual_workers=4, state_sharding=False, runtime="adaptive"), cell
        )
        assert plans and all(p.dp <= 4 and 2 % p.micro_batches == 0 for p, _, _ in plans)
        e = est.estimate(hand_job(8, 4), cell)
        assert e.feasible and e.plan.dp <= 4 and e.plan.num_gpus == 8


def test_dp_two_under_v_four_by_hand():
    # 1x2 at tp 1: dp 2 runs 2 virtual workers of 2 samples each: 2 x 8 s + all-reduce 0.012 s + update,
    # the same as one replica of 4 samples without V
    est = Estimator(hand_store())
    [(t, _)] = [
        (t, mem)
        for p, t, mem in est.plans(
            JobRequest("j", HAND, 8, 1, virtual_workers=4, state_sharding=False, runtime="adaptive"), Cell("g", 1, 2, 1)
        )
        if (p.dp, p.tp, p.micro_batches) == (2, 1, 1)
    ]
    assert t == pytest.approx(16.012 + UPDATE, rel=1e-12)
    # tp 2 (dp 1) runs all 4 in turn: 4 x (2 s + 16 all-reduces of 1500 B = 0.024 s)
    [(t, _)] = [
        (t, mem)
        for p, t, mem in est.plans(
            JobRequest("j", HAND, 8, 1, virtual_workers=4, state_sharding=False, runtime="adaptive"), Cell("g", 1, 2, 1)
        )
        if (p.dp, p.tp, p.micro_batches) == (1, 2, 1)
    ]
    assert t == pytest.approx(4 * 2.024 + UPDATE, rel=1e-12)


def test_pipeline_fill_paid_per_virtual_worker():
    # 1x2 at pp 2 (stages 1.5 and 2.5 s per sample), batch 8, V=2 on dp 1: each of 2 virtual workers runs
    # m=4 micro-batches of 1: (4-1) x 2.5 + (1.5 + 2.5) + 2 p2p of 750 B (0.075 s) = 11.65 s, twice
    est = Estimator(hand_store())
    [(t, _)] = [
        (t, mem)
        for p, t, mem in est.plans(
            JobRequest("j", HAND, 8, 1, virtual_workers=2, state_sharding=False, runtime="adaptive"), Cell("g", 1, 2, 2)
        )
        if (p.dp, p.tp, p.micro_batches) == (1, 1, 4)
    ]
    assert t == pytest.approx(2 * 11.65 + 3000 * 32 / 1e12, rel=1e-12)


def test_infeasible_notes():
    est = Estimator(hand_store())
    e = est.estimate(hand_job(8, 3), Cell("g", 1, 2, 1))
    assert not e.feasible and "do not divide the global batch 8" in e.note
    e = est.estimate(hand_job(8, 1), Cell("g", 2, 2, 1))  # tp <= 2: dp >= 2 > V
    assert not e.feasible and e.note.startswith("needs dp > V") and "smallest dp is 2" in e.note
    assert est.estimate(hand_job(8, 1), Cell("g", 1, 2, 1)).feasible  # tp 2, dp 1
    assert busiest_factor(4, 3) == pytest.approx(1.5) and busiest_factor(8, 4) == 1.0


def test_cache_key_holds_v():
    est = Estimator(hand_store())
    cell = Cell("g", 1, 2, 1)
    a, b = est.estimate_model(HAND, 8, cell), est.estimate_model(HAND, 8, cell, 4)
    assert est.cache_size() == 2 and a is not b
    assert est.estimate(hand_job(8, 4), cell) is b and est.estimate(hand_job(8), cell) is a


def test_measured_cell_under_v():
    s = hand_store()
    s.put_cells(
        [
            CellRecord("hand", 12, "g2", 1, 2, 30.0, source="measured"),
            CellRecord("hand", 8, "g", 1, 2, 19.0, source="measured"),
        ]
    )
    est = Estimator(s)
    # g: the measured optimum is tp 2 (dp 1, 8.096 s modelled); V=2 runs it as 2 x (4 samples in 4.048 s):
    # the model says V costs nothing, so the measured time stands
    e = est.estimate(hand_job(8, 2), Cell("g", 1, 2, 1))
    assert (e.iter_time_s, e.source, e.plan.dp, e.plan.tp) == (19.0, "measured", 1, 2)
    # g2: tp 2 does not fit, the optimum is dp 2 (4 x 6 samples + 0.012 s); V=3 over dp 2: the busiest
    # rank runs 2 of 4 samples: 32 s + 0.012 s, so T* x 32.012 / 24.012 (about k x dp / V = 4/3)
    e = est.estimate(hand_job(12, 3), Cell("g2", 1, 2, 1))
    assert e.source == "measured" and (e.plan.dp, e.plan.tp) == (2, 1)
    assert e.iter_time_s == pytest.approx(30.0 * (32.012 + UPDATE) / (24.012 + UPDATE), rel=1e-12)
    assert est.estimate(hand_job(12), Cell("g2", 1, 2, 1)).iter_time_s == 30.0


def test_per_plan_measurement_under_v():
    s = hand_store()
    s.put_cells([CellRecord("hand", 12, "g2", 1, 2, 20.0, pp=1, dp=2, tp=1, source="measured")])
    e = Estimator(s).estimate(hand_job(12, 3), Cell("g2", 1, 2, 1))
    assert e.source == "measured" and (e.plan.dp, e.plan.tp) == (2, 1)
    assert e.iter_time_s == pytest.approx(20.0 * (32.012 + UPDATE) / (24.012 + UPDATE), rel=1e-12)


def test_arena_optimum_under_v(shipped):
    model = get_model("moe__2.4B")  # Arena's optimum on a40 4x2 is pp 4, dp 2 (6.482 s)
    t_star = 6.481967449188232
    pp4 = Cell("a40", 4, 2, 4)
    e = shipped.estimate(JobRequest("j", model, 256, 10, virtual_workers=2, runtime="adaptive"), pp4)
    assert e.source == "measured" and e.iter_time_s == t_star and e.plan.dp <= 2
    # V=4 over dp 2: 2 virtual workers in turn, each with its own pipeline fill: no faster than T*
    e = shipped.estimate(JobRequest("j", model, 256, 10, virtual_workers=4, runtime="adaptive"), pp4)
    assert e.feasible and e.iter_time_s >= t_star and e.plan.dp <= 4
    for pp in (1, 2, 8):
        e = shipped.estimate(
            JobRequest("j", model, 256, 10, virtual_workers=4, runtime="adaptive"), Cell("a40", 4, 2, pp)
        )
        assert not e.feasible or (e.plan.dp <= 4 and e.iter_time_s >= t_star)
    # V=8 on 8 GPUs at pp 1 is dp 8, one virtual worker each: exactly the estimate without V
    e = shipped.estimate(JobRequest("j", model, 256, 10, virtual_workers=8, runtime="adaptive"), Cell("a40", 4, 2, 1))
    assert (e.iter_time_s, e.plan.dp) == (9.323505031180776, 8)
    e = shipped.estimate(JobRequest("j", model, 256, 10, virtual_workers=2, runtime="adaptive"), Cell("a40", 4, 2, 1))
    assert not e.feasible and e.note.startswith("needs dp > V")  # 8 GPUs at tp <= 2: dp >= 4


def test_job_request_validates_virtual_workers():
    assert hand_job(8, 3).virtual_workers == 3 and hand_job(8).virtual_workers is None
    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match="virtual_workers"):
            hand_job(8, bad)


# ---- mixed cells ------------------------------------------------------------------------------


def test_split_batch_moves_whole_virtual_workers():
    # 4 fast ranks (1 s/sample) and 2 slow (2 s/sample), V=24 of 1 sample: 4 u0 + 2 u1 = 24 with the least
    # max(u0, 2 u1): (5, 2) -> max(5, 4); (4, 4) -> 8
    assert split_batch(24, (4, 2), (1.0, 2.0), 1, 24) == ((5, 2), 1)
    # V=12 of 2 samples: (1, 4) -> max(1, 8); (2, 2) -> max(2, 4): 2 each, 4 samples each
    assert split_batch(24, (4, 2), (1.0, 2.0), 1, 12) == ((4, 4), 1)
    # V=6 of 4 samples: one each; micro-batches per virtual worker: largest divisor of 4 not above 3
    assert split_batch(24, (4, 2), (1.0, 1.0), 3, 6) == ((4, 4), 2)
    assert split_batch(24, (4, 2), (1.0, 1.0), 12, 6) == ((4, 4), 4)
    assert split_batch(24, (4, 2), (1.0, 1.0), 1, 5) is None  # V does not divide the batch
    assert split_batch(24, (4, 2), (1.0, 1.0), 1, 4) is None  # fewer virtual workers than ranks
    assert split_batch(24, (2, 2), (1.0, 1.0), 1, 4) == ((6, 6), 1)
    assert split_batch(24, (2, 2), (2.0, 1.0), 1, 6) == ((4, 8), 1)  # (1, 2) -> max(2, 2); (2, 1) -> max(4, 1)
    assert split_batch(20, (2, 2), (1.0, 1.0), 1, 5) is None  # 2 u0 + 2 u1 = 5 has no whole solution


def tiny_over_two_types(vw: int | None) -> JobRequest:
    """gpt-tiny, 24 samples, at least 6 GPUs of a40 and a10, V = `vw`."""
    model = get_model("gpt-tiny")
    return JobRequest("j", model, 24, 100, gpu_types=("a40", "a10"), min_gpus=6, virtual_workers=vw, runtime="adaptive")


@pytest.mark.parametrize("vw", [6, 8, 12, 24])
def test_mixed_shares_are_whole_virtual_workers(shipped, vw):
    cell = mixed_cell((("a10", 1), ("a40", 2)), 2)
    j = tiny_over_two_types(vw)
    e = shipped.estimate(j, cell)
    assert e.feasible and e.plan.dp == 6 and e.plan.tp == 1
    ranks = (2, 4)
    per_rank = [s for s, r in zip(e.plan.shares, ranks, strict=True) for _ in range(r)]
    assert sum(per_rank) == 24 and all(s % (24 // vw) == 0 for s in per_rank)
    units = tuple(s * vw // 24 for s in per_rank)
    assert sum(units) == vw and min(units) >= 1
    assert virtual_worker_counts(vw, 6, per_rank) == units == largest_remainder(vw, per_rank)
    assert (24 // vw) % e.plan.micro_batches == 0
    # the slowest part's compute: its rank's samples, in m micro-batches per virtual worker (solver.mixed.dp)
    free = tiny_over_two_types(None)
    subs = [shipped.estimate(free, Cell(t, n, 2, 1)) for t, n in cell.parts]
    steps = [part_step(shipped.costs, shipped.settings, free, sub) for sub in subs]
    m = e.plan.micro_batches
    compute = max(p.compute_s(s, s * vw // 24 * m) for s, p in zip(e.plan.shares, steps, strict=True))
    assert compute < e.iter_time_s < compute + 0.01
    assert shipped.estimate(free, cell) is not e


def test_mixed_infeasible_with_v(shipped):
    cell = mixed_cell((("a10", 1), ("a40", 2)), 2)
    for vw, why in ((4, "fewer than the 6 dp ranks"), (5, "do not divide the global batch")):
        j = tiny_over_two_types(vw)
        e = shipped.estimate(j, cell)
        assert not e.feasible and why in e.note


# ---- cells and policies ------------------------------------------------------------------------


def two_gpu_nodes(n: int = 8) -> ClusterView:
    return ClusterView(tuple(NodeView(f"n{i}", "g", 2, 2, ("p",)) for i in range(n)))


def test_enumeration_skips_only_cells_that_need_dp_above_v():
    cl, cfg = two_gpu_nodes(), SolverConfig()
    est = Estimator(hand_store())
    free = enumerate_cells(hand_job(8), cl, cfg)
    with_v = enumerate_cells(hand_job(8, 2), cl, cfg)
    assert set(with_v) < set(free) and [c for c in free if c in set(with_v)] == with_v
    for c in set(free) - set(with_v):
        e = est.estimate(hand_job(8, 2), c)
        assert not e.feasible and e.note.startswith("needs dp > V")
    assert any(c.num_gpus == 16 for c in with_v)  # 16 GPUs in 8 stages of tp 2: dp 1


def test_baselines_keep_dp_at_most_v():
    cl = two_gpu_nodes(4)
    est = Estimator(hand_store())
    cell = Cell("g", 2, 2, 1)
    assert dp_estimate(hand_job(8), cell, est, None).plan.dp == 4
    assert dp_estimate(hand_job(8, 2), cell, est, None) is None
    assert dp_estimate(hand_job(8, 4), cell, est, None).plan.dp == 4
    j = hand_job(8, 2, requested_gpus=4, requested_gpu_type="g", min_gpus=4)
    reply = get_policy("fcfs").schedule(ScheduleRequest(cl, (j,)), est)
    assert "j" not in reply.placements and "no feasible layout" in reply.reasons["j"]
    for name in ("cellsched", "gavel", "sia"):
        jobs = (
            hand_job(8, 2, elastic=True, max_gpus=8),
            JobRequest("k", HAND, 8, 10, elastic=True, max_gpus=8, runtime="adaptive"),
        )
        reply = get_policy(name).schedule(ScheduleRequest(cl, jobs), est)
        p = reply.placements["j"]
        assert p.plan.dp <= 2 and math.isfinite(p.iter_time_s), (name, p)
