"""The contract between the controller and the jobs it places, defined once.

Both sides stand on this module (stdlib and ``solver.contract.plan`` only, so
``cellsched-launch`` starts fast):

* **AdminComment**: a JSON object ``{"spec": {...}, "plan": {...}}``. The
  spec is the job's validated spec (written by ``job_submit.lua`` or the
  controller); the plan is a ``solver.contract.plan.JobPlan`` the controller writes
  when it places the job, and the launcher reads back. While the controller
  has the job held (or is moving it) the object also holds a ``Step``
  under ``STEP_KEY``: how far it got, so that a controller that lost its
  state DB finishes the work from Slurm alone; it is removed once the job
  is released.
* **Environment**: ``cellsched-launch`` gives each task its plan in
  ``ENV_PLAN`` (inline JSON, or a path to a JSON file), and its degrees in
  ``ENV_PP`` / ``ENV_DP`` / ``ENV_TP``; ``ENV_MASTER_ADDR`` /
  ``ENV_MASTER_PORT`` override the rendezvous; ``ENV_RUNTIME``, the batch
  facts (``ENV_GLOBAL_BATCH`` ...) and ``ENV_CHECKPOINT_DIR`` spell out the
  rest of the plan for scripts that do not read it.
* **Checkpoint**: to resize or move a running job the controller sends
  ``CHECKPOINT_SIGNAL`` to its steps; every task checkpoints and exits with
  ``EXIT_CHECKPOINTED`` (EX_TEMPFAIL: "stopped on purpose, run me again"),
  and the controller requeues it. ``CHECKPOINT_SIGNALS`` are the signals the
  launcher answers that way.
* **Progress**: the job writes ``<checkpoint_dir>/PROGRESS_FILE``; the
  controller reads it (as untrusted input) to count iterations done.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from solver.contract.plan import JobPlan, PlanError

EXIT_CHECKPOINTED = 75
CHECKPOINT_SIGNAL = "USR1"
CHECKPOINT_SIGNALS = ("USR1", "TERM")
PROGRESS_FILE = "progress.json"
#: ``<checkpoint_dir>/HOOK_FILE``: written (atomically, by rank 0) when a
#: script calls ``launch.on_checkpoint``; JSON ``{"job_id": "...", "time": t}``.
#: A running job whose runtime checkpoints only through that hook
#: (solver.contract.runtimes.Checkpoint.HOOK) is movable once this file names its job
#: id, and static (never signalled, resized or moved) until then.
HOOK_FILE = "checkpoint-hook.json"

ENV_PLAN = "CELLSCHED_PLAN"
ENV_PP = "CELLSCHED_PP"
ENV_DP = "CELLSCHED_DP"
ENV_TP = "CELLSCHED_TP"
ENV_MASTER_ADDR = "CELLSCHED_MASTER_ADDR"
ENV_MASTER_PORT = "CELLSCHED_MASTER_PORT"
#: the plan's runtime (solver.contract.runtimes; unset for a plan without one)
ENV_RUNTIME = "CELLSCHED_RUNTIME"
#: the plan's batch facts for a script that sizes its own batches (unset when
#: the plan leaves them open): samples per iteration over the whole job; per
#: dp rank (only for an even split); micro-batches per iteration per pipeline
#: and the samples in each of them (even split only)
ENV_GLOBAL_BATCH = "CELLSCHED_GLOBAL_BATCH"
ENV_LOCAL_BATCH = "CELLSCHED_LOCAL_BATCH"
ENV_MICRO_BATCHES = "CELLSCHED_MICRO_BATCHES"
ENV_MICRO_BATCH_SIZE = "CELLSCHED_MICRO_BATCH_SIZE"
#: where the job checkpoints and resumes (plan.checkpoint_dir), and how often
ENV_CHECKPOINT_DIR = "CELLSCHED_CHECKPOINT_DIR"
ENV_CHECKPOINT_EVERY = "CELLSCHED_CHECKPOINT_EVERY"

SPEC_KEY = "spec"
PLAN_KEY = "plan"
STEP_KEY = "step"

#: a move's job was asked to checkpoint (`Step.to` is where it goes next)
SIGNALLED = "signalled"
#: the job carries the plan it is about to be released with
UPDATED = "updated"
#: requeued held after a checkpoint, waiting for a placement
REQUEUED = "requeued"
#: requeued held because its runs kept failing: held until someone releases it
PARKED = "parked"
STEPS = (SIGNALLED, UPDATED, REQUEUED, PARKED)


def admin_comment_dict(text: str | None) -> dict[str, Any]:
    """A job's AdminComment as a JSON object ({} when empty or not an object)."""
    if not text:
        return {}
    try:
        d = json.loads(text)
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def admin_comment_spec(text: str | None) -> dict[str, Any] | None:
    """The raw spec object in an AdminComment; None when it holds none."""
    spec = admin_comment_dict(text).get(SPEC_KEY)
    return spec if isinstance(spec, dict) else None


