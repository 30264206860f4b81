"""Desired placements vs what Slurm shows -> actions, and carrying them out.

`decide` is pure. `apply` is the only code in the controller that changes
Slurm; it writes an intent to the state before touching a job and marks it
after each step, so a round cut short (crash, SIGKILL, Slurm gone) is
finished by the next one: a job updated but not released is released if its
plan still fits (else planned again); a job already released is left alone.
Placements go to Slurm in batches, one call (or one journal transaction) per
step for the whole batch; each job still passes its steps in the same order,
so the same recovery holds for a batch cut short between any two steps.

Moving a running elastic job (resize, other nodes or GPU type): signal its
steps (SIGUSR1: ``cellsched-launch`` checkpoints and exits 75), wait for it
to end (bounded), requeue it held, update it to the new placement with
StartTime=now+1 (Slurm would wait 120 s; never the second the job ended in,
see JobUpdate.start_soon) and release it. A job that does not
end within the wait stays Phase.CHECKPOINTING with its intent open and is finished
by a later round; one that ignores the signal past the timeout is requeued
anyway (Slurm's SIGTERM makes the launcher checkpoint too). Any managed job
that ends checkpointed (exit 75, or its node failed) is requeued and placed
again, so it is never lost.

Every step is mirrored in the job's AdminComment too (contract.Step): the
move's target before the signal, "updated" with the plan a job is about to
be released with, "requeued" / "parked" on a job requeued held without a
placement; the Step is removed (TIDY) once the job is released. A
controller with an empty or lost state DB reads the work in flight from
there (round.Controller rebuilds the intents) and finishes it.

A mixed-GPU-type cell (solver.mixed) is released as ONE ordinary job, not a
heterogeneous one (a pending job cannot become one by update): a partition
holding all its nodes, Features cleared, ReqNodeList naming nodes of both
types and the untyped Gres=gpu:<per node>, so each node gives its own GPUs;
the plan lists the nodes in Slurm's task order with each dp rank's batch share
(pp 1), or, for a pipeline across types, the layers of each stage for the
stage types of that order (solver.mixed.stage_layers_in_order). Every plan
with pp > 1 carries stage_layers; one priced with sharded optimizer state
carries state_sharding ("even"; "memory" with state_shares for a mixed
cell); a plan without them is the same JSON as before.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum

from slurm_ext.backends import JOB_FAILURES, STEPS, Backend, JobUpdate
from slurm_ext.controller.inputs import (
    ManagedJob,
    Phase,
    admin_comment_step,
    checkpointed,
    fixed_virtual_workers,
    same_plan,
)
from slurm_ext.controller.progress import default_checkpoint_dir
from slurm_ext.records import SlurmJob
from slurm_ext.state import HistoryEvent, PlanRow, PlanStatus, StateStore
from solver import contract
from solver.contract.plan import JobPlan
from solver.contract.runtimes import get_runtime, moved_micro_batches
from solver.mixed import stage_layers_in_order, task_stage_types
from solver.placement import PlacementError, validate_plan
from solver.site import SitePolicy
from solver.types import ClusterView, JobRequest, Placement

log = logging.getLogger("cellsched.controller")


class ActionKind(StrEnum):
    """What an Action does to its job. The values are what the state DB's
    rounds, the logs and the metrics (actions_total's "kind") carry: they
    never change, and each compares equal to its string."""

    PLACE = "place"  # (hold or requeue held,) update, release
    HOLD = "hold"  # keep a loose job from starting anywhere
    MOVE = "move"  # signal a running job to checkpoint, wait, requeue held, update, release
    REQUEUE = "requeue"  # requeue a checkpointed (or unresponsive) job held, to be placed later
    TIDY = "tidy"  # remove the Step from a released job's AdminComment
    RESIGNAL = "resignal"  # ask a job checkpointing for a move rebuilt from its Step again (idempotent)
    PREEMPT = "preempt"  # signal a running job to checkpoint, wait, requeue it held (its GPUs go to another job)


@dataclass(frozen=True)
class Action:
    """One change to one job. For PLACE: the plan, the update carrying it and
    whether the job must be held first (it is pending and not held)."""

    kind: ActionKind
    job_id: str
    why: str = ""
    placement: Placement | None = None
    plan: JobPlan | None = None
    update: JobUpdate | None = None
    hold_first: bool = False
    requeue_first: bool = False
    #: the job's AdminComment when decided (MOVE, REQUEUE: the Step is written into it)
    was: str = ""
    #: REQUEUE: the job is parked (left held until someone releases it)
    parks: bool = False
    #: REQUEUE: Slurm requeued the job already (it is pending): only held
    pending: bool = False
    #: PREEMPT: the job its GPUs go to
    preemptor: str = ""

    def summary(self) -> dict:
        d: dict = {"kind": str(self.kind), "job": self.job_id}
        if self.placement is not None:
            d["cell"] = self.placement.cell.key()
            d["nodes"] = [f"{n}:{g}" for n, g in self.placement.nodes]
        if self.update is not None and self.update.partition:
            d["partition"] = self.update.partition
        if self.why:
            d["why"] = self.why
        return d


@dataclass(frozen=True)
class Outcome:
    """What became of an action."""

    action: Action
    ok: bool
    error: str = ""

    def summary(self) -> dict:
        d = self.action.summary()
        d["ok"] = self.ok
        if self.error:
            d["error"] = self.error
        return d


def choose_partition(view: ClusterView, placement: Placement, allowed: tuple[str, ...] | None = None) -> str | None:
    """A partition holding all the placement's nodes (among `allowed`, when
    given): the solver's choice when it made one, else one whose nodes are
    all of the cell's GPU type (the per-type partition), else the smallest."""
    if placement.partition:
        return placement.partition
    want = set(placement.node_names)
    types = {n.name: n.gpu_type for n in view.nodes}
    fits = [
        (name, nodes)
        for name, nodes in view.partitions.items()
        if want <= set(nodes) and (allowed is None or name in allowed)
    ]
    if not fits:
        return None
    per_type = [f for f in fits if all(types.get(n) == placement.cell.gpu_type for n in f[1])]
    return min(per_type or fits, key=lambda f: (len(f[1]), f[0]))[0]


