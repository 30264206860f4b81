"""What the jobs themselves report in a round (slurm_ext.controller.round's
phases): how far each is (its progress file), whether a running job may be
moved (its checkpoint hook), what a move cost it (the first step after it
resumed), which cells it has trained in and the shape of the model it
trains. The files are the users'
(slurm_ext.controller.userfiles): read within the round's budget, and a file
that cannot be used is logged once, when that changes."""

from __future__ import annotations

import json
import logging
import math

from slurm_ext.config import Config
from slurm_ext.controller import inputs as inp
from slurm_ext.controller import metrics as mx
from slurm_ext.controller import relaunch
from slurm_ext.controller.context import RoundContext
from slurm_ext.controller.hooks import HookFiles, HookReader, collect_movability
from slurm_ext.controller.progress import ProgressFiles, ProgressReader, collect_progress
from slurm_ext.state import HistoryEvent, StateStore
from solver.contract.models import ModelSpecError

log = logging.getLogger("cellsched.controller")


class JobReports:
    """Reads and records what the jobs report, round after round (module doc)."""

    def __init__(
        self,
        config: Config,
        state: StateStore,
        metrics: mx.Metrics,
        progress: ProgressReader | None = None,
        hooks: HookReader | None = None,
    ) -> None:
        cc = config.controller
        self.config, self.state, self.metrics = config, state, metrics
        self.progress = progress or ProgressFiles(cc.read_timeout_s, cc.read_budget_s)
        self.hooks = hooks or HookFiles(cc.read_timeout_s, cc.read_budget_s)
        self._hooked: dict[str, float | None] = {}  # job -> start of the run whose hook is registered
        self._hook_notes: dict[str, str] = {}  # job -> why its hook file was not used (logged when it changes)
        self._doubts: dict[str, str] = {}  # job -> why its progress file was not used (logged when it changes)
        self._iter_s: dict[str, float] = {}  # job -> estimated iteration time of its cell at the last round
        self._shape_notes: dict[str, str] = {}  # job -> why its model shape was not kept (logged once)

    def read_progress(self, ctx: RoundContext) -> None:
        """This round's progress: the jobs' own reports where believed
        (slurm_ext.controller.progress), read within the round's budget."""
        self.progress.start_round()
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

    def record_progress(self, ctx: RoundContext) -> None:
        self._measure_restarts(ctx)
        self._record_trained(ctx)
        self._record_models(ctx)

    def read_hooks(self, ctx: RoundContext) -> None:
        """The running jobs that may not be moved this round: their runtime
        checkpoints only through the script's hook, and its file does not
        name them for their current run yet (slurm_ext.controller.hooks).
        A hook file that cannot be used is logged once."""
        self.hooks.start_round()
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
        pending = self.state.pending_restarts(m.job_id for m in ctx.jobs)
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

    def _record_models(self, ctx: RoundContext) -> None:
        """The first model shape each job reports it trains (progress.json's
        "model") is kept, once: the job is priced as that model from then on
        (inputs.trained_models). One that makes no model of the job's spec
        is not kept (logged)."""
        for m in ctx.jobs:
            shape = ctx.prog.models.get(m.job_id)
            row = ctx.known.get(m.job_id)
            if shape is None or m.spec is None or row is None or row.model_shape is not None:
                continue
            try:
                model = shape.applied_to(m.spec.model_spec())
            except ModelSpecError as exc:
                if self._shape_notes.get(m.job_id) != str(exc):
                    log.warning("model shape not used", extra={"fields": {"job": m.job_id, "why": str(exc)}})
                self._shape_notes[m.job_id] = str(exc)
                continue
            if self.state.observe_model(m.job_id, json.dumps(shape.to_dict(), sort_keys=True)):
                log.info("model shape observed", extra={"fields": {"job": m.job_id, "model": model.signature}})

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
