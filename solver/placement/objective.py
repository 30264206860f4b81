"""The objective of a scheduling round.

Every (job j, cell c) gets a value, precomputed here so the CP-SAT model stays
linear (a sum of value x chosen):

    value(j, c) = age(j) * (w_throughput + w_short_jobs * short(j)) * u(j, c)

    u(j, c)   = (T(j, c) / T_ref(j)) ** fairness_p
    T(j, c)   = global_batch / iter_time(j, c)              samples/s
    T_ref(j)  = the job's throughput on its smallest feasible cell (fewest
                GPUs; the fastest one among those)
    short(j)  = R_med / (R_med + R(j))                      in (0, 1]
    R(j)      = remaining_iterations * iter_time on the reference cell (s)
    R_med     = median R over this round's jobs
    age(j)    = 1 + w_age * log2(1 + (now - submit_time) / age_scale_s)

* Throughput is normalised per job, so a job counts about 1 on its smallest
  cell whatever its model or batch; with 0 < p <= 1 (Sia-style) extra GPUs
  give diminishing returns, so starting one more job usually beats growing a
  running one, and p = 1 is plain normalised throughput.
* `short` is a bounded shortest-remaining-work weight (SRPT lowers average
  JCT): a job with half the median remaining work weighs 2/3, one with 10x the
  median 1/11, times w_short_jobs, on top of w_throughput. Being relative to
  the round's median it needs no time unit and cannot dominate throughput.
* `srpt_exponent` q (default 0: off) multiplies the value by
  (R_med / R(j)) ** q, bounded to [1/10, 10] before the power: with q = 1 and
  fairness_p = 1 the value is the job's share of its remaining work done per
  second, and the round maximises the rate at which jobs complete (SRPT in
  the fluid limit), which is what average JCT rewards under a queue.
* `hesrpt` (default on) multiplies the value by heSRPT's weight of the job's
  rank in remaining work R (Berg et al., 2020; ``hesrpt_factors``): with
  speedup k ** fairness_p, the weights make the round's GPU shares those
  that minimise total completion time, the smallest job the largest share,
  the largest job still a share (never starved: shares, not an order).
* `age` grows without bound but slowly, so a job that waits long enough
  eventually outweighs any throughput gain of the jobs ahead of it (no
  starvation), while fresh jobs are ordered by throughput alone.
* A job left unplaced is worth 0.
* With settle_wait (off by default), a pending job that will keep its
  first placement (JobRequest.settles) is offered only the cells within
  ``settle_limits`` of the fastest of their size: a slower GPU type once
  it has waited as long as that cell would add to its run.
* Restart penalty: a running job whose cell or nodes change gets
  value * (1 - restart_penalty * restart_cost_s / H), restart_cost_s from
  the job when measured, else default_restart_cost_s; H is horizon_s, or
  with horizon_remaining (the default) the larger of horizon_s and the
  shorter of the job's remaining time in its current cell and the time it
  has stayed there (``restart_factor``). With restart_history, H is
  instead the job's average stay so far, (age + restart cost) / (restarts
  + 1), and a job younger than its restart cost moves free (Pollux's
  reallocation factor, which Sia uses). A running job that
  is not elastic (or any running job when allow_resize is false) keeps its
  placement and is not part of the optimisation.

Values are scaled by SCALE and rounded to integers for CP-SAT.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from statistics import median

from solver.types import Estimate, JobRequest, SolverConfig

#: Integer units per unit of value in the CP-SAT model.
SCALE = 10_000
#: the srpt factor (R_med / R) is bounded by [1 / this, this]
SRPT_BOUND = 10.0
#: hesrpt_factors takes fairness_p as at most this
HESRPT_MAX_P = 0.95


def throughput(job: JobRequest, est: Estimate) -> float:
    """Samples per second of `job` with estimate `est` (0 when infeasible)."""
    return job.global_batch / est.iter_time_s if est.feasible else 0.0


def reference(job: JobRequest, estimates: Iterable[Estimate]) -> Estimate | None:
    """The job's smallest feasible cell (fewest GPUs, then fastest)."""
    feasible = [e for e in estimates if e.feasible]
    if not feasible:
        return None
    return min(feasible, key=lambda e: (e.cell.num_gpus, e.iter_time_s, e.cell))


