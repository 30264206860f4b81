"""Mixed-GPU-type cells: enumeration, pricing, placement."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from solver.cells import enumerate_cells, optional_mixed_cells
from solver.contract.models import ModelSpec, get_model
from solver.contract.profiles.records import GpuSpec
from solver.contract.profiles.seed import open_store
from solver.cost.comm import NET, Links
from solver.cost.layers import LayerCosts
from solver.cost.runtime import pricing_of
from solver.estimator import CostSettings, Estimator, EstimatorBase
from solver.mixed import OPTIONAL_PER_CELL, MixedEstimator, mixed_cell, parse_key, split_batch, stages_per_part
from solver.mixed.dp import part_step
from solver.placement import PlacementError, validate_plan
from solver.placement.candidates import fits
from solver.policies.cellsched import CellschedPolicy, FreeNow
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
    return JobRequest(
        "j",
        get_model(model),
        batch,
        100,
        **{"runtime": "adaptive", **{"gpu_types": ("a40", "a10"), "min_gpus": 6, **kw}},
    )


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


class HandParts(EstimatorBase):
    """Inner estimator stub with a hand-made cost model: a rank of type t takes
    A[t] s per sample and F s per micro-batch (4 uniform layers, tp 1), syncs
    on links of NET[t] GB/s between nodes (32 GB/s inside one), updates at
    BW[t] GB/s (4 bytes per parameter); a single-type cell's estimate is that
    model's time of the whole batch (its own sync included)."""

    A = {"a10": 0.25, "a40": 0.125}
    F = 0.1
    NET = {"a10": 8.0, "a40": 2.0}
    BW = {"a10": 50.0, "a40": 100.0}
    update_bytes_per_param = 4.0
    settings = CostSettings(update_bytes_per_param=4.0)

    @property
    def cost_model(self):  # itself: no memory limit, no list of plans, its layers on its own scale
        return self

    def pricing(self, runtime):
        return pricing_of(runtime)

    def layer_scale(self, model, global_batch, cell, tp):
        return 1.0

    def mem_limit_gb(self, t):
        return math.inf

    def plans(self, job, cell):
        return None

    def gpu_spec(self, t):
        return GpuSpec(t, 1000.0, 1.0, self.BW[t], intra_bw_gbps=32.0, inter_bw_gbps=self.NET[t])

    def links_of(self, t):
        return Links(self.gpu_spec(t), {})

    def layer_costs(self, model, t, tp, b):
        n = model.num_layers
        grads = model.params * model.dtype_bytes / n
        return LayerCosts((self.A[t] / n,) * n, (self.F / n,) * n, (0.0,) * n, (0.0,) * n, (grads,) * n, (0,) * n, True)

    def estimate(self, job, cell):
        dp, b = cell.num_gpus, job.global_batch / cell.num_gpus
        link = NET if cell.num_nodes > 1 else self.links_of(cell.gpu_type).intra
        sync = self.links_of(cell.gpu_type).allreduce(link, job.model.params * job.model.dtype_bytes, dp)
        update = job.model.params * self.update_bytes_per_param / (self.BW[cell.gpu_type] * 1e9)
        t = b * self.A[cell.gpu_type] + self.F + sync + update
        return Estimate(cell, ParallelPlan(1, dp, 1), t, 1.0, EstimateSource.ANALYTIC)


HAND = ModelSpec("m", "gpt", 4, 256, 4, 128, 1000, 1.5e9)  # fp16: 3e9 gradient bytes


