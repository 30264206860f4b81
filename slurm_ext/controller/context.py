"""A controller round on its way through its phases (slurm_ext.controller.round):
what was observed, what was decided and what came of it, one value
passed from phase to phase."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from slurm_ext.controller import inputs as inp
from slurm_ext.controller import relaunch
from slurm_ext.controller.hooks import Movability
from slurm_ext.controller.progress import Progress
from slurm_ext.controller.reconcile import Action, Outcome
from slurm_ext.records import ClusterSnapshot, SlurmJob
from slurm_ext.site import SiteReading
from slurm_ext.state import JobRow, JobStatus, PlanRow, PlanStatus, SpeedRow
from solver import contract
from solver.types import Estimate, JobRequest, Placement, ScheduleReply


class RestoredIntent(NamedTuple):
    """The intent a job's Step stands for (`restored_intent`), as the state DB journals it."""

    cell: str
    nodes: tuple[tuple[str, int], ...]
    partition: str
    plan_json: str
    admin_comment: str
    status: PlanStatus


#: a round phase: reads the fields of the RoundContext that the phases before it set, sets its own
RoundPhase = Callable[["RoundContext"], None]


@dataclass(repr=False)  # (a generated repr would fail on the fields not set yet)
class RoundContext:
    """One round on its way through the phases (Controller._phases): what
    was observed, what was decided and what came of it. Each phase reads the
    fields the phases before it set; a field no phase has set yet is not
    there (AttributeError), never a stale or made-up value."""

    round_id: int | None  #: None for a dry run (not recorded)
    started: float  #: the controller's clock at the start
    t0: float  #: time.perf_counter() at the start
    dry_run: bool
    observe_s: float = 0.0
    solve_s: float = 0.0
    apply_s: float = 0.0
    # 1. observed: Slurm's snapshot and the state's rows of its jobs
    snap: ClusterSnapshot = field(init=False)
    now: float = field(init=False)  #: when the snapshot was taken
    listed: list[str] = field(init=False)  #: Slurm's jobs (the state's other rows are history)
    known: dict[str, JobRow] = field(init=False)
    released: set[str] = field(init=False)
    parked: set[str] = field(init=False)
    yielding: dict[str, tuple[float, str]] = field(init=False)  #: preempted by cellsched, not requeued yet
    opens: dict[str, PlanRow] = field(init=False)  #: the open intents, by job
    # 2. the work in flight the AdminComments show and the state DB does not know
    rebuilt: dict[str, tuple[SlurmJob, contract.Step, RestoredIntent]] = field(default_factory=dict)
    resignal: set[str] = field(default_factory=set)
    # 3. the managed jobs, their failed runs and their progress
    jobs: tuple[inp.ManagedJob, ...] = field(init=False)
    failures: dict[str, relaunch.RunFailure] = field(init=False)
    prog: Progress = field(init=False)
    proven: dict[str, frozenset[str]] = field(init=False)  #: the cells each job has trained in
    moving: Movability = field(init=False)  #: the running jobs that may not be moved (controller.hooks)
    site: SiteReading = field(init=False)  #: the site's standing policy (slurm_ext.site)
    # 4. the solver's input and reply, and the speeds running jobs reached (to record, with the uncalibrated estimate)
    built: inp.Inputs = field(init=False)
    speeds: dict[tuple[str, str], tuple[SpeedRow, JobRequest, Estimate]] = field(default_factory=dict)
    reply: ScheduleReply = field(init=False)
    crashed: dict[str, str] = field(init=False)  #: the jobs the solver fails on
    # 5. what was decided and what came of it
    desired: dict[str, Placement] = field(init=False)
    rejected: dict[str, str] = field(init=False)
    actions: tuple[Action, ...] = field(init=False)
    outcomes: list[Outcome] = field(default_factory=list)
    summaries: tuple[dict, ...] = ()
    failed: dict[str, str] = field(init=False)  #: the actions that failed, by job
    statuses: tuple[JobStatus, ...] = field(init=False)
