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
from typing import Any

from slurm_ext.backends import Backend, SlurmUnavailable, get_backend
from slurm_ext.config import Config
from slurm_ext.controller import inputs as inp
from slurm_ext.controller import metrics as mx
from slurm_ext.controller import relaunch
from slurm_ext.controller.lease import FencedBackend, FileLease, LeaseLost
from slurm_ext.controller.progress import Progress, ProgressFiles, ProgressReader, collect_progress
from slurm_ext.controller.reconcile import MOVE, PLACE, Outcome, Waiting, apply, checked, decide, intent_outcomes
from slurm_ext.controller.report import RoundReport
from slurm_ext.controller.round_metrics import declare_metrics, record_cluster, record_round
from slurm_ext.records import ClusterSnapshot, SlurmJob
from slurm_ext.state import HistoryEvent, JobStatus, PlanRow, PlanStatus, RoundStatus, SpeedRow, StateStore
from solver import contract
from solver.calibration import CalibratedEstimator, Calibration, Observation, running_ratio
from solver.contention import NicAwareEstimator, contention_factors
from solver.plan import JobPlan, PlanError
from solver.types import EstimatorLike, Policy, ScheduleReply, ScheduleRequest, size_key_of

log = logging.getLogger("cellsched.controller")

#: calibration uses the speeds of this many (job, GPU type) pairs, the most recently seen
CALIBRATION_ROWS = 2000
#: a job first seen this many times slower (or faster) than its estimate is logged
NOTICED = 1.25


def _make_policy(config: Config) -> Policy:
    from solver.policies import get_policy

    return get_policy(config.controller.policy)


