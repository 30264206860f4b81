"""Cell enumeration and dominance pruning."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.cells import cap, enumerate_cells, frontier, prune_dominated
from solver.contract.models import ModelSpec
from solver.types import Cell, ClusterView, Estimate, JobRequest, NodeView, ParallelPlan, SolverConfig

MODEL = ModelSpec("m", "gpt", num_layers=8, hidden=64, heads=4, seq_len=16, vocab=32, params=1e6)
CFG = SolverConfig()


def cluster() -> ClusterView:
    nodes = [NodeView(f"a100-{i}", "a100", 4, 4, ("gpu",)) for i in range(2)]
    nodes += [NodeView(f"a40-{i}", "a40", 2, 1, ("gpu", "small")) for i in range(3)]
    nodes += [NodeView("v100-0", "v100", 8, 0, ("big",))]
    return ClusterView(tuple(nodes))


def job(**kw) -> JobRequest:
    return JobRequest("j", kw.pop("model", MODEL), 64, 10, **{"runtime": "adaptive", **kw})


def test_exact_cells_of_a_small_request():
    cells = enumerate_cells(job(gpu_types=("a100",), min_gpus=2, max_gpus=4), cluster(), CFG)
    assert [c.key() for c in cells] == [
        "a100:1x2:pp1",
        "a100:1x2:pp2",
        "a100:2x1:pp1",
        "a100:2x1:pp2",
        "a100:1x4:pp1",
        "a100:1x4:pp2",
        "a100:1x4:pp4",
        "a100:2x2:pp1",
        "a100:2x2:pp2",
        "a100:2x2:pp4",
    ]  # 4x1 needs four A100 nodes; there are two


def test_allowed_types_and_default_max_is_capacity():
    cells = enumerate_cells(job(), cluster(), CFG)
    assert {c.gpu_type for c in cells} == {"a100", "a40", "v100"}
    by_type = {t: {c.num_gpus for c in cells if c.gpu_type == t} for t in ("a100", "a40", "v100")}
    assert by_type == {"a100": {1, 2, 4, 8}, "a40": {1, 2, 4}, "v100": {1, 2, 4, 8}}
    assert enumerate_cells(job(gpu_types=("h100",)), cluster(), CFG) == []


def test_requested_and_min_counts_are_added():
    cells = enumerate_cells(job(gpu_types=("a100",), min_gpus=3, max_gpus=6, requested_gpus=6), cluster(), CFG)
    assert sorted({c.num_gpus for c in cells}) == [3, 4, 6]
    assert {c.layout for c in cells if c.num_gpus == 6} == {"2x3"}  # 1x6 too big, 3x2/6x1 need more nodes
    assert {c.layout for c in cells if c.num_gpus == 3} == {"1x3"}


def test_node_shapes_and_counts_are_respected():
    cl = cluster()
    for c in enumerate_cells(job(), cl, CFG):
        fitting = [n for n in cl.nodes_of(c.gpu_type) if n.gpus_total >= c.gpus_per_node]
        assert len(fitting) >= c.num_nodes
        assert c.num_gpus % c.pp == 0 and c.pp <= CFG.max_pp


def test_uses_partition_shape_not_free_gpus():
    # v100-0 has no free GPU but its shape still admits 1x8 cells
    cells = enumerate_cells(job(gpu_types=("v100",)), cluster(), CFG)
    assert "v100:1x8:pp1" in {c.key() for c in cells}


def test_partitions_restrict_nodes():
    cells = enumerate_cells(job(partitions=("small",)), cluster(), CFG)
    assert {c.gpu_type for c in cells} == {"a40"}
    # the cluster's partition table counts too
    cl = ClusterView(cluster().nodes, {"extra": ("a100-0",)})
    cells = enumerate_cells(job(partitions=("extra",)), cl, CFG)
    assert {c.gpu_type for c in cells} == {"a100"} and max(c.num_gpus for c in cells) == 4


def test_excluded_cells_are_skipped():
    base = enumerate_cells(job(gpu_types=("a40",)), cluster(), CFG)
    gone = {"a40:2x2:pp2", "a40:1x1:pp1"}
    cells = enumerate_cells(job(gpu_types=("a40",), excluded_cells=frozenset(gone)), cluster(), CFG)
    assert {c.key() for c in cells} == {c.key() for c in base} - gone


def test_pp_bounded_by_layers_and_config():
    two = ModelSpec("two", "gpt", num_layers=2, hidden=64, heads=4, seq_len=16, vocab=32, params=1e6)
    assert max(c.pp for c in enumerate_cells(job(model=two), cluster(), CFG)) == 2
    assert max(c.pp for c in enumerate_cells(job(), cluster(), SolverConfig(max_pp=4))) == 4


def test_deterministic_order_fewest_nodes_first():
    a = enumerate_cells(job(), cluster(), CFG)
    assert a == enumerate_cells(job(), cluster(), CFG)
    keys = [(c.gpu_type, c.num_gpus, c.num_nodes, c.pp) for c in a]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=6),
    lo=st.integers(1, 8),
    span=st.integers(0, 8),
    layers=st.integers(1, 12),
)
def test_cells_honour_limits(sizes, lo, span, layers):
    nodes = tuple(NodeView(f"n{i}", "g", s, s) for i, s in enumerate(sizes))
    model = ModelSpec("p", "gpt", num_layers=layers, hidden=64, heads=4, seq_len=16, vocab=32, params=1e6)
    j = JobRequest("j", model, 64, 10, min_gpus=lo, max_gpus=lo + span, runtime="adaptive")
    cells = enumerate_cells(j, ClusterView(nodes), CFG)
    for c in cells:
        assert lo <= c.num_gpus <= min(lo + span, sum(sizes))
        assert sum(1 for s in sizes if s >= c.gpus_per_node) >= c.num_nodes
        assert c.pp <= min(layers, CFG.max_pp)
    powers = [1 << i for i in range(8) if lo <= 1 << i <= min(lo + span, sum(sizes))]
    for p in powers:  # a power of two in range that one node or enough 1-GPU slots hold appears
        if len(sizes) >= p or max(sizes) >= p:
            assert any(c.num_gpus == p for c in cells)


# ---- pruning -----------------------------------------------------------------------


def est(layout: str, t: float, pp: int = 1, gpu: str = "a100") -> Estimate:
    n, g = map(int, layout.split("x"))
    cell = Cell(gpu, n, g, pp)
    if math.isinf(t):
        return Estimate(cell, None, t, 0.0, "analytic", "OOM")
    return Estimate(cell, ParallelPlan(pp, n * g // pp, 1), t, 1.0, "analytic")


def layouts(kept: list[Estimate]) -> set[str]:
    return {f"{e.cell.gpu_type}:{e.cell.layout}" for e in kept}


def test_prune_drops_infeasible_and_keeps_best_pp():
    kept = prune_dominated([est("1x4", 10, 1), est("1x4", 8, 2), est("1x4", 9, 4), est("1x2", math.inf)], CFG)
    assert [(e.cell.layout, e.cell.pp) for e in kept] == [("1x4", 2)]


def test_same_gpus_slower_dropped_only_for_a_spread_faster_layout():
    kept = prune_dominated([est("1x4", 10), est("2x2", 9)], CFG)
    assert layouts(kept) == {"a100:2x2"}  # spread and faster: the packed one goes
    kept = prune_dominated([est("1x4", 9), est("2x2", 10)], CFG)
    assert layouts(kept) == {"a100:1x4", "a100:2x2"}  # spread is slower but easier to place


def test_more_gpus_no_faster_dropped():
    kept = prune_dominated([est("1x2", 5), est("1x4", 5), est("2x2", 5.5), est("2x1", 4)], CFG)
    assert layouts(kept) == {"a100:2x1"}
    kept = prune_dominated([est("2x1", 5), est("1x4", 4)], CFG)  # 1x4 packs 4 per node: kept
    assert layouts(kept) == {"a100:2x1", "a100:1x4"}


def test_types_do_not_dominate_each_other():
    kept = prune_dominated([est("1x2", 5, gpu="a100"), est("1x4", 9, gpu="a40")], CFG)
    assert layouts(kept) == {"a100:1x2", "a40:1x4"}


def test_cap_keeps_fastest_and_smallest_of_each_type():
    es = [
        est("1x1", 40),
        est("2x1", 21),
        est("4x1", 11),
        est("8x1", 6.5),
        est("16x1", 3.9),
        est("1x1", 50, gpu="a40"),
        est("2x1", 24, gpu="a40"),
        est("4x1", 12.5, gpu="a40"),
    ]
    kept = prune_dominated(es, SolverConfig(max_cells_per_job=5))
    assert len(kept) == 5
    must = {"a100:1x1", "a100:16x1", "a40:1x1", "a40:4x1"}
    assert must <= layouts(kept)
    assert layouts(kept) - must == {"a100:2x1"}  # best throughput per GPU among the rest (42 GPU-s)
    assert len(prune_dominated(es, SolverConfig(max_cells_per_job=1))) == 4  # mandatory ones stay


def cell_items(gpus: str, times: st.SearchStrategy) -> st.SearchStrategy:
    """Lists of (layout, pp, GPU type, time) for `ests`."""
    layouts = st.sampled_from(["1x1", "1x2", "2x1", "1x4", "2x2", "4x1", "2x4", "4x2"])
    return st.lists(st.tuples(layouts, st.sampled_from([1, 2]), st.sampled_from(list(gpus)), times), max_size=20)


def ests(items, scale: float = 1.0) -> list[Estimate]:
    return [est(lay, t * scale, pp if int(lay[0]) * int(lay[-1]) % pp == 0 else 1, gpu) for lay, pp, gpu, t in items]


@settings(max_examples=80, deadline=None)
@given(cell_items("ab", st.floats(1, 100) | st.just(math.inf)))
def test_prune_leaves_no_dominated_cell(items):
    es = ests(items)
    kept = prune_dominated(es, CFG)
    assert all(e.feasible for e in kept)
    for a in kept:
        for b in kept:
            if a is not b and a.cell.gpu_type == b.cell.gpu_type:
                assert a.cell.layout != b.cell.layout
                assert not (
                    a.iter_time_s <= b.iter_time_s
                    and a.cell.num_gpus <= b.cell.num_gpus
                    and a.cell.gpus_per_node <= b.cell.gpus_per_node
                )
    for t in {e.cell.gpu_type for e in es if e.feasible}:  # the fastest of each type survives
        fastest = min(e.iter_time_s for e in es if e.feasible and e.cell.gpu_type == t)
        assert any(e.iter_time_s == fastest for e in kept if e.cell.gpu_type == t)


@settings(max_examples=80, deadline=None)
@given(
    cell_items("abc", st.integers(1, 400) | st.just(math.inf)),
    st.tuples(st.sampled_from([0.25, 0.5, 1.0, 2.0]), st.sampled_from([0.5, 1.0, 4.0]), st.just(1.0)),
    st.sampled_from([2, 5, 24]),
)
def test_a_frontier_scaled_per_type_prunes_as_the_scaled_estimates(items, factors, most):
    """What the policy relies on to calibrate the frontier, not every cell:
    one factor per GPU type (times of a quarter, so products stay exact)
    commutes with steps 1-3, and step 4 then keeps the same cells."""
    es = ests(items, 0.25)
    f = dict(zip("abc", factors, strict=True))

    def scaled(e: Estimate) -> Estimate:
        return dataclasses.replace(e, iter_time_s=e.iter_time_s * f[e.cell.gpu_type])

    cfg = SolverConfig(max_cells_per_job=most)
    want = prune_dominated([scaled(e) for e in es], cfg)
    assert cap([[scaled(e) for e in g] for g in frontier(es)], cfg) == want
    if any(f[e.cell.gpu_type] != 1.0 for e in want):  # the factors matter to step 4, not to 1-3
        assert {e.cell for e in cap(frontier(es), SolverConfig(max_cells_per_job=99))} >= {e.cell for e in want}


def test_prune_rejects_nothing_when_empty():
    assert prune_dominated([], CFG) == []


@pytest.mark.parametrize("cap", [1, 3, 24])
def test_prune_output_order(cap):
    es = [est("2x2", 3), est("1x1", 9), est("1x2", 5, gpu="a40"), est("4x1", 2.5)]
    kept = prune_dominated(es, SolverConfig(max_cells_per_job=cap))
    keys = [(e.cell.gpu_type, e.cell.num_gpus, e.cell.num_nodes, e.cell.pp) for e in kept]
    assert keys == sorted(keys)


# ---- what the job's runtime carries out (solver.contract.runtimes) ---------------------------------


def keys(cells) -> list[str]:
    return [c.key() for c in cells]


def test_a_ddp_job_gets_only_data_parallel_cells_of_one_type():
    """ddp: pp = 1 only; the same GPU counts and layouts as before (hand-listed)."""
    cells = enumerate_cells(job(gpu_types=("a100",), min_gpus=2, max_gpus=4, runtime="ddp"), cluster(), CFG)
    assert keys(cells) == ["a100:1x2:pp1", "a100:2x1:pp1", "a100:1x4:pp1", "a100:2x2:pp1"]


def test_a_ddp_job_gets_only_gpu_counts_that_split_its_batch_evenly():
    # counts 3, 4, 6 (min, power of two, request); 3 and 6 do not divide the global batch of 64
    j = job(gpu_types=("a100",), min_gpus=3, max_gpus=6, requested_gpus=6, runtime="ddp")
    assert keys(enumerate_cells(j, cluster(), CFG)) == ["a100:1x4:pp1", "a100:2x2:pp1"]
    # the same request with a global batch of 48: every count divides it
    j48 = JobRequest("j", MODEL, 48, 10, gpu_types=("a100",), min_gpus=3, max_gpus=6, requested_gpus=6, runtime="ddp")
    assert keys(enumerate_cells(j48, cluster(), CFG)) == [
        "a100:1x3:pp1",
        "a100:1x4:pp1",
        "a100:2x2:pp1",
        "a100:2x3:pp1",
    ]


@pytest.mark.parametrize("runtime", ["megatron", "torchtitan"])
def test_even_stage_runtimes_get_only_stage_counts_that_divide_the_layers(runtime):
    six = dataclasses.replace(MODEL, num_layers=6)  # 4 stages cannot split 6 layers evenly
    cells = enumerate_cells(
        job(model=six, gpu_types=("a100",), min_gpus=2, max_gpus=4, runtime=runtime), cluster(), CFG
    )
    assert keys(cells) == [
        "a100:1x2:pp1",
        "a100:1x2:pp2",
        "a100:2x1:pp1",
        "a100:2x1:pp2",
        "a100:1x4:pp1",
        "a100:1x4:pp2",
        "a100:2x2:pp1",
        "a100:2x2:pp2",
    ]


@pytest.mark.parametrize("runtime", ["exact", "sharded", "adaptive"])
def test_runtimes_that_carry_out_any_plan_get_every_cell(runtime):
    cells = enumerate_cells(job(gpu_types=("a100",), min_gpus=2, max_gpus=4, runtime=runtime), cluster(), CFG)
    assert len(cells) == 10 and {c.pp for c in cells} == {1, 2, 4}  # test_exact_cells_of_a_small_request's list
