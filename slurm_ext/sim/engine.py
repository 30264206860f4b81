"""The trace-driven simulator: the real controller (`Controller.round()`,
the policy and the estimator given) on the simulated Slurm (`SimBackend`),
driven by an event queue, not a tick loop.

The engine drives the simulated cluster (slurm_ext.sim.world) and its
clock directly, reads what became of each job from its accounting
(slurm_ext.sim.accounting), and gives the controller the cluster only
through the Backend protocol (slurm_ext.sim.backend.SimBackend), as the
live controller sees a real one.

Events, in time order (at one instant: job events, then arrivals, then a
round): trace arrivals (each submitted held, with the cellsched tag, exactly
like ``cellsched sbatch`` does), job events of the world (start, end of a
restart stall, completion, end of a checkpoint) and controller rounds.

Rounds come every `interval_s`, and (``early_rounds``, like the daemon's
watcher) `min_gap_s` after the last round when a job arrived, ended or was
requeued; what happened while a round ran brings a round right after it,
unless the round did it itself (its moves' checkpoints and requeues).
With ``skip_idle_rounds`` a round is not run when nothing changed since the
last one (no arrival, no job end or requeue, no node change, no failed
action): the solver is deterministic (SolverConfig.deterministic) and would
repeat its decision. Two clocks the decision depends on are changes too:
a job's run reaching the restart governor's min_run_s (SolverConfig.min_run_s:
a round is due min_run_s after each start) and, with preemption on, a
preempted job's back-off running out (preemption_backoff_s after each
requeue); neither is set with their defaults (0, "off"). What it does not
see is other time alone: a job's age bonus grows between rounds, so a job
the policy left waiting next to free GPUs waits until the next change. The
simulation ends when no event is left.

Arena-compatible mode (``arena_compat``) reproduces the conventions of
Arena's own simulator (solver/data/arena/README.md): fixed rounds of
`ARENA_ROUND_S` (Arena's SCHEDULING_INTERVAL, 300 s) from the first arrival,
no early rounds; arrivals within a round are submitted at its start; at
each round start the round is settled (slurm_ext.sim.quantum: progress,
completions: a job finished mid-round ends at the next boundary, its GPUs
taken until then), then the round's arrivals are submitted, then the
controller round runs; checkpoints and starts take no time; restart charges
as Arena's (see `restart_cost_for`); the truth speed and the estimator are Arena's profile
lookup (`ArenaTable`); Gavel and Sia get Arena's DP memory rule. Progress
follows Arena's executed-seconds model by default
(``progress_model="iterations"`` for the strict one).

Mixed-type cells (solver.mixed): outside arena-compat mode the policies'
estimator is wrapped in `MixedEstimator`, as the live controller's is, and
the conditions' truth composes mixed cells the same way
(slurm_ext.sim.conditions); a policy that offers none is unaffected. In
arena-compat mode neither is (Arena's simulator has no mixed cells).

Runtimes (solver.contract.runtimes): without a runtime mix every trace job
is submitted with `SimOptions.runtime`, by default `TRACE_RUNTIME`
(``adaptive``): Arena's jobs run adaptive parallelism, as Arena assumes (any
dp x tp x pp, uneven shares and stages, mixed types, a checkpoint on the
signal); ``--arena-compat`` always does. With a mix (`SimOptions.runtime_mix`)
each job runs the shipped runtime slurm_ext.sim.workload gives it, declares
the work it says, and a ``ddp`` job whose script registers the checkpoint hook
says so to the controller at the first step of each run (`Hooks`,
as the launcher's file does); what each runtime may run and how it may move
is solver.contract.runtimes's, asked by the policies and the controller. The
``--policy`` baselines keep their own rules within that.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import heapq
import logging
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_ext.config import Config, ControllerConfig, NetworkConfig
from slurm_ext.controller.hooks import Hook
from slurm_ext.controller.progress import EachCall, JobProgress
from slurm_ext.controller.report import RoundReport
from slurm_ext.controller.round import Controller
from slurm_ext.errors import CellschedError
from slurm_ext.sim.accounting import Accounting
from slurm_ext.sim.backend import SimBackend
from slurm_ext.sim.clusterspec import node_names
from slurm_ext.sim.conditions import Conditions, table_speed
from slurm_ext.sim.network import NetworkTruth, cluster_network
from slurm_ext.sim.preempt import SlurmPreemption
from slurm_ext.sim.quantum import EXECUTED_SECONDS, ITERATIONS, QuantumMode
from slurm_ext.sim.site import SiteFeed, SiteUsage, assign_accounts
from slurm_ext.sim.submit import Submitter, best_layout
from slurm_ext.sim.types import ClusterSpec, JobOutcome, RoundStat, Sample, SimRun, TraceJob
from slurm_ext.sim.workload import Workload, WorkloadError
from slurm_ext.sim.world import Observer, RestartCostFn, SimJob, SimWorld, SpeedFn
from slurm_ext.state import RoundStatus, StateStore
from solver.contract import sqlitedb
from solver.contract.jobspec import JobSpec
from solver.contract.models import get_model
from solver.contract.plan import JobPlan
from solver.contract.profiles.arena import load_sim_constants
from solver.contract.runtimes import ADAPTIVE, UnknownRuntime, get_runtime
from solver.estimator.protocol import EstimatorLike
from solver.mixed import MixedEstimator
from solver.network import Network, default_nic_gbps
from solver.policies import Policy
from solver.types import Cell, JobRequest, SolverConfig

#: Python's garbage collector's thresholds while a simulation runs: young collections as often
#: as by default, full ones (over every object the run holds: 0.11 s at the simulated month's
#: fifth day) at most a hundredth as often. With the default a month round spent about 18% of
#: its time in them (sim_scale.md); what a run drops in cycles is still collected.
SIM_GC_THRESHOLD = (700, 10, 1000)

#: policies that search plans with pruning in Arena's simulator (cheap restarts)
PRUNED_POLICIES = ("cellsched", "cellsched-static")
#: the runtime of every trace job (the module doc): Arena's adaptive parallelism
TRACE_RUNTIME = ADAPTIVE

#: the round length of Arena's simulator (its SCHEDULING_INTERVAL, solver/data/arena/sim_constants.json):
#: in arena_compat mode the rounds, the arrival grid and the throughput samples
ARENA_ROUND_S = float(load_sim_constants()["SCHEDULING_INTERVAL"])


class SimError(ValueError, CellschedError):
    """A simulation that cannot run as asked (the message says why)."""


#: a simulation repeats exactly whatever the machine's load: CP-SAT's
#: deterministic budget decides each round, this wall-clock limit is a safety net
SIM_TIME_LIMIT_S = 60.0


@dataclass(frozen=True)
class SimOptions:
    """How a simulation runs.

    interval_s / min_gap_s / early_rounds: when controller rounds happen;
    skip_idle_rounds: see the module doc. checkpoint_s: how long a signalled
    elastic job takes to checkpoint; start_delay_s: Slurm's delay from
    release to start. restart_per_gpu_s / restart_max_s: a (re)started job
    stalls min(per_gpu x GPUs, max) seconds (None: by mode and policy, see
    `restart_cost_for`); charge_first_start: the first start is charged too.
    arena_compat / progress_model: see the module doc. max_time_s: stop this
    many simulated seconds after the first arrival; limit_jobs: only the
    first N trace jobs. elastic / min_gpus / max_gpus: the spec every trace
    job gets (max_gpus at least the job's request). rigid: every trace job
    is submitted rigid instead, elastic false and min_gpus = max_gpus = its
    requested GPUs (its runtime still the workload's): a policy then chooses
    only its GPU type and nodes (`cellsched simulate --policy NAME:rigid=true`). solver: the
    controller's SolverConfig (seed given by `seed`); its default lets the
    policy resize and move running elastic jobs (allow_resize).
    progress_rate_factor: the controller's (a job whose progress runs faster
    than this many times its estimate is scheduled on the estimate; None:
    the simulated counts are taken as they are, as under the executed-seconds
    progress model, see `effective`). contention: jobs that share network
    links slow each other (slurm_ext.sim.network), and the controller is told
    the cluster's NICs; None: when the cluster gives NICs (never in
    arena_compat mode); True on a cluster without NICs: each GPU type's
    default NIC (solver.network). runtime: the runtime every trace job is
    submitted with (solver.contract.runtimes; default `TRACE_RUNTIME`, the module doc).
    runtime_mix / hook_fraction / declared_error: each job's runtime, whether
    a ddp job registers the checkpoint hook, and the badness factor of its
    declared work (slurm_ext.sim.workload.Workload; `workload`); with declared
    error the controller learns what declarations are worth
    (``learn_declared_work``, slurm_ext.controller.declared), for every policy.
    """

    interval_s: float = 60.0
    min_gap_s: float = 2.0
    early_rounds: bool = True
    skip_idle_rounds: bool = True
    checkpoint_s: float = 5.0
    start_delay_s: float = 0.0
    restart_per_gpu_s: float | None = None
    restart_max_s: float | None = None
    charge_first_start: bool = True
    arena_compat: bool = False
    progress_model: str = EXECUTED_SECONDS
    max_time_s: float | None = None
    limit_jobs: int | None = None
    seed: int = 0
    elastic: bool = True
    min_gpus: int = 1
    max_gpus: int = 16
    rigid: bool = False
    min_job_age_s: float = 300.0
    progress_rate_factor: float | None = 10.0
    contention: bool | None = None
    runtime: str = TRACE_RUNTIME
    runtime_mix: tuple[tuple[str, float], ...] = ()
    hook_fraction: float = 0.0
    declared_error: float = 0.0
    solver: SolverConfig = field(default_factory=lambda: SolverConfig(time_limit_s=SIM_TIME_LIMIT_S))

    def __post_init__(self) -> None:
        for name in ("interval_s", "min_gap_s", "checkpoint_s", "start_delay_s", "min_job_age_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise SimError(f"SimOptions.{name} must be a number >= 0, got {v!r}")
        if self.interval_s <= 0:
            raise SimError(f"SimOptions.interval_s must be > 0, got {self.interval_s!r}")
        if self.progress_model not in (EXECUTED_SECONDS, ITERATIONS):
            raise SimError(f"SimOptions.progress_model must be {EXECUTED_SECONDS!r} or {ITERATIONS!r}")
        if self.limit_jobs is not None and self.limit_jobs < 1:
            raise SimError(f"SimOptions.limit_jobs must be >= 1, got {self.limit_jobs}")
        if self.max_time_s is not None and not self.max_time_s > 0:
            raise SimError(f"SimOptions.max_time_s must be > 0, got {self.max_time_s}")
        if not 1 <= self.min_gpus <= self.max_gpus:
            raise SimError("SimOptions: need 1 <= min_gpus <= max_gpus")
        if not isinstance(self.rigid, bool):
            raise SimError(f"SimOptions.rigid must be true or false, got {self.rigid!r}")
        try:
            get_runtime(self.runtime)
        except UnknownRuntime as e:
            raise SimError(f"SimOptions.runtime: {e}") from None
        try:
            self.workload()
        except WorkloadError as e:
            raise SimError(f"SimOptions: {e}") from None
        if self.arena_compat and (self.runtime_mix or self.declared_error or self.runtime != TRACE_RUNTIME):
            raise SimError("arena-compat mode runs Arena's assumption: adaptive jobs declaring their exact work")
        if self.contention and self.arena_compat:
            raise SimError("contention is not modelled in arena-compat mode (Arena's simulator has none)")

    def workload(self) -> Workload:
        """What each trace job runs and declares (slurm_ext.sim.workload)."""
        return Workload(
            self.runtime, self.runtime_mix, self.hook_fraction, self.declared_error, self.seed, not self.arena_compat
        )

    def effective(self) -> SimOptions:
        """The options as they apply: arena_compat fixes the round grid and
        makes checkpoints and starts instantaneous, and the controller does not
        calibrate (Arena's simulator never learns). Under the executed-seconds
        progress model a job's iterations done are its executed seconds at
        its current speed, so a move rescales them (even down): they are taken
        as they are, without the checks a job's own report gets."""
        o = self
        if o.progress_model == EXECUTED_SECONDS:
            o = dataclasses.replace(o, progress_rate_factor=None)
        if not o.arena_compat:
            return o
        return dataclasses.replace(
            o,
            interval_s=ARENA_ROUND_S,
            early_rounds=False,
            checkpoint_s=0.0,
            start_delay_s=0.0,
            charge_first_start=True,
            solver=dataclasses.replace(o.solver, calibrate=False),
        )


@dataclass(frozen=True)
class SimProgress:
    """Where a running simulation is (for a progress bar)."""

    time: float
    start: float
    last_arrival: float
    submitted: int
    finished: int
    total: int
    rounds: int

    @property
    def fraction(self) -> float:
        """Finished jobs over all jobs (the end time is not known in advance)."""
        return self.finished / self.total if self.total else 1.0


def restart_cost_for(policy: str, options: SimOptions) -> RestartCostFn:
    """min(per_gpu x GPUs, max) seconds per (re)start. Defaults: Arena's
    constants in arena_compat mode (10 s / 40 s for cellsched's policies,
    which prune the plan search, 150 s / 600 s for the baselines); outside
    it 10 s / 40 s for every policy (the plan search is the controller's,
    not the restart's)."""
    per, cap = options.restart_per_gpu_s, options.restart_max_s
    if per is None or cap is None:
        c = load_sim_constants()
        c = c.get("constants", c)
        pruned = policy in PRUNED_POLICIES or not options.arena_compat
        d_per = float(c["RESCHED_OVERHEAD_WITH_PRUNE" if pruned else "RESCHED_OVERHEAD_WITHOUT_PRUNE"])
        d_cap = float(c["MAX_RESCHED_OVERHEAD_WITH_PRUNE" if pruned else "MAX_RESCHED_OVERHEAD_WITHOUT_PRUNE"])
        per = d_per if per is None else per
        cap = d_cap if cap is None else cap
    return FlatRestartCost(per, cap, options.charge_first_start)


@dataclass(frozen=True)
class FlatRestartCost:
    """min(per_gpu_s x GPUs, max_s) seconds per (re)start, a first start free unless `first` (``restart_cost_for``)."""

    per_gpu_s: float
    max_s: float
    first: bool

    def __call__(self, spec: JobSpec, gpus: int, first_start: bool) -> float:
        if first_start and not self.first:
            return 0.0
        return min(self.per_gpu_s * gpus, self.max_s)


@dataclass(frozen=True)
class Hooks:
    """The hook record a job's launcher writes once its script registered
    launch.on_checkpoint: at the first step of each run of a trace job that
    does (`hooked`, by trace job id), none before (slurm_ext.controller.hooks)."""

    world: SimWorld
    trace_ids: Mapping[str, str]  # Slurm job id -> trace job id
    hooked: frozenset[str]

    def __call__(self, m: Any) -> Hook | None:
        if self.trace_ids.get(m.job_id) not in self.hooked:
            return None
        at = self.world.first_step_at(m.job_id)
        return None if at is None else Hook(m.job_id, at)


@dataclass(frozen=True)
class RequestedCell:
    """Can a runtime run trace job `job` where its user ran it, as `estimator`
    sees it: in the cell its user asked for (its requested GPUs on the fewest
    nodes of its type); where no code could run there (not even `adaptive`:
    the estimator knows no such cell), in any single-type cell of 1 to
    `max_gpus` GPUs (slurm_ext.sim.workload.Workload.runtime_of)."""

    cluster: ClusterSpec
    estimator: EstimatorLike
    job: TraceJob
    max_gpus: int

    def __call__(self, runtime: str) -> bool:
        asked = best_layout(self.cluster, self.job.requested_gpu_type, self.job.requested_gpus)
        if asked is not None and self._feasible(ADAPTIVE, asked):
            return self._feasible(runtime, asked)
        types = {g.gpu_type for g in self.cluster.groups}
        counts = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= self.max_gpus]
        cells = [c for t in sorted(types) for n in counts if (c := best_layout(self.cluster, t, n)) is not None]
        return any(self._feasible(runtime, c) for c in cells)

    def _feasible(self, runtime: str, cell: tuple[str, int, int]) -> bool:
        request = JobRequest(self.job.job_id, get_model(self.job.model), self.job.global_batch, 1, runtime=runtime)
        return self.estimator.estimate(request, Cell(*cell)).feasible


