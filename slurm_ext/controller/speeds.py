"""The estimates a round decides with (slurm_ext.controller.round's
phases): the profile store's estimator (mixed cells priced over it), on
the cluster's network cards, calibrated by the speeds running jobs report
(solver.calibration; each report a ratio to the uncalibrated estimate of
the job's cell on its nodes next to the other running jobs,
solver.contention), the speeds kept per job and GPU type in the state DB."""

from __future__ import annotations

import dataclasses
import logging
import math

from slurm_ext.config import Config
from slurm_ext.controller.context import RoundContext
from slurm_ext.state import SpeedRow, StateStore
from solver.calibration import CalibratedEstimator, Calibration, Observation, running_ratio
from solver.contention import NicAwareEstimator, contention_factors
from solver.estimator.protocol import EstimatorLike
from solver.types import Cell, Estimate, JobRequest, Placement, ScheduleRequest

log = logging.getLogger("cellsched.controller")

#: calibration uses the speeds of this many (job, GPU type) pairs, the most recently seen
CALIBRATION_ROWS = 2000
#: a job first seen this many times slower (or faster) than its estimate is logged
NOTICED = 1.25


def make_estimator(config: Config) -> EstimatorLike:
    """The estimator of the config's profile store, mixed cells priced over it."""
    from solver.contract.profiles.seed import open_store
    from solver.estimator import Estimator
    from solver.mixed import MixedEstimator

    # Each job is priced by its own runtime (JobRequest.runtime, solver.cost.runtime): its gradient sync,
    # state layout and buffers; the constructor's grad_sync and byte counts are the simulator's (adaptive) only.
    shard = config.solver.state_sharding
    return MixedEstimator(
        Estimator(open_store(config.controller.profiles_path or None), state_sharding=shard), state_sharding=shard
    )


class Speeds:
    """The round's estimator stack and its calibration (module doc)."""

    def __init__(self, config: Config, state: StateStore, estimator: EstimatorLike | None = None) -> None:
        self.config, self.state = config, state
        # the given estimator (or the profile store's) on the cluster's NICs: the uncalibrated estimates
        self._nic_estimator = NicAwareEstimator(estimator or make_estimator(config))
        #: the policy's estimator: the NIC-aware one corrected by what jobs reach
        self.estimator = CalibratedEstimator(self._nic_estimator)

    def calibrate(self, ctx: RoundContext) -> None:
        """Correct the estimates by the iteration times running jobs report
        (solver.calibration; off with the solver's `calibrate`): each
        report is a ratio to the uncalibrated estimate of the job's cell, on
        its nodes next to the other running jobs (solver.contention), kept
        per job and GPU type in the state DB (the newest CALIBRATION_ROWS
        rows calibrate; this round's are `ctx.speeds`, for `record_speeds`)."""
        request = ctx.built.request
        self._nic_estimator.set_cluster(request.cluster)
        if self.estimator.refresh():  # the profile store may have changed
            log.info("profile store changed: estimates recomputed")
        if not self.config.solver.calibrate:
            self.estimator.calibration = Calibration()
            return
        rows = {(r.job_id, r.gpu_type): r for r in self.state.speeds(limit=CALIBRATION_ROWS)}
        for job, cell, est, load in self._uncalibrated(request):
            t = ctx.prog.iter_time.get(job.job_id)
            if t is None:
                continue
            row = _speed_row(job, cell, est.iter_time_s, load, t, rows.get((job.job_id, cell.gpu_type)), ctx.now)
            rows[(job.job_id, cell.gpu_type)] = row
            ctx.speeds[(job.job_id, cell.gpu_type)] = (row, job, est)
        bound = self.config.controller.progress_rate_factor
        self.estimator.calibration = Calibration(
            (Observation(r.job_id, r.user, r.model, r.gpu_type, r.ratio, r.samples) for r in rows.values()),
            max_factor=bound if math.isfinite(bound) else 10.0,
        )

    def _uncalibrated(self, request: ScheduleRequest) -> list[tuple[JobRequest, Cell, Estimate, float]]:
        """(job, cell, uncalibrated estimate, load factor)
        of each running job in a single-type cell that the estimator prices:
        what other jobs on its links cost a job is the placement's, not the
        job's speed (solver.contention)."""
        alone: dict[str, tuple[JobRequest, Placement, Estimate]] = {}
        for job in request.jobs:
            if job.current is not None and not job.current.cell.mixed:
                est = self._nic_estimator.estimate(job, job.current.cell)
                if est.feasible:
                    alone[job.job_id] = (job, job.current, est)
        loaded = contention_factors(((j, p, e.iter_time_s) for j, p, e in alone.values()), request.cluster)
        return [(job, p.cell, est, loaded.get(job.job_id, 1.0)) for job, p, est in alone.values()]

    def record_speeds(self, ctx: RoundContext) -> None:
        """Store this round's speeds with the calibrated estimate of each (the
        round's calibration on the uncalibrated estimate `calibrate` made)."""
        if not ctx.speeds:
            return
        self.state.record_speeds(
            dataclasses.replace(row, calibrated_s=self.estimator.adjust(job, (est,))[0].iter_time_s)
            for row, job, est in ctx.speeds.values()
        )


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