def remaining_work_s(job: JobRequest, ref: Estimate | None) -> float:
    """Remaining seconds of work on the reference cell (inf without one)."""
    return job.remaining_iterations * ref.iter_time_s if ref is not None else math.inf


def age_factor(job: JobRequest, now: float, config: SolverConfig) -> float:
    age = max(0.0, now - job.submit_time)
    return 1.0 + config.w_age * math.log2(1.0 + age / max(config.age_scale_s, 1e-9))


def job_weights(
    jobs: Sequence[JobRequest], refs: Mapping[str, Estimate | None], now: float, config: SolverConfig
) -> dict[str, float]:
    """Per-job multiplier age(j) * (w_throughput + w_short_jobs * short(j)),
    times (R_med / R(j)) ** srpt_exponent (bounded, see SRPT_BOUND)."""
    work = {j.job_id: remaining_work_s(j, refs.get(j.job_id)) for j in jobs}
    finite = [w for w in work.values() if math.isfinite(w)]
    r_med = median(finite) if finite else 0.0
    out = {}
    for j in jobs:
        r = work[j.job_id]
        short = 0.0 if not math.isfinite(r) else (1.0 if r_med + r <= 0 else r_med / (r_med + r))
        w = age_factor(j, now, config) * (config.w_throughput + config.w_short_jobs * short)
        if config.srpt_exponent and math.isfinite(r) and r > 0 and r_med > 0:
            w *= min(SRPT_BOUND, max(1 / SRPT_BOUND, r_med / r)) ** config.srpt_exponent
        out[j.job_id] = w
    if config.hesrpt:
        for job_id, f in hesrpt_factors(work, config.fairness_p).items():
            out[job_id] *= f
    return out


def hesrpt_factors(work: Mapping[str, float], p: float) -> dict[str, float]:
    """heSRPT's allocation as value weights (Berg et al. 2020): with m jobs
    ranked by remaining work, largest first (i = 1..m), the job of rank i
    gets the share theta_i = (i/m)^(1/(1-p)) - ((i-1)/m)^(1/(1-p)), which
    minimises total completion time for speedup k^p without arrivals. A
    weight w on value k^p draws k proportional to w^(1/(1-p)), so the weight
    is (m theta_i)^(1-p) (1 for equal shares). Jobs without finite work keep
    1. p is taken as at most HESRPT_MAX_P (at p = 1 the shares become plain
    SRPT, everything to the smallest job, and the weights unbounded)."""
    finite = sorted((w, job_id) for job_id, w in work.items() if math.isfinite(w))
    q = 1.0 - min(p, HESRPT_MAX_P)
    m = len(finite)
    out = {job_id: 1.0 for job_id in work}
    for k, (_, job_id) in enumerate(finite):
        i = m - k  # the smallest remaining work has rank m
        theta = (i / m) ** (1 / q) - ((i - 1) / m) ** (1 / q)
        out[job_id] = (m * theta) ** q
    return out


def utility(job: JobRequest, est: Estimate, ref: Estimate, p: float) -> float:
    """(T(j,c) / T_ref(j)) ** p; 0 when the estimate is infeasible."""
    return utilities(job, (est,), ref, p)[0]


def utilities(job: JobRequest, estimates: Iterable[Estimate], ref: Estimate, p: float) -> list[float]:
    """`utility` of each of `estimates` (the reference's throughput taken once)."""
    t_ref = throughput(job, ref)
    if not t_ref > 0:
        return [0.0 for _ in estimates]
    return [(throughput(job, e) / t_ref) ** p if e.feasible else 0.0 for e in estimates]


