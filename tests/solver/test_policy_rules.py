"""Rules of cellsched, FCFS, Gavel and Sia one at a time (the mutation
benchmark found them untested): a running job's pruned cell, the mixed
offers, Gavel's max-min value, its served share and its move rules, Sia's
fixed jobs and its `stay` flag, what the replies report. Every expected
value is worked out by hand from the policies' docstrings."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest
from test_policies import MODEL, MOVE, TWO_TYPES, hetero_case, job, move_case, running, table_for

from solver.estimator import EstimatorBase
from solver.placement import validate_plan
from solver.policies import get_policy
from solver.policies.cellsched import FreeNow, _remaining_s
from solver.policies.common import dp_estimate
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
    SolverStatus,
)

# ---------- cellsched ----------


class Recording(EstimatorBase):
    """1 s an iteration on every DP cell; records the jobs it was asked about."""

    def __init__(self) -> None:
        self.seen: list[JobRequest] = []

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        self.seen.append(job)
        return Estimate(cell, ParallelPlan(cell.pp, cell.num_gpus // cell.pp, 1), 1.0, 1.0, EstimateSource.MEASURED)


@pytest.mark.parametrize("sharding", [True, False])
def test_cellsched_estimates_without_state_sharding_when_the_config_says_so(sharding, exact_config):
    cluster = ClusterView((NodeView("a100-0", "a100", 1, 1),))
    jobs = (job("on", max_gpus=1), job("off", max_gpus=1, state_sharding=False))
    est = Recording()
    get_policy("cellsched").schedule(ScheduleRequest(cluster, jobs, config=exact_config(state_sharding=sharding)), est)
    # without sharding both jobs have one shape (estimated once): the estimator sees no sharding at all
    assert {j.state_sharding for j in est.seen} == ({True, False} if sharding else {False})


def test_remaining_seconds_of_a_running_job():
    cell = Cell("a100", 1, 1)
    j = job("j", iterations=1000, iterations_done=900.0)
    assert _remaining_s(j) is None  # not running
    for unknown in (0.0, math.inf):
        assert _remaining_s(running(j, cell, [("a100-0", 1)], unknown)) is None
    assert _remaining_s(running(j, cell, [("a100-0", 1)], 2.0)) == 100 * 2.0


def test_a_running_job_may_stay_in_a_cell_the_pruning_dropped(exact_config):
    """j runs with 2 pipeline stages on one node's 2 GPUs (10 / 2**0.9 *
    1.1 s an iteration); the same GPUs without stages are 1.1x faster, so
    the pruning keeps that cell, not j's. j's own cell is offered anyway:
    staying is worth (10 / its time) = 2**0.9 / 1.1 = 1.696 (fairness p 1,
    the 1-GPU cell's 10 s the reference); moving pays the restart (0.8):
    0.8 * 2**0.9 = 1.493 in 1 stage, 0.8 on one GPU. It stays."""
    cluster = ClusterView((NodeView("a100-0", "a100", 2, 2),))
    j = job("j", max_gpus=2, elastic=True)
    est = table_for([j], cluster, {("j", "a100"): 1.0})
    cell = Cell("a100", 1, 2, 2)
    t = est.table[("j", cell.key())]
    assert t == pytest.approx(10 / 2**0.9 * 1.1)
    j = replace(j, current=Placement("j", cell, (("a100-0", 2),), ParallelPlan(2, 1, 1), t))
    policy = get_policy("cellsched")
    _, kept, *_ = policy._cells(j, cluster, est, exact_config(**MOVE))
    assert cell not in [e.cell for e in kept] and Cell("a100", 1, 2) in [e.cell for e in kept]
    rep = policy.schedule(ScheduleRequest(cluster, (j,), config=exact_config(**MOVE)), est)
    assert rep.placements["j"].cell == cell and rep.placements["j"].nodes == (("a100-0", 2),)
    assert rep.objective == pytest.approx(2**0.9 / 1.1, rel=1e-3)


def test_cellsched_skips_a_job_without_a_feasible_cell_and_places_the_rest(exact_config):
    """x has no estimate anywhere; y, listed after it, still gets the GPU.
    (x asks for 1 GPU, which y does not: another shape, so x's estimates
    are not memoised for y; the table estimates per job, a real estimator
    per shape.)"""
    cluster = ClusterView((NodeView("a100-0", "a100", 1, 1),))
    x, y = job("x", max_gpus=1, requested_gpus=1), job("y", max_gpus=1)
    est = table_for([y], cluster, {("y", "a100"): 1.0})
    rep = get_policy("cellsched").schedule(ScheduleRequest(cluster, (x, y), config=exact_config()), est)
    assert set(rep.placements) == {"y"}
    assert rep.reasons == {"x": "no feasible cell (every cell out of memory or without data)"}


def test_free_now_offers_the_fastest_mixed_cell_that_fits_and_beats_every_single_type_one():
    """One free GPU on each of an A100, a V100 and an A10 node (a10-1 is
    full). The fastest single-type cell the job could get now is the A100's
    (10 s). Mixed cells: A100+V100 6 s, A100+A10 5 s, V100+A10 7 s all fit
    and are faster; A100+2xA10 4 s does not fit (one A10 free); V100+A10 at
    12 s is slower. One is offered (MIXED_OFFERS): the fastest that fits,
    A100+A10, index 1."""
    cluster = ClusterView(
        (
            NodeView("a100-0", "a100", 1, 1),
            NodeView("v100-0", "v100", 1, 1),
            NodeView("a10-0", "a10", 1, 1),
            NodeView("a10-1", "a10", 1, 0),
        )
    )
    j = job("j", max_gpus=3)

    def est(cell: Cell, t: float) -> Estimate:
        return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), t, 1.0, EstimateSource.MEASURED)

    def mixed(*parts: tuple[str, int]) -> Cell:
        return Cell("+".join(p for p, _ in parts), sum(n for _, n in parts), 1, 1, parts)

    kept = [est(Cell("a100", 1, 1), 10.0), est(Cell("v100", 1, 1), 20.0), est(Cell("a10", 2, 1), 3.0)]
    optional = [
        est(mixed(("a100", 1), ("v100", 1)), 6.0),
        est(mixed(("a100", 1), ("a10", 1)), 5.0),
        est(mixed(("v100", 1), ("a10", 1)), 7.0),
        est(mixed(("a100", 1), ("a10", 2)), 4.0),
        est(mixed(("v100", 1), ("a10", 1)), 12.0),
    ]
    free = FreeNow(cluster, {}, [j])
    assert free.paying(j, kept, optional) == [1]
    assert free.paying(j, kept, optional[2:]) == [0]  # only V100+A10 at 7 s is left that pays
    assert free.paying(j, [est(Cell("a100", 1, 1), 5.0)], optional) == []  # none beats 5 s
    assert free.paying(j, kept, [est(mixed(("a100", 1), ("v100", 1)), 10.0)]) == []  # as fast is not faster
    # no single-type cell fits now (two A100 nodes, three A10s): any mixed one that fits pays
    assert free.paying(j, [est(Cell("a100", 2, 1), 1.0), est(Cell("a10", 3, 1), 1.0)], optional[:1]) == [0]


class Shards(EstimatorBase):
    """DP plans with the optimizer state sharded evenly (one part)."""

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        plan = ParallelPlan(1, cell.num_gpus, 1, state_shares=(1.0,))
        return Estimate(cell, plan, 2.0, 3.0, EstimateSource.MEASURED, "n", 0.5)


def test_dp_estimate_keeps_the_estimate_s_sharding_time_memory_and_note():
    j = job("j", max_gpus=4)
    cell = Cell("a100", 1, 4)
    got = dp_estimate(j, cell, Shards(), None)
    assert got == Estimate(
        cell, ParallelPlan(1, 4, 1, state_shares=(1.0,)), 2.0, 3.0, EstimateSource.MEASURED, "n", 0.5
    )
    assert dp_estimate(j, cell, Shards(), lambda jj, c: c.num_gpus < 4) is None
    assert dp_estimate(j, cell, Recording(), None).plan == ParallelPlan(1, 4, 1)  # not sharded: not sharded


class MixedShards(EstimatorBase):
    """A mixed cell's plan sharded over its two parts."""

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        plan = ParallelPlan(1, cell.num_gpus, 1, shares=(3, 1), state_shares=(3.0, 1.0))
        return Estimate(cell, plan, 2.0, 3.0, EstimateSource.MEASURED)


def test_dp_estimate_of_a_mixed_cell_is_plain_data_parallel_without_sharding():
    """The baselines run a mixed cell as plain DP: no batch shares, no sharded state."""
    cell = Cell("a100+v100", 2, 1, 1, (("a100", 1), ("v100", 1)))
    got = dp_estimate(job("j", max_gpus=2), cell, MixedShards(), None)
    assert got is not None and got.plan == ParallelPlan(1, 2, 1)


# ---------- FCFS ----------


def test_fcfs_placements_carry_their_estimate_s_time_and_source():
    cluster = ClusterView((NodeView("a100-0", "a100", 4, 4),))
    j = job("j", requested_gpu_type="a100", requested_gpus=4)
    est = table_for([j], cluster, {("j", "a100"): 1.0})
    p = get_policy("fcfs").schedule(ScheduleRequest(cluster, (j,)), est).placements["j"]
    assert p.iter_time_s == pytest.approx(10 / 4**0.9) and p.source == "table"
    assert p.plan == ParallelPlan(1, 4, 1)


def test_fcfs_backfill_takes_the_feasible_rule_too():
    cluster = ClusterView((NodeView("a100-0", "a100", 4, 4),))
    j = job("j", requested_gpu_type="a100", requested_gpus=4)
    est = table_for([j], cluster, {("j", "a100"): 1.0})
    rep = get_policy("fcfs-backfill", feasible=lambda jj, c: False).schedule(ScheduleRequest(cluster, (j,)), est)
    assert rep.placements == {} and rep.reasons == {"j": "no feasible layout of 4 x a100"}


def test_fcfs_goes_by_submit_time_and_reports_what_it_did():
    """One 4-GPU A100 node. Listed late-first: b (submitted at 2, 2 GPUs),
    a (at 1, 4 GPUs), x (at 0, no GPU type of the cluster allowed, and no
    type requested: the first allowed is taken). FCFS skips x (it could
    never start), starts a (the older), and b waits behind it. The reply:
    heuristic status, one job placed (objective and bound 1), the layouts
    tried (a: 1x4; b: 1x2), the time within the call's."""
    cluster = ClusterView((NodeView("a100-0", "a100", 4, 4),))
    a = job("a", requested_gpu_type="a100", requested_gpus=4, submit_time=1.0)
    b = job("b", requested_gpu_type="a100", requested_gpus=2, submit_time=2.0)
    x = job("x", requested_gpus=1, gpu_types=("v100",), submit_time=0.0)
    est = table_for([a, b], cluster, {("a", "a100"): 1.0, ("b", "a100"): 1.0})
    start = time.perf_counter()
    rep = get_policy("fcfs").schedule(ScheduleRequest(cluster, (b, a, x)), est)
    took = time.perf_counter() - start
    assert set(rep.placements) == {"a"}
    assert rep.reasons == {"x": "no GPU type of the cluster is allowed", "b": "waiting for 2 free a100 GPUs"}
    assert rep.status == SolverStatus.HEURISTIC and rep.objective == 1.0 and rep.bound == 1.0
    assert rep.num_cells == 2
    assert 0.0 < rep.place_s <= took and 0.0 < rep.build_s <= took


def test_fcfs_takes_the_first_gpu_type_a_job_allows():
    """No type requested: the first of the cluster's types (in name order) that the job allows."""
    cluster = ClusterView(
        (NodeView("a100-0", "a100", 1, 1), NodeView("a10-0", "a10", 1, 1), NodeView("v100-0", "v100", 1, 1))
    )
    j = job("j", requested_gpus=1, gpu_types=("v100", "a100"))
    est = table_for([j], cluster, {("j", t): 1.0 for t in ("a100", "a10", "v100")})
    assert get_policy("fcfs").schedule(ScheduleRequest(cluster, (j,)), est).placements["j"].cell.gpu_type == "a100"


def test_fcfs_tries_the_next_layout_when_one_is_not_feasible():
    """Two 4-GPU nodes; the rule forbids 1x4: the 4-GPU job runs 2x2."""
    cluster = ClusterView(tuple(NodeView(f"a100-{i}", "a100", 4, 4) for i in range(2)))
    j = job("j", requested_gpu_type="a100", requested_gpus=4)
    est = table_for([j], cluster, {("j", "a100"): 1.0})
    rep = get_policy("fcfs", feasible=lambda jj, c: c.num_nodes > 1).schedule(ScheduleRequest(cluster, (j,)), est)
    assert rep.placements["j"].cell == Cell("a100", 2, 2)


def test_fcfs_keeps_an_elastic_running_job_where_it_is():
    """FCFS never moves running jobs, elastic or not: j stays on a100-1."""
    cluster = ClusterView(tuple(NodeView(f"a100-{i}", "a100", 4, 4) for i in range(2)))
    j = job("j", requested_gpu_type="a100", requested_gpus=4, elastic=True)
    est = table_for([j], cluster, {("j", "a100"): 1.0})
    cell = Cell("a100", 1, 4)
    j = running(j, cell, [("a100-1", 4)], est.table[("j", cell.key())])
    assert get_policy("fcfs").schedule(ScheduleRequest(cluster, (j,)), est).placements["j"] == j.current


# ---------- Gavel ----------


def test_gavel_objective_is_the_max_min_normalised_throughput(exact_config):
    """hetero_case: x is 10x faster on the A100, y 1.2x; one GPU of each.
    With time fractions a (x on A100), b (x on A10), c (y on A100), d (y on
    A10), both GPUs and both jobs full: b = c, a = d = 1 - c; x gets
    a + b / 10 = 1 - 0.9 c, y gets c + d / 1.2 = 5/6 + c / 6. Equal at
    c = 0.15625: the max-min value 0.859375."""
    cluster, jobs, est = hetero_case()
    rep = get_policy("gavel").schedule(ScheduleRequest(cluster, jobs, config=exact_config()), est)
    assert rep.objective == pytest.approx(0.859375, rel=1e-5) and rep.bound == rep.objective
    assert rep.status == SolverStatus.HEURISTIC
    assert rep.num_cells == 4  # one 1-GPU cell per job and type


def test_gavel_with_no_feasible_job_places_nothing_and_says_why():
    cluster = ClusterView((NodeView("a100-0", "a100", 1, 1),))
    j = job("j", requested_gpus=1)
    rep = get_policy("gavel").schedule(ScheduleRequest(cluster, (j,)), table_for([j], cluster, {}))
    assert rep.placements == {} and rep.reasons == {"j": "no feasible GPU type"} and rep.objective == 0.0


def test_gavel_reports_its_estimation_time_within_the_call_s():
    cluster, jobs, est = hetero_case()
    start = time.perf_counter()
    rep = get_policy("gavel").schedule(ScheduleRequest(cluster, jobs), est)
    took = time.perf_counter() - start
    assert 0.0 < rep.build_s <= took and 0.0 < rep.solve_s <= took and 0.0 < rep.place_s <= took


@pytest.mark.parametrize(
    "a,b",
    [
        # (batch, iterations done, submit time) of a and b
        ((8, 10, 0.0), (64, 20, 500.0)),  # shares 0.1 and 0.4
        ((64, 10, 0.0), (8, 20, 500.0)),  # the same, batches swapped
        ((32, 10, 0.0), (32, 10, 500.0)),  # 0.1 and 0.2: the later job's shorter age counts
    ],
)
def test_gavel_serves_the_job_with_the_smaller_share_of_time_served(a, b):
    """One GPU, two 1-GPU jobs at 10 s an iteration, now 1,000: each gets
    the fraction 1/2. The share a job received is the time its done
    iterations took at its best speed over its age: a did 10 iterations,
    100 s of its 1,000: 0.1; b 20 (or 10) iterations, 200 (100) s of its
    500: 0.4 (0.2). a has the higher priority (0.5 / 0.1) and runs, whatever
    the batch sizes (they cancel) and although b is listed first."""
    cluster = ClusterView((NodeView("a100-0", "a100", 1, 1),))
    ja = JobRequest(
        "a", MODEL, a[0], 1000, requested_gpus=1, iterations_done=float(a[1]), submit_time=a[2], runtime="adaptive"
    )
    jb = JobRequest(
        "b", MODEL, b[0], 1000, requested_gpus=1, iterations_done=float(b[1]), submit_time=b[2], runtime="adaptive"
    )
    est = table_for([ja, jb], cluster, {("a", "a100"): 1.0, ("b", "a100"): 1.0})
    assert est.table[("a", Cell("a100", 1, 1).key())] == 10.0
    rep = get_policy("gavel").schedule(ScheduleRequest(cluster, (jb, ja), now=1000.0), est)
    assert set(rep.placements) == {"a"}
    assert rep.reasons["b"] == "waiting: lower max-min priority this round"


def test_gavel_looks_at_every_gpu_type_a_job_allows(exact_config):
    """j may use A100s only: the A10 (first of the cluster's types) is skipped, the A100 taken."""
    j = job("j", requested_gpus=1, gpu_types=("a100",))
    est = table_for([j], TWO_TYPES, {("j", "a100"): 1.0, ("j", "a10"): 10.0})
    rep = get_policy("gavel").schedule(ScheduleRequest(TWO_TYPES, (j,), config=exact_config()), est)
    assert rep.placements["j"].cell == Cell("a100", 1, 1)


def test_gavel_normalises_by_the_job_s_own_best_throughput():
    """j (batch 8, 10 s an iteration on the A100: 0.8 samples/s; no A10
    estimate) gets the A100 whole: its normalised throughput, the max-min
    value, is 1 (not 0.8: a type it cannot use does not count as 1)."""
    j = JobRequest("j", MODEL, 8, 1000, requested_gpus=1, runtime="adaptive")
    est = table_for([j], TWO_TYPES, {("j", "a100"): 1.0})
    rep = get_policy("gavel").schedule(ScheduleRequest(TWO_TYPES, (j,)), est)
    assert rep.placements["j"].cell == Cell("a100", 1, 1)
    assert rep.objective == pytest.approx(1.0, rel=1e-5)


def test_gavel_keeps_a_running_job_on_its_own_nodes_and_places_others_around_it():
    """r runs on a100-1; a100-0 is free; p is pending. Both get their turn
    on the A100s: r stays where it is (its pair is its own type), p takes
    a100-0, not r's GPU."""
    cluster = ClusterView((NodeView("a100-0", "a100", 1, 1), NodeView("a100-1", "a100", 1, 1)))
    r, p = job("r", requested_gpus=1, max_gpus=1), job("p", requested_gpus=1, max_gpus=1)
    est = table_for([r, p], cluster, {("r", "a100"): 1.0, ("p", "a100"): 1.0})
    r = running(r, Cell("a100", 1, 1), [("a100-1", 1)], est.table[("r", Cell("a100", 1, 1).key())])
    rep = get_policy("gavel").schedule(ScheduleRequest(cluster, (r, p)), est)
    validate_plan(cluster, rep.placements)
    assert rep.placements["r"] == r.current and rep.placements["p"].nodes == (("a100-0", 1),)
    assert rep.placements["p"].source == "table" and rep.placements["p"].iter_time_s == 10.0


def test_gavel_moves_a_running_job_only_where_its_pair_has_room():
    """x runs on the A10 and is 10x faster on the A100; y runs on the A100
    and is as fast on either: max-min pairs x with the A100 and y with the
    A10 (both at their best: 1). Each one's turn finds the other's GPU still
    held (the controller never preempts), so each takes its own back: both
    keep their placements."""
    cluster = TWO_TYPES
    x, y = job("x", requested_gpus=1, max_gpus=1), job("y", requested_gpus=1, max_gpus=1)
    est = table_for([x, y], cluster, {("x", "a100"): 10.0, ("x", "a10"): 1.0, ("y", "a100"): 1.0, ("y", "a10"): 1.0})
    a10, a100 = Cell("a10", 1, 1), Cell("a100", 1, 1)
    x = running(x, a10, [("a10-0", 1)], est.table[("x", a10.key())])
    y = running(y, a100, [("a100-0", 1)], est.table[("y", a100.key())])
    rep = get_policy("gavel").schedule(ScheduleRequest(cluster, (x, y)), est)
    validate_plan(cluster, rep.placements)
    assert rep.placements == {"x": x.current, "y": y.current}
    assert rep.objective == pytest.approx(1.0, rel=1e-5)
    # with the A100 free (y gone), x moves there
    rep = get_policy("gavel").schedule(ScheduleRequest(cluster, (x,)), est)
    assert rep.placements["x"].cell == a100


@pytest.mark.parametrize("name", ["gavel", "sia"])
def test_without_resizing_running_jobs_keep_their_gpus(name, exact_config):
    """allow_resize false: r keeps the only A100 (though x would gain 10x
    there); x takes the A10."""
    cluster, (x, y), est = hetero_case()
    a100 = Cell("a100", 1, 1)
    y = running(y, a100, [("a100-0", 1)], est.table[("y", a100.key())])
    rep = get_policy(name).schedule(ScheduleRequest(cluster, (x, y), config=exact_config(allow_resize=False)), est)
    validate_plan(cluster, rep.placements)
    assert rep.placements["y"] == y.current and rep.placements["x"].cell.gpu_type == "a10"


# ---------- Sia ----------


def test_sia_reasons_for_jobs_it_does_not_place(exact_config):
    cluster = ClusterView((NodeView("a100-0", "a100", 1, 1),))
    a, b, c = job("a", max_gpus=1), job("b", max_gpus=1), job("c", max_gpus=1)
    est = table_for([a, b], cluster, {("a", "a100"): 1.0, ("b", "a100"): 1.0})  # none for c
    rep = get_policy("sia").schedule(ScheduleRequest(cluster, (a, b, c), config=exact_config()), est)
    assert len(rep.placements) == 1
    waiting = ({"a", "b"} - set(rep.placements)).pop()
    assert rep.reasons == {
        waiting: "waiting: not chosen by the goodput ILP this round",
        "c": "no feasible configuration",
    }


def test_sia_looks_at_every_gpu_type_a_job_allows(exact_config):
    """j may use A100s only: the A10 (first of the cluster's types, in name order) is skipped, the A100 taken."""
    assert TWO_TYPES.gpu_types() == ("a10", "a100")
    j = job("j", max_gpus=1, gpu_types=("a100",))
    est = table_for([j], TWO_TYPES, {("j", "a100"): 1.0, ("j", "a10"): 10.0})
    rep = get_policy("sia").schedule(ScheduleRequest(TWO_TYPES, (j,), config=exact_config()), est)
    assert rep.placements["j"].cell == Cell("a100", 1, 1)


def test_sia_charges_its_own_restart_penalty_whatever_the_config_s(exact_config):
    """Sia's rule is penalty 1: with config.restart_penalty 0 (which
    cellsched would take as "restarts are free") a job 1.4x faster on the
    A100 still stays on the A10: sqrt(1/1.4) = 0.845 > 1 - 60/300 = 0.8
    (test_policies' move case)."""
    j, est = move_case(1.4, elastic=True)
    cfg = exact_config(**{**MOVE, "restart_penalty": 0.0})
    rep = get_policy("sia", p=0.5).schedule(ScheduleRequest(TWO_TYPES, (j,), config=cfg), est)
    assert rep.placements["j"].cell.gpu_type == "a10"
    assert rep.objective == pytest.approx((1 / 1.4) ** 0.5, rel=1e-3)


def test_sia_offers_at_most_max_cells_per_job(exact_config):
    """A job of 1 to 4 GPUs on a 4-GPU node: configurations of 1, 2 and 4
    GPUs (powers of two), each at best locality: 3 options, 1 with
    max_cells_per_job 1."""
    cluster = ClusterView((NodeView("a100-0", "a100", 4, 4),))
    j = job("j", max_gpus=4)
    est = table_for([j], cluster, {("j", "a100"): 1.0})
    rep = get_policy("sia").schedule(ScheduleRequest(cluster, (j,), config=exact_config()), est)
    assert rep.num_cells == 3
    rep = get_policy("sia").schedule(ScheduleRequest(cluster, (j,), config=exact_config(max_cells_per_job=1)), est)
    assert rep.num_cells == 1


@pytest.mark.parametrize("name", ["cellsched", "sia"])
def test_no_restart_is_charged_to_a_job_whose_gpus_fixed_jobs_took(name, exact_config):
    """a100-0 gives out 3 GPUs. f1 and f2 (1 GPU each, not elastic nor
    movable) keep theirs; r ran on 2 GPUs there, which no longer fit beside
    them (1 + 1 + 2 > 3): r must restart wherever it goes, so it is valued
    as a pending job (no restart factor): on the 1 GPU left its utility is 1
    (its reference is the 1-GPU cell); charged a restart it would be worth
    0.8."""
    cluster = ClusterView((NodeView("a100-0", "a100", 4, 3),))
    one, two = Cell("a100", 1, 1), Cell("a100", 1, 2)
    f1 = running(job("f1", max_gpus=1), one, [("a100-0", 1)], 1.0, movable=False)
    f2 = running(job("f2", max_gpus=1), one, [("a100-0", 1)], 1.0, movable=False)
    r = job("r", max_gpus=2, elastic=True)
    est = table_for([r], cluster, {("r", "a100"): 1.0})
    r = running(r, two, [("a100-0", 2)], est.table[("r", two.key())])
    policy = get_policy(name, **({"p": 0.5} if name == "sia" else {}))
    rep = policy.schedule(ScheduleRequest(cluster, (f1, f2, r), config=exact_config(**MOVE)), est)
    validate_plan(cluster, rep.placements)
    assert rep.placements["f1"] == f1.current and rep.placements["f2"] == f2.current
    assert rep.placements["r"].cell == one
    assert rep.objective == pytest.approx(1.0, rel=1e-3)


def test_cellsched_says_why_a_job_waits(exact_config):
    cluster = ClusterView((NodeView("a100-0", "a100", 1, 1),))
    a, b = job("a", max_gpus=1), job("b", max_gpus=1)
    est = table_for([a, b], cluster, {("a", "a100"): 1.0, ("b", "a100"): 1.0})
    rep = get_policy("cellsched").schedule(ScheduleRequest(cluster, (a, b), config=exact_config()), est)
    assert len(rep.placements) == 1
    waiting = ({"a", "b"} - set(rep.placements)).pop()
    assert rep.reasons == {waiting: "waiting: the GPUs are worth more to other jobs this round"}


def test_sia_does_not_charge_a_restart_to_a_job_whose_cell_it_does_not_offer(exact_config):
    """r runs 2x1 over two 2-GPU nodes; Sia's 2-GPU configuration is 1x2
    (best locality), so r cannot stay in its cell and is valued as a pending
    job: a restart that costs the whole horizon (factor 0) would otherwise
    leave it worth nothing. It gets 2 GPUs on one node: utility (10 / (10 /
    2**0.9)) ** 0.5 = 2**0.45."""
    cluster = ClusterView((NodeView("a100-0", "a100", 2, 2), NodeView("a100-1", "a100", 2, 2)))
    r = job("r", max_gpus=2, restart_cost_s=300.0)
    est = table_for([r], cluster, {("r", "a100"): 1.0})
    spread = Cell("a100", 2, 1)
    r = running(r, spread, [("a100-0", 1), ("a100-1", 1)], est.table[("r", spread.key())])
    rep = get_policy("sia", p=0.5).schedule(ScheduleRequest(cluster, (r,), config=exact_config(**MOVE)), est)
    assert rep.placements["r"].cell == Cell("a100", 1, 2)
    assert rep.objective == pytest.approx(2**0.45, rel=1e-3)


def test_sia_s_restart_factor_is_not_below_zero(exact_config):
    """A restart that costs twice the horizon: 1 - 2 < 0, at least 0. The
    job stays on the A10 although the A100 is 100x faster."""
    j = job("j", max_gpus=1, elastic=True, restart_cost_s=600.0)
    est = table_for([j], TWO_TYPES, {("j", "a100"): 100.0, ("j", "a10"): 1.0})
    a10 = Cell("a10", 1, 1)
    j = running(j, a10, [("a10-0", 1)], est.table[("j", a10.key())])
    rep = get_policy("sia", p=0.5).schedule(ScheduleRequest(TWO_TYPES, (j,), config=exact_config(**MOVE)), est)
    assert (rep.placements["j"].cell, rep.placements["j"].nodes) == (a10, (("a10-0", 1),))
    assert rep.objective == pytest.approx(0.1, rel=1e-3)  # sqrt(1 / 100)