def mixed_layout(p: Placement, view: ClusterView) -> tuple[tuple[str, ...], tuple[float, ...] | None]:
    """The nodes of a placement in Slurm's task order (the cluster's node
    order) and, for a data-parallel mixed-type cell, each dp rank's batch
    share (its GPU type's samples per rank, solver.mixed); None for a
    single-type cell or a pipeline across types (every rank an even share)."""
    order = {n.name: i for i, n in enumerate(view.nodes)}
    nodes = tuple(sorted(p.node_names, key=lambda n: (order.get(n, len(order)), n)))
    if not p.cell.mixed or len(p.plan.shares) != len(p.cell.parts):
        return (nodes if p.cell.mixed else p.node_names), None
    return nodes, _per_rank(p, view, nodes, p.plan.shares)


def _per_rank(p: Placement, view: ClusterView, nodes: tuple[str, ...], per_part) -> tuple[float, ...]:
    """One value per dp rank in task order, its GPU type's entry of
    `per_part` (pp 1: each node holds gpus_per_node / tp consecutive dp ranks)."""
    of_type = {t: float(v) for (t, _), v in zip(p.cell.parts, per_part, strict=True)}
    types = {n.name: n.gpu_type for n in view.nodes}
    per_node = p.cell.gpus_per_node // p.plan.tp
    return tuple(of_type[types[n]] for n in nodes for _ in range(per_node))


@dataclass(frozen=True)
class StateFields:
    """The plan fields of a placement's pipeline split and state sharding."""

    stage_layers: tuple[int, ...] | None = None
    state_sharding: str | None = None
    state_shares: tuple[float, ...] | None = None


def state_fields(p: Placement, view: ClusterView | None, nodes: tuple[str, ...]) -> StateFields:
    """stage_layers (pp > 1) and state_sharding / state_shares (a plan priced
    with sharded optimizer state) of the plan contract, for the nodes in task
    order: single-type: the priced split and "even"; a mixed cell: "memory"
    with each dp rank's weight (pp 1: its type's free memory, solver.mixed;
    a pipeline: equal, each stage is one type), and a pipeline's split
    carried to the stage types of the task order (solver.mixed.
    stage_layers_in_order). Nothing of it when the plan does not carry it."""
    plan, cell = p.plan, p.cell
    layers: tuple[int, ...] | None = tuple(plan.stage_layers) if plan.pp > 1 and plan.stage_layers else None
    sharding: str | None = "even" if plan.sharded else None
    shares: tuple[float, ...] | None = None
    if cell.mixed and view is not None:
        types = {n.name: n.gpu_type for n in view.nodes}
        if layers is not None:
            stage_types = task_stage_types(cell, plan, [types[n] for n in nodes])
            if stage_types is None:
                raise PlacementError(f"{cell.key()}: a pipeline stage would span GPU types on nodes {list(nodes)}")
            layers = stage_layers_in_order(cell, layers, stage_types)
        if plan.sharded:
            sharding = "memory"
            if cell.pp == 1 and len(plan.state_shares) == len(cell.parts):  # weights: 4 decimals (GB) are plenty
                shares = _per_rank(p, view, nodes, [max(round(w, 4), 1e-4) for w in plan.state_shares])
            else:
                shares = (1.0,) * plan.dp
    return StateFields(layers, sharding, shares)


def plan_virtual_workers(m: ManagedJob, p: Placement) -> int:
    """The V a plan carries: the job's fixed V (spec, else its earlier plan);
    for a job placed the first time, its dp, or for a mixed-type cell the
    number of whole units its batch shares make (global batch / gcd of the
    shares), so that every dp rank runs whole virtual workers from now on."""
    fixed = fixed_virtual_workers(m)
    if fixed is not None:
        return fixed
    if p.cell.mixed and p.plan.shares and m.spec is not None:
        return m.spec.global_batch // math.gcd(*p.plan.shares)
    return p.plan.dp


