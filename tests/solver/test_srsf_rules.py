"""The SRSF baselines' rules one at a time (the mutation benchmark found them
untested): partitions in pick_nodes, the cards a component couples,
clean_start, AdaDUAL's wait and its sharers, the reply's fields. Every
expected value is worked out by hand from the policies' docstrings."""

from __future__ import annotations

import math
import time

import pytest

from solver.contention import loaded_times
from solver.contract.models import get_model
from solver.estimator import EstimatorBase
from solver.placement import Space
from solver.policies import get_policy
from solver.policies.srsf_common import clean_start, component, pick_nodes, remaining_service
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
    SolverStatus,
)

GPT = get_model("gpt-1.3b")


class Seconds(EstimatorBase):
    """Every DP cell of up to 16 GPUs takes `s` seconds an iteration (source MEASURED)."""

    def __init__(self, s: float = 1.0) -> None:
        self.s = s

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        if cell.num_gpus > 16:
            return Estimate(cell, None, math.inf, 0.0, EstimateSource.NONE, "too large")
        return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), self.s, 1.0, EstimateSource.MEASURED)


def nodes(spec: dict[str, int], nic: float = 10.0, parts: dict[str, tuple[str, ...]] | None = None) -> ClusterView:
    """4-GPU V100 nodes with these free GPUs (and partitions)."""
    parts = parts or {}
    return ClusterView(tuple(NodeView(n, "v100", 4, f, parts.get(n, ()), nic_gbps=nic) for n, f in spec.items()))


def job(jid: str, gpus: int, iterations: int = 1000, **kw) -> JobRequest:
    return JobRequest(
        jid, GPT, 64, iterations, requested_gpus=gpus, requested_gpu_type="v100", **{"runtime": "adaptive", **kw}
    )


def placement(jid: str, on: tuple[str, ...], per_node: int, t: float = 1.0) -> Placement:
    cell = Cell("v100", len(on), per_node)
    return Placement(jid, cell, tuple((n, per_node) for n in on), ParallelPlan(1, cell.num_gpus, 1), t)


def running(jid: str, on: tuple[str, ...], per_node: int, iterations: int, t: float = 1.0) -> JobRequest:
    p = placement(jid, on, per_node, t)
    return job(jid, p.cell.num_gpus, iterations, current=p)


def schedule(policy: str, cl: ClusterView, jobs, estimator=None, **cfg):
    req = ScheduleRequest(cl, tuple(jobs), config=SolverConfig(mixed_cells=False, **cfg))
    return get_policy(policy).schedule(req, estimator or Seconds())


# ---------- pick_nodes: partitions ----------


@pytest.mark.parametrize("name", ["srsf-avoid", "srsf-accept", "ada-srsf"])
def test_a_job_with_partitions_runs_on_its_partition_s_nodes(name):
    """n1, n2 are in `gpu`, n3, n4 in `other`: a 2x4 job limited to `gpu`
    runs on n1+n2; one that may use either partition runs within one."""
    cl = nodes({"n1": 4, "n2": 4, "n3": 4, "n4": 4}, parts={"n1": ("gpu",), "n2": ("gpu",), "n3": ("other",)})
    cl = ClusterView(cl.nodes[:3] + (NodeView("n4", "v100", 4, 4, ("other",), nic_gbps=10.0),))
    r = schedule(name, cl, [job("j", 8, partitions=("gpu",))])
    assert sorted(r.placements["j"].node_names) == ["n1", "n2"]
    assert r.placements["j"].partition == "gpu"
    r = schedule(name, cl, [job("j", 8, partitions=("other",))])
    assert sorted(r.placements["j"].node_names) == ["n3", "n4"]


