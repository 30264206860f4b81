"""What became of each simulated job (``Accounting``): an observer of the
simulated cluster (slurm_ext.sim.world) that records every job's starts,
ends and restarts, the GPU-seconds it held and the cells it ran in, and
gives the JobOutcome of each (slurm_ext.sim.types) that the engine puts in
the run's SimRun and slurm_ext.sim.report summarizes.

Each run is counted by its kind of cell (`run_kinds`: single-type, mixed
data-parallel, mixed pipeline, state-sharded), in the job's record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slurm_ext.sim.types import MIXED_DP, MIXED_PIPELINE, SINGLE, STATE_SHARDED, JobOutcome, KindUse
from slurm_ext.sim.world import Observer, SimJob
from solver.contract.plan import JobPlan


def run_kinds(gpu_types: list[str] | tuple[str, ...], plan: JobPlan | None) -> tuple[str, ...]:
    """The kinds of cell (slurm_ext.sim.types.CELL_KINDS) a run on nodes of
    `gpu_types` with `plan` counts under: SINGLE, MIXED_DP or MIXED_PIPELINE
    (plan pp > 1), plus STATE_SHARDED when the plan shards the optimizer
    state ("even" or "memory"; state_shares alone mean "memory")."""
    pp = plan.pp if plan is not None else 1
    kinds = [SINGLE if len(set(gpu_types)) < 2 else (MIXED_PIPELINE if pp > 1 else MIXED_DP)]
    if plan is not None and (
        plan.state_sharding in ("even", "memory") or (plan.state_sharding is None and plan.state_shares)
    ):
        kinds.append(STATE_SHARDED)
    return tuple(kinds)


@dataclass
class _Record:
    """One job so far: see Accounting.outcome."""

    first_start: float | None = None
    starts: int = 0
    gpu_seconds: float = 0.0
    cells: list[str] = field(default_factory=list)
    kinds: dict[str, KindUse] = field(default_factory=dict)
    run_kinds: tuple[str, ...] = ()  # the kinds of cell of its current run
    completed_at: float | None = None  # its end, when its last end was its completion
    contended_s: float = 0.0  # seconds its runs lost to shared links (SimJob.contended_s)


class Accounting(Observer):
    """Every job's record, kept as the world tells what happens to it."""

    def __init__(self) -> None:
        self._jobs: dict[str, _Record] = {}
        #: starts that failed at once for want of a speed in their cell
        self.infeasible_starts = 0

    def _record(self, job_id: str) -> _Record:
        rec = self._jobs.get(job_id)
        if rec is None:
            rec = self._jobs[job_id] = _Record()
        return rec

    # --- the world's hooks (slurm_ext.sim.world.Observer) -------------------------

    def submitted(self, job: SimJob) -> None:
        self._record(job.job_id)

    def started(self, job: SimJob, cell: str) -> None:
        rec = self._record(job.job_id)
        rec.starts += 1
        if rec.first_start is None:
            rec.first_start = job.start_time
        rec.cells.append(cell)
        rec.completed_at = None

    def running(self, job: SimJob, gpu_types: tuple[str, ...], plan: JobPlan | None) -> None:
        rec = self._record(job.job_id)
        rec.run_kinds = run_kinds(gpu_types, plan)
        for k in rec.run_kinds:
            use = rec.kinds.get(k, KindUse())
            rec.kinds[k] = KindUse(use.placements + 1, use.seconds, use.gpu_seconds)

    def infeasible(self, job: SimJob) -> None:
        self.infeasible_starts += 1

    def stopped(self, job: SimJob, held_s: float) -> None:
        rec = self._record(job.job_id)
        rec.gpu_seconds += job.gpus * held_s
        rec.contended_s = job.contended_s
        for k in rec.run_kinds:
            use = rec.kinds[k]
            rec.kinds[k] = KindUse(use.placements, use.seconds + held_s, use.gpu_seconds + job.gpus * held_s)
        rec.run_kinds = ()

    def ended(self, job: SimJob) -> None:
        self._record(job.job_id).completed_at = job.end_time if job.state == "COMPLETED" else None

    def requeued(self, job: SimJob) -> None:
        self._record(job.job_id).completed_at = None

    # --- what the run reports -------------------------------------------------------

    def completed(self, job_id: str) -> bool:
        """Did the job complete (and stay so: not requeued since)?"""
        rec = self._jobs.get(job_id)
        return rec is not None and rec.completed_at is not None

    def outcome(self, job_id: str, trace_job_id: str, submit_time: float) -> JobOutcome:
        """What became of Slurm job `job_id`, reported as trace job
        `trace_job_id` submitted at `submit_time`: its first start; its end
        when it completed; its restarts (starts after the first); the
        GPU-seconds it held; the cells it ran in, in order (a cell repeated
        back to back once); its runs by kind of cell (`run_kinds`); the
        seconds its runs lost to links shared with other jobs."""
        rec = self._jobs.get(job_id) or _Record()
        cells: list[str] = []
        for c in rec.cells:
            if not cells or cells[-1] != c:
                cells.append(c)
        return JobOutcome(
            trace_job_id,
            submit_time,
            rec.first_start,
            rec.completed_at,
            rec.completed_at is not None,
            max(0, rec.starts - 1),
            rec.gpu_seconds,
            tuple(cells),
            dict(rec.kinds),
            rec.contended_s,
        )