def job_plan(m: ManagedJob, p: Placement, checkpoint_root: str, view: ClusterView | None = None) -> JobPlan:
    """The plan written to the job's AdminComment. The checkpoint directory
    and the virtual worker count stay what an earlier plan said, and so do
    the micro-batches per virtual worker where the job's runtime allows it
    for the new plan (solver.contract.runtimes.moved_micro_batches: a
    virtual worker's work must not change when the job moves, or its
    gradients change in the last bits, but a pipeline needs at least pp of
    them); else the placement's. A mixed-type
    cell (needs `view`) lists its nodes in task order with the batch share of
    each dp rank (whole virtual workers: solver.mixed). A plan with pp > 1
    carries its stage_layers, one priced with sharded optimizer state its
    state_sharding / state_shares (`state_fields`), and every plan the
    runtime of the job's spec (solver.contract.runtimes)."""
    spec = m.spec
    assert spec is not None
    old = m.plan
    ckpt = (
        old.checkpoint_dir
        if old and old.checkpoint_dir
        else default_checkpoint_dir(m.job_id, m.job.user, m.job.work_dir or None, checkpoint_root)
    )
    vw = plan_virtual_workers(m, p)
    nodes, shares = mixed_layout(p, view) if p.cell.mixed and view is not None else (p.node_names, None)
    extra = state_fields(p, view, nodes)
    micro_batches = p.plan.micro_batches
    if old is not None:
        micro_batches = moved_micro_batches(
            get_runtime(spec.runtime),
            old.micro_batches,
            micro_batches,
            pp=p.plan.pp,
            per_worker=spec.global_batch // vw,
            same_workers=old.virtual_workers == vw,
        )
    return JobPlan(
        pp=p.plan.pp,
        dp=p.plan.dp,
        tp=p.plan.tp,
        micro_batches=micro_batches,
        global_batch=spec.global_batch,
        gpu_types=tuple(t for t, _ in p.cell.by_type()),
        nodes=nodes,
        gpus_per_node=p.cell.gpus_per_node,
        batch_shares=shares,
        stage_layers=extra.stage_layers,
        state_sharding=extra.state_sharding,
        state_shares=extra.state_shares,
        virtual_workers=vw,
        checkpoint_dir=ckpt,
        runtime=spec.runtime,
        cell=p.cell.key(),
        job_id=m.job_id,
        iter_time_s=round(p.iter_time_s, 6) if p.iter_time_s else None,
    )


def checked(
    view: ClusterView,
    placements: Mapping[str, Placement],
    first: frozenset[str] | set[str] = frozenset(),
    jobs: Mapping[str, JobRequest] | None = None,
    site: SitePolicy | None = None,
    now: float = 0.0,
) -> tuple[dict[str, Placement], dict[str, str]]:
    """The placements that can be carried out together, and why the others
    cannot (solver.placement.validate_plan; on a failure, placements are
    admitted one at a time, the jobs in `first` (already placed) first).
    A placement of a job in `jobs` other than the one it runs in must be a
    plan its runtime carries out, and the placements of all of them must
    keep the `site`'s hard rules at `now` (siterules.site_problems: GPU
    limits, partition access, active reservations), whatever the policy."""
    new = {j: r for j, r in (jobs or {}).items() if r.current is None or placements.get(j) != r.current}
    every = dict(jobs or {})
    try:
        validate_plan(view, placements, new, site, now, every)
        return dict(placements), {}
    except PlacementError:
        pass
    ok: dict[str, Placement] = {}
    rejected: dict[str, str] = {}
    for job_id, p in sorted(placements.items(), key=lambda kv: (kv[0] not in first, kv[0])):
        try:
            validate_plan(view, {job_id: p}, new, site, now, every, admitted=ok)
            ok[job_id] = p
        except PlacementError as exc:
            rejected[job_id] = f"plan rejected: {exc}"
    return ok, rejected


