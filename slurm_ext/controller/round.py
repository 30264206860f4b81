"""One controller round: observe -> decide -> act (the Controller). The
daemon that repeats it is slurm_ext.controller.daemon; `cellsched plan` and
the simulator run single rounds."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from slurm_ext.backends import Backend, SlurmError, SlurmUnavailable, get_backend
from slurm_ext.config import Config
from slurm_ext.controller import inputs as inp
from slurm_ext.controller import metrics as mx
from slurm_ext.controller import relaunch
from slurm_ext.controller.context import RestoredIntent, RoundContext, RoundPhase
from slurm_ext.controller.declared import DeclaredWork
from slurm_ext.controller.hooks import STATIC_REASON, HookReader
from slurm_ext.controller.lease import FencedBackend, FileLease, LeaseLost
from slurm_ext.controller.limits import within_limits
from slurm_ext.controller.progress import Progress, ProgressReader
from slurm_ext.controller.reconcile import ActionKind, Waiting, apply, checked, decide, intent_outcomes
from slurm_ext.controller.report import RoundReport
from slurm_ext.controller.reports import JobReports
from slurm_ext.controller.round_metrics import declare_metrics, record_cluster, record_restarts, record_round
from slurm_ext.controller.speeds import Speeds
from slurm_ext.parse.values import ParseError
from slurm_ext.records import ClusterSnapshot, SlurmJob
from slurm_ext.site import SiteReading, allowed_partitions
from slurm_ext.state import HistoryEvent, JobRow, JobStatus, PlanStatus, RoundStatus, StateStore
from solver import contract
from solver.contract.plan import JobPlan, PlanError
from solver.estimator.protocol import EstimatorLike
from solver.policies import Policy
from solver.types import Placement, ScheduleReply, ScheduleRequest, size_key_of

log = logging.getLogger("cellsched.controller")

#: after the site's policy could not be read, the rounds of this many seconds go without one before a retry
SITE_RETRY_S = 60.0


def _make_policy(config: Config) -> Policy:
    from solver.policies import get_policy

    return get_policy(config.controller.policy)


def replans_all(last: float | None, now: float, interval_s: float) -> bool:
    """Whether the round at `now` re-plans every running job, the last one
    that did having begun at `last` (None: none has): always with an
    interval of 0, else once `interval_s` has passed (a partial round
    otherwise: SolverConfig.replan_interval_s)."""
    return interval_s <= 0 or last is None or not 0 <= now - last < interval_s


def finish_round(state: StateStore, round_id: int, report: RoundReport) -> None:
    """Record how the round ended in the state DB (a failure to is only logged)."""
    try:
        state.finish_round(
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


def marked(built: inp.Inputs, last: float | None, now: float, interval_s: float) -> tuple[inp.Inputs, float | None]:
    """The round's inputs, its request marked partial (replan_all false)
    unless it re-plans every running job (`replans_all`); and the start of
    the last round that did."""
    if replans_all(last, now, interval_s):
        return built, now
    return dataclasses.replace(built, request=dataclasses.replace(built.request, replan_all=False)), last


class Controller:
    """Runs rounds against one backend with one state DB."""

    replanned_at: float | None = None  #: the last whole round began then (replans_all); old checkpoints lack it

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
        self.stop = threading.Event()  # set: the round in progress stops waiting (daemon.run(stop=...) shares it)
        self.backend = backend or get_backend(
            cc.backend, **({"timeout": cc.slurm_timeout_s, "workers": cc.slurm_workers} if cc.backend == "cli" else {})
        )
        self.state = state or StateStore(cc.state_path, readonly=readonly)
        self.policy = policy or _make_policy(config)
        self.metrics = metrics or mx.Metrics()
        declare_metrics(self.metrics)
        #: what the jobs report (progress, checkpoint hooks, restarts, cells trained in)
        self.reports = JobReports(config, self.state, self.metrics, progress, hooks)
        #: what declared iterations turn out to be (None: the declared ones are believed)
        self.declared = DeclaredWork(self.reports.progress) if config.controller.learn_declared_work else None
        #: the estimates the policy decides with, calibrated by what jobs reach
        self.speeds = Speeds(config, self.state, estimator)
        self.estimator = self.speeds.estimator
        if lease is None and cc.lease_path and not readonly:
            lease = FileLease(cc.lease_path, cc.lease_s, cc.lease_settle_s)
        self.lease = lease
        self.observed: ClusterSnapshot | None = None  # what the last round saw of Slurm: the watcher counts from it
        self._standing_by = False  # the last round was a standby round
        self._site_failure = ""  # why the site's policy could not be read ("" : it could)
        self._site_retry_at = 0.0  # no new try to read it before (controller clock)
        self._site_dropped: tuple[str, ...] = ()  # what the last reading left out (logged when it changes)

    # --- one round --------------------------------------------------------

    def round(self, *, dry_run: bool = False) -> RoundReport:
        """Observe, solve, apply (not with `dry_run`). Never raises for
        Slurm being away or one bad job; records the round."""
        dry_run = dry_run or self.readonly
        started, t0 = self.clock(), time.perf_counter()
        self.observed = None
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
            finish_round(self.state, ctx.round_id, report)
        if self.lease is not None and report.status == RoundStatus.OK:
            self._standing_by = False
            self.lease.note_round(started + report.total_s)
        record_round(self.metrics, report, self.clock)
        return report

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
            (self._record_slurm_preemptions, live),  # what Slurm's preemption did to managed jobs
            (self._review_failures, both),  # runs that failed before training: relaunched or parked
            (self._record_failures, live),
            (self.reports.read_progress, both),  # how far each job is
            (self.reports.record_progress, live),  # restart costs measured, cells trained in
            (self.reports.read_hooks, both),  # which running jobs may be moved at all
            (self._read_site, both),  # the site's policy: limits, shares, reservations, access
            (self._build_request, both),  # 4. the solver's input
            (self.speeds.calibrate, both),  # the estimates corrected by what jobs reach
            (self.speeds.record_speeds, live),
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
        ctx.snap = self.observed = self.backend.observe()
        ctx.now = ctx.snap.taken_at
        ctx.observe_s = time.perf_counter() - ctx.t0
        ctx.listed = [j.job_id for j in ctx.snap.jobs]
        ctx.known = self.state.jobs(job_ids=ctx.listed)
        ctx.released = self.state.released(ctx.listed)
        ctx.parked = self.state.parked(ctx.listed)
        ctx.yielding = self.state.yielding(ctx.listed)
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
        ctx.jobs = inp.classify(ctx.snap, ctx.known, ctx.opens, ctx.released, ctx.parked, ctx.yielding)

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

    def _record_slurm_preemptions(self, ctx: RoundContext) -> None:
        journal_slurm_preemptions(self.state, ctx.jobs, ctx.now, ctx.round_id)

    def _review_failures(self, ctx: RoundContext) -> None:
        """Jobs whose run ended before training are requeued and placed again
        (slurm_ext.controller.relaunch): those that have trained (their own
        progress reports counted iterations) are never given up but parked
        when their runs keep failing; the jobs parked before stay parked."""
        ctx.failures = relaunch.review(
            ctx.jobs,
            self.reports.progress,
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
        cells that keep failing them (`excluded_cells`), each priced as the
        model it says it trains (the first shape it reported)."""
        cfg = self.config
        max_fail = cfg.controller.max_cell_failures
        ids = [m.job_id for m in ctx.jobs]  # the state's reads: this round's jobs, not every job it kept
        excluded = {
            j: excluded_cells(f, max_fail, ctx.proven.get(j, frozenset()))
            for j, f in self.state.cell_failures(ids).items()
        }
        ctx.built = inp.build_request(
            ctx.snap,
            ctx.jobs,
            ctx.prog.done,
            cfg.solver,
            excluded,
            restart_costs=self.state.restart_costs(ids),
            first_step_at=ctx.prog.first_step_at,
            network=cfg.network,
            static=ctx.moving.static,
            site=ctx.site,
            models=inp.trained_models(ctx.known, ctx.prog.models),
            preempted=self.state.preemptions(ctx.listed),
            restarts=self.state.restart_counts(ids),
        )
        if self.declared is not None:
            self.declared.observe(ctx.jobs)
            ctx.built = self.declared.applied(ctx.built)
        ctx.built, self.replanned_at = marked(ctx.built, self.replanned_at, ctx.now, cfg.solver.replan_interval_s)

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
        keeps its own unless moved or preempted) and the actions that make
        Slurm match them."""
        preempted = self._checked(ctx, dict(ctx.reply.preempted))
        lost = {v for v, p in preempted.items() if p not in ctx.desired}
        if lost:  # a preemptor whose placement was rejected takes nobody's GPUs
            preempted = self._checked(ctx, {v: p for v, p in preempted.items() if v not in lost})
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
            preempted=preempted,
        )
        ctx.actions, held_back = within_limits(ctx.actions, ctx.jobs, ctx.built.request)
        ctx.rejected.update(held_back)

    def _checked(self, ctx: RoundContext, preempted: dict[str, str]) -> dict[str, str]:
        """Set the round's `desired` placements and `rejected` ones with the
        running jobs in `preempted` giving up their GPUs; the preempted jobs
        left without a placement (victim -> preemptor)."""
        placed = {m.job_id for m in ctx.jobs if m.current is not None}
        request = ctx.built.request
        requests = {j.job_id: j for j in request.jobs}
        keep = _keep_running(ctx.jobs, ctx.reply.placements, ctx.moving.static, preempted)
        ctx.desired, ctx.rejected = checked(ctx.built.view, keep, placed, requests, request.site, request.now)
        return {v: p for v, p in preempted.items() if v not in ctx.desired}

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
            **ctx.reply.notes,
            **ctx.reply.reasons,
            **static,
            **ctx.built.skipped,
            **ctx.crashed,
            **ctx.rejected,
            **ctx.failed,
            **later,
        }
        ctx.statuses = tuple(_job_status(m, reasons, placed, ctx.prog, ctx.reply.notes) for m in ctx.jobs)

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
        record_restarts(self.metrics, self.state.restart_counts(m.job_id for m in ctx.jobs))
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


def journal_slurm_preemptions(
    state: StateStore, jobs: tuple[inp.ManagedJob, ...], now: float, round_id: int | None
) -> None:
    """A "slurm-preempted" event, once, for each managed job that Slurm
    preempts (its PreemptTime), and a "slurm-requeued" one for each time
    Slurm requeued one itself (Phase.SLURM_REQUEUED; the requeue's submit
    time): the journal says what Slurm did (docs/preemption.md)."""
    seen = {
        (j.job_id, HistoryEvent.SLURM_PREEMPTED, j.job.preempted_at) for j in jobs if j.job.preempted_at is not None
    } | {
        (j.job_id, HistoryEvent.SLURM_REQUEUED, j.job.submit_time)
        for j in jobs
        if j.phase == inp.Phase.SLURM_REQUEUED and j.job.submit_time is not None
    }
    ids = [job_id for job_id, _, _ in seen]
    events = (HistoryEvent.SLURM_PREEMPTED, HistoryEvent.SLURM_REQUEUED)
    known = {e: state.event_values(e, ids) for e in events}
    for job_id, event, value in sorted(seen, key=lambda s: (s[0], s[1])):
        if value in known[event].get(job_id, set()):
            continue
        state.add_history(job_id, event, now, round_id, value=value)
        log.warning(str(event).replace("-", " "), extra={"fields": {"job": job_id, "at": value}})


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


def _job_status(
    m: inp.ManagedJob, reasons: Mapping[str, str], placed: set[str], prog: Progress, notes: Mapping[str, str]
) -> JobStatus:
    """A managed job's status: `placed`: released this round (with the
    policy's note first, when it has one: a preemptor names its victims);
    `reasons`: why a job is where it is; `prog`: its progress and where it
    came from."""
    j = m.job
    phase = inp.Phase.RELEASED if m.job_id in placed else m.phase
    if m.job_id in placed:
        reason = f"{notes[m.job_id]}; released this round" if m.job_id in notes else "released this round"
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
    jobs: tuple[inp.ManagedJob, ...],
    placements: Mapping[str, Any],
    static: Collection[str] = (),
    preempted: Collection[str] = (),
) -> dict[str, Any]:
    """The policy's placements, except that a running job keeps its GPUs when
    it is not moved: it is not elastic, or it is `static` (controller.hooks),
    or the policy gave it no placement and did not preempt it (`preempted`),
    or it is checkpointing already."""
    out = dict(placements)
    for m in jobs:
        if m.current is None or m.phase not in (inp.Phase.RUNNING, inp.Phase.CHECKPOINTING):
            continue
        elastic = m.spec is not None and m.spec.elastic and m.phase == inp.Phase.RUNNING and m.job_id not in static
        if (m.job_id not in out and m.job_id not in preempted) or not elastic:
            out[m.job_id] = m.current
    return out