def _make_estimator(config: Config) -> EstimatorLike:
    from solver.estimator import Estimator
    from solver.mixed import MixedEstimator
    from solver.profiles.seed import open_store

    shard = config.solver.state_sharding
    return MixedEstimator(
        Estimator(open_store(config.controller.profiles_path or None), state_sharding=shard), state_sharding=shard
    )


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
        self._doubts: dict[str, str] = {}  # job -> why its progress file was not used (logged when it changes)
        self._iter_s: dict[str, float] = {}  # job -> estimated iteration time of its cell at the last round
        self.stop = threading.Event()  # set: the round in progress stops waiting (daemon.run(stop=...) shares it)
        self.backend = backend or get_backend(
            config.controller.backend,
            **(
                {"timeout": config.controller.slurm_timeout_s, "workers": config.controller.slurm_workers}
                if config.controller.backend == "cli"
                else {}
            ),
        )
        self.state = state or StateStore(config.controller.state_path, readonly=readonly)
        self.policy = policy or _make_policy(config)
        #: the policy's estimator: the given one (or the profile store's) on the cluster's NICs,
        #: corrected by what jobs reach
        self.estimator = CalibratedEstimator(NicAwareEstimator(estimator or _make_estimator(config)))
        self.metrics = metrics or mx.Metrics()
        declare_metrics(self.metrics)
        if lease is None and cc.lease_path and not readonly:
            lease = FileLease(cc.lease_path, cc.lease_s, cc.lease_settle_s)
        self.lease = lease
        self._standing_by = False  # the last round was a standby round

    # --- one round --------------------------------------------------------

    def round(self, *, dry_run: bool = False) -> RoundReport:
        """Observe, solve, apply (not with `dry_run`). Never raises for
        Slurm being away or one bad job; records the round."""
        dry_run = dry_run or self.readonly
        started = self.clock()
        t0 = time.perf_counter()
        round_id = None if dry_run else self.state.begin_round(started)
        timings: dict[str, float] = {}
        try:
            if self.lease is not None and not dry_run and not self.lease.acquire():
                raise LeaseLost(_standby_reason(self.lease))
            report = self._round(round_id, started, t0, dry_run, timings)
        except LeaseLost as exc:  # standby: nothing was (or, fenced, nothing more is) changed in Slurm
            level = logging.DEBUG if self._standing_by else logging.INFO  # logged at info when it starts
            self._standing_by = True
            log.log(level, "standby", extra={"fields": {"round": round_id, "why": str(exc)}})
            report = RoundReport(
                round_id,
                RoundStatus.STANDBY,
                started,
                total_s=time.perf_counter() - t0,
                error=str(exc),
                dry_run=dry_run,
                **timings,
            )
        except SlurmUnavailable as exc:
            self.metrics.inc("errors_total", labels={"kind": "slurm_unavailable"})
            log.warning("slurm unavailable", extra={"fields": {"round": round_id, "error": str(exc)}})
            report = RoundReport(
                round_id,
                RoundStatus.UNAVAILABLE,
                started,
                total_s=time.perf_counter() - t0,
                error=str(exc),
                dry_run=dry_run,
                **timings,
            )
        except Exception as exc:  # a bug or an unexpected answer must not stop the daemon
            self.metrics.inc("errors_total", labels={"kind": "round"})
            log.exception("round failed", extra={"fields": {"round": round_id}})
            report = RoundReport(
                round_id,
                RoundStatus.ERROR,
                started,
                total_s=time.perf_counter() - t0,
                error=f"{type(exc).__name__}: {exc}",
                dry_run=dry_run,
                **timings,
            )
        if round_id is not None:
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
        if self.lease is not None and report.status == RoundStatus.OK:
            self._standing_by = False
            self.lease.note_round(started + report.total_s)
        record_round(self.metrics, report, self.clock)
        return report

    def _round(
        self, round_id: int | None, started: float, t0: float, dry_run: bool, timings: dict[str, float]
    ) -> RoundReport:
        cfg = self.config
        snap = self.backend.observe()
        now = snap.taken_at
        timings["observe_s"] = time.perf_counter() - t0

        listed = [j.job_id for j in snap.jobs]  # Slurm's jobs: the state's other rows are history
        known = self.state.jobs(job_ids=listed)
        released = self.state.released(listed)
        parked = self.state.parked(listed)
        opens = self.state.open_plans()
        opens, resignal = self._from_slurm(snap, opens, released, parked, dry_run)
        jobs = inp.classify(snap, known, opens, released, parked)
        if not dry_run:
            self._remember(jobs, known, now)
            settled = intent_outcomes(jobs, opens)
            for job_id, outcome in settled.items():
                self.state.set_plan_status(opens[job_id].id, outcome, now)
                opens.pop(job_id)
            if settled:
                jobs = inp.classify(snap, known, opens, released, parked)
        jobs = self._review_failures(jobs, listed, now, round_id, dry_run, relaunch.trained_jobs(known), parked)

        prog = self._progress(jobs, known, now)
        progress, progress_src = prog.done, prog.source
        proven = self.state.trained_cells(listed)
        if not dry_run:
            self._measure_restarts(jobs, prog.first_step_at, now, round_id, prog.iter_time)
            self._record_trained(jobs, prog.first_step_at, proven, now, round_id)
        max_fail = cfg.controller.max_cell_failures
        excluded = {
            j: excluded_cells(f, max_fail, proven.get(j, frozenset())) for j, f in self.state.cell_failures().items()
        }
        built = inp.build_request(
            snap,
            jobs,
            progress,
            cfg.solver,
            excluded,
            restart_costs=self.state.restart_costs(),
            first_step_at=prog.first_step_at,
            network=cfg.network,
        )

        self.estimator.inner.set_cluster(built.request.cluster)
        refresh = getattr(self.estimator, "refresh", None)  # the profile store may have changed
        if refresh is not None and refresh():
            log.info("profile store changed: estimates recomputed")
        self._calibrate(built.request, prog.iter_time, now, dry_run)
        t1 = time.perf_counter()
        reply, crashed = self._solve(built.request)
        timings["solve_s"] = solve_s = time.perf_counter() - t1
        desired, rejected = checked(
            built.view, _keep_running(jobs, reply.placements), {m.job_id for m in jobs if m.current is not None}
        )
        for job_id, why in rejected.items():
            log.error("placement rejected", extra={"fields": {"job": job_id, "error": why}})
            self.metrics.inc("errors_total", labels={"kind": "invalid_placement"})
        cc = cfg.controller
        actions = decide(
            jobs,
            desired,
            built.view,
            cc.checkpoint_root,
            now=now,
            checkpoint_timeout_s=cc.checkpoint_timeout_s,
            resignal=resignal,
        )

        t2 = time.perf_counter()
        waiting = Waiting(cc.checkpoint_wait_s, cc.checkpoint_poll_s, self.sleep, self.stop.is_set)
        backend: Any = self.backend
        if self.lease is not None and not dry_run:
            self.lease.check()  # fencing: a controller that lost the lease mid-round applies nothing
            backend = FencedBackend(self.backend, self.lease.fence)  # ... and stops when it loses it applying
        outcomes: list[Outcome] = (
            []
            if dry_run
            else apply(
                actions,
                backend,
                self.state,
                round_id,
                self.clock,
                waiting,
                batch=cc.apply_batch,
                budget_s=cc.apply_budget_s,
            )
        )
        apply_s = time.perf_counter() - t2
        failed = {o.action.job_id: o.error for o in outcomes if not o.ok}
        later = {o.action.job_id: o.error for o in outcomes if o.ok and o.error}  # deferred, still checkpointing
        placed = {o.action.job_id for o in outcomes if o.ok and o.action.kind in (PLACE, MOVE) and not o.error}

        reasons = {**reply.reasons, **built.skipped, **crashed, **rejected, **failed, **later}
        statuses = tuple(self._status(m, reasons, placed, progress, progress_src, prog.notes) for m in jobs)
        if not dry_run:
            self._finish(jobs, statuses, known, snap, now, round_id)
        summaries = tuple(o.summary() for o in outcomes) if not dry_run else tuple(a.summary() for a in actions)
        for o in outcomes:
            self.metrics.inc("actions_total", labels={"kind": o.action.kind, "result": "ok" if o.ok else "failed"})
        record_cluster(self.metrics, snap, jobs)
        report = RoundReport(
            round_id,
            RoundStatus.OK,
            started,
            timings["observe_s"],
            solve_s,
            apply_s,
            time.perf_counter() - t0,
            reply.status,
            float(reply.objective),
            len(built.request.jobs),
            summaries,
            statuses,
            {
                j: {
                    "cell": p.cell.key(),
                    "nodes": [f"{n}:{g}" for n, g in p.nodes],
                    "pp": p.plan.pp,
                    "dp": p.plan.dp,
                    "tp": p.plan.tp,
                }
                for j, p in desired.items()
            },
            dry_run=dry_run,
        )
        log.info(
            "round",
            extra={
                "fields": {
                    "round": round_id,
                    "status": report.status,
                    "jobs": report.num_jobs,
                    "actions": len(summaries),
                    "failed": len(failed),
                    "solver": reply.status,
                    "observe_s": round(report.observe_s, 3),
                    "solve_s": round(solve_s, 3),
                    "apply_s": round(apply_s, 3),
                    "total_s": round(report.total_s, 3),
                    "dry_run": dry_run,
                }
            },
        )
        return report

    def _solve(self, request: ScheduleRequest) -> tuple[ScheduleReply, dict[str, str]]:
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

    def _calibrate(self, request: ScheduleRequest, observed: Mapping[str, float], now: float, dry_run: bool) -> None:
        """Correct the estimates by the iteration times running jobs report
        (solver.calibration; off with the solver's `calibrate`): each
        report is a ratio to the uncalibrated estimate of the job's cell, on
        its nodes next to the other running jobs (solver.contention), kept
        per job and GPU type in the state DB (the newest CALIBRATION_ROWS
        rows calibrate)."""
        if not self.config.solver.calibrate:
            self.estimator.calibration = Calibration()
            return
        rows = {(r.job_id, r.gpu_type): r for r in self.state.speeds(limit=CALIBRATION_ROWS)}
        seen: dict[tuple[str, str], tuple[SpeedRow, Any]] = {}
        alone = {}
        for job in request.jobs:
            if job.current is not None and not job.current.cell.mixed:
                est = self.estimator.inner.estimate(job, job.current.cell)
                if est.feasible:
                    alone[job.job_id] = (job, est)
        # what other jobs on its links cost a job is the placement's, not the job's speed
        loaded = contention_factors(((j, j.current, e.iter_time_s) for j, e in alone.values()), request.cluster)
        for job, est in alone.values():
            t, cell = observed.get(job.job_id), job.current.cell
            if t is None:
                continue
            prev = rows.get((job.job_id, cell.gpu_type))
            ratio, n = running_ratio(
                (prev.ratio, prev.samples) if prev else None, t / (est.iter_time_s * loaded.get(job.job_id, 1.0))
            )
            row = SpeedRow(
                job.job_id, cell.gpu_type, job.user, job.model.name, cell.key(), est.iter_time_s, t, ratio, n, None, now
            )
            rows[(job.job_id, cell.gpu_type)] = row
            seen[(job.job_id, cell.gpu_type)] = (row, job)
            if prev is None and abs(math.log(ratio)) > math.log(NOTICED):
                log.warning(
                    "job speed differs from its estimate",
                    extra={
                        "fields": {
                            "job": job.job_id,
                            "cell": row.cell,
                            "estimated_s": round(est.iter_time_s, 4),
                            "observed_s": round(t, 4),
                        }
                    },
                )
        bound = self.config.controller.progress_rate_factor
        self.estimator.calibration = Calibration(
            (Observation(r.job_id, r.user, r.model, r.gpu_type, r.ratio, r.samples) for r in rows.values()),
            max_factor=bound if math.isfinite(bound) else 10.0,
        )
        if dry_run or not seen:
            return
        self.state.record_speeds(
            dataclasses.replace(row, calibrated_s=self.estimator.estimate(job, job.current.cell).iter_time_s)
            for row, job in seen.values()
        )

    def _review_failures(
        self,
        jobs: tuple[inp.ManagedJob, ...],
        listed: list[str],
        now: float,
        round_id: int | None,
        dry_run: bool,
        trained: Collection[str],
        parked: Collection[str],
    ) -> tuple[inp.ManagedJob, ...]:
        """Jobs whose run ended before training are requeued and placed again
        (slurm_ext.controller.relaunch); a new failure is recorded against its
        cell. `trained`: the jobs that have trained (never given up, parked
        when their runs keep failing); `parked`: the jobs parked before. A
        parked job seen released (or run again) is managed again: an
        "unparked" event starts its count over."""
        failures = relaunch.review(
            jobs,
            self.progress,
            self.state.run_failures(listed),
            self.config.controller.max_relaunches,
            trained,
            self.state.trained_or_parked_at(listed),
            parked,
        )
        for f in failures.values():
            if f.new and not dry_run:
                self.state.add_history(f.job_id, HistoryEvent.RUN_FAILED, now, round_id, f.cell, value=f.end_time)
                self.metrics.inc("errors_total", labels={"kind": "run_failed"})
                log.warning(
                    "run failed before training",
                    extra={"fields": {"job": f.job_id, "cell": f.cell, "relaunch": f.relaunch, "reason": f.reason}},
                )
                if f.park:
                    self.state.add_history(f.job_id, HistoryEvent.PARKED, now, round_id, f.cell)
                    log.warning("job parked", extra={"fields": {"job": f.job_id, "reason": f.reason}})
        out = relaunch.apply_review(jobs, failures)
        for m in out:
            if m.job_id in parked and m.phase not in (inp.Phase.PARKED, inp.Phase.FINISHED) and not dry_run:
                self.state.add_history(m.job_id, HistoryEvent.UNPARKED, now, round_id)
                log.info("parked job released: managed again", extra={"fields": {"job": m.job_id, "phase": m.phase}})
        return out

    def _progress(self, jobs: tuple[inp.ManagedJob, ...], known: Mapping[str, Any], now: float) -> Progress:
        """This round's progress: the jobs' own reports where believed
        (slurm_ext.controller.progress), read within the round's budget."""
        start_round = getattr(self.progress, "start_round", None)
        if start_round is not None:
            start_round()
        previous = {
            j: (r.iterations_done, r.updated if r.progress_at is None else r.progress_at)
            for j, r in known.items()
            if r.iterations_done is not None
        }
        # a job moved since the last round ran part of the time in its earlier cell: the faster one bounds it
        now_s = {m.job_id: m.current.iter_time_s for m in jobs if m.current is not None and m.current.iter_time_s}
        fastest = {j: min(s, self._iter_s.get(j, s)) for j, s in now_s.items()}
        self._iter_s = now_s
        prog = collect_progress(
            jobs,
            now,
            {j for j, r in known.items() if r.finished},
            self.progress,
            previous=previous,
            rate_factor=self.config.controller.progress_rate_factor,
            iter_times=fastest,
        )
        for job_id, why in prog.notes.items():
            if self._doubts.get(job_id) != why:
                log.warning("progress not used", extra={"fields": {"job": job_id, "why": why}})
                self.metrics.inc("errors_total", labels={"kind": "progress"})
        self._doubts = dict(prog.notes)
        return prog

    def _measure_restarts(
        self,
        jobs: tuple[inp.ManagedJob, ...],
        first_step_at: Mapping[str, float],
        now: float,
        round_id: int | None,
        iter_time: Mapping[str, float],
    ) -> None:
        """Restart cost of each moved job, once it runs again: from the
        signal to the end of the first step after the resume (the job's own
        progress record), less that step (the seconds per iteration it
        reports, else its cell's estimate): the step is work done, not lost.
        Stored as a "resumed" event; the solver charges it for the job's next
        move."""
        pending = self.state.pending_restarts()
        for m in jobs:
            signalled_at = pending.get(m.job_id)
            first = first_step_at.get(m.job_id)
            if signalled_at is None or first is None or m.phase != inp.Phase.RUNNING or first <= signalled_at:
                continue
            step = iter_time.get(m.job_id) or (m.current.iter_time_s if m.current else 0.0) or 0.0
            step = step if math.isfinite(step) else 0.0
            # the job's own word: bounded
            cost = min(max(0.0, first - signalled_at - step), self.config.controller.max_restart_cost_s)
            self.state.add_history(
                m.job_id,
                HistoryEvent.RESUMED,
                now,
                round_id,
                m.current.cell.key() if m.current else "",
                value=round(cost, 3),
            )
            log.info("restart measured", extra={"fields": {"job": m.job_id, "restart_s": round(cost, 3)}})

    def _record_trained(
        self,
        jobs: tuple[inp.ManagedJob, ...],
        first_step_at: Mapping[str, float],
        proven: dict[str, frozenset[str]],
        now: float,
        round_id: int | None,
    ) -> None:
        """A "trained" event for each cell a running job has reported a step
        in since its run started, once per job and cell (`proven`, updated):
        the job fits there, whatever failed in other layouts of its size."""
        for m in jobs:
            if m.phase != inp.Phase.RUNNING or m.current is None:
                continue
            if not relaunch.trained(m.job.start_time, first_step_at.get(m.job_id)):
                continue  # no step yet, or only an earlier run's
            key = m.current.cell.key()
            if key in proven.get(m.job_id, ()):
                continue
            self.state.add_history(m.job_id, HistoryEvent.TRAINED, now, round_id, key)
            proven[m.job_id] = proven.get(m.job_id, frozenset()) | {key}

    def _from_slurm(
        self, snap: ClusterSnapshot, opens: dict[str, PlanRow], released: set[str], parked: set[str], dry_run: bool
    ) -> tuple[dict[str, PlanRow], set[str]]:
        """The state rebuilt from Slurm: the work in flight that the jobs'
        AdminComments show (contract.Step) and this state DB does not know
        (it has no plan of the job from the Step's time on: an empty or lost
        DB, or a standby's). A job held for a move or a placement, or
        checkpointing for a move, gets its intent journalled again (the
        round then finishes it as its own); one requeued held is the
        controller's (not in `released`), a parked one parked. A held job
        that carries a plan but no Step, of which the DB knows no plan, was
        released and then held by its user or an operator: in `released`.
        Changes `released` and `parked`; returns the open intents and the
        jobs checkpointing for a move rebuilt now, to be signalled again (the
        Step is written before the signal: one that died between the two
        never sent it; a second signal only repeats the request)."""
        marked = {}
        unmarked = []
        for job in snap.jobs:
            step = inp.admin_comment_step(job.admin_comment)
            if step is not None and (job.held or (step.step == contract.SIGNALLED and job.holds_resources)):
                marked[job.job_id] = (job, step)  # (a job released since is tidied, one finished is left)
            elif step is None and job.held and not job.finished and inp.admin_comment_plan(job.admin_comment):
                unmarked.append(job.job_id)
        if not marked and not unmarked:
            return opens, set()
        known_at = self.state.newest_plan_times([*marked, *unmarked])
        released.update(j for j in unmarked if j not in known_at)
        restored: set[str] = set()
        for job_id, (job, step) in marked.items():
            if job_id in known_at and known_at[job_id] >= step.at - 1e-3:
                continue  # the state DB journalled this work (or newer)
            released.discard(job_id)
            if step.step == contract.PARKED:
                parked.add(job_id)
                continue
            row = restored_intent(job, step)
            if row is None or dry_run:
                continue
            intent = self.state.begin_plan(job_id, None, *row[:5], step.at)
            self.state.set_plan_status(intent, row[5], step.at)
            restored.add(job_id)
            log.info(
                "intent rebuilt from slurm",
                extra={"fields": {"job": job_id, "step": step.step, "cell": row[0], "status": row[5]}},
            )
        resignal = {j for j in restored if marked[j][1].step == contract.SIGNALLED and marked[j][0].holds_resources}
        return (self.state.open_plans() if restored else opens), resignal

    def _remember(self, jobs: tuple[inp.ManagedJob, ...], known: Mapping[str, Any], now: float) -> None:
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

    def _status(
        self,
        m: inp.ManagedJob,
        reasons: Mapping[str, str],
        placed: set[str],
        progress: Mapping[str, float],
        src: Mapping[str, str],
        notes: Mapping[str, str],
    ) -> JobStatus:
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
        if m.job_id in notes:
            reason = f"{reason}; {notes[m.job_id]}" if reason else notes[m.job_id]
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
            progress.get(m.job_id),
            src.get(m.job_id),
            m.phase == inp.Phase.FINISHED,
        )

    def _finish(
        self,
        jobs: tuple[inp.ManagedJob, ...],
        statuses: tuple[JobStatus, ...],
        known: Mapping[str, Any],
        snap: ClusterSnapshot,
        now: float,
        round_id: int | None,
    ) -> None:
        self.state.save_statuses(statuses, now)
        for m in jobs:
            row = known.get(m.job_id)
            if m.phase == inp.Phase.FINISHED and (row is None or not row.finished):
                self.state.add_history(m.job_id, HistoryEvent.FINISHED, now, round_id, m.job.state, "")
        self.state.mark_vanished({j.job_id for j in snap.jobs}, now)


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