def decide(
    jobs: tuple[ManagedJob, ...],
    desired: Mapping[str, Placement],
    view: ClusterView,
    checkpoint_root: str,
    *,
    now: float = 0.0,
    checkpoint_timeout_s: float = float("inf"),
    resignal: Collection[str] = (),
    static: Collection[str] = (),
    partitions: Mapping[str, tuple[str, ...]] | None = None,
    preempted: Mapping[str, str] | None = None,
) -> tuple[Action, ...]:
    """Actions that make Slurm match `desired`.

    A held (or loose) job with a placement is placed; a released job whose
    placement changed is held, updated and released again; a loose job
    without one is held. A job Slurm requeued itself (Phase.SLURM_REQUEUED)
    is held at once (Slurm would start it again by itself, outside any
    plan) and placed from the next round on: in this one its GPUs are
    there for the job that preempted it, which Slurm starts once its
    processes have ended (placed now, it would race that job for them). A
    running elastic job whose placement changed is moved; a checkpointed job
    is requeued held and placed (or only requeued when it has no placement
    this round), a parked one only requeued held (and then left alone); a
    job checkpointing for longer than
    `checkpoint_timeout_s` is requeued, and one in `resignal` (its move
    rebuilt from the Step this round: the controller that wrote the Step may
    have died before its signal) is asked again. Jobs that keep their cell
    are not touched, and neither is a running job in `static` (it may not be
    signalled at all: controller.hooks). `partitions`: the partitions a job
    may be placed in where the site's partition access allows it fewer than
    its own (`site.allowed_partitions`). A running job in `preempted` (and
    without a placement) is preempted: asked to checkpoint and requeued held
    (its GPUs go to the job named).
    """
    actions: list[Action] = []
    for m in jobs:
        p = None if m.phase == Phase.RUNNING and m.job_id in static else desired.get(m.job_id)
        allowed = (partitions or {}).get(m.job_id, getattr(m.spec, "partitions", None))
        by = (preempted or {}).get(m.job_id, "") if m.phase == Phase.RUNNING and m.job_id not in static else ""
        if by and p is None:
            actions.append(Action(ActionKind.PREEMPT, m.job_id, f"preempted for job {by}", preemptor=by))
            continue
        a = _action(m, p, view, checkpoint_root, now, checkpoint_timeout_s, resignal, allowed)
        if a is not None:
            actions.append(a)
    acted = {a.job_id for a in actions}
    for m in jobs:
        if m.job_id not in acted and needs_tidy(m):
            tidy = JobUpdate(admin_comment=contract.with_step(m.job.admin_comment, None))
            actions.append(Action(ActionKind.TIDY, m.job_id, "released: its AdminComment loses the Step", update=tidy))
    return tuple(actions)


def _action(
    m: ManagedJob,
    p: Placement | None,
    view: ClusterView,
    checkpoint_root: str,
    now: float,
    checkpoint_timeout_s: float,
    resignal: Collection[str],
    allowed: tuple[str, ...] | None = None,
) -> Action | None:
    """The action on one job (`decide`), None when it is left as it is;
    `allowed`: the partitions it may be placed in (None: any)."""
    if m.phase == Phase.LOOSE and p is None:
        return Action(ActionKind.HOLD, m.job_id, "pending without a plan")
    if m.phase == Phase.CHECKPOINTING:
        since = m.intent.created if m.intent is not None else (m.yielded[0] if m.yielded is not None else None)
        if since is not None and now - since > checkpoint_timeout_s:
            why = f"no checkpoint {checkpoint_timeout_s:.0f} s after the signal"
            return Action(ActionKind.REQUEUE, m.job_id, why, was=m.job.admin_comment)
        if m.job_id in resignal:
            return Action(ActionKind.RESIGNAL, m.job_id, "move rebuilt from its Step; the signal may not have come")
        return None
    if m.phase == Phase.CHECKPOINTED and p is None:
        return Action(ActionKind.REQUEUE, m.job_id, "checkpointed; waits for a placement", was=m.job.admin_comment)
    if m.phase == Phase.SLURM_REQUEUED:
        why = "requeued by Slurm; held until it is placed again"
        return Action(ActionKind.REQUEUE, m.job_id, why, was=m.job.admin_comment, pending=True)
    if m.phase == Phase.PARKED:
        if not m.job.finished:
            return None
        why = "parked; held until it is released"
        return Action(ActionKind.REQUEUE, m.job_id, why, was=m.job.admin_comment, parks=True)
    if p is None or not _to_place(m, p):
        return None
    return _placement_action(m, p, view, checkpoint_root, allowed)


#: the phases of a job that may be placed (again)
PLACEABLE = (Phase.HELD, Phase.LOOSE, Phase.RELEASED, Phase.RUNNING, Phase.CHECKPOINTED)


def _to_place(m: ManagedJob, p: Placement) -> bool:
    """Is the job (in a phase that may be placed) to be placed on `p`? Not
    when it is released or running there already, nor when it runs and is
    not elastic."""
    if m.phase not in PLACEABLE or m.spec_json is None:
        return False
    if m.phase in (Phase.RELEASED, Phase.RUNNING) and p.same_resources(m.current):
        return False
    # only elastic jobs are moved while they run
    return m.phase != Phase.RUNNING or (m.spec is not None and m.spec.elastic)


