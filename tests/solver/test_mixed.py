"""Mixed-GPU-type cells: enumeration, pricing, placement."""

from __future__ import annotations

import math

import pytest

from solver.cells import enumerate_cells
from solver.estimator import Estimator
from solver.mixed import MixedEstimator, mixed_cell, parse_key, split_batch
from solver.models import ModelSpec, get_model
from solver.placement import PlanError, validate_plan
from solver.placement.candidates import fits
from solver.policies.cellsched import CellschedPolicy
from solver.profiles.seed import open_store
from solver.types import (
    Cell,
    ClusterView,
    Estimate,
    EstimateSource,
    JobRequest,
    NodeView,
    ParallelPlan,
    Placement,
    ScheduleRequest,
    SolverConfig,
)

CFG = SolverConfig()
CELL = "a10x1+a40x2:3x2:pp1"


def cluster(a40_free: int = 2) -> ClusterView:
    """The dev cluster's shape: 2 x a100x4, 1 x v100x8, 2 x a40x2, 1 x a10x2."""
    nodes = [NodeView(f"n{i}", "a100", 4, 4, ("a100", "all")) for i in (1, 2)]
    nodes += [NodeView("n3", "v100", 8, 8, ("v100", "all"))]
    nodes += [NodeView(f"n{i}", "a40", 2, a40_free, ("a40", "all")) for i in (4, 5)]
    nodes += [NodeView("n6", "a10", 2, 2, ("a10", "all"))]
    return ClusterView(tuple(nodes))


def job(model: str = "gpt-tiny", batch: int = 24, **kw) -> JobRequest:
    return JobRequest("j", get_model(model), batch, 100, **{"gpu_types": ("a40", "a10"), "min_gpus": 6, **kw})


@pytest.fixture(scope="module")
def estimator() -> MixedEstimator:
    return MixedEstimator(Estimator(open_store(":memory:")))


def test_mixed_cells_only_where_no_single_type_can_serve():
    assert [c.key() for c in enumerate_cells(job(), cluster(), CFG)] == [CELL]
    assert all(not c.mixed for c in enumerate_cells(job(min_gpus=4), cluster(), CFG))
    assert enumerate_cells(job(), cluster(), SolverConfig(mixed_cells=False)) == []
    assert enumerate_cells(job(min_gpus=7), cluster(), CFG) == []  # 7 GPUs: no uniform layout on 2-GPU nodes
    assert enumerate_cells(job(excluded_cells=frozenset({CELL})), cluster(), CFG) == []
    big = enumerate_cells(job(gpu_types=None, min_gpus=9, max_gpus=16), cluster(), CFG)
    assert big and all(c.mixed and len(c.parts) == 2 and c.pp == 1 for c in big)
    assert len(big) <= CFG.max_mixed_cells
    assert {c.num_gpus for c in big} <= {9, 16}


def test_mixed_cell_keys_and_checks():
    cell = mixed_cell((("a10", 1), ("a40", 2)), 2)
    assert (cell.key(), cell.gpu_type, cell.num_gpus, cell.by_type()) == (CELL, "a10+a40", 6, (("a10", 1), ("a40", 2)))
    assert parse_key(CELL) == cell and parse_key("a40:2x2:pp1") is None and parse_key("junk") is None
    assert cell.holds_types(["a40", "a10", "a40"]) and not cell.holds_types(["a40", "a10", "a10"])
    assert Cell("a40", 2, 2).key() == "a40:2x2:pp1" and Cell("a40", 2, 2).by_type() == (("a40", 2),)
    with pytest.raises(ValueError):
        Cell("a10+a40", 3, 2, 1, (("a10", 1), ("a40", 1)))  # parts do not add up to the nodes
    with pytest.raises(ValueError):
        Cell("a40", 2, 2, 1, (("a40", 2),))  # one type is not mixed


def test_split_batch_gives_the_slower_ranks_less():
    shares, m = split_batch(24, (4, 2), (1.0, 2.0), 1)
    assert m == 1 and 4 * shares[0] + 2 * shares[1] == 24 and shares == (5, 2)  # slowest part: 5 s vs 4 s
    assert split_batch(24, (4, 2), (1.0, 1.0), 1) == ((4, 4), 1)
    assert split_batch(24, (4, 2), (1.0, 1.0), 12) == ((4, 4), 4)  # 12 micro-batches do not split; 4 do
    assert split_batch(5, (4, 2), (1.0, 1.0), 1) is None  # fewer samples than ranks


def brute_split(batch, ranks, cost, micro_batches, vw=None):
    """(m, least slowest-part time) over every whole split, by the module doc's rule; None: no split."""
    if vw is not None:  # whole virtual workers of batch / V samples, m: largest divisor of batch / V <= micro_batches
        per = batch // vw
        units = [(u0, u1) for u0 in range(1, vw + 1) for u1 in range(1, vw + 1) if ranks[0] * u0 + ranks[1] * u1 == vw]
        m = max(d for d in range(1, min(micro_batches, per) + 1) if per % d == 0)
        return (m, min(max(u0 * per * cost[0], u1 * per * cost[1]) for u0, u1 in units)) if units else None
    for m in (d for d in range(micro_batches, 0, -1) if micro_batches % d == 0):  # largest m with a split
        splits = [
            (a, b)
            for a in range(m, batch + 1, m)
            for b in range(m, batch + 1, m)
            if ranks[0] * a + ranks[1] * b == batch
        ]
        if splits:
            return m, min(max(a * cost[0], b * cost[1]) for a, b in splits)
    return None