def test_pick_nodes_keeps_a_cell_in_one_partition_and_takes_unpartitioned_nodes():
    """Partition `a` holds n1 only, `b` holds n2 only, n3 is in none: a 2x4
    cell of a job that may use a or b takes n1+n3 (a, then the unpartitioned
    node), never n1+n2 (two partitions); with n3 full there is no pair."""
    cl = nodes({"n1": 4, "n2": 4, "n3": 4}, parts={"n1": ("a",), "n2": ("b",)})
    j = job("j", 8, partitions=("a", "b"))
    space = Space.of(cl)
    rank = {"n1": 0, "n2": 1, "n3": 2}
    cell = Cell("v100", 2, 4)
    assert pick_nodes(space, space.ledger(), j, cell, 1, "first-fit", rank) == ("n1", "n3")
    cl = nodes({"n1": 4, "n2": 4, "n3": 0}, parts={"n1": ("a",), "n2": ("b",)})
    space = Space.of(cl)
    assert pick_nodes(space, space.ledger(), j, cell, 1, "first-fit", rank) is None


def test_pick_nodes_tries_the_job_s_next_partition_when_one_lacks_nodes():
    """a holds n1 only, b holds n2 and n4; n3 (in none) is full: a 2x4
    cell finds one node in a, then two in b."""
    cl = nodes({"n1": 4, "n2": 4, "n3": 0, "n4": 4}, parts={"n1": ("a",), "n2": ("b",), "n4": ("b",)})
    space = Space.of(cl)
    rank = {f"n{i}": i for i in range(1, 5)}
    j = job("j", 8, partitions=("a", "b"))
    assert pick_nodes(space, space.ledger(), j, Cell("v100", 2, 4), 1, "first-fit", rank) == ("n2", "n4")


def test_pick_nodes_takes_each_type_s_nodes_of_a_mixed_cell():
    cl = ClusterView((NodeView("a", "a100", 4, 4, nic_gbps=10.0), NodeView("v", "v100", 4, 4, nic_gbps=10.0)))
    space = Space.of(cl)
    cell = Cell("a100+v100", 2, 4, 1, (("a100", 1), ("v100", 1)))
    j = JobRequest("j", GPT, 64, 100, requested_gpus=8, runtime="adaptive")
    assert pick_nodes(space, space.ledger(), j, cell, 1, "lwf-kappa", {"a": 0, "v": 1}) == ("a", "v")


def test_a_one_node_job_is_never_capped():
    """old (2x2) is on n1 and n2's cards: srsf-avoid's cap of 1 keeps a
    second multi-node job off them, but a 1-GPU job packs onto n1."""
    cl = nodes({"n1": 4, "n2": 4})
    r = schedule("srsf-avoid", cl, [running("old", ("n1", "n2"), 2, 1000), job("small", 1, 10)])
    assert r.placements["small"].node_names == ("n1",)


def test_first_fit_follows_the_cluster_s_order_of_nodes():
    cl = nodes({"n2": 4, "n1": 4})  # n2 listed first
    r = schedule("srsf-avoid", cl, [job("small", 1, 10)], node_placement="first-fit")
    assert r.placements["small"].node_names == ("n2",)


def test_lwf_kappa_breaks_ties_by_the_cluster_s_order_whatever_the_partitions():
    """n1 (partition b) and n2 (partition a) tie (4 free, no multi-node job):
    the first in the cluster's order, n1, takes a job that names no
    partition (the node classes sort a before b)."""
    cl = nodes({"n1": 4, "n2": 4}, parts={"n1": ("b",), "n2": ("a",)})
    r = schedule("srsf-avoid", cl, [job("small", 1, 10)])
    assert r.placements["small"].node_names == ("n1",)


# ---------- component, clean_start, remaining_service ----------