def restored_intent(job: SlurmJob, step: contract.Step) -> tuple[Any, ...] | None:
    """(cell, nodes, partition, plan JSON, AdminComment, status) of the intent
    a job's Step stands for: a move signalled (its target, from the Step)
    or a job updated for its release (the plan it carries); None for a Step
    that stands for no intent (requeued, parked) or cannot be read."""
    try:
        if step.step == contract.SIGNALLED and step.to is not None:
            plan = JobPlan.from_dict(step.to)
            spec = contract.admin_comment_spec(job.admin_comment)
            if spec is None:
                return None
            admin, partition, status = contract.encode_admin_comment(spec, plan), step.partition, PlanStatus.SIGNALLED
        elif step.step == contract.UPDATED and job.held:
            plan = contract.admin_comment_plan(job.admin_comment)
            if plan is None:
                return None
            admin, partition, status = contract.with_step(job.admin_comment, None), job.partition, PlanStatus.UPDATED
        else:
            return None
    except PlanError:
        return None
    nodes = tuple((n, plan.gpus_per_node) for n in plan.nodes)
    return plan.cell or "", nodes, partition, plan.to_json(), admin, status


def _keep_running(jobs: tuple[inp.ManagedJob, ...], placements: Mapping[str, Any]) -> dict[str, Any]:
    """The policy's placements, except that a running job keeps its GPUs when
    it is not moved: it is not elastic, or the policy gave it no placement
    (the controller does not preempt), or it is checkpointing already."""
    out = dict(placements)
    for m in jobs:
        if m.current is None or m.phase not in (inp.Phase.RUNNING, inp.Phase.CHECKPOINTING):
            continue
        elastic = m.spec is not None and m.spec.elastic and m.phase == inp.Phase.RUNNING
        if m.job_id not in out or not elastic:
            out[m.job_id] = m.current
    return out