def _placement_action(
    m: ManagedJob, p: Placement, view: ClusterView, checkpoint_root: str, allowed: tuple[str, ...] | None
) -> Action | None:
    """MOVE a running job to `p`, or PLACE a waiting one there, in a
    partition among `allowed`; None when none of them holds the placement's nodes."""
    partition = choose_partition(view, p, allowed)
    if partition is None:
        return None  # validate() keeps such placements out; nothing to carry out
    plan = job_plan(m, p, checkpoint_root, view)
    # a job that ran before (requeued: its BeginTime is cred_expire away) starts in the next whole second
    restart = m.phase in (Phase.RUNNING, Phase.CHECKPOINTED) or (m.phase == Phase.HELD and m.plan is not None)
    update = _placement_update(m, p, partition, plan, restart)
    if m.phase == Phase.RUNNING:
        assert m.current is not None  # a running job's phase says it runs on a plan of ours
        why = "resize" if p.cell.num_gpus != m.current.cell.num_gpus else "move"
        return Action(ActionKind.MOVE, m.job_id, why, p, plan, update, was=m.job.admin_comment)
    why = {Phase.CHECKPOINTED: "resume", Phase.RELEASED: "move"}.get(
        m.phase, "recover" if m.intent is not None and m.phase == Phase.HELD else "new"
    )
    return Action(
        ActionKind.PLACE,
        m.job_id,
        why,
        p,
        plan,
        update,
        hold_first=m.phase in (Phase.LOOSE, Phase.RELEASED),
        requeue_first=m.phase == Phase.CHECKPOINTED,
    )


def _placement_update(m: ManagedJob, p: Placement, partition: str, plan: JobPlan, start_soon: bool) -> JobUpdate:
    """The update that puts a job on placement `p` with `plan` in its AdminComment."""
    assert m.spec_json is not None
    # A mixed-type cell: no feature constraint (each node's own type is
    # what ReqNodeList names), untyped gres per node (see docs/slurm-support.md).
    features = "" if p.cell.mixed else p.cell.gpu_type
    return JobUpdate(
        partition=partition,
        features=features,
        num_nodes=p.cell.num_nodes,
        req_nodes=tuple(sorted(p.node_names)),
        gres_per_node=p.cell.gpus_per_node,
        num_tasks=p.cell.num_gpus,
        tasks_per_node=p.cell.gpus_per_node,
        min_cpus_per_node=p.cell.gpus_per_node,
        admin_comment=contract.encode_admin_comment(json.loads(m.spec_json), plan),
        start_soon=start_soon,
    )


def needs_tidy(m: ManagedJob) -> bool:
    """A job released (pending or running, not held) with no open intent
    whose AdminComment still carries a Step: the Step is removed, so that a
    later hold of the job reads as an operator's."""
    if m.job.held or m.job.finished or m.intent is not None:
        return False
    return admin_comment_step(m.job.admin_comment) is not None


def intent_outcomes(jobs: tuple[ManagedJob, ...], open_plans: Mapping[str, PlanRow]) -> dict[str, PlanStatus]:
    """How each open intent ended, for jobs no longer held: "released" when
    the job carries its plan, "abandoned" when it carries another, "gone"
    when the job ended or vanished first. Held jobs keep theirs open."""
    by_id = {m.job_id: m for m in jobs}
    out: dict[str, PlanStatus] = {}
    for job_id, row in open_plans.items():
        m = by_id.get(job_id)
        if m is None:
            out[job_id] = PlanStatus.GONE
        elif row.status == PlanStatus.SIGNALLED and (m.job.holds_resources or checkpointed(m.job)):
            continue  # still checkpointing, or checkpointed and to be requeued
        elif m.job.held and not m.job.finished:
            continue
        elif same_plan(m.job, row):
            out[job_id] = PlanStatus.RELEASED
        else:
            out[job_id] = PlanStatus.GONE if m.job.finished else PlanStatus.ABANDONED
    return out


@dataclass(frozen=True)
class Waiting:
    """How `apply` waits for jobs asked to checkpoint: up to `checkpoint_wait_s`
    in this round, polling Slurm every `poll_s` with `sleep`, and not once
    `stopping()` (the daemon was told to stop: the moves' intents stay open
    and a later round finishes them)."""

    checkpoint_wait_s: float = 60.0
    poll_s: float = 1.0
    sleep: Callable[[float], None] = time.sleep
    stopping: Callable[[], bool] = lambda: False


#: the outcome of a placement left for the next round
DEFERRED = "deferred to the next round: this round's apply budget is spent"