def file_stem(label: str) -> str:
    """A run's label as a file name: letters, digits, '-' and '_' (the rest '_')."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in label)


class LogCollector(logging.Handler):
    """Counts the controller's warnings and errors of a run (by message)
    and keeps the first few with their fields, for the run's meta."""

    def __init__(self, keep: int = 20) -> None:
        super().__init__(logging.WARNING)
        self.counts: dict[str, int] = {}
        self.examples: list[dict[str, object]] = []
        self.keep = keep

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        self.counts[msg] = self.counts.get(msg, 0) + 1
        if len(self.examples) < self.keep:
            fields = getattr(record, "fields", None) or {}
            self.examples.append({"level": record.levelname, "message": msg, **{k: str(v) for k, v in fields.items()}})


class _Changes(Observer):
    """Tells the simulator (`on_change(kind, job id or node name)`) what
    happened in the world: "submit", "start", "stall-end", "end", "requeue"
    or "node"."""

    def __init__(self, on_change: Callable[[str, str], None]) -> None:
        self.on_change = on_change

    def submitted(self, job: SimJob) -> None:
        self.on_change("submit", job.job_id)

    def started(self, job: SimJob, cell: str) -> None:
        self.on_change("start", job.job_id)

    def stall_ended(self, job: SimJob) -> None:
        self.on_change("stall-end", job.job_id)

    def ended(self, job: SimJob) -> None:
        self.on_change("end", job.job_id)

    def requeued(self, job: SimJob) -> None:
        self.on_change("requeue", job.job_id)

    def node_changed(self, name: str) -> None:
        self.on_change("node", name)