def test_component_follows_shared_cards_through_other_jobs():
    """A on n1+n2, B on n2+n3, C on n3+n4, D on n5+n6: a job on n0+n1 shares
    n1 with A, A shares n2 with B, B n3 with C: all three are coupled to
    it; D shares no card with any of them. A one-node job uses no card."""
    cl = nodes({f"n{i}": 4 for i in range(7)})
    comm = {
        jid: (job(jid, 2), placement(jid, on, 1), 1.0)
        for jid, on in (("A", ("n1", "n2")), ("B", ("n2", "n3")), ("C", ("n3", "n4")), ("D", ("n5", "n6")))
    }
    assert sorted(c[0].job_id for c in component(cl, ("n0", "n1"), comm)) == ["A", "B", "C"]
    assert sorted(c[0].job_id for c in component(cl, ("n0", "n6"), comm)) == ["D"]
    assert component(cl, ("n0", "n1"), {}) == []
    assert component(cl, ("n1",), comm) == []


def test_clean_start_is_when_a_cell_fits_on_cards_without_multi_node_jobs():
    """Fixed: M (2x2) on n1+n2, ending at 50 s; S (1x4, one node) on n3,
    ending at 30 s; n4 has 2 GPUs free. A 2x2 cell needs two cards with 2
    free GPUs and no multi-node job: now only n4; at 30 s n3 too (4 free).
    A 2x4 cell: n1, n2 get 4 free (and a clean card) at 50 s. A 1x2 cell
    (one node: its card's load does not matter) fits now on n1."""
    cl = nodes({"n1": 4, "n2": 4, "n3": 4, "n4": 2})
    m, s = placement("M", ("n1", "n2"), 2), placement("S", ("n3",), 4)
    space = Space.of(cl, {"M": m, "S": s})
    ends = [(50.0, m), (30.0, s)]  # not in time order: clean_start sorts them
    assert clean_start(cl, space.ledger(), space, ends, [Cell("v100", 2, 2)]) == 30.0
    assert clean_start(cl, space.ledger(), space, ends, [Cell("v100", 2, 4)]) == 50.0
    assert clean_start(cl, space.ledger(), space, ends, [Cell("v100", 1, 2)]) == 0.0
    assert clean_start(cl, space.ledger(), space, ends, [Cell("v100", 1, 4), Cell("v100", 2, 2)]) == 30.0
    assert clean_start(cl, space.ledger(), space, [], [Cell("v100", 2, 2)]) == math.inf
    free = nodes({"n1": 2, "n2": 2})  # exactly 2 free on each: a 2x2 fits now
    space = Space.of(free)
    assert clean_start(free, space.ledger(), space, [], [Cell("v100", 2, 2)]) == 0.0


def test_remaining_service_is_iterations_times_seconds_times_gpus():
    j = job("j", 4, 150, iterations_done=50.0)  # 100 left
    est = Estimate(Cell("v100", 1, 4), ParallelPlan(1, 4, 1), 2.5, 1.0, EstimateSource.MEASURED)
    assert remaining_service(j, est) == 100 * 2.5 * 4


def test_srsf_orders_by_service_with_iteration_times_that_are_not_one():
    """At 2 s an iteration: a (4 GPUs, 100 it) has 800 GPU-s, b (1 GPU, 300
    it) 600: b goes first and takes one of the 4 free GPUs; a waits."""
    cl = nodes({"n1": 4})
    r = schedule("srsf-avoid", cl, [job("a", 4, 100), job("b", 1, 300)], Seconds(2.0))
    assert set(r.placements) == {"b"}


# ---------- the reply ----------


@pytest.mark.parametrize("name", ["srsf-avoid", "srsf-accept", "ada-srsf"])
def test_the_reply_reports_what_was_placed_how_and_when(name):
    """Two jobs placed this round (the objective counts them), heuristic
    status, the layouts tried (4 GPUs on two 4-GPU nodes: 1x4 and 2x2; 4x1
    needs four nodes; for each of the two jobs), each placement's plan and time and source from
    its estimate, and the time it took within the call's."""
    cl = nodes({"n1": 4, "n2": 4})
    start = time.perf_counter()
    r = schedule(name, cl, [job("a", 4, 100), job("b", 4, 200)], Seconds(1.5))
    took = time.perf_counter() - start
    assert set(r.placements) == {"a", "b"}
    assert r.status == SolverStatus.HEURISTIC
    assert r.objective == 2.0 and r.bound == 2.0
    assert r.num_cells == 4
    assert 0.0 < r.place_s <= took and 0.0 < r.build_s <= took
    for p in r.placements.values():
        assert p.cell == Cell("v100", 1, 4)
        assert p.plan == ParallelPlan(1, 4, 1)
        assert p.iter_time_s == 1.5 and p.source == EstimateSource.MEASURED


