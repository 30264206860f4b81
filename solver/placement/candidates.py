"""Options: the ways one job may run this round, each with its integer value.

A running job that may move gets a *pinned* option (its current cell on its
current nodes, no restart penalty) next to its other options (any cell,
nodes chosen by the solver, restart penalty applied). A running job that may
not move is *fixed*: it keeps its placement and only takes capacity away.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from solver.placement import objective
from solver.types import Cell, ClusterView, Estimate, JobRequest, NodeView, ParallelPlan, Placement, SolverConfig


@dataclass(frozen=True)
class Option:
    """Job `job_id` in `cell` with `plan`, worth `value` (objective units).

    `pinned` holds the exact (node, GPUs) pairs when the option is "stay where
    you are"; None lets the solver choose the nodes.
    """

    @property
    def multi_node(self) -> bool:
        return self.cell.num_nodes > 1

    job_id: str
    cell: Cell
    plan: ParallelPlan
    iter_time_s: float
    value: int
    pinned: tuple[tuple[str, int], ...] | None = None
    source: str = ""
    #: what the job loses (objective units) when its network card is shared
    #: with another multi-node job (0: not priced; see model.py)
    nic_cost: int = 0
    #: the reservation marks (nodes.RESERVED + name) whose nodes the option
    #: may not use (a free option of a job a reservation does not admit)
    blocked: frozenset[str] = frozenset()

    def placement(self, nodes: tuple[tuple[str, int], ...], partition: str | None = None) -> Placement:
        return Placement(self.job_id, self.cell, nodes, self.plan, self.iter_time_s, partition, self.source)


def fits(
    cluster: ClusterView | Mapping[str, NodeView], placement: Placement, used: Mapping[str, int] | None = None
) -> bool:
    """True when `placement` still fits its nodes (type, free GPUs minus
    `used`); pass the nodes by name when checking many placements."""
    by_name = {n.name: n for n in cluster.nodes} if isinstance(cluster, ClusterView) else cluster
    used = used or {}
    types = []
    for name, g in placement.nodes:
        node = by_name.get(name)
        if node is None or g + used.get(name, 0) > node.gpus_free:
            return False
        types.append(node.gpu_type)
    return len(set(placement.node_names)) == len(placement.nodes) and placement.cell.holds_types(types)


def split_fixed(
    cluster: ClusterView,
    jobs: Sequence[JobRequest],
    movable_running: bool,
    config: SolverConfig,
    now: float | None = None,
) -> tuple[dict[str, Placement], list[JobRequest], dict[str, str]]:
    """Running jobs that keep their placement, the jobs to optimise, reasons.

    A running job is fixed unless it is elastic and movable
    (JobRequest.movable), `movable_running` is set and config.allow_resize
    is true, and, given `now`, the restart governor lets it go (`governed`).
    A fixed placement that no longer fits (node gone, drained, taken) frees
    the job to be placed again.
    """
    return _split(
        cluster,
        jobs,
        lambda job: (
            not (movable_running and job.elastic and job.movable and config.allow_resize)
            or (now is not None and governed(job, now, config.min_run_s))
        ),
    )


def governed(job: JobRequest, now: float, min_run_s: float) -> bool:
    """The restart governor (SolverConfig.min_run_s): is the job's current
    run (JobRequest.running_since: its start, or its last move or resize,
    which restarts it) younger than `min_run_s`? Such a job keeps its
    placement; 0 turns it off."""
    return min_run_s > 0 and job.running_since is not None and now - job.running_since < min_run_s


def partial_round(
    cluster: ClusterView, fixed: Mapping[str, Placement], jobs: Sequence[JobRequest]
) -> tuple[dict[str, Placement], list[JobRequest], list[str]]:
    """A partial round's split (ScheduleRequest.replan_all false): of `jobs`
    (`split_fixed`'s jobs to optimise, beside its `fixed`), each running job
    whose nodes have no idle GPU keeps its placement too, while it fits.
    Idle GPUs are those no job holds now, fixed or running. Returns
    (fixed, the jobs left to place, the ids of those kept)."""
    held = dict(fixed)
    idle = {n.name: n.gpus_free for n in cluster.nodes}
    for p in [*fixed.values(), *(j.current for j in jobs if j.current is not None)]:
        for name, g in p.nodes:
            idle[name] = idle.get(name, 0) - g
    by_name = {n.name: n for n in cluster.nodes}
    used: dict[str, int] = {}
    for p in fixed.values():
        for name, g in p.nodes:
            used[name] = used.get(name, 0) + g
    rest: list[JobRequest] = []
    kept: list[str] = []
    for job in jobs:
        cur = job.current
        if cur is None or any(idle.get(name, 0) > 0 for name, _ in cur.nodes) or not fits(by_name, cur, used):
            rest.append(job)
            continue
        held[job.job_id] = cur
        kept.append(job.job_id)
        for name, g in cur.nodes:
            used[name] = used.get(name, 0) + g
    return held, rest, kept


def split_static(
    cluster: ClusterView, jobs: Sequence[JobRequest]
) -> tuple[dict[str, Placement], list[JobRequest], dict[str, str]]:
    """`split_fixed` for the policies that re-allocate every job each round
    (Gavel, Sia): only the running jobs that may not be moved at all
    (JobRequest.movable false) keep their placement."""
    return _split(cluster, jobs, lambda job: not job.movable)


def _split(
    cluster: ClusterView, jobs: Sequence[JobRequest], keeps: Callable[[JobRequest], bool]
) -> tuple[dict[str, Placement], list[JobRequest], dict[str, str]]:
    """The running jobs that `keeps` says keep their placement (while it fits), the others, reasons."""
    fixed: dict[str, Placement] = {}
    used: dict[str, int] = {}
    free_jobs: list[JobRequest] = []
    reasons: dict[str, str] = {}
    by_name = {n.name: n for n in cluster.nodes}
    for job in jobs:
        cur = job.current
        keep = cur is not None and keeps(job)
        if keep and cur is not None and fits(by_name, cur, used):
            fixed[job.job_id] = cur
            for name, g in cur.nodes:
                used[name] = used.get(name, 0) + g
            continue
        if keep:
            reasons[job.job_id] = "current placement no longer fits the cluster; placed again"
        free_jobs.append(job)
    return fixed, free_jobs, reasons


def resumable(job: JobRequest, estimates: Sequence[Estimate]) -> list[Estimate]:
    """The estimates whose plans the job can resume its checkpoint with
    (JobRequest.move_problem: its runtime's rule)."""
    if not job.moves_bound:
        return list(estimates)
    return [e for e in estimates if e.plan is None or job.move_problem(e.cell, e.plan) is None]


def staying(job: JobRequest, est: Estimate) -> Estimate:
    """The estimate of the cell the job runs in, `est`, with the plan it runs
    there where the estimate's own is one it could not resume with (a cell
    priced by its fastest plan): staying is always allowed."""
    cur = job.current
    if cur is None or est.cell != cur.cell or est.plan is None or job.move_problem(est.cell, est.plan) is None:
        return est
    return dataclasses.replace(est, plan=cur.plan)


#: One option of a job before it is an Option: (estimate index, value, pinned).
Pick = tuple[int, int, bool]


def option_picks(
    job: JobRequest,
    estimates: Sequence[Estimate],
    ref: Estimate,
    weight: float,
    p: float,
    restart_mult: float,
    stay_ok: bool,
    max_options: int,
    utilities: Sequence[float] | None = None,
) -> list[Pick]:
    """The job's options, best first, as (estimate index, value, pinned)
    triples (cheap to weigh before `make_options` makes the Option objects):
    at most `max_options` free ones plus the pinned one when the job runs and
    may stay (`stay_ok`). Free options of a running job that may stay are
    worth `restart_mult` times their value; options worth <= 0 are dropped.
    `utilities` may carry objective.utility of each estimate, computed once
    per job shape."""
    cur = job.current
    here = cur.cell if cur is not None and stay_ok else None  # the cell a job that may stay runs in
    mult = restart_mult if here is not None else 1.0
    if utilities is None:
        utilities = objective.utilities(job, estimates, ref, p)
    free: list[tuple[int, int, Cell, int]] = []
    pinned: Pick | None = None
    for i, est in enumerate(estimates):
        if not est.feasible or job.excludes(est.cell):
            continue
        base = weight * utilities[i]
        if here is not None and est.cell == here:
            pinned = (i, objective.to_int(base), True)
        value = objective.to_int(base * mult)
        if value > 0:
            free.append((-value, est.cell.num_gpus, est.cell, i))
    free.sort()
    out: list[Pick] = [(i, -v, False) for v, _, _, i in free[:max_options]]
    if pinned is not None and pinned[1] > 0:
        out.insert(0, pinned)
    return out


def make_options(
    job: JobRequest, estimates: Sequence[Estimate], picks: Sequence[Pick], nic_costs: Sequence[int] | None = None
) -> list[Option]:
    """The Options of `picks` (with their nic_cost, aligned with `picks`, when given)."""
    cur = job.current
    out = []
    for n, (i, value, pinned) in enumerate(picks):
        est = estimates[i]
        assert est.plan is not None  # option_picks picks feasible estimates only
        out.append(
            Option(
                job.job_id,
                est.cell,
                est.plan,
                est.iter_time_s,
                value,
                tuple(cur.nodes) if pinned and cur is not None else None,
                est.source,
                nic_costs[n] if nic_costs is not None else 0,
            )
        )
    return out