def test_pricing_by_hand():
    """A mixed estimate from hand-computed shares, compute, ONE gradient sync and the update.

    Per rank and sample an a40 takes 0.125 s, an a10 0.25 s (0.1 s per micro-batch each). The a40 part
    (2 nodes, 4 ranks) alone: 6 x 0.125 + 0.1 + its sync over a 2 GB/s network (2 x 3 x 25 us + 1.5 x
    3e9 / 2e9 = 2.25015 s) + its update (1.5e9 x 4 / 100e9 = 0.06 s) = 3.16015 s for 24 samples; the a10
    part (1 node): 12 x 0.25 + 0.1 + 0.09377 (pcie) + 0.12 = 3.31377 s. By those totals an a40 rank
    would cost 3.16 x 4 / 24 = 0.527 s a sample, more than an a10's 3.31 x 2 / 24 = 0.276 s, and take
    fewer samples; by its compute it is twice as fast: 2 s10 + 4 s40 = 24 ->
    (2, 5): max(0.6, 0.725); (4, 4): max(1.1, 0.6); ... -> (2, 5), compute 0.725 s."""
    est = MixedEstimator(HandParts()).estimate(
        JobRequest("j", HAND, 24, 10, runtime="adaptive"), mixed_cell((("a10", 1), ("a40", 2)), 2)
    )
    assert est.plan == ParallelPlan(1, 6, 1, 1, (2, 5))
    # one sync over the 6 ranks on the slowest network (2 GB/s): 2 x 5 x 25 us + 2 x 5/6 x 3e9 / 2e9
    sync = 10 * 25e-6 + 2 * 5 / 6 * 3e9 / 2e9
    update = 1.5e9 * 4 / 50e9  # the slower part's (the a10's)
    assert est.iter_time_s == pytest.approx(0.725 + sync + update, rel=1e-12)
    # the parts taken apart: compute per sample and per micro-batch, and the update, without their own sync
    inner, j = HandParts(), JobRequest("j", HAND, 24, 10, runtime="adaptive")
    steps = [
        part_step(inner, inner.settings, j, inner.estimate(j, Cell(t, n, 2, 1))) for t, n in (("a10", 1), ("a40", 2))
    ]
    assert [s.per_sample_s for s in steps] == pytest.approx([0.25, 0.125], rel=1e-12)
    assert [s.per_micro_batch_s for s in steps] == pytest.approx([0.1, 0.1], rel=1e-12)
    assert [s.update_s for s in steps] == pytest.approx([0.12, 0.06], rel=1e-12)


def test_a_faster_type_takes_more_samples_per_rank_and_its_own_sync_does_not_count(estimator):
    """bert__760M on one a10 node and two a40 nodes: an a40 rank computes faster and gets more of the
    batch; what a part spends on its own gradient sync (the a40 part's crosses the network, the a10
    part's stays in its node) is not charged per sample."""
    j, cell = job("bert__760M"), mixed_cell((("a10", 1), ("a40", 2)), 2)
    est = estimator.estimate(j, cell)
    s10, s40 = est.plan.shares
    assert s40 > s10 and 2 * s10 + 4 * s40 == j.global_batch, est
    # per sample an a40 rank costs the same over one node or two: only its compute counts
    one, two = (estimator.inner.estimate(j, Cell("a40", n, 2, 1)) for n in (1, 2))
    assert one.plan.tp == two.plan.tp == 1
    assert one.iter_time_s * 2 < two.iter_time_s * 4  # by the whole estimates, two nodes cost more per sample
    per = [part_step(estimator.costs, estimator.settings, j, e).per_sample_s for e in (one, two)]
    assert per[0] == pytest.approx(per[1], rel=1e-9)
    a10 = estimator.inner.estimate(j, Cell("a10", 1, 2, 1))
    assert part_step(estimator.costs, estimator.settings, j, a10).per_sample_s > per[0]


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
    p10, p40 = (part_step(estimator.costs, estimator.settings, j, e) for e in (a10, a40))
    m = est.plan.micro_batches
    assert m == max(a10.plan.micro_batches, a40.plan.micro_batches)
    # the shares: the least slowest compute over every whole split (multiples of m)
    splits = [(a, b) for a in range(m, 25, m) for b in range(m, 25, m) if 2 * a + 4 * b == 24]
    compute = min(max(p10.compute_s(a, m), p40.compute_s(b, m)) for a, b in splits)
    assert max(p10.compute_s(s10, m), p40.compute_s(s40, m)) == pytest.approx(compute, rel=1e-12)
    # plus one ring all-reduce of the gradients over the 6 ranks on the slower network, and the update
    grads = j.model.params * j.model.dtype_bytes
    sync = max(estimator.inner.links_of(t).allreduce(NET, grads, 6) for t in ("a10", "a40"))
    assert est.iter_time_s == pytest.approx(compute + sync + max(p10.update_s, p40.update_s), rel=1e-12)
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
    with pytest.raises(PlacementError):
        validate_plan(cl, {"j": wrong})
    with pytest.raises(PlacementError):
        validate_plan(cl, {"j": Placement("j", cell, (("n4", 2), ("n6", 2), ("n2", 2)), plan, 1.0)})
    assert math.isclose(sum(s * n for s, n in zip(plan.shares, (2, 4), strict=True)), 24)


# ---- issue 15: more types, cells that pay, sharded state, pipelines across types ----------------------------