def admin_comment_plan(text: str | None, *, strict: bool = True) -> JobPlan | None:
    """The plan in an AdminComment; None when it holds none. A malformed plan
    is a PlanError, or None when not `strict` (the scheduler's side, which
    treats a job whose plan it cannot read as unplanned)."""
    raw = admin_comment_dict(text).get(PLAN_KEY)
    if raw is None:
        return None
    try:
        if not isinstance(raw, dict):
            raise PlanError(f"the AdminComment's plan must be a JSON object, got {type(raw).__name__}")
        return JobPlan.from_dict(raw)
    except PlanError:
        if strict:
            raise
        return None


@dataclass(frozen=True)
class Step:
    """The controller's work on a job in flight, mirrored in its AdminComment.

    `step` is one of STEPS; `at` when the controller journalled it (its
    intent's time: a state DB that has a plan of the job from then on knows
    it); `to` a move's target plan (a JobPlan's dict) and `partition` its
    partition."""

    step: str
    at: float
    to: dict[str, Any] | None = None
    partition: str = ""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"step": self.step, "at": self.at}
        if self.to is not None:
            d["to"] = self.to
        if self.partition:
            d["partition"] = self.partition
        return d


def admin_comment_step(text: str | None) -> Step | None:
    """The Step in an AdminComment; None when it holds none (or a malformed one)."""
    raw = admin_comment_dict(text).get(STEP_KEY)
    if not isinstance(raw, dict) or raw.get("step") not in STEPS:
        return None
    at, to, partition = raw.get("at"), raw.get("to"), raw.get("partition", "")
    if not isinstance(at, int | float) or isinstance(at, bool) or not isinstance(partition, str):
        return None
    return Step(raw["step"], float(at), to if isinstance(to, dict) else None, partition)


def with_step(text: str, step: Step | None) -> str:
    """The AdminComment `text` with `step` in it (None: without one); an
    AdminComment that is not a JSON object is returned as it is."""
    d = admin_comment_dict(text)
    if not d:
        return text
    d.pop(STEP_KEY, None)
    if step is not None:
        d[STEP_KEY] = step.to_dict()
    return json.dumps(d, separators=(",", ":"), sort_keys=True)


def encode_admin_comment(spec: Mapping[str, Any], plan: JobPlan | None = None) -> str:
    """The AdminComment of a job with this spec (and plan): compact, sorted JSON."""
    d: dict[str, Any] = {SPEC_KEY: dict(spec)}
    if plan is not None:
        d[PLAN_KEY] = json.loads(plan.to_json())
    return json.dumps(d, separators=(",", ":"), sort_keys=True)


def plan_from_env(env: Mapping[str, str] | None = None) -> JobPlan | None:
    """The plan in ``ENV_PLAN`` (inline JSON or a file path); None when unset.
    PlanError when it is malformed or names a file that cannot be read."""
    env = os.environ if env is None else env
    text = env.get(ENV_PLAN, "").strip()
    if not text:
        return None
    if not text.startswith("{"):
        try:
            with open(text, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise PlanError(f"{ENV_PLAN} names file {text!r} that cannot be read: {e.strerror}") from None
    return JobPlan.from_json(text)