@pytest.mark.parametrize("name", ["srsf-avoid", "srsf-accept", "ada-srsf"])
def test_the_srsf_baselines_respect_the_feasible_rule(name):
    """Without 1x4 (the rule), a 4-GPU job on two free 4-GPU nodes runs 2x2."""
    cl = nodes({"n1": 4, "n2": 4})
    r = get_policy(name, feasible=lambda j, c: c.num_nodes > 1).schedule(
        ScheduleRequest(cl, (job("a", 4),), config=SolverConfig(mixed_cells=False)), Seconds()
    )
    assert r.placements["a"].cell == Cell("v100", 2, 2)
    r = get_policy(name, feasible=lambda j, c: False).schedule(
        ScheduleRequest(cl, (job("a", 4),), config=SolverConfig(mixed_cells=False)), Seconds()
    )
    assert "a" not in r.placements and "no feasible layout" in r.reasons["a"]


# ---------- AdaDUAL's inputs ----------


def test_ada_srsf_waits_for_other_cards_that_are_clean_soon():
    """Slow (1 Gb/s) cards. old (2x2 on n1+n2) has 10,000 s to go; n3 and n4
    each run a one-node job that ends in 5 s. A 100-iteration new job could
    share n1+n2 now: against waiting for old (10,000 s) sharing wins (the
    existing test), but n3 (or n4) is free of multi-node jobs and has room
    for a 1x4 in 5 s: waiting costs 5 + 100 s and old is untouched, while
    sharing slows both (each iteration > 1 s): 100 s_new + (old's slowdown
    while they share) > 105 for any s_new > 1.05, so it waits."""
    cl = nodes({"n1": 4, "n2": 4, "n3": 4, "n4": 4}, nic=1.0)
    jobs = [
        running("old", ("n1", "n2"), 2, 10_000),
        running("s3", ("n3",), 4, 5),
        running("s4", ("n4",), 4, 5),
        job("new", 4, 100),
    ]
    r = schedule("ada-srsf", cl, jobs)
    assert "new" not in r.placements and "AdaDUAL" in r.reasons["new"]


def test_ada_srsf_counts_a_job_placed_this_round_as_a_sharer():
    """3 GPUs free on n1 and n2 (n3, n4 full). a (4 GPUs, 100 it: 400
    GPU-s) goes first and runs 2x2 on n1+n2; b (2 GPUs, 1,000 it: 2,000
    GPU-s) then fits only as 2x1 on the same cards. On 10 Gb/s cards sharing
    costs little: b's 1,000 s plus a's 100 s (both barely slower) beat b
    waiting 100 s for a: 100 + 1,000 + 100. b is admitted beside a."""
    cl = nodes({"n1": 3, "n2": 3, "n3": 0, "n4": 0})
    r = schedule("ada-srsf", cl, [job("a", 4, 100), job("b", 2, 1000)])
    assert r.placements["a"].cell == Cell("v100", 2, 2) and r.placements["b"].cell == Cell("v100", 2, 1)
    assert sorted(r.placements["b"].node_names) == ["n1", "n2"]


def test_ada_srsf_ignores_jobs_on_other_cards():
    """The existing short-beside-long case (a 100-iteration job shares
    n1+n2 with old, which has 10,000 to go), with a long multi-node job far
    on n3+n4: it shares no card with them and changes nothing."""
    cl = nodes({"n1": 4, "n2": 4, "n3": 4, "n4": 4}, nic=1.0)
    jobs = [running("old", ("n1", "n2"), 2, 10_000), running("far", ("n3", "n4"), 4, 1_000_000), job("new", 4, 100)]
    r = schedule("ada-srsf", cl, jobs)
    assert sorted(r.placements["new"].node_names) == ["n1", "n2"]