def _news(report: RoundReport, events: list[tuple[str, str]]) -> bool:
    """Did something happen while the round of `report` ran (`events`: (kind,
    job id or node)) that it did not do itself (as the daemon's watcher
    counts, slurm_ext.controller.watcher)?"""
    acted = report.acted_on
    return any(kind == "node" or who not in acted for kind, who in events)


class Simulator:
    """One policy over one trace on one simulated cluster."""

    def __init__(
        self,
        trace: Sequence[TraceJob],
        cluster: ClusterSpec,
        policy: str | Policy,
        *,
        speed: SpeedFn | None = None,
        estimator: EstimatorLike | None = None,
        options: SimOptions | None = None,
        policy_opts: Mapping[str, Any] | None = None,
        restart_cost: RestartCostFn | None = None,
        state_dir: str | Path | None = None,
        conditions: Conditions | None = None,
        label: str | None = None,
    ) -> None:
        """`speed` is the truth (how fast jobs really run), `estimator` what
        the policy believes; both default to those of `conditions`
        (slurm_ext.sim.conditions: also the noise on the truth and the
        restart cost), in arena_compat mode to Arena's profile table.
        `policy` is a name for solver.policies.get_policy (with
        `policy_opts`) or a Policy; `label` names the run (default: the
        policy's name)."""
        self.options = (options or SimOptions()).effective()
        o = self.options
        self.conditions = conditions
        if conditions is not None and (speed is None or estimator is None):
            c_speed, c_est = conditions.speed_and_estimator(mixed=not o.arena_compat)
            speed, estimator = speed or c_speed, estimator or c_est
        if restart_cost is None and conditions is not None and conditions.restart is not None:
            restart_cost = conditions.restart.cost
        if not trace:
            raise SimError("the trace has no jobs")
        jobs = sorted(trace, key=lambda j: (j.submit_time, j.line, j.job_id))
        if o.limit_jobs is not None:
            jobs = jobs[: o.limit_jobs]
        if cluster.site is not None:
            jobs = list(assign_accounts(jobs, cluster.site))  # slurm_ext.sim.site
        self.cluster = cluster
        self.policy_name = policy if isinstance(policy, str) else getattr(policy, "name", type(policy).__name__)
        self.label = label or self.policy_name
        if o.arena_compat and (speed is None or estimator is None):
            from solver.arena.lookup import ArenaTable

            table = ArenaTable()
            speed = speed or table_speed(table)
            estimator = estimator or table
        if speed is None or estimator is None:
            raise SimError("a simulation needs a truth speed and an estimator (or arena_compat)")
        if not o.arena_compat:
            estimator = MixedEstimator(estimator)  # as the live controller's (speeds.make_estimator)
        self.speed = speed
        self.estimator = estimator
        if isinstance(policy, str):
            from solver.policies import get_policy

            opts = dict(policy_opts or {})
            if o.arena_compat and policy in ("gavel", "sia") and "feasible" not in opts:
                from solver.arena.lookup import arena_dp_feasible

                opts["feasible"] = arena_dp_feasible()
            try:
                policy = get_policy(policy, **opts)
            except ValueError as exc:
                raise SimError(str(exc)) from None
        #: the site's usage (slurm_ext.sim.site; None: the cluster file has no [site])
        self.site_usage = (
            SiteUsage(cluster.site, cluster.total_gpus, self._clock, jobs[0].submit_time)
            if cluster.site is not None
            else None
        )
        self.policy = policy if self.site_usage is None else SiteFeed(policy, self.site_usage)
        self.restart_cost = restart_cost or restart_cost_for(self.policy_name, o)
        contention = o.contention if o.contention is not None else cluster.has_network and not o.arena_compat
        self.network = sim_network(cluster) if contention else None
        self.t0 = jobs[0].submit_time
        #: Arena's rounds (arena_compat), slurm_ext.sim.quantum
        self.quantum = QuantumMode(ARENA_ROUND_S, o.progress_model) if o.arena_compat else None
        self.trace = [self._quantized(j) for j in jobs] if o.arena_compat else jobs
        self.arrival_time = {j.job_id: j.submit_time for j in self.trace}
        self._state_dir = state_dir
        self.accounting = Accounting()
        preemption = SlurmPreemption.of_site(cluster.site)  # Slurm's own (slurm_ext.sim.preempt)
        if preemption is not None and o.arena_compat:
            raise SimError("Slurm's preemption (a QOS that preempts) is not modelled in arena-compat mode")
        self.world = SimWorld(
            cluster,
            speed=self._speed,
            restart_cost=self.restart_cost,
            checkpoint_s=o.checkpoint_s,
            start_delay_s=o.start_delay_s,
            min_job_age_s=o.min_job_age_s,
            quantum=self.quantum,
            start_time=self.t0,
            observers=(self.accounting, _Changes(self._on_event))
            + ((self.site_usage,) if self.site_usage is not None else ()),
            speed_factor=self._speed_factor if conditions is not None and conditions.noise else None,
            network=NetworkTruth(self.network) if self.network is not None else None,
            gate=self.site_usage.gate if self.site_usage is not None else None,
            preemption=preemption,
        )
        self.clock = self.world.clock
        #: what the controller talks to
        self.backend = SimBackend(self.world)
        #: the trace's jobs as Slurm jobs (slurm_ext.sim.submit)
        self.workload = wl = o.workload()
        #: each trace job's runtime (slurm_ext.sim.workload), and those whose script registers the hook (`Hooks`)
        self.runtimes = {
            j.job_id: wl.runtime_of(j, RequestedCell(cluster, estimator, j, max(o.max_gpus, j.requested_gpus)))
            for j in self.trace
        }
        self.hooked = frozenset(j.job_id for j in self.trace if wl.hooked(j, self.runtimes[j.job_id]))
        self.submitter = Submitter(
            self.backend, cluster, o, self._speed, self.site_usage, self.world, self.runtimes, wl.declared
        )
        self.slurm_ids = self.submitter.slurm_ids  # trace job id -> Slurm job id
        self.trace_ids = self.submitter.trace_ids  # Slurm job id -> trace job id
        self.samples: list[Sample] = []
        self.rounds: list[RoundStat] = []
        self.rounds_skipped = 0
        self.dirty = False
        self._sample_due = True
        self._next = 0  # next arrival
        self._last_round = -math.inf
        self._next_round = self.t0
        self._in_round = False
        self._round_events: list[tuple[str, str]] = []  # (kind, who) of the changes while a round ran
        self._wakes: list[float] = []  # times a round is due by the clock alone (`_wake_at`), a heap
        self.timings: dict[str, float] = {
            "round_s": 0.0,
            "solve_s": 0.0,
            "observe_s": 0.0,
            "apply_s": 0.0,
            "sample_s": 0.0,
            "backend_s": 0.0,
        }

    # --- plumbing ---------------------------------------------------------------

    def _quantized(self, job: TraceJob) -> TraceJob:
        """The job submitted at the start of the Arena round its arrival falls in."""
        k = math.floor((job.submit_time - self.t0) / ARENA_ROUND_S)
        return dataclasses.replace(job, submit_time=self.t0 + ARENA_ROUND_S * k)

    def _speed(
        self, spec: JobSpec, gpu_type: str, num_nodes: int, gpus_per_node: int, plan: JobPlan | None
    ) -> float | None:
        try:
            return self.speed(spec, gpu_type, num_nodes, gpus_per_node, plan)
        except (ValueError, KeyError):
            return None

    def _speed_factor(self, job_id: str, gpu_type: str) -> float:
        """The conditions' noise on the truth of a Slurm job (keyed by its trace job)."""
        assert self.conditions is not None
        return self.conditions.speed_factor(self.trace_ids.get(job_id, job_id), gpu_type)

    def _on_event(self, kind: str, who: str) -> None:
        """Something happened to job or node `who` (see _Changes): a sample is due, and a round
        when a job arrived, ended or was requeued, or a node changed (while a round ran: after
        it, see `_news`); a start or a requeue may make a round due later (`_wake_at`)."""
        self._sample_due = True
        cfg = self.options.solver
        if kind == "start" and cfg.min_run_s > 0:
            self._wake_at(self.clock.now + cfg.min_run_s)
        elif kind == "requeue" and cfg.preemption != "off" and cfg.preemption_backoff_s > 0:
            self._wake_at(self.clock.now + cfg.preemption_backoff_s)
        if kind in ("submit", "end", "requeue", "node"):
            self.dirty = True
            if self._in_round:
                self._round_events.append((kind, who))
            elif kind != "submit":
                self._want_round(self.clock.now)

    def _wake_at(self, t: float) -> None:
        """A change due at `t` by the clock alone (the module doc): a round is wanted then."""
        heapq.heappush(self._wakes, t)

    def _want_round(self, t: float) -> None:
        """A change at `t`: an early round (or the next interval round, when rounds are idle)."""
        o = self.options
        if o.early_rounds:
            self._next_round = min(self._next_round, max(t, self._last_round + o.min_gap_s))
        elif math.isinf(self._next_round):
            k = max(1, math.ceil((t - self._last_round) / o.interval_s)) if not math.isinf(self._last_round) else 0
            self._next_round = t if k == 0 else self._last_round + k * o.interval_s

    def _clock(self) -> float:
        return self.clock.now

    def _sleep(self, dt: float) -> None:
        """The controller waits inside a round: job events (and arrivals)
        happen, no round starts. In arena_compat mode events due now (a
        0-s checkpoint) are processed first without moving the clock."""
        if self.quantum is not None and self.world.due_now():
            self.world.advance(self.clock.now)
            return
        self._advance_to(self.clock.now + max(0.0, dt))

    def _progress(self, m: Any) -> JobProgress | None:
        done = self.world.iterations_done(m.job_id)
        if done is None:
            return None
        return JobProgress(done, self.world.first_step_at(m.job_id), self.world.iter_time(m.job_id))

    def _advance_to(self, t: float) -> None:
        """Arrivals and job events up to `t`, in time order; no rounds."""
        while True:
            t_ev = self.world.next_event_time()
            t_arr = (
                self.trace[self._next].submit_time
                if self._next < len(self.trace) and self.quantum is None
                else math.inf
            )
            nxt = min(t_ev, t_arr)
            if nxt > t:
                break
            if t_ev <= t_arr:
                self.world.advance(t_ev)
            else:
                self.world.advance(t_arr)
                while self._next < len(self.trace) and self.trace[self._next].submit_time <= t_arr:
                    self.submitter.submit(self.trace[self._next])
                    self._next += 1
                if not self._in_round:
                    self._want_round(t_arr)
            self._sample()
        self.world.advance(t)

    def _sample(self) -> None:
        if not self._sample_due or self.quantum is not None:
            return
        self._sample_due = False
        t0 = time.perf_counter()
        w = self.world
        s = Sample(w.now, w.num_pending(), w.num_running(), w.throughput(), w.gpus_used())
        if self.samples and self.samples[-1].time == s.time:
            self.samples[-1] = s
        elif not self.samples or (
            self.samples[-1].queued,
            self.samples[-1].running,
            self.samples[-1].throughput,
            dict(self.samples[-1].gpus_used),
        ) != (s.queued, s.running, s.throughput, dict(s.gpus_used)):
            self.samples.append(s)
        self.timings["sample_s"] += time.perf_counter() - t0

    def _round(self, controller: Controller) -> None:
        o = self.options
        self._last_round = self.clock.now
        if o.skip_idle_rounds and not self.dirty and self.rounds:
            self.rounds_skipped += 1
            self._next_round = math.inf
            return
        self.dirty = False
        self._in_round = True
        self._round_events = []
        try:
            report = controller.round()
        finally:
            self._in_round = False
        failed = sum(1 for a in report.actions if not a.get("ok", True))
        if report.status != RoundStatus.OK or failed:
            self.dirty = True  # the next interval round is not idle
        self.rounds.append(
            RoundStat(self._last_round, report.solve_s, report.total_s, report.num_jobs, len(report.actions))
        )
        for k in ("solve_s", "observe_s", "apply_s"):
            self.timings[k] += getattr(report, k)
        self.timings["round_s"] += report.total_s
        self._next_round = self._last_round + o.interval_s
        if _news(report, self._round_events):
            self._want_round(self.clock.now)
        self._sample_due = True
        self._sample()

    def _drained(self) -> bool:
        """Nothing left to happen: every arrival submitted, no job running or
        waiting to start on its own, no change the controller has not seen."""
        return self._next >= len(self.trace) and not self.world.has_active_jobs() and not self.dirty

    # --- running ------------------------------------------------------------------

    def run_key(self) -> str:
        """Names this run (label, policy, options, conditions, trace, cluster) in its checkpoints."""
        o, trace = self.options, self.trace
        what = (
            self.label,
            self.policy_name,
            dataclasses.asdict(o),
            self.conditions.describe() if self.conditions is not None else None,
            [(j.job_id, j.submit_time) for j in trace],
            self.cluster.gpus_by_type(),
        ) + ((self.cluster.site,) if self.cluster.site is not None else ())
        return f"{self.label}:{hashlib.sha256(repr(what).encode()).hexdigest()[:16]}"

    def run(
        self,
        progress_callback: Callable[[SimProgress], None] | None = None,
        *,
        checkpoint: str | Path | None = None,
        checkpoint_every_s: float = 600.0,
    ) -> SimRun:
        """Simulate to the end; `progress_callback` gets a SimProgress now and then.

        With `checkpoint` (a file path) the run is saved there every
        `checkpoint_every_s` seconds of wall time (slurm_ext.sim.checkpoint),
        its state DB in the folder ``<checkpoint>.state``, and when the file
        already holds this run (``run_key``), the run goes on from it instead
        of starting over, to the same result as far as a run repeats (the
        solver's wall-clock limit can bind on a loaded machine). Both are
        removed once the run is over. A run that starts over removes a state
        DB a run stopped before its first checkpoint left (its controller
        would take that run's jobs for its own). CheckpointError: the file holds
        another run."""
        if checkpoint is not None and Path(checkpoint).exists():
            from slurm_ext.sim.checkpoint import load

            sim, controller, wall_s = load(checkpoint, self.run_key())
            return sim._run(progress_callback, controller, Path(checkpoint), checkpoint_every_s, wall_s)
        return self._run(progress_callback, None, Path(checkpoint) if checkpoint else None, checkpoint_every_s, 0.0)

    def _run(
        self,
        progress_callback: Callable[[SimProgress], None] | None,
        controller: Controller | None,
        checkpoint: Path | None,
        checkpoint_every_s: float,
        wall_s_before: float,
    ) -> SimRun:
        """The run from `controller` on (None: from the start), `wall_s_before` spent on it already."""
        wall0 = time.perf_counter()
        tmp = None
        state_dir = self._state_dir
        if state_dir is None and checkpoint is not None:
            state_dir = Path(f"{checkpoint}.state")
        elif state_dir is None:
            tmp = tempfile.TemporaryDirectory(prefix="cellsched-sim-")
            state_dir = tmp.name
        state_path = Path(state_dir) / f"state-{file_stem(self.label)}.sqlite"
        if controller is None:
            self.log = LogCollector()
        restore = _set_for_run(self.log)
        state = None
        try:
            if controller is None:  # from the start: a state DB left there by a stopped run is not this run's
                sqlitedb.remove(state_path)
                state = StateStore(state_path)
                controller = self._controller(state, state_path)
            else:
                state = controller.state
            step = self._step_arena_round if self.quantum is not None else self._step_to_next_event
            last_report = last_save = time.perf_counter()
            while True:
                more = step(controller)
                now = time.perf_counter()
                if progress_callback is not None and (now - last_report > 0.5 or not more):
                    last_report = now
                    progress_callback(self.progress())
                if not more:
                    break
                if checkpoint is not None and now - last_save >= checkpoint_every_s:
                    from slurm_ext.sim.checkpoint import save

                    save(checkpoint, self.run_key(), (self, controller, wall_s_before + now - wall0))
                    last_save = time.perf_counter()
        finally:
            restore()
            if state is not None:
                state.close()
            if tmp is not None:
                tmp.cleanup()
        result = run_result(self, wall_s_before + time.perf_counter() - wall0)
        if checkpoint is not None:  # over: nothing to go on from
            checkpoint.unlink(missing_ok=True)
            if self._state_dir is None:
                shutil.rmtree(state_dir, ignore_errors=True)
        return result

    def _controller(self, state: StateStore, state_path: Path) -> Controller:
        config = Config(
            controller=ControllerConfig(
                policy=self.policy_name,
                state_path=str(state_path),
                interval_s=self.options.interval_s,
                min_gap_s=self.options.min_gap_s,
                checkpoint_root="/tmp/cellsched-sim",
                kick_file="",
                progress_rate_factor=math.inf
                if self.options.progress_rate_factor is None
                else self.options.progress_rate_factor,
                learn_declared_work=self.options.declared_error > 0,
            ),
            solver=dataclasses.replace(self.options.solver, seed=self.options.seed),
            network=network_config(self.network),
        )
        return Controller(
            config,
            backend=self.backend,
            state=state,
            policy=self.policy,
            estimator=self.estimator,
            clock=self._clock,
            sleep=self._sleep,
            progress=EachCall(self._progress),
            hooks=EachCall(Hooks(self.world, self.trace_ids, self.hooked)),
        )

    def _over_time(self, t: float) -> bool:
        return self.options.max_time_s is not None and t > self.t0 + self.options.max_time_s

    def _step_to_next_event(self, controller: Controller) -> bool:
        """The event-driven simulation (the default): to the next thing
        that happens, whichever comes first: a job event or an arrival
        (processed, which may ask for an early round), or a controller round
        (run). Samples whenever something changed. False when the
        simulation is over: no event left, or past max_time_s.

        Arena-compatible runs step by `_step_arena_round` instead: Arena's
        simulator works on a fixed grid of rounds, not on events, and the two
        differ in when arrivals are submitted, when a job's completion is
        seen, how often a round is considered and what a sample measures."""
        t_ev = self.world.next_event_time()
        t_arr = self.trace[self._next].submit_time if self._next < len(self.trace) else math.inf
        t_round = self._next_round
        if not self.options.skip_idle_rounds and self._drained():
            return False
        t_wake = self._wakes[0] if self._wakes and not self._drained() else math.inf
        t = min(t_ev, t_arr, t_round, t_wake)
        if math.isinf(t) or self._over_time(t):
            return False
        if t_wake <= t and t_ev > t and t_arr > t:
            heapq.heappop(self._wakes)
            self.world.advance(t)
            self.dirty = True
            self._want_round(t)
            return True
        if t_ev <= t or t_arr <= t:
            self._advance_to(t)
        else:
            self.world.advance(t)
            self._round(controller)
        self._sample()
        return True

    def _step_arena_round(self, controller: Controller) -> bool:
        """Arena-compatible mode: one round of Arena's fixed grid (every
        ARENA_ROUND_S from the first arrival, whether anything happened or
        not). At the round start T the round is settled (job events
        up to T, progress, the completions seen at T), the arrivals of
        [T, T + ARENA_ROUND_S) are submitted, the controller round runs (or
        is skipped when idle), and one sample is taken for the round. False
        when the simulation is over: nothing left (see `_drained`), or past
        max_time_s. See `_step_to_next_event` for why this is a step of
        its own."""
        assert self.quantum is not None
        T = self._next_round
        if self._over_time(T):
            return False
        if self._drained():
            return False
        self.quantum.settle(self.world, T)
        end = T + ARENA_ROUND_S
        while self._next < len(self.trace) and self.trace[self._next].submit_time < end:
            self.submitter.submit(self.trace[self._next])
            self._next += 1
        self._round(controller)
        self._round_sample(T)
        self._next_round = T + ARENA_ROUND_S
        return True

    def _round_sample(self, T: float) -> None:
        """Arena-compatible mode: one sample per round, as Arena counts it:
        the jobs running in [T, T + ARENA_ROUND_S) at their speed, each
        restarting job's share of the round lost to its restart charge taken
        off (QuantumMode.round_throughput)."""
        assert self.quantum is not None
        w = self.world
        s = Sample(T, w.num_pending(), w.num_running(), self.quantum.round_throughput(w, T), w.gpus_used())
        if self.samples and self.samples[-1].time == T:
            self.samples[-1] = s
        else:
            self.samples.append(s)

    def progress(self) -> SimProgress:
        done = sum(1 for sid in self.slurm_ids.values() if self.accounting.completed(sid))
        return SimProgress(
            self.clock.now,
            self.t0,
            self.trace[-1].submit_time,
            len(self.slurm_ids),
            done,
            len(self.trace),
            len(self.rounds),
        )


