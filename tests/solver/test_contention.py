"""The network in the solver: the time-averaged contention model, NIC-aware
estimates, and cellsched's price for sharing a network card."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from solver.contention import NicAwareEstimator, contention_factors, duty, nic_by_type
from solver.contract.models import get_model
from solver.cost.share import network_share, nominal_nic_gbps
from solver.estimator import EstimatorBase
from solver.network import CommLoad, Network, iteration_times, slowdowns
from solver.placement import Space
from solver.placement.candidates import Option
from solver.placement.greedy import value_of
from solver.placement.siterules import UNMANAGED_PREFIX
from solver.policies import get_policy
from solver.policies.cellsched import shared_loss
from solver.types import (
    Cell,
    ClusterView,
    Estimate,
    JobRequest,
    NodeView,
    ParallelPlan,
    Placement,
    ScheduleRequest,
    SolverConfig,
)

GPT = get_model("gpt-1.3b")


def test_two_jobs_that_always_communicate_take_twice_as_long_on_a_shared_card():
    net = Network({"a": 10.0, "b": 10.0})
    loads = [CommLoad("1", ("a", "b"), 1.0, 1.0), CommLoad("2", ("a", "b"), 1.0, 1.0)]
    assert iteration_times(loads, net) == pytest.approx({"1": 2.0, "2": 2.0})


def test_two_half_communicating_jobs_meet_at_the_fixed_point():
    net = Network({"a": 10.0, "b": 10.0})
    loads = [CommLoad("1", ("a", "b"), 1.0, 0.5), CommLoad("2", ("a", "b"), 1.0, 0.5)]
    s = slowdowns(loads, net)["1"]
    # s = 1 + duty(s), duty(s) = 0.5 s / (0.5 + 0.5 s): s = (1 + sqrt 5) / 2
    assert s == pytest.approx((1 + math.sqrt(5)) / 2, rel=1e-6)


def test_one_node_jobs_and_jobs_on_other_cards_are_not_slowed():
    net = Network({"a": 10.0, "b": 10.0, "c": 10.0, "d": 10.0})
    loads = [
        CommLoad("multi", ("a", "b"), 1.0, 0.8),
        CommLoad("single", ("a",), 1.0, 0.0),
        CommLoad("apart", ("c", "d"), 1.0, 0.8),
    ]
    assert iteration_times(loads, net) == pytest.approx({"multi": 1.0, "single": 1.0, "apart": 1.0})


def test_an_oversubscribed_uplink_slows_a_job_that_spans_racks_even_alone():
    net = Network({n: 10.0 for n in "abcd"}, {"a": "r1", "b": "r1", "c": "r2", "d": "r2"}, {"r1": 5.0, "r2": 40.0})
    across = CommLoad("x", ("a", "c"), 1.0, 0.5)
    inside = CommLoad("y", ("b", "a"), 1.0, 0.5)
    assert slowdowns([across], net) == pytest.approx({"x": 2.0})  # 10 Gb/s cards, a 5 Gb/s uplink
    assert slowdowns([CommLoad("z", ("c", "d"), 1.0, 0.5)], net) == {"z": 1.0}
    both = slowdowns([across, inside], net)  # they share card a; x is held back by the uplink still
    assert both["x"] == pytest.approx(2.0) and both["y"] > 1.5


def test_a_bad_nic_is_refused():
    with pytest.raises(ValueError, match="nic_gbps"):
        Network({"a": 0.0})


def test_the_network_share_is_zero_on_one_node_and_grows_with_nodes():
    assert network_share(GPT, 64, Cell("v100", 1, 4), None) == 0.0
    two = network_share(GPT, 64, Cell("v100", 2, 2), None)
    four = network_share(GPT, 64, Cell("v100", 4, 1), None)
    assert 0 < two < 1 and 0 < four < 1
    assert nominal_nic_gbps("v100") == 100.0


def _cluster(nic: float, free: dict[str, int] | None = None) -> ClusterView:
    free = free or {}
    return ClusterView(tuple(NodeView(f"n{i}", "v100", 4, free.get(f"n{i}", 4), nic_gbps=nic) for i in range(1, 5)))


class Table(EstimatorBase):
    """Iteration times by cell key (missing: infeasible), DP-only plans."""

    def __init__(self, times: dict[str, float]) -> None:
        self.times = times

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        t = self.times.get(cell.key())
        plan = ParallelPlan(cell.pp, cell.num_gpus // cell.pp, 1)
        if t is None:
            return Estimate(cell, None, math.inf, 0.0, "table", "no entry")
        return Estimate(cell, plan, t, 1.0, "table")


def test_a_multi_node_cell_on_slow_cards_is_estimated_slower_and_a_one_node_cell_is_not():
    est = NicAwareEstimator(Table({"v100:2x2:pp1": 1.0, "v100:1x4:pp1": 1.0}))
    job = JobRequest("j", GPT, 64, 100, runtime="adaptive")
    est.set_cluster(_cluster(100.0))
    assert est.estimate(job, Cell("v100", 2, 2)).iter_time_s == pytest.approx(1.0)
    assert est.set_cluster(_cluster(10.0))
    share = network_share(GPT, 64, Cell("v100", 2, 2), ParallelPlan(1, 4, 1))
    assert est.estimate(job, Cell("v100", 2, 2)).iter_time_s == pytest.approx(1 - share + 10 * share)
    assert est.estimate(job, Cell("v100", 1, 4)).iter_time_s == 1.0
    assert nic_by_type(_cluster(10.0)) == {"v100": 10.0}


def test_a_pipeline_boundary_between_nodes_costs_every_micro_batch_at_the_card():
    """Every micro-batch's activations (forward) and their gradients (back) cross
    the card between the two stages' nodes: 2 x (batch / dp) x boundary bytes per
    sample x the dp ranks on a node, priced at the card's speed beyond the
    datasheet network (100 Gb/s for a v100) that the estimate stands on."""
    est = NicAwareEstimator(Table({"v100:2x2:pp2": 1.0}))
    job = JobRequest("j", GPT, 64, 100, runtime="adaptive")
    cell = Cell("v100", 2, 2, 2)
    est.set_cluster(_cluster(100.0))
    assert est.estimate(job, cell).iter_time_s == pytest.approx(1.0)
    est.set_cluster(_cluster(10.0))
    share = network_share(GPT, 64, cell, ParallelPlan(2, 2, 1))  # the fill's transfer only
    per_card = 2 * (64 / 2) * GPT.boundary_bytes_per_sample() * 2
    extra = per_card * 8 / 1e9 * (1 / 10 - 1 / 100)
    assert extra > 0.1  # far from the fill's share alone
    assert est.estimate(job, cell).iter_time_s == pytest.approx(1 - share + 10 * share + extra)


def test_contention_factors_price_jobs_on_the_same_cards():
    cluster = _cluster(10.0)
    a, b = JobRequest("a", GPT, 64, 100, runtime="adaptive"), JobRequest("b", GPT, 64, 100, runtime="adaptive")
    cell, plan = Cell("v100", 2, 2), ParallelPlan(1, 4, 1)
    pa = Placement("a", cell, (("n1", 2), ("n2", 2)), plan, 1.0)
    pb = Placement("b", cell, (("n1", 2), ("n2", 2)), plan, 1.0)
    apart = Placement("b", cell, (("n3", 2), ("n4", 2)), plan, 1.0)
    d = duty(a, cell, plan, 10.0)
    shared = contention_factors([(a, pa, 1.0), (b, pb, 1.0)], cluster)
    assert shared["a"] == pytest.approx(shared["b"]) and 1 + d * d < shared["a"] <= 1 + d
    assert contention_factors([(a, pa, 1.0), (b, apart, 1.0)], cluster) == pytest.approx({"a": 1.0, "b": 1.0})


def _request(contention_aware: bool, times: dict[str, float]) -> tuple[ScheduleRequest, Table]:
    """n3, n4 full (single-node jobs of others); n1, n2 carry a running 2x2
    job that stays: a new job may share its cards (2x2) or run on one node (1x2)."""
    cluster = _cluster(10.0, {"n3": 0, "n4": 0})
    plan = ParallelPlan(1, 4, 1)
    running = JobRequest(
        "old",
        GPT,
        64,
        10_000,
        min_gpus=4,
        max_gpus=4,
        current=Placement("old", Cell("v100", 2, 2), (("n1", 2), ("n2", 2)), plan, 1.0),
        runtime="adaptive",
    )
    new = JobRequest("new", GPT, 64, 10_000, min_gpus=2, max_gpus=4, elastic=True, runtime="adaptive")
    cfg = SolverConfig(contention_aware=contention_aware, mixed_cells=False)
    return ScheduleRequest(cluster, (running, new), config=cfg), Table(times)


def test_cellsched_keeps_a_communicating_job_off_a_shared_card_when_a_one_node_cell_is_near():
    times = {"v100:2x2:pp1": 1.0, "v100:1x2:pp1": 1.5}
    aware, table = _request(True, times)
    blind, _ = _request(False, times)
    pa = get_policy("cellsched").schedule(aware, table).placements["new"]
    pb = get_policy("cellsched").schedule(blind, table).placements["new"]
    assert pb.cell == Cell("v100", 2, 2)  # as if alone on its cards: the faster cell
    assert pa.cell == Cell("v100", 1, 2)  # sharing the running job's cards costs more


def test_a_link_carrying_two_multi_node_jobs_costs_the_product_of_their_duties():
    racks = {"n1": "r0", "n2": "r0", "n3": "r1", "n4": "r1"}
    cluster = ClusterView(
        tuple(NodeView(n, "v100", 4, 4, nic_gbps=10.0, rack=r) for n, r in racks.items()),
        uplink_gbps={"r0": 10.0, "r1": 10.0},
    )
    plan = ParallelPlan(1, 4, 1)
    cell = Cell("v100", 2, 2)
    jobs = {j: JobRequest(j, GPT, 64, 10_000, runtime="adaptive") for j in "abcd"}
    d = duty(jobs["a"], cell, plan, 10.0)
    assert 0.1 < d < 1

    def at(jid: str, *nodes: str) -> Placement:
        return Placement(jid, Cell("v100", len(nodes), 2), tuple((n, 2) for n in nodes), plan, 1.0)

    def loss(*ps: Placement) -> float:
        return shared_loss(cluster, {p.job_id: p for p in ps}, jobs)

    assert loss(at("a", "n1", "n2"), at("b", "n3", "n4")) == 0.0  # a rack each: no card, no uplink in common
    assert loss(at("a", "n1", "n2"), at("b", "n2", "n3")) == pytest.approx(1 - 1 / (1 + d * d))  # n2's card
    assert loss(at("a", "n1", "n3"), at("b", "n2", "n4")) == pytest.approx(1 - 1 / (1 + d * d))  # the uplinks
    assert loss(at("a", "n1", "n2"), at("c", "n1"), at("d", "n2")) == 0.0  # one-node jobs use no link
    assert loss(at("a", "n1", "n2"), at(UNMANAGED_PREFIX + "7", "n1", "n2")) == 0.0  # a plain job's stand-in
    assert loss(at("a", "n1", "n2"), at("x", "n1", "n2")) == 0.0  # a job no longer there (a previous plan's)


def test_cellsched_prices_sharing_only_where_links_are_or_would_be_shared(monkeypatch):
    """Sharing is priced (pick_costs) in a round where two multi-node jobs
    share a link now (one solve), or in the plan made as if every job were
    alone on its links (solved again); elsewhere the round is the one
    without contention_aware (one solve, nothing priced)."""
    import solver.policies.cellsched as cs

    costs: list[int] = []
    solves: list[int] = []
    real_costs, real_place = cs.pick_costs, cs.place_jobs
    monkeypatch.setattr(cs, "pick_costs", lambda *a, **k: costs.append(1) or real_costs(*a, **k))
    monkeypatch.setattr(cs, "place_jobs", lambda *a, **k: solves.append(1) or real_place(*a, **k))
    times = {"v100:2x2:pp1": 1.0, "v100:1x2:pp1": 1.5}
    cluster = _cluster(10.0)  # the job alone on four free nodes: its 2x2 shares no card
    lone = JobRequest("new", GPT, 64, 10_000, min_gpus=2, max_gpus=4, elastic=True, runtime="adaptive")
    for aware in (True, False):
        request = ScheduleRequest(cluster, (lone,), config=SolverConfig(contention_aware=aware, mixed_cells=False))
        assert get_policy("cellsched").schedule(request, Table(times)).placements["new"].cell == Cell("v100", 2, 2)
    assert (costs, solves) == ([], [1, 1])
    would, table = _request(True, times)  # the running 2x2 job's cards are the only free ones
    assert get_policy("cellsched").schedule(would, table).placements["new"].cell == Cell("v100", 1, 2)
    assert (costs, solves) == ([1], [1, 1, 1, 1])
    # two running 2x2 jobs on n1 and n2's cards already: priced from the first solve
    plan = ParallelPlan(1, 4, 1)
    both = tuple(
        JobRequest(
            jid,
            GPT,
            64,
            10_000,
            min_gpus=4,
            max_gpus=4,
            current=Placement(jid, Cell("v100", 2, 2), nodes, plan, 1.0),
            runtime="adaptive",
        )
        for jid, nodes in (("a", (("n1", 2), ("n2", 2))), ("b", (("n1", 2), ("n2", 2))))
    )
    now = ScheduleRequest(_cluster(10.0), both, config=SolverConfig(mixed_cells=False))
    get_policy("cellsched").schedule(now, table)
    assert (costs, solves) == ([1, 1], [1, 1, 1, 1, 1])


def test_cellsched_shares_a_card_when_that_pays():
    times = {"v100:2x2:pp1": 1.0, "v100:1x2:pp1": 4.0}
    aware, table = _request(True, times)
    p = get_policy("cellsched").schedule(aware, table).placements["new"]
    assert p.cell == Cell("v100", 2, 2) and sorted(p.node_names) == ["n1", "n2"]


def test_the_node_pass_puts_a_multi_node_job_on_cards_no_fixed_job_uses():
    cluster = _cluster(10.0)
    plan = ParallelPlan(1, 4, 1)
    fixed = {"old": Placement("old", Cell("v100", 2, 2), (("n1", 2), ("n2", 2)), plan, 1.0)}
    space = Space.of(cluster, fixed)
    assert dict(space.links) == {"n1": 1, "n2": 1}
    ledger = space.ledger()
    assert sorted(ledger.pick(list(space.classes), 2, 2, True, True)) == ["n3", "n4"]


def test_a_plan_whose_multi_node_jobs_share_a_card_is_worth_less():
    a = Option("a", Cell("v100", 2, 2), ParallelPlan(1, 4, 1), 1.0, 100, nic_cost=30)
    b = replace(a, job_id="b")
    shared = {"a": (a, (("n1", 2), ("n2", 2)), None), "b": (b, (("n1", 2), ("n2", 2)), None)}
    apart = {"a": (a, (("n1", 2), ("n2", 2)), None), "b": (b, (("n3", 2), ("n4", 2)), None)}
    assert value_of(apart) == 200
    assert value_of(shared) == 140  # each of the two cards: 2 x the mean cost per share (15)
    assert value_of({"b": apart["b"]}, {"n3": 1}) == 70  # sharing n3 with a fixed job: 2 x 15
