"""solver.placement.objective term by term, each against a value worked out
by hand from the formulas in its docstring (the mutation benchmark found
these terms reached only through whole solves, where a changed constant or
branch did not show)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from solver.contract.models import ModelSpec
from solver.contract.runtimes import Layout
from solver.placement import objective
from solver.types import Cell, Estimate, EstimateSource, JobRequest, ParallelPlan, Placement, SolverConfig

MODEL = ModelSpec("tiny", "gpt", 4, 256, 4, 128, 1000, 1e7)
CELL = Cell("a100", 1, 4, 1)
# every term off but the one a test looks at
PLAIN = SolverConfig(w_age=0.0, w_throughput=1.0, w_short_jobs=0.0, srpt_exponent=0.0, hesrpt=False)


def job(jid: str = "j", iterations: float = 100, **kw) -> JobRequest:
    return JobRequest(jid, MODEL, 8, iterations, **{"runtime": "adaptive", **kw})


def est(iter_time_s: float, feasible: bool = True) -> Estimate:
    return Estimate(CELL, ParallelPlan(1, 4, 1) if feasible else None, iter_time_s, 1.0, EstimateSource.MEASURED)


def test_throughput_is_samples_per_second_and_zero_when_infeasible():
    assert objective.throughput(job(), est(2.0)) == 4.0  # 8 samples / 2 s
    assert objective.throughput(job(), est(2.0, feasible=False)) == 0.0


def test_remaining_work_is_iterations_times_the_reference_time():
    assert objective.remaining_work_s(job(iterations=100, iterations_done=40), est(2.0)) == 120.0
    assert objective.remaining_work_s(job(), None) == math.inf


def test_utility_is_throughput_over_the_reference_to_the_p():
    assert objective.utility(job(), est(1.0), est(2.0), 0.5) == pytest.approx(math.sqrt(2))
    assert objective.utility(job(), est(1.0, feasible=False), est(2.0), 0.5) == 0.0
    assert objective.utility(job(), est(1.0), est(2.0, feasible=False), 0.5) == 0.0  # no reference throughput


def test_age_factor():
    cfg = SolverConfig(w_age=0.25, age_scale_s=3600.0)
    assert objective.age_factor(job(submit_time=100.0), 100.0 + 3600.0, cfg) == pytest.approx(1.25)  # log2(2)
    assert objective.age_factor(job(submit_time=100.0), 100.0 + 3 * 3600.0, cfg) == pytest.approx(1.5)  # log2(4)
    assert objective.age_factor(job(submit_time=100.0), 50.0, cfg) == 1.0  # not submitted yet: no age
    assert objective.age_factor(job(submit_time=100.0), 100.0, cfg) == 1.0
    # an age scale below one second is used as it is: 1.5 s / 0.5 s -> log2(4)
    assert objective.age_factor(job(), 1.5, SolverConfig(w_age=0.25, age_scale_s=0.5)) == pytest.approx(1.5)


def weights(works: dict[str, float | None], cfg: SolverConfig) -> dict[str, float]:
    """job_weights of jobs with these remaining seconds of work (None: no reference cell): one iteration
    left, of that many seconds on the reference cell."""
    jobs = [job(jid, iterations=1) for jid in works]
    refs = {jid: (est(w) if w is not None else None) for jid, w in works.items()}
    return objective.job_weights(jobs, refs, 0.0, cfg)


def test_short_jobs_weight_is_the_median_over_median_plus_own_work():
    cfg = SolverConfig(**{**PLAIN.__dict__, "w_short_jobs": 1.0})
    # median of 100 and 300 is 200: 200/300 and 200/500; no reference: no bonus
    assert weights({"a": 100, "b": 300, "c": None}, cfg) == pytest.approx({"a": 1 + 2 / 3, "b": 1.4, "c": 1.0})
    assert weights({"a": 0.1, "b": 0.1}, cfg) == pytest.approx({"a": 1.5, "b": 1.5})  # 0.1 / 0.2
    assert weights({"a": 0, "b": 0}, cfg) == {"a": 2.0, "b": 2.0}  # nothing left anywhere: the full bonus


def test_srpt_exponent_factor_and_its_conditions():
    cfg = SolverConfig(**{**PLAIN.__dict__, "srpt_exponent": 1.0})
    # median 1.0: (1.0 / 0.5) = 2 and 1.0 / 1.5; a job without a reference keeps 1
    assert weights({"a": 0.5, "b": 1.5, "c": None}, cfg) == pytest.approx({"a": 2.0, "b": 2 / 3, "c": 1.0})
    # a job with no work left keeps 1 (no division by zero) while the median is positive
    assert weights({"a": 0, "b": 4, "c": 8}, cfg) == pytest.approx({"a": 1.0, "b": 1.0, "c": 0.5})
    # a median of 0 leaves every job at 1
    assert weights({"a": 0, "b": 0, "c": 5}, cfg) == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.0})
    # the factor is a power of q, and multiplies the short-jobs weight
    q2 = SolverConfig(**{**cfg.__dict__, "srpt_exponent": 2.0, "w_short_jobs": 1.0})
    # median 2: a = (1 + 2/3) * (2/1)**2, b = (1 + 2/5) * (2/3)**2
    assert weights({"a": 1, "b": 3}, q2) == pytest.approx({"a": (5 / 3) * 4, "b": 1.4 * 4 / 9})


def test_hesrpt_multiplies_the_other_weights():
    cfg = SolverConfig(**{**PLAIN.__dict__, "w_short_jobs": 1.0, "hesrpt": True, "fairness_p": 0.5})
    # two jobs, p = 0.5: heSRPT weights sqrt(1.5) (the smaller) and sqrt(0.5), times the short-jobs
    # weights of the median 200: 1 + 200/300 and 1 + 200/500
    w = weights({"a": 100, "b": 300}, cfg)
    assert w == pytest.approx({"a": (1 + 2 / 3) * math.sqrt(1.5), "b": 1.4 * math.sqrt(0.5)})


def test_settle_limits_spread_the_wait_over_the_remaining_iterations_per_size():
    """A pending ddp job (Checkpoint.HOOK, never trained) settles: on each
    number of GPUs its limit is the fastest cell's iteration of that size
    plus its wait over its remaining iterations; every other job is unbound."""
    cfg = SolverConfig(settle_wait=True)
    four, eight = Cell("a100", 1, 4, 1), Cell("a100", 2, 4, 1)
    ests = [
        Estimate(four, ParallelPlan(1, 4, 1), 2.5, 1.0, EstimateSource.MEASURED),
        Estimate(Cell("a10", 1, 4, 1), ParallelPlan(1, 4, 1), 10.0, 1.0, EstimateSource.MEASURED),
        Estimate(eight, ParallelPlan(1, 8, 1), 1.5, 1.0, EstimateSource.MEASURED),
        est(1.0, feasible=False),  # an infeasible cell bounds nothing
    ]
    ddp = job(iterations=1000, iterations_done=200, runtime="ddp", submit_time=100.0)
    assert ddp.settles
    # 800 iterations left, waited 4,000 s: 5 s an iteration on top of each size's fastest
    assert objective.settle_limits(ddp, ests, 4100.0, cfg) == pytest.approx({4: 7.5, 8: 6.5})
    assert objective.settle_limits(ddp, ests, 100.0, cfg) == pytest.approx({4: 2.5, 8: 1.5})  # not waited
    assert objective.settle_limits(ddp, ests, 0.0, cfg) == pytest.approx({4: 2.5, 8: 1.5})  # a clock behind
    unbound = (
        replace(ddp, runtime="sharded"),  # answers the signal itself: movable once it runs
        replace(ddp, resumes_from=Layout(1, 4, 1)),  # trained before: it registered the hook
        replace(ddp, current=Placement("j", CELL, (("n", 4),), ParallelPlan(1, 4, 1), 2.5)),  # runs
        replace(ddp, iterations_done=1000),  # nothing left
    )
    for j in unbound:
        assert objective.settle_limits(j, ests, 4100.0, cfg) == {}
    assert [j.settles for j in unbound] == [False, False, False, True]
    assert objective.settle_limits(ddp, ests, 4100.0, SolverConfig()) == {}  # off by default


def test_restart_history_is_pollux_reallocation_factor():
    cfg = SolverConfig(restart_penalty=1.0, horizon_s=3600.0, restart_history=True)
    # (age - restarts x cost) / (age + cost): age 1,000 s, cost 250 s, never restarted: 1000 / 1250
    fresh = job(restart_cost_s=250.0, restarts=0)
    assert objective.restart_factor(fresh, cfg, age_s=1000.0) == pytest.approx(0.8)
    # three restarts: (1000 - 750) / 1250; the horizons of horizon_s and the stay are not used
    thrice = job(restart_cost_s=250.0, restarts=3)
    assert objective.restart_factor(thrice, cfg, age_s=1000.0, stayed_s=5000.0, remaining_s=9e9) == pytest.approx(0.2)
    # restarts that took more than its age: never below 0
    assert objective.restart_factor(job(restart_cost_s=250.0, restarts=5), cfg, age_s=1000.0) == 0.0
    # younger than its restart cost: free
    assert objective.restart_factor(thrice, cfg, age_s=249.0) == 1.0
    # the penalty weighs the cost: 1 - 0.5 x 250 x 4 / 1250
    assert objective.restart_factor(thrice, cfg, penalty=0.5, age_s=1000.0) == pytest.approx(0.6)
    # no age given (or restart_history off): the horizon rule
    plain = SolverConfig(restart_penalty=1.0, horizon_s=3600.0, horizon_remaining=False)
    assert objective.restart_factor(thrice, cfg) == pytest.approx(1 - 250 / 3600)
    assert objective.restart_factor(thrice, plain, age_s=1000.0) == pytest.approx(1 - 250 / 3600)


def test_restart_factor_uses_the_penalty_given_and_a_short_horizon_as_it_is():
    cfg = SolverConfig(restart_penalty=1.0, horizon_s=300.0, horizon_remaining=False)
    assert objective.restart_factor(job(restart_cost_s=30.0), cfg) == pytest.approx(0.9)
    assert objective.restart_factor(job(restart_cost_s=30.0), cfg, penalty=0.5) == pytest.approx(0.95)
    short = SolverConfig(restart_penalty=1.0, horizon_s=0.5, horizon_remaining=False)
    assert objective.restart_factor(job(restart_cost_s=0.1), short) == pytest.approx(0.8)  # 1 - 0.1 / 0.5


def test_restart_on_throughput_scales_the_throughput_not_the_value():
    """With restart_on_throughput the factor multiplies the job's throughput
    in its new cell, so the value, (T / T_ref) ** p, is multiplied by
    factor ** p; off (the default) by the factor itself."""
    thrice = job(restart_cost_s=250.0, restarts=3)  # Pollux's factor at age 1,000 s: (1000 - 750) / 1250 = 0.2
    history = SolverConfig(restart_penalty=1.0, restart_history=True, fairness_p=0.5)
    on = replace(history, restart_on_throughput=True)
    assert objective.restart_factor(thrice, history, age_s=1000.0) == pytest.approx(0.2)
    assert objective.restart_factor(thrice, on, age_s=1000.0) == pytest.approx(0.2**0.5)
    assert objective.restart_factor(thrice, replace(on, fairness_p=1.0), age_s=1000.0) == pytest.approx(0.2)
    # the horizon rule likewise: 1 - 250 / 1000 = 0.75, through p = 0.5
    horizon = SolverConfig(restart_penalty=1.0, horizon_s=1000.0, horizon_remaining=False, restart_on_throughput=True)
    assert objective.restart_factor(thrice, horizon) == pytest.approx(0.75**0.5)
    # a move that loses more than the horizon is still worth nothing (not a root of a negative)
    assert objective.restart_factor(thrice, replace(horizon, horizon_s=200.0)) == pytest.approx(1 - 250 / 200)
    assert objective.restart_factor(job(restart_cost_s=250.0, restarts=5), on, age_s=1000.0) == 0.0
    assert objective.restart_factor(thrice, on, age_s=249.0) == 1.0  # younger than its cost: free
