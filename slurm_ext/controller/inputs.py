"""From what Slurm shows and what the state remembers to the solver's input.

Pure functions: a snapshot, the stored specs and open intents in; managed
jobs (with their phase and current placement) and a ScheduleRequest out.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from slurm_ext.config import NetworkConfig
from slurm_ext.records import ClusterSnapshot, SlurmJob
from slurm_ext.site import PriorityModel, SiteReading, round_policy
from slurm_ext.state import JobRow, PlanRow, PlanStatus
from slurm_ext.view import to_cluster_view
from solver import contract
from solver.cells import in_partitions
from solver.contract.jobspec import JobSpec, JobSpecError, is_managed_comment, spec_of_job
from solver.contract.models import ModelShape, ModelSpec, ModelSpecError
from solver.contract.plan import JobPlan, PlanError, default_virtual_workers
from solver.contract.runtimes import Layout, get_runtime
from solver.mixed import parse_key
from solver.types import Cell, ClusterView, JobRequest, ParallelPlan, Placement, ScheduleRequest, SolverConfig


class Phase(StrEnum):
    """Where a managed job is, as one round sees it."""

    HELD = "held"  # held, waiting for a placement
    LOOSE = "loose"  # pending, not held, no plan: gets held, then placed
    RELEASED = "released"  # released with a plan, waiting for Slurm to start it
    RUNNING = "running"
    FINISHED = "finished"
    UNPLANNED = "unplanned"  # runs without a plan (released by someone else)
    OPERATOR_HOLD = "operator-hold"  # held again after it was released: left to the operator
    BAD = "bad"  # its spec was refused
    CHECKPOINTING = "checkpointing"  # asked to checkpoint for a move; keeps its GPUs until it ends
    CHECKPOINTED = "checkpointed"  # ended with a checkpoint (or its node failed): requeued and placed again
    PARKED = "parked"  # its runs kept failing (controller.relaunch): requeued held, left held until released
    #: Slurm requeued it itself (preempted, or its node failed): held at once, placed again from the next round on
    SLURM_REQUEUED = "slurm-requeued"


#: a job's preemptions by cellsched: ((when, for which job) of the last, every job it was preempted for)
Preemptions = tuple[tuple[float, str], frozenset[str]]

#: phases the solver sees
SCHEDULED = (Phase.HELD, Phase.LOOSE, Phase.RELEASED, Phase.RUNNING, Phase.CHECKPOINTING, Phase.CHECKPOINTED)

#: Slurm states after which a managed job is requeued rather than given up
#: (its node failed under it and Slurm did not requeue it itself)
REQUEUE_STATES = ("NODE_FAIL",)


@dataclass(frozen=True)
class ManagedJob:
    """A managed job as one round sees it.

    `spec_source` says where the spec came from ("state", "admin_comment",
    "comment"); `plan` is the plan in its AdminComment; `current` where it
    runs or was released to (for a held job with an open intent: the
    intent's placement, which is carried out again if it still fits).
    """

    job: SlurmJob
    phase: Phase
    spec: JobSpec | None = None
    spec_json: str | None = None
    spec_source: str = ""
    reason: str = ""
    plan: JobPlan | None = None
    current: Placement | None = None
    intent: PlanRow | None = None
    #: (when, for which job) cellsched preempted it, while it checkpoints to give its GPUs away
    yielded: tuple[float, str] | None = None

    @property
    def job_id(self) -> str:
        return self.job.job_id


@functools.lru_cache(maxsize=8192)
def admin_comment_plan(text: str | None) -> JobPlan | None:
    """The plan in an AdminComment, None when there is none (or it is
    malformed). Cached by text: every round parses every job's comment."""
    return contract.admin_comment_plan(text, strict=False)


@functools.lru_cache(maxsize=8192)
def _has_spec(admin_comment: str | None) -> bool:
    return contract.SPEC_KEY in contract.admin_comment_dict(admin_comment)


@functools.lru_cache(maxsize=8192)
def _stored_spec(text: str) -> JobSpec:
    """A stored spec, parsed and validated once per text (JobSpec is frozen)."""
    return JobSpec.from_json(text)


def is_managed(job: SlurmJob, known: Mapping[str, JobRow]) -> bool:
    row = known.get(job.job_id)
    return (
        (row is not None and (row.spec is not None or row.bad_reason is not None))
        or is_managed_comment(job.comment)
        or _has_spec(job.admin_comment)
    )


def read_spec(job: SlurmJob, known: JobRow | None) -> tuple[JobSpec | None, str | None, str, str]:
    """(spec, its JSON, source, error): the stored copy when there is one,
    else the job's own (`jobspec.spec_of_job`); always re-validated."""
    try:
        if known is not None and known.spec is not None:
            return _stored_spec(known.spec), known.spec, "state", ""
        spec = spec_of_job(job.comment, job.admin_comment)
        if spec is None:
            return None, None, "", "no spec"
        source = "admin_comment" if _has_spec(job.admin_comment) else "comment"
        return spec, spec.to_json(), source, ""
    except (JobSpecError, ValueError, TypeError) as exc:
        return None, None, "", f"bad spec: {exc}"


def capacity(spec: JobSpec, view: ClusterView) -> int:
    """GPUs of the nodes the job may run on (its GPU types and partitions)."""
    return sum(
        n.gpus_total
        for n in view.nodes
        if (spec.gpu_types is None or n.gpu_type in spec.gpu_types)
        and (spec.partitions is None or in_partitions(n, spec.partitions, view))
    )


def with_virtual_workers(spec: JobSpec, view: ClusterView) -> JobSpec:
    """The spec as the controller accepts it. An elastic job that names no
    virtual workers gets V now, once (EasyScale): the smallest divisor of its
    global batch that covers the largest dp it may get (``max_gpus``, else
    every GPU it may use), so it can grow to any size and shrink back with
    the same training. V then travels in the accepted spec. Only for a
    runtime with virtual workers (solver.contract.runtimes): another runtime's dp is
    whatever the plan says."""
    if not spec.elastic or spec.virtual_workers is not None or not get_runtime(spec.runtime).virtual_workers:
        return spec
    cap = capacity(spec, view)
    largest = cap if spec.max_gpus is None else min(spec.max_gpus, cap or spec.max_gpus)
    v = default_virtual_workers(spec.global_batch, max(largest, spec.min_gpus))
    return dataclasses.replace(spec, virtual_workers=v)


def fixed_virtual_workers(m: ManagedJob) -> int | None:
    """The job's V when it is fixed: its spec's, else its plan's (a job placed
    before keeps the virtual workers its checkpoints hold); None while a
    never-placed job may still pick its dp freely, and always for a runtime
    without virtual workers (its V is its dp: solver.contract.runtimes)."""
    if m.spec is not None and not get_runtime(m.spec.runtime).virtual_workers:
        return None
    if m.spec is not None and m.spec.virtual_workers is not None:
        return m.spec.virtual_workers
    return m.plan.virtual_workers if m.plan is not None else None


def placement_of(job_id: str, plan: JobPlan) -> Placement | None:
    """The Placement a plan describes; None when it does not describe one."""
    try:
        if not plan.gpu_types or not plan.nodes or not plan.gpus_per_node:
            return None
        cell = Cell(plan.gpu_types[0], len(plan.nodes), plan.gpus_per_node, plan.pp)
        if len(plan.gpu_types) > 1:  # a mixed-type cell: its key says how many nodes of each type (and pp)
            mixed = parse_key(plan.cell or "")
            if (
                mixed is None
                or mixed.num_nodes != len(plan.nodes)
                or mixed.gpus_per_node != plan.gpus_per_node
                or mixed.pp != plan.pp
            ):
                return None
            cell = mixed
        par = ParallelPlan(plan.pp, plan.dp, plan.tp, plan.micro_batches, **plan_state(plan, cell))
        if par.num_gpus != cell.num_gpus:
            return None
        return Placement(
            job_id, cell, tuple((n, plan.gpus_per_node) for n in plan.nodes), par, float(plan.iter_time_s or 0.0)
        )
    except (ValueError, TypeError):
        return None


def plan_state(plan: JobPlan, cell: Cell) -> dict:
    """The ParallelPlan fields a written plan gives back: a single-type
    cell's stage_layers (the same in any stage order) and whether its state
    is sharded (state_shares (1.0,): even); a mixed cell's per-rank fields
    are in task order and stay with the JobPlan."""
    if cell.mixed:
        return {}
    out: dict = {}
    if plan.pp > 1 and plan.stage_layers is not None and len(plan.stage_layers) == plan.pp:
        out["stage_layers"] = tuple(int(n) for n in plan.stage_layers)
    if plan.state_sharding in ("even", "memory") or (plan.state_sharding is None and plan.state_shares):
        out["state_shares"] = (1.0,)
    return out


def intent_placement(row: PlanRow) -> Placement | None:
    try:
        return placement_of(row.job_id, JobPlan.from_json(row.plan))
    except PlanError:
        return None


@functools.lru_cache(maxsize=8192)
def admin_comment_step(text: str | None) -> contract.Step | None:
    """The controller's Step in an AdminComment (contract.Step), cached by text."""
    return contract.admin_comment_step(text)


def same_plan(job: SlurmJob, row: PlanRow) -> bool:
    """Does the job's AdminComment carry exactly this intent's spec and plan
    (with or without a Step)?"""
    if job.admin_comment == row.admin_comment:
        return True
    return admin_comment_step(job.admin_comment) is not None and (
        contract.with_step(job.admin_comment, None) == contract.with_step(row.admin_comment, None)
    )


#: a begin time at most this far ahead is the one `JobUpdate.start_soon` set
START_SOON_SLACK_S = 2.0


def requeued_by_slurm(job: SlurmJob, now: float) -> bool:
    """Did Slurm requeue the job itself after it ran (preempted with
    PreemptMode=REQUEUE, or its node failed)? Such a job is pending, not held,
    and waits for the BeginTime Slurm gives a requeued job (cred_expire
    later: 120 s by default), then Slurm starts it again by itself. One the
    controller released with `JobUpdate.start_soon` waits a second at most.
    (Before that, while its processes end, Slurm 23.02+ shows it
    `PENDING,COMPLETING`: it still holds its resources, and is left alone.)
    The one rule of it (docs/preemption.md), asked for a job that carries a
    plan of ours (`_phase`: Phase.SLURM_REQUEUED)."""
    if not job.pending or job.held or job.holds_resources:
        return False
    if job.eligible_time is None:
        return job.reason == "BeginTime"
    return job.eligible_time > now + START_SOON_SLACK_S


def ended_reason(job: SlurmJob) -> str:
    """Why a managed job that will not run again ended, as its status and the
    log say: its Slurm state, and that Slurm preempted it when it did (it
    ended without a checkpoint: PreemptMode=CANCEL, or killed in its grace time)."""
    if not job.preempted:
        return job.state.lower()
    exit_text = f", exit {job.exit_code}" if job.exit_code else ""
    return f"preempted by Slurm ({job.state.lower()}{exit_text}); ended without a checkpoint and not requeued by Slurm"


def checkpointed(job: SlurmJob) -> bool:
    """Did the job end in a way that asks for it to be run again from its
    checkpoint (exit 75, or its node failed)? Not one that Slurm ended as
    PREEMPTED (PreemptMode=CANCEL: the site ends preempted jobs, whatever
    they saved; docs/preemption.md)."""
    if not job.finished or job.state == "PREEMPTED":
        return False
    return job.exit_code == contract.EXIT_CHECKPOINTED or job.state in REQUEUE_STATES


def classify(
    snapshot: ClusterSnapshot,
    known: Mapping[str, JobRow],
    intents: Mapping[str, PlanRow],
    released: frozenset[str] | set[str] = frozenset(),
    parked: frozenset[str] | set[str] = frozenset(),
    yielding: Mapping[str, tuple[float, str]] | None = None,
) -> tuple[ManagedJob, ...]:
    """Every managed job in the snapshot with its phase.

    `known`: the state's jobs; `intents`: open intents by job; `released`:
    jobs the controller released before (a held one is then left alone:
    Phase.OPERATOR_HOLD, when the state knows the job or it carries a plan);
    `parked`: jobs the controller parked (controller.relaunch): Phase.PARKED
    while they stay held; `yielding`: jobs cellsched preempted and has not
    requeued yet (StateStore.yielding): Phase.CHECKPOINTING while they run.
    A job id that Slurm reuses (another submit time) is a new job. A job
    that ended checkpointed is Phase.CHECKPOINTED (to be requeued); a running job
    with a signalled intent is Phase.CHECKPOINTING. A spec read for the first time
    is the one the controller accepts (`with_virtual_workers`).
    """
    out = []
    view: ClusterView | None = None
    now = snapshot.taken_at
    for job in snapshot.jobs:
        row = known.get(job.job_id)
        if row is not None and reused(row, job):
            row = None
        if not is_managed(job, {job.job_id: row} if row else {}):
            continue
        spec, spec_json, source, error = read_spec(job, row)
        if spec is not None and source != "state" and spec.elastic and spec.virtual_workers is None:
            view = view or to_cluster_view(snapshot, ())
            spec = with_virtual_workers(spec, view)
            spec_json = spec.to_json()
        plan = admin_comment_plan(job.admin_comment)
        intent = intents.get(job.job_id)
        yielded, refused = (yielding or {}).get(job.job_id), None if spec is not None else error
        phase, reason, current = _phase(
            job, plan, intent, row, spec_error=refused, released=released, parked=parked, now=now, yielded=yielded
        )
        out.append(
            ManagedJob(
                job=job,
                phase=phase,
                spec=spec,
                spec_json=spec_json,
                spec_source=source,
                reason=reason,
                plan=plan,
                current=current,
                intent=None if phase == Phase.PARKED else intent,  # a parked job's intent is not carried out
                yielded=yielded if phase == Phase.CHECKPOINTING else None,
            )
        )
    return tuple(out)


def _phase(
    job: SlurmJob,
    plan: JobPlan | None,
    intent: PlanRow | None,
    row: JobRow | None,
    *,
    spec_error: str | None,
    released: Collection[str],
    parked: Collection[str],
    now: float = 0.0,
    yielded: tuple[float, str] | None = None,
) -> tuple[Phase, str, Placement | None]:
    """A managed job's phase, why it is there, and its current placement
    (`classify`); `spec_error`: why its spec was refused (None: accepted);
    `yielded`: (when, for which job) cellsched preempted it, not requeued since.
    A released job that Slurm requeued itself (`requeued_by_slurm` at `now`)
    is Phase.SLURM_REQUEUED: held at once (reconcile.decide)."""
    if job.finished:
        if spec_error is None and checkpointed(job):
            # a move's job: its target, carried out if it still fits (as for a held job)
            target = intent_placement(intent) if intent is not None and intent.status == PlanStatus.SIGNALLED else None
            on = " on Slurm's preemption" if job.preempted else ""
            return (
                Phase.CHECKPOINTED,
                f"checkpointed{on} ({job.state.lower()}, exit {job.exit_code}); to be requeued",
                target,
            )
        return Phase.FINISHED, ended_reason(job), None
    if spec_error is not None:
        return Phase.BAD, spec_error, None
    if job.holds_resources:
        return _running_phase(job, plan, intent, yielded)
    if job.held:
        return _held_phase(job, plan, intent, row, released=released, parked=parked)
    current = placement_of(job.job_id, plan) if plan else None
    if current is None:
        return Phase.LOOSE, "pending without a plan", None
    if requeued_by_slurm(job, now):
        why = "requeued by Slurm (preempted, or its node failed); held, to be placed again from its checkpoint"
        return Phase.SLURM_REQUEUED, why, None
    return Phase.RELEASED, job.reason, current


def _running_phase(
    job: SlurmJob, plan: JobPlan | None, intent: PlanRow | None, yielded: tuple[float, str] | None
) -> tuple[Phase, str, Placement | None]:
    """`_phase` of a job holding its resources: on its plan (running, or
    checkpointing for a move or for a job that preempts it), or without one
    (unplanned); a job that Slurm preempts says so (it checkpoints in its
    grace time, and is not moved)."""
    current = placement_of(job.job_id, plan) if plan else None
    if current is None or sorted(current.node_names) != sorted(job.nodes):
        return Phase.UNPLANNED, "runs without a cellsched plan", None
    if intent is not None and intent.status == PlanStatus.SIGNALLED:
        return Phase.CHECKPOINTING, "asked to checkpoint for a move", current
    if yielded is not None:
        return Phase.CHECKPOINTING, f"asked to checkpoint: preempted for job {yielded[1]}", current
    if job.preempted:
        return Phase.RUNNING, "preempted by Slurm: checkpoints in its grace time", current
    return Phase.RUNNING, "", current


def _held_phase(
    job: SlurmJob,
    plan: JobPlan | None,
    intent: PlanRow | None,
    row: JobRow | None,
    *,
    released: Collection[str],
    parked: Collection[str],
) -> tuple[Phase, str, Placement | None]:
    """`_phase` of a held job: parked, held for its open intent (placed
    there again if it still fits), held by someone after the controller
    released it (left to the operator), or held for a placement."""
    if job.job_id in parked:
        why = row.reason if row is not None and row.phase == Phase.PARKED and row.reason else ""
        why = why or f"parked: its runs kept failing; release it (scontrol release {job.job_id}) to continue"
        return Phase.PARKED, why, None
    if intent is not None:
        return Phase.HELD, "", intent_placement(intent)
    if job.job_id in released and (row is not None or plan is not None):
        why = f"held again after cellsched released it ({job.reason or 'held'}); release it to continue"
        return Phase.OPERATOR_HOLD, why, None
    return Phase.HELD, "", None


def reused(row: JobRow, job: SlurmJob) -> bool:
    """The stored row is of an earlier job with the same id (Slurm restarted
    from scratch): another submit time, and no plan of ours for this id in
    its AdminComment. (A requeue also moves SubmitTime on, but the job keeps
    the plan cellsched gave it.)"""
    if row.submit_time is None or job.submit_time is None or abs(row.submit_time - job.submit_time) <= 1.0:
        return False
    plan = admin_comment_plan(job.admin_comment)
    return plan is None or plan.job_id not in (None, job.job_id)


@dataclass(frozen=True)
class Inputs:
    """One round's solver input and what it was built from."""

    view: ClusterView
    request: ScheduleRequest
    jobs: tuple[ManagedJob, ...]
    #: jobs whose spec or request could not be used this round: id -> reason
    skipped: Mapping[str, str]


def started_training(m: ManagedJob, first_step_at: Mapping[str, float]) -> bool:
    """Has the job's current run reported a step (its first step ended at or
    after the run started)? Only then is its launcher sure to have its
    checkpoint handler, so only then may the job be asked to checkpoint."""
    first = first_step_at.get(m.job_id)
    return first is not None and (m.job.start_time is None or first >= m.job.start_time)


def request_view(
    snapshot: ClusterSnapshot, jobs: tuple[ManagedJob, ...], network: NetworkConfig | None = None
) -> ClusterView:
    """The view a round places jobs in: the GPUs of the jobs running (or
    checkpointing) on a placement of ours are theirs, and so are those that
    Slurm still counts for a Phase.CHECKPOINTED job on the nodes it ran on
    (to_cluster_view's `ending_job_ids`): a move's job finds its own GPUs
    free for its target, and is not put on a smaller cell by its own
    checkpoint and then moved again."""
    ending_ids = [m.job_id for m in jobs if m.phase == Phase.CHECKPOINTED]
    return to_cluster_view(snapshot, placed_ids(jobs), network, ending_ids)


def placed_ids(jobs: tuple[ManagedJob, ...]) -> list[str]:
    """The managed jobs running (or checkpointing) on a placement of ours: the request carries their GPUs."""
    return [m.job_id for m in jobs if m.phase in (Phase.RUNNING, Phase.CHECKPOINTING) and m.current is not None]


def site_fields(job: SlurmJob, model: PriorityModel, now: float) -> dict[str, Any]:
    """A JobRequest's view of the site from the Slurm job: account, QOS,
    priority (Slurm's; for a held job the estimate of `model`), time limit
    in seconds and reservation."""
    return {
        "account": job.account,
        "qos": job.qos,
        "priority": model.priority(job, now),
        "time_limit_s": job.time_limit * 60.0 if job.time_limit else None,
        "reservation": job.reservation or None,
    }


def elastic_now(m: ManagedJob, first_step_at: Mapping[str, float] | None, static: Collection[str]) -> bool:
    """May the job be resized or moved this round (`build_request`)? An
    elastic one, unless it is checkpointing, `static` (controller.hooks),
    preempted by Slurm, or running and its current run has not reported a
    step yet."""
    if m.spec is None or not m.spec.elastic or m.phase == Phase.CHECKPOINTING or m.job_id in static:
        return False
    if m.job.preempted:  # Slurm takes its GPUs: it checkpoints and ends by itself
        return False
    return m.phase != Phase.RUNNING or first_step_at is None or started_training(m, first_step_at)


def trained_models(known: Mapping[str, JobRow], reported: Mapping[str, ModelShape]) -> dict[str, ModelShape]:
    """The shape of the model each job trains: the first it reported (kept
    in the state DB), else the one it reports now (progress.Progress.models)."""
    out = dict(reported)
    for job_id, row in known.items():
        if row.model_shape is not None:
            try:
                out[job_id] = ModelShape.from_dict(json.loads(row.model_shape))
            except (ValueError, TypeError):
                continue
    return out


def trained_model(spec: JobSpec, shape: ModelShape | None) -> ModelSpec:
    """The model a job is priced as: its spec's, in the shape it reports it
    trains (ModelShape.applied_to) when that makes a model."""
    model = spec.model_spec()
    if shape is None:
        return model
    try:
        return shape.applied_to(model)
    except ModelSpecError:
        return model


def resumes_from(m: ManagedJob, progress: Mapping[str, float]) -> Layout | None:
    """The layout of the plan a job's checkpoint was written under: its last
    plan, once it has trained (every plan after the first was one its
    runtime resumes: JobRequest.resumes_from); None before."""
    return m.plan.layout if m.plan is not None and progress.get(m.job_id, 0.0) > 0 else None


def job_request(
    m: ManagedJob,
    spec: JobSpec,
    progress: Mapping[str, float],
    excluded: Mapping[str, frozenset[str]],
    restart_costs: Mapping[str, float],
    first_step_at: Mapping[str, float] | None,
    static: Collection[str],
    site: SiteReading,
    now: float,
    models: Mapping[str, ModelShape] | None = None,
    preempted: Mapping[str, Preemptions] | None = None,
    restarts: Mapping[str, int] | None = None,
) -> JobRequest:
    """The JobRequest of a managed job in a scheduled phase (`build_request`),
    priced as the model it trains (`models`: `trained_model`); `preempted`:
    the job's preemptions by cellsched (StateStore.preemptions); `restarts`:
    how often it was requeued (StateStore.restart_counts)."""
    got = (preempted or {}).get(m.job_id)
    last, by = (got[0][0], got[1]) if got is not None else (None, frozenset[str]())
    return JobRequest.from_spec(
        spec,
        m.job_id,
        model=trained_model(spec, (models or {}).get(m.job_id)),
        resumes_from=resumes_from(m, progress),
        iterations_done=min(float(spec.iterations), progress.get(m.job_id, 0.0)),
        user=m.job.user,
        elastic=elastic_now(m, first_step_at, static),
        submit_time=m.job.submit_time or 0.0,
        current=m.current,
        excluded_cells=excluded.get(m.job_id, frozenset()),
        restart_cost_s=restart_costs.get(m.job_id),
        running_since=m.job.start_time if m.current is not None else None,
        restarts=(restarts or {}).get(m.job_id, 0),
        virtual_workers=fixed_virtual_workers(m),
        movable=m.job_id not in static,
        preempted_at=last,
        preempted_by=by,
        **site_fields(m.job, site.priority, now),
    )


def build_request(
    snapshot: ClusterSnapshot,
    jobs: tuple[ManagedJob, ...],
    progress: Mapping[str, float],
    config: SolverConfig,
    excluded: Mapping[str, frozenset[str]] | None = None,
    previous: Mapping[str, Placement] | None = None,
    restart_costs: Mapping[str, float] | None = None,
    first_step_at: Mapping[str, float] | None = None,
    network: NetworkConfig | None = None,
    static: Collection[str] = (),
    site: SiteReading | None = None,
    models: Mapping[str, ModelShape] | None = None,
    preempted: Mapping[str, Preemptions] | None = None,
    restarts: Mapping[str, int] | None = None,
) -> Inputs:
    """The ScheduleRequest of a round: jobs in a scheduled phase, with their
    progress and measured restart cost; the view counts GPUs of every job
    that has no placement of ours (unmanaged, or running without a plan) as
    taken. A Phase.CHECKPOINTING job keeps its placement (it is not elastic this
    round), and so does a running job whose current run has not reported a
    step yet (`started_training`, from `first_step_at`; None: not checked);
    a Phase.CHECKPOINTED one is placed like a pending job (`request_view`).
    `network`: the view's NICs and racks ([network]); a job in `static`
    is neither elastic nor movable (controller.hooks, JobRequest.movable).
    `site`: the site's standing policy (slurm_ext.site; None: none), made
    the round's (`site.round_policy`); each job carries its account, QOS,
    priority, time limit and reservation (`site_fields`). `models`: the
    shape of the model each job trains (`trained_models`), which it is
    priced as; `preempted`: each job's preemptions by cellsched
    (StateStore.preemptions); `restarts`: how often each was requeued
    (StateStore.restart_counts; the restart_history horizon)."""
    reading, now = site or SiteReading(), snapshot.taken_at
    view = request_view(snapshot, jobs, network)
    requests: list[JobRequest] = []
    skipped: dict[str, str] = {}
    facts = (progress, excluded or {}, restart_costs or {}, first_step_at, static, reading, now, models, preempted)
    counts = restarts or {}
    for m in jobs:
        if m.phase not in SCHEDULED or m.spec is None:
            continue
        try:
            requests.append(job_request(m, m.spec, *facts, restarts=counts))
        except (JobSpecError, ValueError, TypeError) as exc:
            skipped[m.job_id] = f"cannot schedule: {exc}"
    request = ScheduleRequest(
        cluster=view,
        jobs=tuple(requests),
        previous=dict(previous or {}),
        config=config,
        now=now,
        site=round_policy(reading, snapshot, placed_ids(jobs), {m.job_id for m in jobs}),
    )
    return Inputs(view=view, request=request, jobs=jobs, skipped=skipped)