def _set_for_run(log: LogCollector) -> Callable[[], None]:
    """Set what a run needs of its process, and return what sets it back:
    the cellsched logger's records collected into `log` (the run's meta),
    not printed; full garbage collections rare (SIM_GC_THRESHOLD)."""
    logger = logging.getLogger("cellsched")
    saved = (logger.level, logger.propagate, gc.get_threshold())
    logger.addHandler(log)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    gc.set_threshold(*SIM_GC_THRESHOLD)

    def restore() -> None:
        logger.removeHandler(log)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        gc.set_threshold(*saved[2])

    return restore


def run_result(sim: Simulator, wall_s: float) -> SimRun:
    """What a finished run recorded: each trace job's outcome, the samples, the rounds and the run's meta."""
    outcomes = []
    for tj in sim.trace:
        sid = sim.slurm_ids.get(tj.job_id)
        if sid is None:
            outcomes.append(JobOutcome(tj.job_id, tj.submit_time, None, None, False))
            continue
        outcomes.append(sim.accounting.outcome(sid, tj.job_id, tj.submit_time))
    o = sim.options
    meta: dict[str, object] = {
        "mode": "arena-compat" if o.arena_compat else "event",
        "policy": sim.policy_name,
        "conditions": sim.conditions.describe() if sim.conditions is not None else None,
        "options": {k: v for k, v in dataclasses.asdict(o).items() if k != "solver"},
        "solver": dataclasses.asdict(dataclasses.replace(o.solver, seed=o.seed)),  # the config the rounds ran with
        "jobs": len(sim.trace),
        "not_submitted": dict(sim.submitter.skipped),
        "infeasible_starts": sim.accounting.infeasible_starts,
        "rounds_run": len(sim.rounds),
        "rounds_skipped": sim.rounds_skipped,
        "contention": sim.network is not None,
        "observe_calls": sim.world.observe_calls,
        "simulated_s": sim.clock.now - sim.t0,
        "timings_s": {k: round(v, 3) for k, v in sim.timings.items()},
        "controller_warnings": dict(sim.log.counts),
        "controller_warning_examples": list(sim.log.examples),
    }
    if sim.site_usage is not None:
        meta["site"] = sim.site_usage.summary()
    return SimRun(
        sim.label, tuple(outcomes), tuple(sim.samples), tuple(sim.rounds), sim.cluster.gpus_by_type(), wall_s, meta
    )


