"""Helpers the baseline policies share: best-locality layouts, DP-only
estimates, the optional feasibility rule, and building a reply."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping

from solver.contract.runtimes import refusal
from solver.estimator.protocol import EstimatorLike
from solver.placement import Result
from solver.types import (
    Cell,
    ClusterView,
    Estimate,
    JobRequest,
    ParallelPlan,
    Placement,
    ScheduleReply,
    ScheduleRequest,
    SolverStatus,
)

#: `feasible(job, cell) -> bool`: an extra rule a baseline must respect
#: (e.g. Arena's dp_mem memory test); None accepts every cell.
Feasible = Callable[[JobRequest, Cell], bool] | None


def layouts(cluster: ClusterView, gpu_type: str, gpus: int) -> list[Cell]:
    """DP-only cells of `gpus` GPUs of one type: best locality first (fewest
    nodes), then relaxed locality, halving the GPUs per node each time."""
    return list(_layouts(cluster.node_sizes(gpu_type), gpu_type, gpus))


@functools.lru_cache(maxsize=65536)
def _layouts(sizes: tuple[tuple[int, int], ...], gpu_type: str, gpus: int) -> tuple[Cell, ...]:
    """`layouts` on nodes of these (GPUs, count) sizes (a pure function: cached)."""
    if not sizes or gpus < 1:
        return ()
    per = 1
    while per * 2 <= min(gpus, sizes[0][0]) and gpus % (per * 2) == 0:
        per *= 2
    out = []
    while per >= 1:
        if gpus % per == 0 and sum(k for s, k in sizes if s >= per) >= gpus // per:
            out.append(Cell(gpu_type, gpus // per, per, 1))
        per //= 2
    return tuple(out)


def dp_estimate(job: JobRequest, cell: Cell, estimator: EstimatorLike, feasible: Feasible) -> Estimate | None:
    """The cell's estimate with a pure data-parallel plan (pp = tp = 1), or
    None when infeasible. Baselines run DP-only at the estimated speed of the
    cell (as Arena's simulator does: every policy progresses at its profile's
    iteration time). None where the job's runtime cannot run that plan
    (solver.contract.runtimes.refusal: on more GPUs than its V virtual
    workers, the batch split unevenly by a runtime that splits it evenly, ...),
    and where the job could not resume its checkpoint with it (JobRequest.move_problem)."""
    if (feasible is not None and not feasible(job, cell)) or job.excludes(cell):
        return None
    shape = (job.runtime, job.model.num_layers, job.global_batch, job.virtual_workers)
    if refusal(*shape, pp=1, tp=1, dp=cell.num_gpus, gpu_types=[t for t, _ in cell.by_type()]):
        return None
    if job.move_problem(cell, ParallelPlan(1, cell.num_gpus, 1)) is not None:
        return None
    est = estimator.estimate(job, cell)
    if not est.feasible:
        return None
    shards = est.plan.state_shares if est.plan is not None and not cell.mixed else ()  # sharded where it had to be
    plan = ParallelPlan(1, cell.num_gpus, 1, state_shares=shards)
    return Estimate(cell, plan, est.iter_time_s, est.mem_per_gpu_gb, est.source, est.note, est.state_gb)


def reply(
    fixed: Mapping[str, Placement],
    result: Result,
    num_cells: int,
    reasons: Mapping[str, str],
    extra_build_s: float = 0.0,
    request: ScheduleRequest | None = None,
) -> ScheduleReply:
    """The policy's reply; with its `request`, kept within the site's hard
    rules (siterules.enforce_site: GPU limits, partition access, active
    reservations), whatever the policy chose (unchanged without a site policy)."""
    placements = {**fixed, **result.placements}
    why = {k: v for k, v in {**reasons, **result.reasons}.items() if k not in placements}
    out = ScheduleReply(
        placements,
        result.status,
        result.objective,
        result.bound,
        extra_build_s + result.build_s,
        result.solve_s,
        num_cells,
        why,
        result.place_s,
    )
    if request is None or request.site.empty:
        return out
    from solver.placement.siterules import enforce_site

    return enforce_site(request, out)


def heuristic_reply(
    fixed: Mapping[str, Placement],
    placed: Mapping[str, Placement],
    num_cells: int,
    reasons: Mapping[str, str],
    t0: float,
    request: ScheduleRequest,
) -> ScheduleReply:
    """`reply` for a baseline's own placement (no solver ran), its time
    counted from `t0` (time.perf_counter)."""
    dt = time.perf_counter() - t0
    n = float(len(placed))
    return reply(fixed, Result(dict(placed), SolverStatus.HEURISTIC, n, n, place_s=dt), num_cells, reasons, dt, request)