@pytest.mark.parametrize("ranks", [(1, 1), (2, 1), (1, 3), (4, 2), (3, 2)])
@pytest.mark.parametrize("cost", [(1.0, 1.0), (1.0, 2.0), (3.0, 1.0), (1.0, 1.7)])
def test_split_batch_matches_brute_force_over_every_split(ranks, cost):
    """split_batch picks the largest feasible m and a split whose slowest part is least of all whole splits."""
    for batch in range(1, 25):
        for micro_batches in (1, 2, 4, 6):
            for vw in (None, *(v for v in range(1, batch + 1) if batch % v == 0)):
                got, want = (
                    split_batch(batch, ranks, cost, micro_batches, vw),
                    brute_split(batch, ranks, cost, micro_batches, vw),
                )
                case = (batch, micro_batches, vw)
                assert (got is None) == (want is None), case
                if got is None:
                    continue
                (s0, s1), m = got
                unit = m if vw is None else batch // vw
                assert ranks[0] * s0 + ranks[1] * s1 == batch and s0 % unit == s1 % unit == 0 < min(s0, s1), case
                assert m == want[0] and max(s0 * cost[0], s1 * cost[1]) == pytest.approx(want[1], rel=1e-12), case


class PartTimes:
    """Inner estimator stub: every single-type cell runs the whole batch in TIMES[gpu type] s (tp 1, m 1)."""

    TIMES = {"a10": 6.0, "a40": 2.0}

    def estimate(self, job, cell):
        return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), self.TIMES[cell.gpu_type], 1.0, "table")


def test_pricing_by_hand():
    """A mixed estimate from hand-computed shares, compute time and gradient sync."""
    model = ModelSpec("m", "gpt", 4, 256, 4, 128, 1000, 1.5e9)  # fp16: 3e9 gradient bytes
    est = MixedEstimator(PartTimes(), net_gbps=10.0).estimate(
        JobRequest("j", model, 24, 10), mixed_cell((("a10", 1), ("a40", 2)), 2)
    )
    # per rank and sample: a10 6 s x 2 ranks / 24 = 0.5 s, a40 2 s x 4 ranks / 24 = 1/3 s; 2 s10 + 4 s40 = 24:
    # (s10, s40) = (2, 5): max(1, 5/3) = 5/3; (4, 4): 2; (6, 3): 3; (8, 2): 4; (10, 1): 5 -> (2, 5)
    # sync over 3 nodes: 2 x 2 x 25 us + 2 x 2/3 x 3e9 B / 10 GB/s = 0.0001 + 0.4
    assert est.plan == ParallelPlan(1, 6, 1, 1, (2, 5))
    assert est.iter_time_s == pytest.approx(5 / 3 + 0.4001, rel=1e-12)


def test_pricing_composes_the_parts(estimator):
    j, cell = job(), mixed_cell((("a10", 1), ("a40", 2)), 2)
    est = estimator.estimate(j, cell)
    a10, a40 = (estimator.estimate(j, Cell(t, n, 2, 1)) for t, n in cell.parts)
    assert a40 is estimator.inner.estimate(j, Cell("a40", 2, 2, 1))  # single-type cells are the inner's
    assert (
        est.feasible
        and est.source == EstimateSource.MIXED
        and est.note.startswith("parts ")
        and est.plan.pp == 1
        and est.plan.dp == 6
    )
    s10, s40 = est.plan.shares
    assert 2 * s10 + 4 * s40 == j.global_batch
    per_sample = (a10.iter_time_s * 2 / 24, a40.iter_time_s * 4 / 24)  # s per sample and rank
    want = brute_split(24, (2, 4), per_sample, max(a10.plan.micro_batches, a40.plan.micro_batches))
    assert (est.plan.micro_batches, max(s10 * per_sample[0], s40 * per_sample[1])) == pytest.approx(want)
    compute = max(s10 * a10.iter_time_s * 2 / 24, s40 * a40.iter_time_s * 4 / 24)
    assert compute < est.iter_time_s < compute + 0.01  # plus the cross-type gradient sync
    assert est.iter_time_s < max(a10.iter_time_s, a40.iter_time_s)  # six GPUs beat either part alone here
    assert not estimator.estimate(job("gpt-13b"), cell).feasible  # a part that runs out of memory


@pytest.mark.parametrize("exact", [True, False])
def test_policy_places_a_mixed_cell_on_both_types(estimator, exact, exact_config):
    cfg = exact_config(exact_node_model_max_nodes=64 if exact else 0)
    cl = cluster()
    reply = CellschedPolicy().schedule(ScheduleRequest(cl, (job(),), config=cfg), estimator)
    p = reply.placements["j"]
    assert p.cell.key() == CELL and sorted(p.nodes) == [("n4", 2), ("n5", 2), ("n6", 2)]
    validate_plan(cl, reply.placements)
    busy = cluster(a40_free=0)  # the a40 nodes are taken: nothing fits
    assert "j" not in CellschedPolicy().schedule(ScheduleRequest(busy, (job(),), config=cfg), estimator).placements


def test_mixed_placements_are_checked_per_type():
    cl, cell = cluster(), mixed_cell((("a10", 1), ("a40", 2)), 2)
    plan = ParallelPlan(1, 6, 1, 1, (6, 3))
    good = Placement("j", cell, (("n4", 2), ("n5", 2), ("n6", 2)), plan, 1.0)
    wrong = Placement("j", cell, (("n4", 2), ("n1", 2), ("n6", 2)), plan, 1.0)
    assert fits(cl, good) and not fits(cl, wrong)
    validate_plan(cl, {"j": good})
    with pytest.raises(PlanError):
        validate_plan(cl, {"j": wrong})
    with pytest.raises(PlanError):
        validate_plan(cl, {"j": Placement("j", cell, (("n4", 2), ("n6", 2), ("n2", 2)), plan, 1.0)})
    assert math.isclose(sum(s * n for s, n in zip(plan.shares, (2, 4))), 24)