def test_mixed_keys_with_pipelines_and_more_types():
    for cell in (
        mixed_cell((("a100", 1), ("a10", 1)), 1, 2),
        mixed_cell((("a10", 1), ("a40", 2), ("v100", 1)), 2),
        mixed_cell((("a10", 2), ("a40", 2)), 2, 4),
    ):
        assert parse_key(cell.key()) == cell
    assert mixed_cell((("a100", 1), ("a10", 1)), 1, 2).key() == "a100x1+a10x1:2x1:pp2"
    assert parse_key("a100x1+a10x1:2x1:ppx") is None and parse_key("a100x1+a10x1:3x1:pp2") is None
    assert stages_per_part(mixed_cell((("a10", 2), ("a40", 2)), 2, 4)) == (2, 2)
    assert stages_per_part(mixed_cell((("a10", 1), ("a40", 2)), 2, 2)) is None  # 3 GPUs a stage: not whole
    assert stages_per_part(mixed_cell((("a10", 1), ("a40", 2)), 2, 1)) is None  # pp 1: not a pipeline


def brute_units(units, ranks, cost):
    best = None
    for us in itertools.product(*(range(1, units // r + 1) for r in ranks)):
        if sum(r * u for r, u in zip(ranks, us, strict=True)) == units:
            worst = max(u * c for u, c in zip(us, cost, strict=True))
            best = worst if best is None else min(best, worst)
    return best


@pytest.mark.parametrize("ranks", [(1, 1, 1), (2, 1, 3), (1, 2, 2), (4, 2, 1, 1)])
@pytest.mark.parametrize("cost", [(1.0, 1.0, 1.0, 1.0), (1.0, 2.0, 3.0, 1.5), (0.5, 1.7, 1.0, 4.0)])
def test_split_batch_over_three_and_more_parts_matches_brute_force(ranks, cost):
    cost = cost[: len(ranks)]
    for batch in range(1, 25):
        got, want = split_batch(batch, ranks, cost, 1), brute_units(batch, ranks, cost)
        assert (got is None) == (want is None), batch
        if got is not None:
            shares, m = got
            assert m == 1 and sum(r * s for r, s in zip(ranks, shares, strict=True)) == batch and min(shares) >= 1
            assert max(s * c for s, c in zip(shares, cost, strict=True)) == pytest.approx(want, rel=1e-12), batch


def test_cells_that_may_pay_are_enumerated_bounded():
    j = job(min_gpus=2, max_gpus=6)
    assert all(not c.mixed for c in enumerate_cells(j, cluster(), CFG))  # a single type can hold it: none needed
    opt = optional_mixed_cells(j, cluster(), CFG)
    assert opt and len(opt) <= OPTIONAL_PER_CELL * CFG.max_mixed_cells
    assert all(c.mixed and len(c.parts) <= CFG.max_mixed_types and c.num_gpus <= 6 for c in opt)
    assert all(c.pp == 1 or stages_per_part(c) is not None for c in opt)
    assert any(c.pp > 1 for c in opt) and any(c.pp == 1 for c in opt)
    assert optional_mixed_cells(j, cluster(), SolverConfig(mixed_cells=False)) == []
    assert optional_mixed_cells(job(), cluster(), CFG) == []  # it needs mixed cells: enumerate_cells has them
    wide = optional_mixed_cells(
        job(gpu_types=None, min_gpus=4, max_gpus=16), cluster(), SolverConfig(max_mixed_types=3)
    )
    assert any(len(c.parts) == 3 for c in wide)
    assert all(len(c.parts) == 2 for c in optional_mixed_cells(job(gpu_types=None, min_gpus=4), cluster(), CFG))


def four_types() -> ClusterView:
    """etc/sim-hetero-24.toml's shape: one a100x4, one v100x4, four a40x2, four a10x2 nodes."""
    nodes = [NodeView("a", "a100", 4, 4, ("all",)), NodeView("v", "v100", 4, 4, ("all",))]
    nodes += [NodeView(f"f{i}", "a40", 2, 2, ("all",)) for i in range(4)]
    nodes += [NodeView(f"t{i}", "a10", 2, 2, ("all",)) for i in range(4)]
    return ClusterView(tuple(nodes))


def test_cells_that_may_pay_give_every_size_and_combination_its_data_parallel_cell_first():
    """The budget goes round the (GPU count, types) groups: each group's pp-1 cell before any
    pipeline, so the last combination in name order (a100 + v100) is not cut for the first
    combinations' pipelines; then the pipelines, the deepest of each group first."""
    opt = optional_mixed_cells(job("gpt-2.7b", gpu_types=None, min_gpus=1), four_types(), CFG)
    assert len(opt) <= OPTIONAL_PER_CELL * CFG.max_mixed_cells
    keys = [c.key() for c in opt]
    assert "a100x1+v100x1:2x4:pp1" in keys and "a10x4+a40x4:8x2:pp1" in keys

    def group(c: Cell) -> tuple:
        return c.num_gpus, tuple(t for t, _ in c.parts)

    first_pipeline = next(i for i, c in enumerate(opt) if c.pp > 1)
    assert {group(c) for c in opt[:first_pipeline]} == {group(c) for c in opt}
    deep = [c.pp for c in opt if group(c) == (16, ("a10", "a40")) and c.pp > 1]
    assert deep == [8, 4, 2]  # a stage on one type each: 2, 4 or 8 GPUs


def fake(cell: Cell, t: float) -> Estimate:
    return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), t, 1.0, EstimateSource.ANALYTIC)


def test_a_mixed_cell_is_offered_only_when_free_now_and_faster_than_the_best_single_cell_free_now():
    a40_1, a40_2, a10 = Cell("a40", 1, 2), Cell("a40", 2, 2), Cell("a10", 1, 2)
    kept = [fake(a40_1, 2.0), fake(a40_2, 1.2), fake(a10, 4.0)]
    optional = [fake(mixed_cell((("a10", 1), ("a40", 2)), 2), 1.0), fake(mixed_cell((("a10", 1), ("a40", 1)), 2), 1.5)]
    j = job(min_gpus=2)
    assert FreeNow(cluster(), {}, [j]).paying(j, kept, optional) == [0]  # a40:2x2 (1.2 s) is free: only 1.0 s pays
    assert FreeNow(cluster(), {"n5": 2}, [j]).paying(j, kept, optional) == [
        1
    ]  # a fixed job holds n5: 3x2 no longer fits
    held = Placement("j", a40_1, (("n5", 2),), ParallelPlan(1, 2, 1), 2.0)
    mine = replace(j, current=held)
    assert FreeNow(cluster(), {}, [mine]).paying(mine, kept, optional) == [0]  # n5 is its own: a40:2x2 again
    other = replace(job(min_gpus=2), job_id="k", current=replace(held, job_id="k"))
    assert FreeNow(cluster(), {}, [j, other]).paying(j, kept, optional) == [1]  # another running job holds n5
    assert FreeNow(cluster(a40_free=0), {}, [j]).paying(j, kept, optional) == []  # only the a10 is free: no mixed cell
    assert FreeNow(cluster(), {"n5": 2, "n6": 2}, [j]).paying(j, kept, optional) == []  # nor without the a10


def test_policy_places_a_mixed_cell_when_it_pays(estimator, exact_config):
    """gpt-2.7b on a40 + a10 nodes: with one a40 node taken, the a40 + a10 cell beats the a40 node alone."""
    nodes = list(cluster().nodes)
    busy = ClusterView(tuple(replace(n, gpus_free=0) if n.name == "n5" else n for n in nodes))
    j = job("gpt-2.7b", min_gpus=2, max_gpus=4)
    cfg = exact_config()
    reply = CellschedPolicy().schedule(ScheduleRequest(busy, (j,), config=cfg), estimator)
    p = reply.placements["j"]
    assert p.cell.mixed and {n for n, _ in p.nodes} == {"n4", "n6"}
    validate_plan(busy, reply.placements)
    single = CellschedPolicy().schedule(ScheduleRequest(busy, (j,), config=exact_config(mixed_cells=False)), estimator)
    q = single.placements["j"]
    assert not q.cell.mixed and p.iter_time_s < q.iter_time_s


def test_mixed_state_sharded_by_free_memory(estimator):
    """gpt-13b on one a100x4 and two a40x4 nodes: the replicated state fits neither type; sharded
    by each GPU's free memory (limit - parameters, gradients, activations) it fits the sum."""
    cell = mixed_cell((("a100", 1), ("a40", 2)), 4)
    off = estimator.estimate(job("gpt-13b", gpu_types=None, state_sharding=False), cell)
    assert not off.feasible
    e = estimator.estimate(job("gpt-13b", gpu_types=None), cell)
    assert e.feasible and e.plan.sharded and len(e.plan.state_shares) == 2
    free100, free40 = e.plan.state_shares
    assert free40 > free100 > 0  # an a40 has more memory left for state than an a100-40GB
    limit = max(estimator.costs.mem_limit_gb("a100"), estimator.costs.mem_limit_gb("a40"))
    assert e.mem_per_gpu_gb <= limit + 1e-9
    # the cell's whole state fits the free memory of its ranks, and no more than that is claimed
    ranks = [4 // e.plan.tp, 8 // e.plan.tp]
    assert e.state_gb <= max(free100, free40) + 1e-9
    assert (
        sum(r * f for r, f in zip(ranks, e.plan.state_shares, strict=True))
        >= e.state_gb * sum(ranks) / max(ranks) - 1e-9
    )
    # a cell that fits replicated stays replicated
    ok = estimator.estimate(job("gpt-2.7b", gpu_types=None), cell)
    assert ok.feasible and not ok.plan.sharded


def test_gpt13b_mixed_cell_stays_infeasible_where_an_a10_cannot_hold_even_the_replicated_half(estimator):
    """a10x1+a40x2:3x2: at tp 2 gpt-13b's parameters and gradients alone (6.5e9 x 4 B = 26 GB) pass an
    a10's 21.6 GB, so no state split can help; with sharding off it is infeasible too."""
    cell = mixed_cell((("a10", 1), ("a40", 2)), 2)
    assert not estimator.estimate(job("gpt-13b"), cell).feasible
    assert not estimator.estimate(job("gpt-13b", state_sharding=False), cell).feasible


def test_three_types_as_data_parallel_groups(estimator):
    cell = mixed_cell((("a10", 1), ("a40", 1), ("v100", 1)), 2)
    e = estimator.estimate(job(gpu_types=None, min_gpus=2), cell)
    assert e.feasible and len(e.plan.shares) == 3 and e.plan.dp == 6
    assert sum(2 * s for s in e.plan.shares) == 24  # two dp ranks per part
    parts = [estimator.estimate(job(gpu_types=None, min_gpus=2), Cell(t, 1, 2, 1)) for t, _ in cell.parts]
    per_sample = [p.iter_time_s * 2 / 24 for p in parts]
    compute = max(s * c for s, c in zip(e.plan.shares, per_sample, strict=True))
    assert compute == pytest.approx(brute_units(24, (2, 2, 2), per_sample), rel=1e-12)


def test_a_mixed_cell_is_excluded_with_a_part_the_job_failed_in():
    """A job kept out of 2 A10s (by size) or of one A10 node (by key) is not
    given a mixed cell whose A10 part is that; other mixed cells stay."""
    by_size = replace(job(), excluded_cells=frozenset({"a10:2gpus:pp1"}))
    by_key = replace(job(), excluded_cells=frozenset({"a10:1x2:pp1"}))
    for j in (by_size, by_key):
        assert j.excludes(mixed_cell((("a40", 1), ("a10", 1)), 2))
        assert not j.excludes(mixed_cell((("a40", 1), ("a10", 2)), 2))  # 4 A10s: not what failed
        assert not j.excludes(mixed_cell((("a40", 1), ("a100", 1)), 2))
    assert not job().excludes(mixed_cell((("a40", 1), ("a10", 1)), 2))


#: 4 layers, 29 GB of training state each: on 2-GPU a40 nodes it fits only with its optimizer state sharded
CEPHALO = ModelSpec("gpt-cephalo-4l", "gpt", 4, 12288, 16, 32, 256, 4 * 12 * 12288**2)


@pytest.fixture(scope="module")
def twins() -> MixedEstimator:
    """A store with two GPU types "x" and "y" that are both an a40 under another name."""
    store = open_store(":memory:")
    a40 = store.gpus()["a40"]
    for name in ("x", "y"):
        store.put_gpu(replace(a40, name=name))
    return MixedEstimator(Estimator(store))


@pytest.mark.parametrize(
    ("model", "vw", "sharded"),
    [
        (get_model("gpt-350m"), None, False),
        (get_model("gpt-350m"), 8, False),
        (CEPHALO, None, True),
        (CEPHALO, 24, True),
    ],
)
def test_a_mixed_cell_of_two_alike_types_prices_the_single_type_step(twins, model, vw, sharded):
    """x + y (one node each) runs the step of x:2x2 with the same plan: the same compute, gradient sync
    and update; with the state sharded, the runtime's sharded step (every rank's unit gradients
    gathered to the slices' owners, the slices all-gathered), priced the same way for both."""
    j = JobRequest("j", model, 24, 10, virtual_workers=vw, runtime="adaptive")
    mixed = twins.estimate(j, mixed_cell((("x", 1), ("y", 1)), 2))
    assert mixed.feasible and mixed.plan.sharded == sharded, mixed
    assert mixed.plan.shares[0] == mixed.plan.shares[1]
    if sharded:
        assert not twins.estimate(replace(j, state_sharding=False), Cell("x", 2, 2)).feasible
        assert mixed.plan.state_shares[0] == pytest.approx(mixed.plan.state_shares[1])  # even slices
    p = mixed.plan
    same = [
        t
        for plan, t, _ in twins.inner.plans(
            JobRequest("j", model, 24, 1, virtual_workers=vw, state_sharding=sharded, runtime="adaptive"),
            Cell("x", 2, 2),
        )
        if (plan.dp, plan.tp, plan.micro_batches, plan.sharded) == (p.dp, p.tp, p.micro_batches, sharded)
    ]
    assert len(same) == 1 and mixed.iter_time_s == pytest.approx(same[0], rel=1e-9), (mixed, same)


@pytest.mark.parametrize("ranks", [(2, 4), (4, 2), (1, 2, 2), (2, 1, 3)])
@pytest.mark.parametrize("fixed", [(0.0, 0.5, 2.0), (3.0, 0.0, 0.1)])
def test_split_batch_with_micro_batch_costs_and_a_sync_of_the_most_virtual_workers(ranks, fixed):
    """Per rank: samples x c_i + micro-batches x f_i; with V, + sync(the most virtual workers a rank
    holds): the split is the least of every whole split by brute force."""
    cost, fixed = (1.0, 0.6, 1.3)[: len(ranks)], fixed[: len(ranks)]

    def sync(u: int) -> float:
        return 4.0 * u  # large enough to move some splits towards even

    for batch in (12, 24, 36):
        m = 2  # without V: shares are multiples of 2, each rank runs 2 micro-batches
        got = split_batch(batch, ranks, cost, m, None, fixed)
        whole = [
            us
            for us in itertools.product(*(range(1, batch // m // r + 1) for r in ranks))
            if sum(r * u for r, u in zip(ranks, us, strict=True)) * m == batch
        ]
        want = min(max(u * m * c + m * f for u, c, f in zip(us, cost, fixed, strict=True)) for us in whole)
        (shares, got_m) = got
        assert got_m == m and max(s * c + m * f for s, c, f in zip(shares, cost, fixed, strict=True)) == pytest.approx(
            want
        )
        for vw in (v for v in (6, 12) if batch % v == 0 and v >= sum(ranks)):
            per = batch // vw  # with V: whole virtual workers of `per` samples, 1 micro-batch each
            got = split_batch(batch, ranks, cost, 1, vw, fixed, sync)
            units = [
                us
                for us in itertools.product(*(range(1, vw // r + 1) for r in ranks))
                if sum(r * u for r, u in zip(ranks, us, strict=True)) == vw
            ]

            def total(us, per=per):
                return max(u * (per * c + f) for u, c, f in zip(us, cost, fixed, strict=True)) + sync(max(us))

            (shares, _) = got
            assert total([s // per for s in shares]) == pytest.approx(min(total(us) for us in units)), (batch, vw)


# ---- mixed cells only for runtimes that run one job over several GPU types ------------------


@pytest.mark.parametrize("runtime", ["ddp", "torchtitan", "megatron"])
def test_one_type_runtimes_get_no_mixed_cell(runtime):
    needs = job(runtime=runtime)  # 6 GPUs of A40 + A10: no single type holds them
    assert enumerate_cells(needs, cluster(), CFG) == []
    may_pay = job(min_gpus=2, max_gpus=6, runtime=runtime)
    assert optional_mixed_cells(may_pay, cluster(), CFG) == []
    assert all(not c.mixed and len({c.gpu_type}) == 1 for c in enumerate_cells(may_pay, cluster(), CFG))


@pytest.mark.parametrize("runtime", ["exact", "sharded", "adaptive"])
def test_mixed_type_runtimes_keep_their_mixed_cells(runtime):
    assert [c.key() for c in enumerate_cells(job(runtime=runtime), cluster(), CFG)] == [CELL]
    assert optional_mixed_cells(job(min_gpus=2, max_gpus=6, runtime=runtime), cluster(), CFG)