@pytest.mark.parametrize("unknown", [0.0, math.inf])
def test_ada_srsf_does_not_share_with_a_job_of_unknown_speed(unknown):
    """old runs 2x1 on n1+n2 with no iteration time known (0 or inf):
    AdaDUAL cannot price what sharing costs it, so old is not among the
    jobs it weighs. `one` runs on n1 alone: a one-node job sends nothing
    over the card, so new would not wait for it and it is not weighed
    either. Sharing and waiting then both finish new in its own time
    (nothing to wait for, no one slowed) and sharing is not smaller: new
    waits."""
    cl = nodes({"n1": 4, "n2": 4, "n3": 0, "n4": 0}, nic=1.0)
    old = running("old", ("n1", "n2"), 1, 10_000, t=unknown)
    jobs = [old, running("one", ("n1",), 1, 10), job("new", 4, 100)]  # free: 2 on n1, 3 on n2: new fits 2x2
    r = schedule("ada-srsf", cl, jobs)
    assert r.placements["old"] == old.current
    assert "new" not in r.placements and "AdaDUAL" in r.reasons["new"]


@pytest.mark.parametrize("alone", [0.5, 2.0])
def test_ada_srsf_s_boundary_in_other_time_units(alone):
    """test_srsf_policies' boundary with every iteration `alone` s instead
    of 1 s. old has 1,000 iterations left (1,000 a s alone), new R. Sharing:
    new ends at R s_new, old runs at s_old until then and alone after:
    2 R s_new + (1000 - R s_new / s_old) a. Waiting: new starts when old
    ends: 1000 a + R a, and old's own 1000 a. Sharing is smaller below R =
    1000 a / (2 s_new - a s_new / s_old - a)."""
    cl = nodes({"n1": 4, "n2": 4, "n3": 0, "n4": 0}, nic=1.0)
    old = running("old", ("n1", "n2"), 2, 1000, t=alone)
    mine = placement("new", ("n1", "n2"), 2, alone)
    times = loaded_times([(old, old.current, alone), (job("new", 4, 1), mine, alone)], cl)
    s_new, s_old = times["new"], times["old"]
    limit = 1000 * alone / (2 * s_new - alone * s_new / s_old - alone)
    assert limit * 1.1 * s_new < 1000 * s_old  # new ends first at both R below
    below, above = int(limit * 0.9), int(limit * 1.1) + 1
    assert "new" in schedule("ada-srsf", cl, [old, job("new", 4, below)], Seconds(alone)).placements
    assert "new" not in schedule("ada-srsf", cl, [old, job("new", 4, above)], Seconds(alone)).placements


def test_srsf_says_when_no_gpu_type_of_the_cluster_is_allowed():
    a100_only = JobRequest("x", GPT, 64, 100, requested_gpus=1, gpu_types=("a100",), runtime="adaptive")
    r = schedule("srsf-avoid", nodes({"n1": 4}), [a100_only])
    assert r.placements == {} and r.reasons == {"x": "no GPU type of the cluster is allowed"}


@pytest.mark.parametrize("name", ["srsf-avoid", "srsf-accept", "ada-srsf"])
def test_an_elastic_running_job_keeps_its_placement_under_srsf(name):
    """SRSF is not preemptive here and never resizes: an elastic job on
    n3+n4 stays there although first-fit would now put it on n1."""
    cl = nodes({"n1": 4, "n2": 4, "n3": 4, "n4": 4})
    p = placement("old", ("n3", "n4"), 2)
    old = job("old", 4, 1000, current=p, elastic=True)
    r = schedule(name, cl, [old], node_placement="first-fit")
    assert r.placements["old"] == p
