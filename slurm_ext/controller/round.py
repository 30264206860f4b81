"""One controller round: observe -> decide -> act (the Controller). The
daemon that repeats it is slurm_ext.controller.daemon; `cellsched plan` and
the simulator run single rounds."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from slurm_ext.backends import Backend, SlurmError, SlurmUnavailable, get_backend
from slurm_ext.config import Config
from slurm_ext.controller import inputs as inp
from slurm_ext.controller import metrics as mx
from slurm_ext.controller import relaunch
from slurm_ext.controller.hooks import STATIC_REASON, HookFiles, HookReader, Movability, collect_movability
from slurm_ext.controller.lease import FencedBackend, FileLease, LeaseLost
from slurm_ext.controller.limits import within_limits
from slurm_ext.controller.progress import Progress, ProgressFiles, ProgressReader, collect_progress
from slurm_ext.controller.reconcile import Action, ActionKind, Outcome, Waiting, apply, checked, decide, intent_outcomes
from slurm_ext.controller.report import RoundReport
from slurm_ext.controller.round_metrics import declare_metrics, record_cluster, record_round
from slurm_ext.parse.values import ParseError
from slurm_ext.records import ClusterSnapshot, SlurmJob
from slurm_ext.site import SiteReading, allowed_partitions
from slurm_ext.state import HistoryEvent, JobRow, JobStatus, PlanRow, PlanStatus, RoundStatus, SpeedRow, StateStore
from solver import contract
from solver.calibration import CalibratedEstimator, Calibration, Observation, running_ratio
from solver.contention import NicAwareEstimator, contention_factors
from solver.contract.plan import JobPlan, PlanError
from solver.estimator.protocol import EstimatorLike
from solver.policies import Policy
from solver.types import Cell, JobRequest, Placement, ScheduleReply, ScheduleRequest, size_key_of

log = logging.getLogger("cellsched.controller")

#: calibration uses the speeds of this many (job, GPU type) pairs, the most recently seen
CALIBRATION_ROWS = 2000
#: a job first seen this many times slower (or faster) than its estimate is logged
NOTICED = 1.25
#: after the site's policy could not be read, the rounds of this many seconds go without one before a retry
SITE_RETRY_S = 60.0


def _make_policy(config: Config) -> Policy:
    from solver.policies import get_policy

    return get_policy(config.controller.policy)


def _make_estimator(config: Config) -> EstimatorLike:
    from solver.contract.profiles.seed import open_store
    from solver.estimator import Estimator
    from solver.mixed import MixedEstimator

    # Each job is priced by its own runtime (JobRequest.runtime, solver.cost.runtime): its gradient sync,
    # state layout and buffers; the constructor's grad_sync and byte counts are the simulator's (adaptive) only.
    shard = config.solver.state_sharding
    return MixedEstimator(
        Estimator(open_store(config.controller.profiles_path or None), state_sharding=shard), state_sharding=shard
    )


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
    # 4. the solver's input and reply, and the speeds running jobs reached (to record)
    built: inp.Inputs = field(init=False)
    speeds: dict[tuple[str, str], tuple[SpeedRow, JobRequest]] = field(default_factory=dict)
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


class Controller:
    """Runs rounds against one backend with one state DB."""

    def __init__(
        self,
        config: Config,
        *,
        backend: Backend | None = None,
        state: StateStore | None = None,
        policy: Policy | None = None,
        estimator: EstimatorLike | None = None,
        metrics: mx.Metrics | None = None,
        readonly: bool = False,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        progress: ProgressReader | None = None,
        lease: FileLease | None = None,
        hooks: HookReader | None = None,
    ) -> None:
        """`clock` / `sleep` are wall time on a real cluster and the
        simulator's clock in a simulation; `progress` tells how far a job is
        (default: the jobs' progress files, read as userfiles says); `lease`:
        the active/standby lease (default: the config's lease_path, if any;
        none for a read-only controller)."""
        self.config = config
        self.readonly = readonly
        self.clock = clock
        self.sleep = sleep
        cc = config.controller
        self.progress = progress or ProgressFiles(cc.read_timeout_s, cc.read_budget_s)
        self.hooks = hooks or HookFiles(cc.read_timeout_s, cc.read_budget_s)
        self._hooked: dict[str, float | None] = {}  # job -> start of the run whose hook is registered
        self._hook_notes: dict[str, str] = {}  # job -> why its hook file was not used (logged when it changes)
        self._doubts: dict[str, str] = {}  # job -> why its progress file was not used (logged when it changes)
        self._iter_s: dict[str, float] = {}  # job -> estimated iteration time of its cell at the last round
        self.stop = threading.Event()  # set: the round in progress stops waiting (daemon.run(stop=...) shares it)
        self.backend = backend or get_backend(
            cc.backend, **({"timeout": cc.slurm_timeout_s, "workers": cc.slurm_workers} if cc.backend == "cli" else {})
        )
        self.state = state or StateStore(cc.state_path, readonly=readonly)
        self.policy = policy or _make_policy(config)
        # the given estimator (or the profile store's) on the cluster's NICs: the uncalibrated estimates
        self._nic_estimator = NicAwareEstimator(estimator or _make_estimator(config))
        #: the policy's estimator: the NIC-aware one corrected by what jobs reach
        self.estimator = CalibratedEstimator(self._nic_estimator)
        self.metrics = metrics or mx.Metrics()
        declare_metrics(self.metrics)
        if lease is None and cc.lease_path and not readonly:
            lease = FileLease(cc.lease_path, cc.lease_s, cc.lease_settle_s)
        self.lease = lease
        self._standing_by = False  # the last round was a standby round
        self._site_failure = ""  # why the site's policy could not be read ("" : it could)
        self._site_retry_at = 0.0  # no new try to read it before (controller clock)
        self._site_dropped: tuple[str, ...] = ()  # what the last reading left out (logged when it changes)

    # --- one round --------------------------------------------------------

    def round(self, *, dry_run: bool = False) -> RoundReport:
        """Observe, solve, apply (not with `dry_run`). Never raises for
        Slurm being away or one bad job; records the round."""
        dry_run = dry_run or self.readonly
        started = self.clock()
        t0 = time.perf_counter()
        ctx = RoundContext(None if dry_run else self.state.begin_round(started), started, t0, dry_run)
        try:
            report = self._round(ctx)
        except LeaseLost as exc:  # standby: nothing was (or, fenced, nothing more is) changed in Slurm
            level = logging.DEBUG if self._standing_by else logging.INFO  # logged at info when it starts
            self._standing_by = True
            log.log(level, "standby", extra={"fields": {"round": ctx.round_id, "why": str(exc)}})
            report = _cut_short(ctx, RoundStatus.STANDBY, str(exc))
        except SlurmUnavailable as exc:
            self.metrics.inc("errors_total", labels={"kind": "slurm_unavailable"})
            log.warning("slurm unavailable", extra={"fields": {"round": ctx.round_id, "error": str(exc)}})
            report = _cut_short(ctx, RoundStatus.UNAVAILABLE, str(exc))
        except Exception as exc:  # a bug or an unexpected answer must not stop the daemon
            self.metrics.inc("errors_total", labels={"kind": "round"})
            log.exception("round failed", extra={"fields": {"round": ctx.round_id}})
            report = _cut_short(ctx, RoundStatus.ERROR, f"{type(exc).__name__}: {exc}")
        if ctx.round_id is not None:
            self._finish_round(ctx.round_id, report)
        if self.lease is not None and report.status == RoundStatus.OK:
            self._standing_by = False
            self.lease.note_round(started + report.total_s)
        record_round(self.metrics, report, self.clock)
        return report

    def _finish_round(self, round_id: int, report: RoundReport) -> None:
        """Record how the round ended in the state DB (a failure to is only logged)."""
        try:
            self.state.finish_round(
                round_id,
                status=report.status,
                duration_s=report.total_s,
                observe_s=report.observe_s,
                solve_s=report.solve_s,
                apply_s=report.apply_s,
                objective=report.objective,
                solver_status=report.solver_status,
                num_jobs=report.num_jobs,
                actions=report.actions,
                error=report.error or None,
            )
        except Exception:
            log.exception("could not record the round", extra={"fields": {"round": round_id}})

    def _round(self, ctx: RoundContext) -> RoundReport:
        """The round's phases (`_phases`) in order, then its report, metrics and log line."""
        for phase in self._phases(ctx.dry_run):
            phase(ctx)
        return self._report(ctx)

    def _phases(self, dry_run: bool) -> list[RoundPhase]:
        """The phases of a round, in order. Whether the round is a dry run is
        decided here, once: a dry run leaves out every phase that writes (to
        the state DB or to Slurm) and previews its actions instead of
        applying them; what it observes and decides is otherwise the same."""
        live, dry, both = not dry_run, dry_run, True
        phases: tuple[tuple[RoundPhase, bool], ...] = (
            (self._take_lease, live),  # a standby changes nothing
            (self._observe, both),  # 1. Slurm's snapshot, the state's rows of its jobs
            (self._rebuild, both),  # 2. work in flight that only the AdminComments show ...
            (self._journal_rebuilt, live),  # ... journalled again
            (self._classify, both),  # 3. the managed jobs and their phases
            (self._settle, live),  # remembered specs, ended intents
            (self._review_failures, both),  # runs that failed before training: relaunched or parked
            (self._record_failures, live),
            (self._read_progress, both),  # how far each job is
            (self._record_progress, live),  # restart costs measured, cells trained in
            (self._read_hooks, both),  # which running jobs may be moved at all
            (self._read_site, both),  # the site's policy: limits, shares, reservations, access
            (self._build_request, both),  # 4. the solver's input
            (self._calibrate, both),  # the estimates corrected by what jobs reach
            (self._record_speeds, live),
            (self._solve, both),
            (self._decide, both),  # 5. the actions that make Slurm match the placements
            (self._apply, live),
            (self._preview, dry),
            (self._statuses, both),  # 6. each job's status
            (self._record_statuses, live),
        )
        return [phase for phase, runs in phases if runs]

    def _take_lease(self, ctx: RoundContext) -> None:
        """Only the controller holding the lease acts; another stands by (LeaseLost)."""
        if self.lease is not None and not self.lease.acquire():
            raise LeaseLost(_standby_reason(self.lease))

    def _observe(self, ctx: RoundContext) -> None:
        ctx.snap = self.backend.observe()
        ctx.now = ctx.snap.taken_at
        ctx.observe_s = time.perf_counter() - ctx.t0
        ctx.listed = [j.job_id for j in ctx.snap.jobs]
        ctx.known = self.state.jobs(job_ids=ctx.listed)
        ctx.released = self.state.released(ctx.listed)
        ctx.parked = self.state.parked(ctx.listed)
        ctx.opens = self.state.open_plans()

    def _rebuild(self, ctx: RoundContext) -> None:
        """The state rebuilt from Slurm: the work in flight that the jobs'
        AdminComments show (contract.Step) and this state DB does not know
        (it has no plan of the job from the Step's time on: an empty or lost
        DB, or a standby's). A job held for a move or a placement, or
        checkpointing for a move, gets its intent journalled again
        (`ctx.rebuilt`, by `_journal_rebuilt`: the round then finishes it as
        its own); one requeued held is the controller's (not in `released`),
        a parked one parked. A held job that carries a plan but no Step, of
        which the DB knows no plan, was released and then held by its user
        or an operator: in `released`."""
        marked, unmarked = _marked_jobs(ctx.snap)
        if not marked and not unmarked:
            return
        known_at = self.state.newest_plan_times([*marked, *unmarked])
        ctx.released.update(j for j in unmarked if j not in known_at)
        for job_id, (job, step) in marked.items():
            if job_id in known_at and known_at[job_id] >= step.at - 1e-3:
                continue  # the state DB journalled this work (or newer)
            ctx.released.discard(job_id)
            if step.step == contract.PARKED:
                ctx.parked.add(job_id)
                continue
            row = restored_intent(job, step)
            if row is not None:
                ctx.rebuilt[job_id] = (job, step, row)

    def _journal_rebuilt(self, ctx: RoundContext) -> None:
        """Journal the intents `_rebuild` found. The jobs checkpointing for a
        move rebuilt now are signalled again (`ctx.resignal`: the Step is
        written before the signal, so one that died between the two never
        sent it; a second signal only repeats the request)."""
        for job_id, (_, step, row) in ctx.rebuilt.items():
            intent = self.state.begin_plan(
                job_id, None, row.cell, row.nodes, row.partition, row.plan_json, row.admin_comment, step.at
            )
            self.state.set_plan_status(intent, row.status, step.at)
            log.info(
                "intent rebuilt from slurm",
                extra={"fields": {"job": job_id, "step": step.step, "cell": row.cell, "status": row.status}},
            )
        ctx.resignal = {
            j for j, (job, step, _) in ctx.rebuilt.items() if step.step == contract.SIGNALLED and job.holds_resources
        }
        if ctx.rebuilt:
            ctx.opens = self.state.open_plans()

    def _classify(self, ctx: RoundContext) -> None:
        ctx.jobs = inp.classify(ctx.snap, ctx.known, ctx.opens, ctx.released, ctx.parked)

    def _settle(self, ctx: RoundContext) -> None:
        """Persist first accepted specs and refused ones; close the intents
        of jobs no longer held (reconcile.intent_outcomes) and classify the
        jobs again when any closed."""
        self._remember(ctx.jobs, ctx.known, ctx.now)
        settled = intent_outcomes(ctx.jobs, ctx.opens)
        for job_id, outcome in settled.items():
            self.state.set_plan_status(ctx.opens[job_id].id, outcome, ctx.now)
            ctx.opens.pop(job_id)
        if settled:
            self._classify(ctx)

    def _review_failures(self, ctx: RoundContext) -> None:
        """Jobs whose run ended before training are requeued and placed again
        (slurm_ext.controller.relaunch): those that have trained (their own
        progress reports counted iterations) are never given up but parked
        when their runs keep failing; the jobs parked before stay parked."""
        ctx.failures = relaunch.review(
            ctx.jobs,
            self.progress,
            self.state.run_failures(ctx.listed),
            self.config.controller.max_relaunches,
            relaunch.trained_jobs(ctx.known),
            self.state.trained_or_parked_at(ctx.listed),
            ctx.parked,
        )
        ctx.jobs = relaunch.apply_review(ctx.jobs, ctx.failures)

    def _record_failures(self, ctx: RoundContext) -> None:
        """A new run failure is recorded against its cell (and a parked job
        as parked). A parked job seen released (or run again) is managed
        again: an "unparked" event starts its count over."""
        for f in ctx.failures.values():
            if not f.new:
                continue
            self.state.add_history(f.job_id, HistoryEvent.RUN_FAILED, ctx.now, ctx.round_id, f.cell, value=f.end_time)
            self.metrics.inc("errors_total", labels={"kind": "run_failed"})
            log.warning(
                "run failed before training",
                extra={"fields": {"job": f.job_id, "cell": f.cell, "relaunch": f.relaunch, "reason": f.reason}},
            )
            if f.park:
                self.state.add_history(f.job_id, HistoryEvent.PARKED, ctx.now, ctx.round_id, f.cell)
                log.warning("job parked", extra={"fields": {"job": f.job_id, "reason": f.reason}})
        for m in ctx.jobs:
            if m.job_id in ctx.parked and m.phase not in (inp.Phase.PARKED, inp.Phase.FINISHED):
                self.state.add_history(m.job_id, HistoryEvent.UNPARKED, ctx.now, ctx.round_id)
                log.info("parked job released: managed again", extra={"fields": {"job": m.job_id, "phase": m.phase}})

    def _read_progress(self, ctx: RoundContext) -> None:
        """This round's progress: the jobs' own reports where believed
        (slurm_ext.controller.progress), read within the round's budget."""
        start_round = getattr(self.progress, "start_round", None)
        if start_round is not None:
            start_round()
        previous = {
            j: (r.iterations_done, r.updated if r.progress_at is None else r.progress_at)
            for j, r in ctx.known.items()
            if r.iterations_done is not None
        }
        # a job moved since the last round ran part of the time in its earlier cell: the faster one bounds it
        now_s = {m.job_id: m.current.iter_time_s for m in ctx.jobs if m.current is not None and m.current.iter_time_s}
        fastest = {j: min(s, self._iter_s.get(j, s)) for j, s in now_s.items()}
        self._iter_s = now_s
        ctx.prog = collect_progress(
            ctx.jobs,
            ctx.now,
            {j for j, r in ctx.known.items() if r.finished},
            self.progress,
            previous=previous,
            rate_factor=self.config.controller.progress_rate_factor,
            iter_times=fastest,
        )
        for job_id, why in ctx.prog.notes.items():
            if self._doubts.get(job_id) != why:
                log.warning("progress not used", extra={"fields": {"job": job_id, "why": why}})
                self.metrics.inc("errors_total", labels={"kind": "progress"})
        self._doubts = dict(ctx.prog.notes)
        ctx.proven = self.state.trained_cells(ctx.listed)

    def _record_progress(self, ctx: RoundContext) -> None:
        self._measure_restarts(ctx)
        self._record_trained(ctx)

    def _read_hooks(self, ctx: RoundContext) -> None:
        """The running jobs that may not be moved this round: their runtime
        checkpoints only through the script's hook, and its file does not
        name them for their current run yet (slurm_ext.controller.hooks).
        A hook file that cannot be used is logged once."""
        start_round = getattr(self.hooks, "start_round", None)
        if start_round is not None:
            start_round()
        ctx.moving, self._hooked = collect_movability(ctx.jobs, self.hooks, self._hooked)
        for job_id, why in ctx.moving.notes.items():
            if self._hook_notes.get(job_id) != why:
                log.warning("checkpoint hook not used", extra={"fields": {"job": job_id, "why": why}})
                self.metrics.inc("errors_total", labels={"kind": "hook"})
        self._hook_notes = dict(ctx.moving.notes)

    def _measure_restarts(self, ctx: RoundContext) -> None:
        """Restart cost of each moved job, once it runs again: from the
        signal to the end of the first step after the resume (the job's own
        progress record), less that step (the seconds per iteration it
        reports, else its cell's estimate): the step is work done, not lost.
        Stored as a "resumed" event; the solver charges it for the job's next
        move."""
        pending = self.state.pending_restarts()
        for m in ctx.jobs:
            signalled_at = pending.get(m.job_id)
            first = ctx.prog.first_step_at.get(m.job_id)
            if signalled_at is None or first is None or m.phase != inp.Phase.RUNNING or first <= signalled_at:
                continue
            step = ctx.prog.iter_time.get(m.job_id) or (m.current.iter_time_s if m.current else 0.0) or 0.0
            step = step if math.isfinite(step) else 0.0
            # the job's own word: bounded
            cost = min(max(0.0, first - signalled_at - step), self.config.controller.max_restart_cost_s)
            cell = m.current.cell.key() if m.current else ""
            self.state.add_history(m.job_id, HistoryEvent.RESUMED, ctx.now, ctx.round_id, cell, value=round(cost, 3))
            log.info("restart measured", extra={"fields": {"job": m.job_id, "restart_s": round(cost, 3)}})

    def _record_trained(self, ctx: RoundContext) -> None:
        """A "trained" event for each cell a running job has reported a step
        in since its run started, once per job and cell (`ctx.proven`,
        updated): the job fits there, whatever failed in other layouts of its
        size."""
        proven = ctx.proven
        for m in ctx.jobs:
            if m.phase != inp.Phase.RUNNING or m.current is None:
                continue
            if not relaunch.trained(m.job.start_time, ctx.prog.first_step_at.get(m.job_id)):
                continue  # no step yet, or only an earlier run's
            key = m.current.cell.key()
            if key in proven.get(m.job_id, ()):
                continue
            self.state.add_history(m.job_id, HistoryEvent.TRAINED, ctx.now, ctx.round_id, key)
            proven[m.job_id] = proven.get(m.job_id, frozenset()) | {key}

    def _read_site(self, ctx: RoundContext) -> None:
        """The site's standing policy, read from Slurm each round (the
        backend's `read_site`; one without accounting reads an empty one).
        When it cannot be read (no slurmdbd, say) the round goes on without
        it: one warning, and no new try for SITE_RETRY_S seconds."""
        ctx.site = SiteReading()
        if self.clock() < self._site_retry_at:
            return
        try:
            ctx.site = self.backend.read_site()
        except (SlurmError, ParseError, OSError, ValueError) as exc:
            self._site_retry_at = self.clock() + SITE_RETRY_S
            if str(exc) != self._site_failure:
                log.warning(
                    "site policy not read: scheduling without accounts, limits, fair share and reservations",
                    extra={"fields": {"error": str(exc), "retry_s": SITE_RETRY_S}},
                )
            self._site_failure = str(exc)
            return
        if self._site_failure:
            log.info("site policy read again")
            self._site_failure = ""
        if ctx.site.dropped != self._site_dropped:
            self._site_dropped = ctx.site.dropped
            if ctx.site.dropped:
                log.warning("site policy: parts not used", extra={"fields": {"dropped": list(ctx.site.dropped)}})

    def _build_request(self, ctx: RoundContext) -> None:
        """The solver's input: the jobs in a scheduled phase, kept out of the
        cells that keep failing them (`excluded_cells`)."""
        cfg = self.config
        max_fail = cfg.controller.max_cell_failures
        excluded = {
            j: excluded_cells(f, max_fail, ctx.proven.get(j, frozenset()))
            for j, f in self.state.cell_failures().items()
        }
        ctx.built = inp.build_request(
            ctx.snap,
            ctx.jobs,
            ctx.prog.done,
            cfg.solver,
            excluded,
            restart_costs=self.state.restart_costs(),
            first_step_at=ctx.prog.first_step_at,
            network=cfg.network,
            static=ctx.moving.static,
            site=ctx.site,
        )

    def _calibrate(self, ctx: RoundContext) -> None:
        """Correct the estimates by the iteration times running jobs report
        (solver.calibration; off with the solver's `calibrate`): each
        report is a ratio to the uncalibrated estimate of the job's cell, on
        its nodes next to the other running jobs (solver.contention), kept
        per job and GPU type in the state DB (the newest CALIBRATION_ROWS
        rows calibrate; this round's are `ctx.speeds`, for `_record_speeds`)."""
        request = ctx.built.request
        self._nic_estimator.set_cluster(request.cluster)
        if self.estimator.refresh():  # the profile store may have changed
            log.info("profile store changed: estimates recomputed")
        if not self.config.solver.calibrate:
            self.estimator.calibration = Calibration()
            return
        rows = {(r.job_id, r.gpu_type): r for r in self.state.speeds(limit=CALIBRATION_ROWS)}
        for job, cell, est_s, load in self._uncalibrated(request):
            t = ctx.prog.iter_time.get(job.job_id)
            if t is None:
                continue
            row = _speed_row(job, cell, est_s, load, t, rows.get((job.job_id, cell.gpu_type)), ctx.now)
            rows[(job.job_id, cell.gpu_type)] = row
            ctx.speeds[(job.job_id, cell.gpu_type)] = (row, job)
        bound = self.config.controller.progress_rate_factor
        self.estimator.calibration = Calibration(
            (Observation(r.job_id, r.user, r.model, r.gpu_type, r.ratio, r.samples) for r in rows.values()),
            max_factor=bound if math.isfinite(bound) else 10.0,
        )

    def _uncalibrated(self, request: ScheduleRequest) -> list[tuple[JobRequest, Cell, float, float]]:
        """(job, cell, uncalibrated estimate (s per iteration), load factor)
        of each running job in a single-type cell that the estimator prices:
        what other jobs on its links cost a job is the placement's, not the
        job's speed (solver.contention)."""
        alone: dict[str, tuple[JobRequest, Placement, float]] = {}
        for job in request.jobs:
            if job.current is not None and not job.current.cell.mixed:
                est = self._nic_estimator.estimate(job, job.current.cell)
                if est.feasible:
                    alone[job.job_id] = (job, job.current, est.iter_time_s)
        loaded = contention_factors(alone.values(), request.cluster)
        return [(job, p.cell, est_s, loaded.get(job.job_id, 1.0)) for job, p, est_s in alone.values()]

    def _record_speeds(self, ctx: RoundContext) -> None:
        """Store this round's speeds with the calibrated estimate of each."""
        if not ctx.speeds:
            return
        self.state.record_speeds(
            dataclasses.replace(row, calibrated_s=self.estimator.estimate(job, _current(job).cell).iter_time_s)
            for row, job in ctx.speeds.values()
        )

    def _solve(self, ctx: RoundContext) -> None:
        t1 = time.perf_counter()
        ctx.reply, ctx.crashed = self._schedule(ctx.built.request)
        ctx.solve_s = time.perf_counter() - t1

    def _schedule(self, request: ScheduleRequest) -> tuple[ScheduleReply, dict[str, str]]:
        """The policy's reply. Should the policy fail, the jobs it fails on
        are found (each new job solved alone next to the placed ones) and left
        out, so one job the solver cannot handle does not stop the others."""
        try:
            return self.policy.schedule(request, self.estimator), {}
        except Exception as exc:
            log.error(
                "solver failed; looking for the job it fails on",
                extra={"fields": {"error": f"{type(exc).__name__}: {exc}"}},
            )
        placed = tuple(j for j in request.jobs if j.current is not None)
        bad: dict[str, str] = {}
        for job in request.jobs:
            if job.current is not None:
                continue
            try:
                self.policy.schedule(dataclasses.replace(request, jobs=placed + (job,)), self.estimator)
            except Exception as exc:
                bad[job.job_id] = f"the solver fails on this job: {type(exc).__name__}: {exc}"
                self.metrics.inc("errors_total", labels={"kind": "solver_job"})
                log.error("solver fails on job", extra={"fields": {"job": job.job_id, "error": bad[job.job_id]}})
        rest = tuple(j for j in request.jobs if j.job_id not in bad)
        return self.policy.schedule(dataclasses.replace(request, jobs=rest), self.estimator), bad

    def _decide(self, ctx: RoundContext) -> None:
        """The placements that can be carried out together (a running job
        keeps its own unless moved) and the actions that make Slurm match them."""
        placed = {m.job_id for m in ctx.jobs if m.current is not None}
        request = ctx.built.request
        requests = {j.job_id: j for j in request.jobs}
        keep = _keep_running(ctx.jobs, ctx.reply.placements, ctx.moving.static)
        ctx.desired, ctx.rejected = checked(ctx.built.view, keep, placed, requests, request.site, request.now)
        for job_id, why in ctx.rejected.items():
            log.error("placement rejected", extra={"fields": {"job": job_id, "error": why}})
            self.metrics.inc("errors_total", labels={"kind": "invalid_placement"})
        cc = self.config.controller
        ctx.actions = decide(
            ctx.jobs,
            ctx.desired,
            ctx.built.view,
            cc.checkpoint_root,
            now=ctx.now,
            checkpoint_timeout_s=cc.checkpoint_timeout_s,
            resignal=ctx.resignal,
            static=ctx.moving.static,
            partitions=allowed_partitions(ctx.built.request),
        )
        ctx.actions, held_back = within_limits(ctx.actions, ctx.jobs, ctx.built.request)
        ctx.rejected.update(held_back)

    def _apply(self, ctx: RoundContext) -> None:
        """Carry the actions out (reconcile.apply), fenced by the lease."""
        cc = self.config.controller
        t2 = time.perf_counter()
        waiting = Waiting(cc.checkpoint_wait_s, cc.checkpoint_poll_s, self.sleep, self.stop.is_set)
        backend: Any = self.backend
        if self.lease is not None:
            self.lease.check()  # fencing: a controller that lost the lease mid-round applies nothing
            backend = FencedBackend(self.backend, self.lease.fence)  # ... and stops when it loses it applying
        ctx.outcomes = apply(
            ctx.actions,
            backend,
            self.state,
            ctx.round_id,
            self.clock,
            waiting,
            batch=cc.apply_batch,
            budget_s=cc.apply_budget_s,
        )
        ctx.apply_s = time.perf_counter() - t2
        ctx.summaries = tuple(o.summary() for o in ctx.outcomes)

    def _preview(self, ctx: RoundContext) -> None:
        """A dry run's actions: shown, not carried out."""
        ctx.summaries = tuple(a.summary() for a in ctx.actions)

    def _statuses(self, ctx: RoundContext) -> None:
        """Each managed job's status: its phase (released, for a job placed
        this round) and why it is where it is."""
        ctx.failed = {o.action.job_id: o.error for o in ctx.outcomes if not o.ok}
        later = {o.action.job_id: o.error for o in ctx.outcomes if o.ok and o.error}  # deferred, still checkpointing
        placed = {
            o.action.job_id
            for o in ctx.outcomes
            if o.ok and o.action.kind in (ActionKind.PLACE, ActionKind.MOVE) and not o.error
        }
        static = {
            j: f"{STATIC_REASON}; {ctx.moving.notes[j]}" if j in ctx.moving.notes else STATIC_REASON
            for j in ctx.moving.static
        }
        reasons = {
            **ctx.reply.reasons,
            **static,
            **ctx.built.skipped,
            **ctx.crashed,
            **ctx.rejected,
            **ctx.failed,
            **later,
        }
        ctx.statuses = tuple(_job_status(m, reasons, placed, ctx.prog) for m in ctx.jobs)

    def _record_statuses(self, ctx: RoundContext) -> None:
        """Store the statuses; a "finished" event for each job that ended; the jobs Slurm forgot vanish."""
        self.state.save_statuses(ctx.statuses, ctx.now)
        for m in ctx.jobs:
            row = ctx.known.get(m.job_id)
            if m.phase == inp.Phase.FINISHED and (row is None or not row.finished):
                self.state.add_history(m.job_id, HistoryEvent.FINISHED, ctx.now, ctx.round_id, m.job.state, "")
        self.state.mark_vanished({j.job_id for j in ctx.snap.jobs}, ctx.now)

    def _report(self, ctx: RoundContext) -> RoundReport:
        """The round's report, its metrics and its log line."""
        for o in ctx.outcomes:
            self.metrics.inc("actions_total", labels={"kind": o.action.kind, "result": "ok" if o.ok else "failed"})
        record_cluster(self.metrics, ctx.snap, ctx.jobs)
        report = RoundReport(
            ctx.round_id,
            RoundStatus.OK,
            ctx.started,
            ctx.observe_s,
            ctx.solve_s,
            ctx.apply_s,
            time.perf_counter() - ctx.t0,
            ctx.reply.status,
            float(ctx.reply.objective),
            len(ctx.built.request.jobs),
            ctx.summaries,
            ctx.statuses,
            {j: _placement_shown(p) for j, p in ctx.desired.items()},
            dry_run=ctx.dry_run,
        )
        fields = {
            "round": ctx.round_id,
            "status": report.status,
            "jobs": report.num_jobs,
            "actions": len(ctx.summaries),
            "failed": len(ctx.failed),
            "solver": ctx.reply.status,
            "observe_s": round(report.observe_s, 3),
            "solve_s": round(ctx.solve_s, 3),
            "apply_s": round(ctx.apply_s, 3),
            "total_s": round(report.total_s, 3),
            "dry_run": ctx.dry_run,
        }
        log.info("round", extra={"fields": fields})
        return report

    def _remember(self, jobs: tuple[inp.ManagedJob, ...], known: Mapping[str, JobRow], now: float) -> None:
        """Persist first accepted specs and refused ones (one job at a time)."""
        for m in jobs:
            row = known.get(m.job_id)
            if row is not None and inp.reused(row, m.job):
                self.state.retire(m.job_id)
                row = None
            if m.spec_json is not None and m.spec_source != "state":
                self.state.accept_spec(m.job_id, m.job.user, m.spec_json, m.spec_source, now)
                log.info(
                    "job accepted", extra={"fields": {"job": m.job_id, "user": m.job.user, "spec_from": m.spec_source}}
                )
            elif m.phase == inp.Phase.BAD and (row is None or row.bad_reason != m.reason):
                self.state.mark_bad(m.job_id, m.job.user, m.reason, now)
                self.metrics.inc("errors_total", labels={"kind": "bad_spec"})
                log.warning("job refused", extra={"fields": {"job": m.job_id, "user": m.job.user, "reason": m.reason}})


def _cut_short(ctx: RoundContext, status: RoundStatus, error: str) -> RoundReport:
    """The report of a round that ended early (standby, Slurm away, a bug):
    the durations of the phases it got through."""
    return RoundReport(
        ctx.round_id,
        status,
        ctx.started,
        observe_s=ctx.observe_s,
        solve_s=ctx.solve_s,
        total_s=time.perf_counter() - ctx.t0,
        error=error,
        dry_run=ctx.dry_run,
    )


def _marked_jobs(snap: ClusterSnapshot) -> tuple[dict[str, tuple[SlurmJob, contract.Step]], list[str]]:
    """The jobs whose AdminComment shows work in flight (a Step, on a held
    job or one checkpointing for a move: a job released since is tidied, one
    finished is left), and the held jobs that carry a plan but no Step."""
    marked = {}
    unmarked = []
    for job in snap.jobs:
        step = inp.admin_comment_step(job.admin_comment)
        if step is not None and (job.held or (step.step == contract.SIGNALLED and job.holds_resources)):
            marked[job.job_id] = (job, step)
        elif step is None and job.held and not job.finished and inp.admin_comment_plan(job.admin_comment):
            unmarked.append(job.job_id)
    return marked, unmarked


def _current(job: JobRequest) -> Placement:
    assert job.current is not None  # only running jobs have speeds
    return job.current


def _speed_row(
    job: JobRequest, cell: Cell, est_s: float, load: float, t: float, prev: SpeedRow | None, now: float
) -> SpeedRow:
    """A running job's speed in `cell`: `t` s per iteration against the
    uncalibrated estimate `est_s` times the `load` of its links, kept as a
    running ratio with the earlier rounds' (`prev`). A job first seen far
    from its estimate (NOTICED) is logged."""
    ratio, n = running_ratio((prev.ratio, prev.samples) if prev else None, t / (est_s * load))
    row = SpeedRow(job.job_id, cell.gpu_type, job.user, job.model.name, cell.key(), est_s, t, ratio, n, None, now)
    if prev is None and abs(math.log(ratio)) > math.log(NOTICED):
        fields = {"job": job.job_id, "cell": row.cell, "estimated_s": round(est_s, 4), "observed_s": round(t, 4)}
        log.warning("job speed differs from its estimate", extra={"fields": fields})
    return row


def _job_status(m: inp.ManagedJob, reasons: Mapping[str, str], placed: set[str], prog: Progress) -> JobStatus:
    """A managed job's status: `placed`: released this round; `reasons`: why
    a job is not placed; `prog`: its progress and where it came from."""
    j = m.job
    phase = inp.Phase.RELEASED if m.job_id in placed else m.phase
    if m.job_id in placed:
        reason = "released this round"
    elif m.job_id in reasons:
        reason = reasons[m.job_id]
    elif m.phase == inp.Phase.RELEASED:
        reason = f"released; Slurm: {j.reason}" if j.reason and j.reason != "None" else "released"
    else:
        reason = m.reason
    if m.job_id in prog.notes:
        reason = f"{reason}; {prog.notes[m.job_id]}" if reason else prog.notes[m.job_id]
    return JobStatus(
        m.job_id,
        j.user,
        j.state,
        phase,
        reason,
        j.submit_time,
        j.start_time,
        j.end_time if j.finished else None,
        j.exit_code,
        prog.done.get(m.job_id),
        prog.source.get(m.job_id),
        m.phase == inp.Phase.FINISHED,
    )


def _placement_shown(p: Placement) -> dict:
    """A placement as the report shows it."""
    return {
        "cell": p.cell.key(),
        "nodes": [f"{n}:{g}" for n, g in p.nodes],
        "pp": p.plan.pp,
        "dp": p.plan.dp,
        "tp": p.plan.tp,
    }


def _standby_reason(lease: FileLease) -> str:
    """Why this controller is standing by: who holds the lease, until when."""
    try:
        rec = lease.read()
    except OSError as exc:
        return f"the lease file cannot be read: {exc}"
    if rec is None:
        return "the lease was not taken (another controller took it first)"
    return f"the lease is held by {rec.holder} (epoch {rec.epoch}) until {rec.expires_at:.3f}"


def excluded_cells(failures: Mapping[str, int], max_failures: int, trained_in: Collection[str] = ()) -> frozenset[str]:
    """The cells a job is kept out of: a cell that failed it `max_failures`
    times, and every layout of a size (Cell.size_key: GPU type, GPU count,
    stages; what decides whether it fits in memory) whose layouts together
    failed it that often. Never a cell in `trained_in` (the job has trained
    there) nor its size: the job fits there, so it always keeps somewhere to
    run and is never stranded by failures elsewhere."""
    proven_sizes = {size_key_of(c) for c in trained_in}
    sizes: dict[str, int] = {}
    for key, n in failures.items():
        size = size_key_of(key)
        if size is not None:
            sizes[size] = sizes.get(size, 0) + n
    cells = {c for c, n in failures.items() if n >= max_failures and c not in trained_in}
    return frozenset(cells | {s for s, n in sizes.items() if n >= max_failures and s not in proven_sizes})


class RestoredIntent(NamedTuple):
    """The intent a job's Step stands for (`restored_intent`), as the state DB journals it."""

    cell: str
    nodes: tuple[tuple[str, int], ...]
    partition: str
    plan_json: str
    admin_comment: str
    status: PlanStatus


def restored_intent(job: SlurmJob, step: contract.Step) -> RestoredIntent | None:
    """(cell, nodes, partition, plan JSON, AdminComment, status) of the intent
    a job's Step stands for: a move signalled (its target, from the Step)
    or a job updated for its release (the plan it carries); None for a Step
    that stands for no intent (requeued, parked) or cannot be read, or whose
    plan names no GPUs per node."""
    try:
        if step.step == contract.SIGNALLED and step.to is not None:
            plan = JobPlan.from_dict(step.to)
            spec = contract.admin_comment_spec(job.admin_comment)
            if spec is None:
                return None
            admin, partition, status = contract.encode_admin_comment(spec, plan), step.partition, PlanStatus.SIGNALLED
        elif step.step == contract.UPDATED and job.held:
            held = contract.admin_comment_plan(job.admin_comment)
            if held is None:
                return None
            plan = held
            admin, partition, status = contract.with_step(job.admin_comment, None), job.partition, PlanStatus.UPDATED
        else:
            return None
    except PlanError:
        return None
    if plan.gpus_per_node is None:
        return None  # describes no placement (and "node:None" would make the journal unreadable)
    nodes = tuple((n, plan.gpus_per_node) for n in plan.nodes)
    return RestoredIntent(plan.cell or "", nodes, partition, plan.to_json(), admin, status)


def _keep_running(
    jobs: tuple[inp.ManagedJob, ...], placements: Mapping[str, Any], static: Collection[str] = ()
) -> dict[str, Any]:
    """The policy's placements, except that a running job keeps its GPUs when
    it is not moved: it is not elastic, or it is `static` (controller.hooks),
    or the policy gave it no placement (the controller does not preempt), or
    it is checkpointing already."""
    out = dict(placements)
    for m in jobs:
        if m.current is None or m.phase not in (inp.Phase.RUNNING, inp.Phase.CHECKPOINTING):
            continue
        elastic = m.spec is not None and m.spec.elastic and m.phase == inp.Phase.RUNNING and m.job_id not in static
        if m.job_id not in out or not elastic:
            out[m.job_id] = m.current
    return out
