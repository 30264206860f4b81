"""Check that a plan can be carried out on the cluster as it is."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from solver.contract.errors import SolverError
from solver.contract.runtimes import even_split, get_runtime, plan_problem
from solver.mixed import task_stage_types
from solver.placement.nodes import in_partition
from solver.site import SitePolicy
from solver.types import Cell, ClusterView, JobRequest, ParallelPlan, Placement


class PlacementError(ValueError, SolverError):
    """Placements that cannot be carried out on the cluster as it is (not to
    be confused with ``solver.contract.plan.PlanError``, a malformed job plan)."""


def _runtime_problem(job: JobRequest, cell: Cell, plan: ParallelPlan, gpu_types: Sequence[str] = ()) -> str | None:
    """Why the job's runtime (solver.contract.runtimes) cannot carry out `plan` on
    `cell` (its nodes of these GPU types; default: the cell's own types);
    None when it can. The batch shares are the plan's per-part shares on a
    mixed cell, else the global batch split over dp as evenly as whole
    samples allow. The stages hold the job's model (its layers, as the job
    trains it), and a job with a checkpoint resumes it only as its runtime
    allows (`JobRequest.resumes_from`)."""
    shares: Sequence[int] = plan.shares if cell.mixed else even_split(job.global_batch, plan.dp)
    return plan_problem(
        get_runtime(job.runtime),
        pp=plan.pp,
        tp=plan.tp,
        dp=plan.dp,
        gpu_types=gpu_types or [t for t, _ in cell.by_type()],
        batch_shares=shares or None,
        stage_layers=plan.stage_layers or None,
        virtual_workers=job.virtual_workers,
        micro_batches=plan.micro_batches,
        global_batch=job.global_batch,
        layers=job.model.num_layers,
        resumed_from=job.resumes_from,
    )


def validate_plan(
    cluster: ClusterView,
    placements: Mapping[str, Placement],
    jobs: Mapping[str, JobRequest] | None = None,
    site: SitePolicy | None = None,
    now: float = 0.0,
    site_jobs: Mapping[str, JobRequest] | None = None,
    admitted: Mapping[str, Placement] | None = None,
) -> None:
    """Raise PlacementError unless every placement is on existing nodes of its cell's
    GPU type, matches its cell's layout (num_nodes distinct nodes with
    gpus_per_node GPUs each), uses only nodes of its partition (when set), its
    plan fits the cell, every stage of a pipeline across types lies on nodes of
    one type in the cluster's node order (Slurm's task order), no node
    gives out more than its free GPUs, and (for the jobs in `jobs`, by id) the
    job's runtime carries its plan out (`_runtime_problem`): whatever policy
    chose it, no job is given a plan its code would ignore. With a `site`
    policy (and `jobs`), neither may it break the site's hard rules
    (siterules.site_problems: GPU limits, partition access, reservations
    active at `now`) for the jobs in `site_jobs` (default: `jobs`; the
    controller checks the runtimes of the jobs that move or start only, and
    the rules over every job, as the running ones hold GPUs under the limits too).
    The `admitted` placements passed this check before (placements admitted
    one at a time): only their GPUs on each node and their share of the
    site's rules count, each checked once however many are admitted."""
    by_name = {n.name: n for n in cluster.nodes}
    order = {n.name: i for i, n in enumerate(cluster.nodes)}
    used: dict[str, int] = {}
    for p in (admitted or {}).values():
        for name, g in p.nodes:
            used[name] = used.get(name, 0) + g
    for job_id, p in placements.items():
        if p.job_id != job_id:
            raise PlacementError(f"placement under key {job_id} is for job {p.job_id}")
        cell = p.cell
        names = p.node_names
        if len(names) != cell.num_nodes or len(set(names)) != len(names):
            raise PlacementError(
                f"job {job_id}: {len(names)} nodes {names} for layout {cell.layout} (need distinct nodes)"
            )
        if p.plan.num_gpus != cell.num_gpus:
            raise PlacementError(
                f"job {job_id}: plan uses {p.plan.num_gpus} GPUs, cell {cell.key()} has {cell.num_gpus}"
            )
        for name, g in p.nodes:
            node = by_name.get(name)
            if node is None:
                raise PlacementError(f"job {job_id}: unknown node {name}")
            if node.gpu_type not in dict(cell.by_type()):
                raise PlacementError(f"job {job_id}: node {name} has {node.gpu_type}, cell wants {cell.gpu_type}")
            if g != cell.gpus_per_node:
                raise PlacementError(
                    f"job {job_id}: {g} GPUs on {name}, layout {cell.layout} wants {cell.gpus_per_node}"
                )
            if p.partition is not None and not in_partition(cluster, node, p.partition):
                raise PlacementError(f"job {job_id}: node {name} is not in partition {p.partition}")
            used[name] = used.get(name, 0) + g
        if not cell.holds_types([by_name[n].gpu_type for n in names]):
            raise PlacementError(f"job {job_id}: nodes {names} are not the GPU types of cell {cell.key()}")
        if cell.mixed and cell.pp > 1:
            tasks = [by_name[n].gpu_type for n in sorted(names, key=lambda n: order[n])]
            if task_stage_types(cell, p.plan, tasks) is None:
                raise PlacementError(
                    f"job {job_id}: a pipeline stage would span GPU types on nodes {names} in task order"
                )
        job = (jobs or {}).get(job_id)
        if job is not None:
            problem = _runtime_problem(job, cell, p.plan, [by_name[n].gpu_type for n in names])
            if problem is not None:
                raise PlacementError(f"job {job_id}: {problem}")
    for name, g in sorted(used.items()):
        if g > by_name[name].gpus_free:
            raise PlacementError(f"node {name}: {g} GPUs planned, {by_name[name].gpus_free} free")
    ruled = jobs if site_jobs is None else site_jobs
    if site is not None and not site.empty and ruled is not None:
        from solver.placement.siterules import site_problems  # siterules stands on this package

        problems = site_problems(site, cluster, list(ruled.values()), {**(admitted or {}), **placements}, now)
        if problems:
            raise PlacementError("; ".join(problems))