def apply(
    actions: tuple[Action, ...],
    backend: Backend,
    state: StateStore,
    round_id: int | None,
    clock: Callable[[], float] = time.time,
    waiting: Waiting = Waiting(),
    *,
    batch: int = 1000,
    budget_s: float = float("inf"),
) -> list[Outcome]:
    """Carry the actions out, many jobs per Slurm call: holds, requeues and
    the (re)signals of moves and preemptions first, then the placements
    `batch` jobs at a time (`_place_many`), then the moves whose jobs
    checkpointed (waited for together with the preempted ones, which are
    requeued held). A failing job is recorded and skipped. Once `budget_s` (wall
    time) is spent, the placements not begun are journalled and the next
    round carries them out. SlurmUnavailable stops the round (the intents
    stay open)."""
    t0 = time.monotonic()
    of = {kind: [a for a in actions if a.kind == kind] for kind in ActionKind}
    outcomes = _tidy(of[ActionKind.TIDY], backend) if of[ActionKind.TIDY] else []
    holds = of[ActionKind.HOLD]
    outcomes += _outcomes(holds, backend.hold_many([a.job_id for a in holds]) if holds else {})
    if of[ActionKind.REQUEUE]:
        outcomes += _requeue(of[ActionKind.REQUEUE], backend, state, round_id, clock)
    outcomes += _resignal(of[ActionKind.RESIGNAL], backend)
    signalled: dict[str, tuple[Action, tuple[int, float]]] = {}
    for a in of[ActionKind.MOVE]:
        try:
            signalled[a.job_id] = (a, _signal(a, backend, state, round_id, clock))
        except JOB_FAILURES as exc:
            outcomes += _outcomes([a], {a.job_id: exc})
    preempting, failed = _preempt(of[ActionKind.PREEMPT], backend, state, round_id, clock)
    outcomes += failed
    places = of[ActionKind.PLACE]
    for k in range(0, len(places), batch):
        if time.monotonic() - t0 > budget_s:
            outcomes += _defer(places[k:], state, round_id, clock)
            break
        outcomes += _place_many(places[k : k + batch], backend, state, round_id, clock)
    if signalled or preempting:
        ended = _wait_ended([*signalled, *preempting], backend, clock, waiting)
        outcomes += _finish_moves(signalled, ended, backend, state, round_id, clock)
        outcomes += _finish_preemptions(preempting, ended, backend, state, round_id, clock)
    return outcomes


def _preempt(
    actions: list[Action], backend: Backend, state: StateStore, round_id: int | None, clock: Callable[[], float]
) -> tuple[dict[str, Action], list[Outcome]]:
    """Ask each preempted job to checkpoint (PREEMPT), then record it ("yielded",
    for the job its GPUs go to): the jobs signalled, and the outcomes of those
    that could not be. A controller that dies between the two finds the job
    running (then checkpointed: requeued like any job that ends so)."""
    signalled: dict[str, Action] = {}
    unsignalled: dict[str, Exception] = {}
    for a in actions:
        try:
            backend.signal(a.job_id, contract.CHECKPOINT_SIGNAL, target=STEPS)
        except JOB_FAILURES as exc:
            unsignalled[a.job_id] = exc
            continue
        state.add_history(a.job_id, HistoryEvent.YIELDED, clock(), round_id, a.preemptor)
        log.info("asked to checkpoint: preempted", extra={"fields": {**a.summary(), "for": a.preemptor}})
        signalled[a.job_id] = a
    return signalled, _outcomes([a for a in actions if a.job_id in unsignalled], unsignalled)


def _wait_ended(
    job_ids: list[str], backend: Backend, clock: Callable[[], float], waiting: Waiting
) -> dict[str, SlurmJob | None]:
    """Wait (bounded) for the signalled jobs to end: those that ended (None: vanished)."""
    deadline = clock() + waiting.checkpoint_wait_s
    ended: dict[str, SlurmJob | None] = {}
    while True:
        jobs = {j.job_id: j for j in backend.observe().jobs if j.job_id in job_ids}
        ended = {j: job for j, job in jobs.items() if not job.holds_resources}
        ended.update({j: None for j in job_ids if j not in jobs})
        if len(ended) == len(job_ids) or clock() >= deadline or waiting.stopping():
            return ended
        waiting.sleep(min(waiting.poll_s, max(0.0, deadline - clock())))


def _finish_preemptions(
    preempting: Mapping[str, Action],
    ended: Mapping[str, SlurmJob | None],
    backend: Backend,
    state: StateStore,
    round_id: int | None,
    clock: Callable[[], float],
) -> list[Outcome]:
    """Requeue held the preempted jobs that ended checkpointed; those still
    checkpointing are requeued by a later round (Phase.CHECKPOINTING, then
    CHECKPOINTED), those that ended otherwise (completed, failed) are left."""
    outcomes = []
    ready = []
    for job_id, a in preempting.items():
        if job_id not in ended:
            outcomes.append(Outcome(a, True, "still checkpointing; requeued by a later round"))
            continue
        job = ended[job_id]
        if job is None or not checkpointed(job):
            outcomes.append(Outcome(a, True, "ended without a checkpoint" if job is not None else "vanished"))
        else:
            ready.append(dataclasses.replace(a, was=job.admin_comment))
    if ready:
        outcomes += _requeue(ready, backend, state, round_id, clock)
    return outcomes


def _requeue(
    actions: list[Action], backend: Backend, state: StateStore, round_id: int | None, clock: Callable[[], float]
) -> list[Outcome]:
    """Requeue the jobs held (REQUEUE), each with a "requeued" event and
    Step; one that Slurm requeued itself (pending) is only held."""
    ended = [a.job_id for a in actions if not a.pending]
    failed = backend.requeue_many(ended, hold=True) if ended else {}
    pending = [a.job_id for a in actions if a.pending]
    if pending:
        failed.update(backend.hold_many(pending))
    with state.batch():
        for a in actions:
            if a.job_id not in failed:
                state.add_history(a.job_id, HistoryEvent.REQUEUED, clock(), round_id)
    _mark_requeued([a for a in actions if a.job_id not in failed], backend, clock())
    return _outcomes(actions, failed)


