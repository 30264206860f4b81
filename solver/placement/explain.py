"""Why a running job stays where it is (ScheduleReply.notes): the round's
answer to "why was my elastic job neither grown, shrunk nor moved?", in
solver.site's forms ("stays in <cell>: <why>", "governor: ...").

A job the round kept fixed says what fixed it: not elastic now (its spec,
a checkpoint under way, or a run that has not reported its first step), a
policy or a config that moves no running job, the restart governor
(SolverConfig.min_run_s), or a partial round (SolverConfig.replan_interval_s).
A job the joint model could have moved compares its best other cell with
its own, by value (objective.utility: throughput
against its smallest cell, to the power fairness_p): no cell worth more;
one worth more but not after the restart cost (objective.restart_factor);
one the site's rules refuse it (a time limit it would miss, a reservation);
or one that pays its restart, whose GPUs are worth more to other jobs.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from solver.placement import objective
from solver.placement.candidates import governed
from solver.site import reason_governor, reason_stays
from solver.types import Cell, Estimate, JobRequest, Placement, SolverConfig

#: why a partial round (SolverConfig.replan_interval_s) kept a running job where it is
PARTIAL_ROUND = "a partial round: no idle GPU on its nodes; re-planned within replan_interval_s"


def fixed_note(job: JobRequest, moves_running: bool, config: SolverConfig, now: float) -> str:
    """Why a running job the round kept fixed stays (split_fixed's causes)."""
    assert job.current is not None
    cell = job.current.cell.key()
    if not job.movable:
        return reason_stays(cell, "not movable now (no checkpoint hook yet)")
    if not job.elastic:
        return reason_stays(cell, "not elastic now (its spec, a checkpoint under way, or no step of its run yet)")
    if not moves_running:
        return reason_stays(cell, "the policy moves no running job")
    if not config.allow_resize:
        return reason_stays(cell, "allow_resize is false")
    if job.running_since is not None and governed(job, now, config.min_run_s):
        return reason_governor(max(0.0, now - job.running_since), config.min_run_s)
    return reason_stays(cell, "its placement is fixed")


def move_note(
    job: JobRequest,
    estimates: Sequence[Estimate],
    ref: Estimate | None,
    config: SolverConfig,
    restart_mult: float,
    allowed: Collection[Cell],
) -> str:
    """Why a running job the joint model could move keeps its placement:
    its best other cell by value against its own (module doc). `allowed`:
    the cells the site's rules left it."""
    cur = job.current
    assert cur is not None
    here = next((e for e in estimates if e.cell == cur.cell and e.feasible), None)
    if ref is None or here is None:
        return reason_stays(cur.cell.key(), "no estimate of another cell")
    mine = objective.utility(job, here, ref, config.fairness_p)
    best: tuple[float, Cell] | None = None
    for e, u in zip(estimates, objective.utilities(job, estimates, ref, config.fairness_p), strict=True):
        if not e.feasible or e.cell == cur.cell or job.excludes(e.cell):
            continue
        if best is None or (u, e.cell.num_gpus) > (best[0], best[1].num_gpus):
            best = (u, e.cell)
    if best is None or mine <= 0 or best[0] <= mine:
        return reason_stays(cur.cell.key(), "no cell is worth more than its own")
    ratio, other = best[0] / mine, best[1].key()
    after = ratio * restart_mult
    if after <= 1.0:
        return reason_stays(cur.cell.key(), f"{other} worth {ratio:.2f}x, {after:.2f}x after its restart cost")
    if best[1] not in allowed:
        return reason_stays(
            cur.cell.key(), f"{other} worth {after:.2f}x after its restart cost, refused by a site rule"
        )
    return reason_stays(
        cur.cell.key(), f"{other} worth {after:.2f}x after its restart cost; its GPUs are worth more to other jobs"
    )


def stay_notes(
    jobs: Sequence[JobRequest],
    placements: Mapping[str, Placement],
    fixed: Collection[str],
    estimates: Mapping[str, Sequence[Estimate]],
    refs: Mapping[str, Estimate | None],
    restart_mults: Mapping[str, float],
    allowed: Mapping[str, Collection[Cell]],
    moves_running: bool,
    config: SolverConfig,
    now: float,
    kept: Collection[str] = (),
) -> dict[str, str]:
    """A note for each running job of `jobs` that keeps its placement in
    `placements`: for those a partial round `kept` (candidates.partial_round),
    that; `fixed_note` for the others in `fixed`, else `move_note`."""
    out: dict[str, str] = {}
    for job in jobs:
        cur, p = job.current, placements.get(job.job_id)
        if cur is None or p is None or not p.same_resources(cur):
            continue
        if job.job_id in kept:
            out[job.job_id] = reason_stays(cur.cell.key(), PARTIAL_ROUND)
        elif job.job_id in fixed or job.job_id not in estimates:
            out[job.job_id] = fixed_note(job, moves_running, config, now)
        else:
            out[job.job_id] = move_note(
                job,
                estimates[job.job_id],
                refs.get(job.job_id),
                config,
                restart_mults.get(job.job_id, 1.0),
                allowed.get(job.job_id, ()),
            )
    return out