def sim_network(cluster: ClusterSpec) -> Network:
    """The simulated cluster's network: its NICs where the spec gives them,
    else each GPU type's default (solver.network)."""
    net = cluster_network(cluster)
    nics = {name: net.nic_gbps.get(name) or default_nic_gbps(t) for name, t, _ in node_names(cluster)}
    return Network(nics, dict(net.rack_of), dict(net.uplink_gbps))


def network_config(network: Network | None) -> NetworkConfig:
    """The controller's [network]: what an admin of the simulated cluster
    would write (each node's NIC, the racks, their uplinks); not modelled
    without contention."""
    if network is None:
        return NetworkConfig(modelled=False)
    racks: dict[str, list[str]] = {}
    for node, rack in network.rack_of.items():
        racks.setdefault(rack, []).append(node)
    return NetworkConfig(
        nodes=dict(network.nic_gbps),
        racks={r: ",".join(ns) for r, ns in racks.items()},
        uplink_gbps=dict(network.uplink_gbps),
    )


def simulate(trace: Sequence[TraceJob], cluster: ClusterSpec, policy: str, **kw: Any) -> SimRun:
    """Simulator(trace, cluster, policy, **kw).run()."""
    progress_callback = kw.pop("progress_callback", None)
    return Simulator(trace, cluster, policy, **kw).run(progress_callback)