def _resignal(actions: list[Action], backend: Backend) -> list[Outcome]:
    """Ask the jobs to checkpoint again (RESIGNAL)."""
    unsignalled: dict[str, Exception] = {}
    for a in actions:
        try:
            backend.signal(a.job_id, contract.CHECKPOINT_SIGNAL, target=STEPS)
            log.info("asked to checkpoint again", extra={"fields": a.summary()})
        except JOB_FAILURES as exc:
            unsignalled[a.job_id] = exc
    return _outcomes(actions, unsignalled)


def _tidy(actions: list[Action], backend: Backend) -> list[Outcome]:
    """Remove the Step from released jobs' AdminComments (TIDY)."""
    results = backend.update_many({a.job_id: a.update for a in actions if a.update is not None})
    _step("tidied", len(actions))
    return _outcomes(actions, {j: r for j, r in results.items() if isinstance(r, Exception)})


def _mark_requeued(actions: list[Action], backend: Backend, now: float) -> None:
    """Write "requeued" (or "parked") into the AdminComment of jobs just
    requeued held without a placement, so that a controller without this
    state DB knows the hold for its own (or the job for parked). A move's
    job keeps its "signalled" Step (where it was going). Failures are only
    logged: the state DB knows the requeue."""
    changes = {}
    for a in actions:
        old = admin_comment_step(a.was)
        if not a.was or (old is not None and old.step == contract.SIGNALLED):
            continue
        step = contract.Step(contract.PARKED if a.parks else contract.REQUEUED, now)
        changes[a.job_id] = JobUpdate(admin_comment=contract.with_step(a.was, step))
    if not changes:
        return
    for job_id, result in backend.update_many(changes).items():
        if isinstance(result, Exception):
            log.warning("step not written", extra={"fields": {"job": job_id, "error": str(result)}})
    _step("marked", len(changes))


def _outcomes(actions: list[Action], failed: Mapping[str, Exception]) -> list[Outcome]:
    out = []
    for a in actions:
        if a.job_id in failed:
            log.warning("action failed", extra={"fields": {**a.summary(), "error": str(failed[a.job_id])}})
            out.append(Outcome(a, False, str(failed[a.job_id])))
        else:
            out.append(Outcome(a, True))
    return out


def _step(step: str, jobs: int) -> None:
    """Log one step of a batch (tests that kill the controller wait for these)."""
    log.info("apply step", extra={"fields": {"step": step, "jobs": jobs}})


def _begin(a: Action, state: StateStore, round_id: int | None, now: float) -> int:
    """Journal the action's plan as an intent (at `now`), before Slurm is touched."""
    assert a.placement is not None and a.plan is not None and a.update is not None
    p = a.placement
    return state.begin_plan(
        a.job_id,
        round_id,
        p.cell.key(),
        p.nodes,
        a.update.partition or "",
        a.plan.to_json(),
        a.update.admin_comment or "",
        now,
    )


def _journal(
    actions: list[Action],
    state: StateStore,
    round_id: int | None,
    clock: Callable[[], float],
    written: Mapping[str, tuple[int, float]] | None = None,
) -> dict[str, tuple[int, float]]:
    """Each action's intent (id, time): those `written` already, the others
    journalled now in one transaction."""
    intent = dict(written or {})
    with state.batch():
        for a in actions:
            if a.job_id not in intent:
                now = clock()
                intent[a.job_id] = (_begin(a, state, round_id, now), now)
    return intent


def _defer(actions: list[Action], state: StateStore, round_id: int | None, clock: Callable[[], float]) -> list[Outcome]:
    """Journal placements this round has no time left for: a held job's
    open intent is carried out by the next round if it still fits."""
    _journal(actions, state, round_id, clock)
    _step("deferred", len(actions))
    return [Outcome(a, True, DEFERRED) for a in actions]


def _signal(
    a: Action, backend: Backend, state: StateStore, round_id: int | None, clock: Callable[[], float]
) -> tuple[int, float]:
    """Write the move's intent, then its Step ("signalled", with the target
    plan) into the job's AdminComment, and ask the job to checkpoint (status
    signalled). The Step comes first: a controller that finds it (without
    this state DB) finishes the move, and asks a job still running once
    more (RESIGNAL: this one may have died before its signal)."""
    assert a.placement is not None and a.plan is not None and a.update is not None
    p = a.placement
    now = clock()
    intent = _begin(a, state, round_id, now)
    step = contract.Step(contract.SIGNALLED, now, json.loads(a.plan.to_json()), a.update.partition or "")
    try:
        if a.was:
            backend.update(a.job_id, JobUpdate(admin_comment=contract.with_step(a.was, step)))
            _step("marked", 1)
        backend.signal(a.job_id, contract.CHECKPOINT_SIGNAL, target=STEPS)
    except JOB_FAILURES as exc:
        state.set_plan_status(intent, PlanStatus.FAILED, clock(), str(exc))
        raise
    state.set_plan_status(intent, PlanStatus.SIGNALLED, clock())
    state.add_history(a.job_id, HistoryEvent.SIGNALLED, clock(), round_id, p.cell.key())
    log.info("asked to checkpoint", extra={"fields": a.summary()})
    return intent, now


