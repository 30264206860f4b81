"""FCFS: what plain Slurm does with static jobs (Arena's FCFS baseline).

Pending jobs in submit order, each on its requested GPU type and count
(JobRequest.requested_gpu_type / requested_gpus, else the first allowed type
and min_gpus), best locality first (fewest nodes), then relaxed locality
(halving the GPUs per node), best-fit nodes. Strict per GPU type: once a job
of a type cannot start, later jobs of that type wait (no backfill), unless
`backfill=True`. Running jobs keep their placement. A job no cell of which is
feasible is skipped (it could never start) without blocking its type.
"""

from __future__ import annotations

import time

from solver.estimator.protocol import EstimatorLike
from solver.placement import Space, split_fixed
from solver.placement.candidates import Option
from solver.placement.greedy import try_place
from solver.policies.common import Feasible, dp_estimate, heuristic_reply, layouts
from solver.types import JobRequest, ScheduleReply, ScheduleRequest


def requested(job: JobRequest, types: tuple[str, ...]) -> tuple[str | None, int]:
    allowed = [t for t in types if job.gpu_types is None or t in job.gpu_types]
    gpu_type = job.requested_gpu_type or (allowed[0] if allowed else None)
    return gpu_type, job.requested_gpus or job.min_gpus


class FcfsPolicy:
    def __init__(self, backfill: bool = False, feasible: Feasible = None) -> None:
        self.backfill = backfill
        self.feasible = feasible
        self.name = "fcfs-backfill" if backfill else "fcfs"

    def schedule(self, request: ScheduleRequest, estimator: EstimatorLike) -> ScheduleReply:
        t0 = time.perf_counter()
        cluster = request.cluster
        fixed, jobs, reasons = split_fixed(cluster, request.jobs, False, request.config)
        space = Space.of(cluster, fixed)
        ledger = space.ledger()
        order = sorted(range(len(jobs)), key=lambda i: (jobs[i].submit_time, i))
        blocked: set[str] = set()
        placed, cells = {}, 0
        for i in order:
            job = jobs[i]
            gpu_type, gpus = requested(job, cluster.gpu_types())
            if gpu_type is None:
                reasons[job.job_id] = "no GPU type of the cluster is allowed"
                continue
            if gpu_type in blocked:
                reasons[job.job_id] = f"waiting behind an earlier {gpu_type} job (FCFS)"
                continue
            any_feasible = False
            for cell in layouts(cluster, gpu_type, gpus):
                cells += 1
                est = dp_estimate(job, cell, estimator, self.feasible)
                if est is None:
                    continue
                any_feasible = True
                assert est.plan is not None  # dp_estimate's estimates are feasible
                opt = Option(job.job_id, cell, est.plan, est.iter_time_s, 0, None, est.source)
                got = try_place(space, ledger, job, opt)
                if got is not None:
                    placed[job.job_id] = opt.placement(*got)
                    break
            if job.job_id in placed:
                continue
            if not any_feasible:
                reasons[job.job_id] = f"no feasible layout of {gpus} x {gpu_type}"
                continue
            reasons[job.job_id] = f"waiting for {gpus} free {gpu_type} GPUs"
            if not self.backfill:
                blocked.add(gpu_type)
        return heuristic_reply(fixed, placed, cells, reasons, t0, request)