def restart_factor(
    job: JobRequest,
    config: SolverConfig,
    *,
    penalty: float | None = None,
    at_least: float = -math.inf,
    remaining_s: float | None = None,
    stayed_s: float | None = None,
    age_s: float | None = None,
) -> float:
    """Multiplier on the value of a running job that changes cell or nodes:
    ``1 - penalty * restart cost / horizon`` (penalty: config.restart_penalty
    unless given), not below `at_least`.

    The horizon is how long the move's gain is expected to last: horizon_s,
    or with config.horizon_remaining the larger of horizon_s and the shorter
    of `remaining_s` (the job's remaining time where it runs: no gain
    outlasts the job) and `stayed_s` (how long it has stayed there: a
    placement that has lasted t is expected to last about t more, as the
    new one would). So a restart of minutes costs a job that has run for a
    day next to nothing, while one moved a minute ago pays it over
    horizon_s: without that bound, a job with days left was moved for any
    gain, round after round. Our re-implementation of Sia
    (solver/policies/sia.py) uses penalty 1, at least 0, the fixed horizon.

    With config.restart_history the horizon is the job's average stay so far,
    (age + cost) / (restarts + 1), `age_s` its time since submission and
    job.restarts how often it has restarted: with penalty 1 the factor is
    (age - restarts x cost) / (age + cost), the reallocation factor of Pollux
    that the Sia artifact's Sia applies (never below 0). A job that restarts
    often pays more for each further move however long it has left, and a job
    younger than its restart cost moves free (it has not yet run long enough
    to have grown).

    The factor is the share of the horizon the job trains after the move:
    with config.restart_on_throughput it scales the job's throughput in its
    new cell, as the Sia artifact's factor scales goodput before its power,
    so the value's multiplier is factor ** fairness_p (a factor of 0.25
    costs half the value at p = 0.5); otherwise it scales the value itself."""
    cost = job.restart_cost_s if job.restart_cost_s is not None else config.default_restart_cost_s
    weight = config.restart_penalty if penalty is None else penalty
    if config.restart_history and age_s is not None:
        if age_s < cost:
            return 1.0
        factor = max(0.0, 1.0 - weight * cost * (job.restarts + 1) / (age_s + cost))
    else:
        horizon = config.horizon_s
        known = [t for t in (remaining_s, stayed_s) if t is not None and math.isfinite(t)]
        if config.horizon_remaining and known:
            horizon = max(horizon, min(known))
        factor = 1.0 - weight * cost / max(horizon, 1e-9)
    if config.restart_on_throughput and factor > 0 and config.fairness_p > 0:
        factor **= config.fairness_p  # the throughput's factor, through the value's power
    return max(at_least, factor)


def settle_limits(job: JobRequest, estimates: Iterable[Estimate], now: float, config: SolverConfig) -> dict[int, float]:
    """GPU count -> the slowest iteration a job that keeps its first
    placement (JobRequest.settles; config.settle_wait) may start with on
    that many GPUs: the fastest cell's of that count, plus the time the job
    has waited spread over its remaining iterations ({}: not bound). A
    slower GPU type (or layout) then costs it more over its run than the
    fastest of the same size only by as much as it has already waited for
    better (ski rental): when a fast cell frees in time the job ends no
    later than in the slow one, else less than twice as late as in the
    slow one started at once. How many GPUs it gets stays the objective's
    choice: waiting for more GPUs would make every such job hold out for
    the largest cell, and take it for good."""
    if not (config.settle_wait and job.settles) or job.remaining_iterations <= 0:
        return {}
    slack = max(0.0, now - job.submit_time) / job.remaining_iterations
    best: dict[int, float] = {}
    for e in estimates:
        if e.feasible:
            best[e.cell.num_gpus] = min(best.get(e.cell.num_gpus, math.inf), e.iter_time_s)
    return {gpus: t + slack for gpus, t in best.items()}


def to_int(value: float) -> int:
    return int(round(value * SCALE))