def _finish_moves(
    signalled: dict[str, tuple[Action, tuple[int, float]]],
    ended: Mapping[str, SlurmJob | None],
    backend: Backend,
    state: StateStore,
    round_id: int | None,
    clock: Callable[[], float],
) -> list[Outcome]:
    """Requeue, update and release the signalled jobs that ended
    checkpointed (`ended`: `_wait_ended`), together. Jobs still running are
    left to a later round (their intent stays open)."""
    outcomes = []
    ready: dict[str, tuple[int, float]] = {}
    for job_id, (a, intent) in signalled.items():
        if job_id not in ended:
            outcomes.append(Outcome(a, True, "still checkpointing; finished by a later round"))
            continue
        job = ended[job_id]
        if job is None or not checkpointed(job):
            state.set_plan_status(intent[0], PlanStatus.GONE, clock())
            outcomes.append(
                Outcome(a, False, "the job ended without a checkpoint" if job is not None else "the job vanished")
            )
            continue
        ready[job_id] = intent
    if ready:
        outcomes += _place_many([signalled[j][0] for j in ready], backend, state, round_id, clock, ready)
    return outcomes


def _place_many(
    actions: list[Action],
    backend: Backend,
    state: StateStore,
    round_id: int | None,
    clock: Callable[[], float],
    intents: Mapping[str, tuple[int, float]] | None = None,
) -> list[Outcome]:
    """Place the jobs, one Slurm call (or journal transaction) per step for
    them all: journal the intents; requeue held (moved and checkpointed
    jobs) or hold (pending jobs not held); update; release. A job whose step
    fails drops out with its plan failed. Each job passes the steps in the
    order one job alone would, and the journal says how far it got, so a
    SIGKILL between any two steps leaves what the next round finishes. The
    update writes the Step "updated" with the plan (the job is the
    controller's while held, for a controller without this journal too); a
    released job's AdminComment then loses it (`_tidy`)."""
    journalled = _journal(actions, state, round_id, clock, intents)
    intent = {j: i for j, (i, _) in journalled.items()}
    _step("journalled", len(actions))
    errors: dict[str, Exception] = {}
    requeue = [a.job_id for a in actions if a.kind == ActionKind.MOVE or a.requeue_first]
    if requeue:
        errors.update(backend.requeue_many(requeue, hold=True))
        with state.batch():
            for job_id in requeue:
                if job_id not in errors:
                    state.set_plan_status(intent[job_id], PlanStatus.REQUEUED, clock())
                    state.add_history(job_id, HistoryEvent.REQUEUED, clock(), round_id)
        _step("requeued", len(requeue))
    hold = [a.job_id for a in actions if a.hold_first and a.job_id not in requeue]
    if hold:
        errors.update(backend.hold_many(hold))
        _step("held", len(hold))
    updated = _update(actions, journalled, backend, state, clock, errors)
    if updated:
        errors.update(backend.release_many(updated))
    with state.batch():
        for a in actions:
            if a.job_id in errors:
                state.set_plan_status(intent[a.job_id], PlanStatus.FAILED, clock(), str(errors[a.job_id]))
            else:
                state.set_plan_status(intent[a.job_id], PlanStatus.RELEASED, clock())
    _step("released", len(updated) - len(set(updated) & set(errors)))
    tidy = [
        Action(ActionKind.TIDY, a.job_id, update=JobUpdate(admin_comment=a.update.admin_comment))
        for a in actions
        if a.job_id in updated and a.job_id not in errors and a.update is not None
    ]
    if tidy:
        _tidy(tidy, backend)
    for a in actions:
        if a.job_id not in errors:
            log.info("placed", extra={"fields": a.summary()})
    return _outcomes(actions, errors)


def _update(
    actions: list[Action],
    journalled: Mapping[str, tuple[int, float]],
    backend: Backend,
    state: StateStore,
    clock: Callable[[], float],
    errors: dict[str, Exception],
) -> list[str]:
    """Update the jobs not failed so far (`errors`, added to) to their
    placements, each AdminComment with the Step "updated" at its intent's
    time; the jobs updated, their intents marked so."""
    changes = {
        a.job_id: dataclasses.replace(
            a.update,
            admin_comment=contract.with_step(
                a.update.admin_comment or "", contract.Step(contract.UPDATED, journalled[a.job_id][1])
            ),
        )
        for a in actions
        if a.job_id not in errors and a.update is not None
    }
    updated = []
    for job_id, result in backend.update_many(changes).items() if changes else ():
        if isinstance(result, Exception):
            errors[job_id] = result
        else:
            updated.append(job_id)
    with state.batch():
        for job_id in updated:
            state.set_plan_status(journalled[job_id][0], PlanStatus.UPDATED, clock())
    _step("updated", len(updated))
    return updated
