"""Desired placements vs what Slurm shows -> actions, and carrying them out.

`decide` is pure. `apply` is the only code in the controller that changes
Slurm; it writes an intent to the state before touching a job and marks it
after each step, so a round cut short (crash, SIGKILL, Slurm gone) is
finished by the next one: a job updated but not released is released if its
plan still fits (else planned again); a job already released is left alone.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from slurm_ext.backends import Backend, JobUpdate, SlurmCommandError, SlurmUnavailable, UpdateNotApplied
from slurm_ext.controller.inputs import HELD, LOOSE, RELEASED, ManagedJob, same_plan
from slurm_ext.controller.progress import default_checkpoint_dir
from slurm_ext.state import PlanRow, StateStore
from solver.placement import PlanError, validate_plan
from solver.plan import JobPlan
from solver.types import ClusterView, Placement

log = logging.getLogger("cellsched.controller")

PLACE = "place"  # (hold,) update, release
HOLD = "hold"  # keep a loose job from starting anywhere


@dataclass(frozen=True)
class Action:
    """One change to one job. For PLACE: the plan, the update carrying it and
    whether the job must be held first (it is pending and not held)."""

    kind: str
    job_id: str
    why: str = ""
    placement: Placement | None = None
    plan: JobPlan | None = None
    update: JobUpdate | None = None
    hold_first: bool = False

    def summary(self) -> dict:
        d: dict = {"kind": self.kind, "job": self.job_id}
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
    fits = [(name, nodes) for name, nodes in view.partitions.items()
            if want <= set(nodes) and (allowed is None or name in allowed)]
    if not fits:
        return None
    per_type = [f for f in fits if all(types.get(n) == placement.cell.gpu_type for n in f[1])]
    return min(per_type or fits, key=lambda f: (len(f[1]), f[0]))[0]


def job_plan(m: ManagedJob, p: Placement, checkpoint_root: str) -> JobPlan:
    """The plan written to the job's AdminComment. The checkpoint directory
    and the virtual worker count stay what an earlier plan said."""
    spec = m.spec
    assert spec is not None
    old = m.plan
    ckpt = (old.checkpoint_dir if old and old.checkpoint_dir else
            default_checkpoint_dir(m.job_id, m.job.user, m.job.work_dir or None, checkpoint_root))
    vw = spec.virtual_workers or (old.virtual_workers if old and old.virtual_workers else None) or p.plan.dp
    return JobPlan(
        pp=p.plan.pp, dp=p.plan.dp, tp=p.plan.tp, micro_batches=p.plan.micro_batches,
        global_batch=spec.global_batch, gpu_types=(p.cell.gpu_type,), nodes=p.node_names,
        gpus_per_node=p.cell.gpus_per_node, virtual_workers=vw, checkpoint_dir=ckpt, cell=p.cell.key(),
        job_id=m.job_id, iter_time_s=round(p.iter_time_s, 6) if p.iter_time_s else None,
    )


def admin_comment(spec_json: str, plan: JobPlan) -> str:
    return json.dumps({"spec": json.loads(spec_json), "plan": json.loads(plan.to_json())}, separators=(",", ":"), sort_keys=True)


def checked(view: ClusterView, placements: Mapping[str, Placement],
            first: frozenset[str] | set[str] = frozenset()) -> tuple[dict[str, Placement], dict[str, str]]:
    """The placements that can be carried out together, and why the others
    cannot (solver.placement.validate_plan; on a failure, placements are
    admitted one at a time, the jobs in `first` (already placed) first)."""
    try:
        validate_plan(view, placements)
        return dict(placements), {}
    except PlanError:
        pass
    ok: dict[str, Placement] = {}
    rejected: dict[str, str] = {}
    for job_id, p in sorted(placements.items(), key=lambda kv: (kv[0] not in first, kv[0])):
        try:
            validate_plan(view, {**ok, job_id: p})
            ok[job_id] = p
        except PlanError as exc:
            rejected[job_id] = f"plan rejected: {exc}"
    return ok, rejected


def decide(jobs: tuple[ManagedJob, ...], desired: Mapping[str, Placement], view: ClusterView,
           checkpoint_root: str) -> tuple[Action, ...]:
    """Actions that make Slurm match `desired`.

    A held (or loose) job with a placement is placed; a released job whose
    placement changed is held, updated and released again; a loose job
    without one is held. Running jobs keep their resources (resizing is not
    done by this controller yet); released jobs that keep their cell are not
    touched.
    """
    actions: list[Action] = []
    for m in jobs:
        p = desired.get(m.job_id)
        if m.phase == LOOSE and p is None:
            actions.append(Action(HOLD, m.job_id, "pending without a plan"))
            continue
        if p is None or m.phase not in (HELD, LOOSE, RELEASED) or m.spec_json is None:
            continue
        if m.phase == RELEASED and p.same_resources(m.current):
            continue
        partition = choose_partition(view, p, getattr(m.spec, "partitions", None))
        if partition is None:
            continue  # validate() keeps such placements out; nothing to carry out
        plan = job_plan(m, p, checkpoint_root)
        update = JobUpdate(partition=partition, features=p.cell.gpu_type, num_nodes=p.cell.num_nodes,
                           req_nodes=tuple(sorted(p.node_names)), gres_per_node=p.cell.gpus_per_node,
                           num_tasks=p.cell.num_gpus, tasks_per_node=p.cell.gpus_per_node,
                           admin_comment=admin_comment(m.spec_json, plan))
        why = "recover" if m.intent is not None and m.phase == HELD else ("move" if m.phase == RELEASED else "new")
        actions.append(Action(PLACE, m.job_id, why, p, plan, update, hold_first=m.phase != HELD))
    return tuple(actions)


def intent_outcomes(jobs: tuple[ManagedJob, ...], open_plans: Mapping[str, PlanRow]) -> dict[str, str]:
    """How each open intent ended, for jobs no longer held: "released" when
    the job carries its plan, "abandoned" when it carries another, "gone"
    when the job ended or vanished first. Held jobs keep theirs open."""
    by_id = {m.job_id: m for m in jobs}
    out: dict[str, str] = {}
    for job_id, row in open_plans.items():
        m = by_id.get(job_id)
        if m is None:
            out[job_id] = "gone"
        elif m.job.held and not m.job.finished:
            continue
        elif same_plan(m.job, row):
            out[job_id] = "released"
        else:
            out[job_id] = "gone" if m.job.finished else "abandoned"
    return out


def apply(actions: tuple[Action, ...], backend: Backend, state: StateStore, round_id: int | None,
          clock: Callable[[], float] = time.time) -> list[Outcome]:
    """Carry the actions out, one job at a time; a failing job is recorded
    and skipped. SlurmUnavailable stops the round (the intents stay open)."""
    outcomes = []
    for a in actions:
        try:
            if a.kind == HOLD:
                backend.hold(a.job_id)
            elif a.kind == PLACE:
                _place(a, backend, state, round_id, clock)
            outcomes.append(Outcome(a, True))
        except SlurmUnavailable:
            raise
        except (SlurmCommandError, UpdateNotApplied, ValueError) as exc:
            log.warning("action failed", extra={"fields": {**a.summary(), "error": str(exc)}})
            outcomes.append(Outcome(a, False, str(exc)))
    return outcomes


def _place(a: Action, backend: Backend, state: StateStore, round_id: int | None, clock: Callable[[], float]) -> None:
    assert a.placement is not None and a.plan is not None and a.update is not None
    p = a.placement
    intent = state.begin_plan(a.job_id, round_id, p.cell.key(), p.nodes, a.update.partition or "", a.plan.to_json(),
                              a.update.admin_comment or "", clock())
    try:
        if a.hold_first:
            backend.hold(a.job_id)
        backend.update(a.job_id, a.update)
        state.set_plan_status(intent, "updated", clock())
        backend.release(a.job_id)
    except SlurmUnavailable:
        raise
    except (SlurmCommandError, UpdateNotApplied, ValueError) as exc:
        state.set_plan_status(intent, "failed", clock(), str(exc))
        raise
    state.set_plan_status(intent, "released", clock())
    log.info("placed", extra={"fields": a.summary()})
