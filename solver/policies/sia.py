"""Sia-like goodput ILP (Jayaram Subramanya et al., SOSP'23), solved with CP-SAT.

Configurations per job: (GPU type, GPU count) with counts the powers of two
from min_gpus up to max_gpus (else up to the type's capacity), DP-only, best
locality (relaxed when the best does not exist). Goodput is taken as the
estimated throughput (no statistical-efficiency model here).

    utility(j, c) = (goodput(j, c) / goodput(j, c_min)) ** p

c_min = the job's smallest feasible configuration (fastest type at that
count). Sia aggregates these normalised goodputs with a p-norm; here p is
`p` (default 0.5, must be in (0, 1] because a job left out is worth 0):
each job gains most from its first GPUs, so the ILP spreads GPUs over jobs
before it scales any one up. A running job that changes configuration (or
nodes) is worth utility * max(0, 1 - restart_cost_s / horizon_s) (restart
factor); every running job may change. The ILP is the joint placement model
(at most one configuration per job, node capacity), without the age and
short-job weights of cellsched.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from solver.estimator.protocol import EstimatorLike
from solver.placement import Space, make_options, objective, option_picks, place_jobs, split_fixed, split_static
from solver.placement.candidates import fits
from solver.policies.common import Feasible, dp_estimate, layouts, reply
from solver.types import JobRequest, Placement, ScheduleReply, ScheduleRequest


class SiaPolicy:
    name = "sia"

    def __init__(self, p: float = 0.5, feasible: Feasible = None) -> None:
        if not 0 < p <= 1:
            raise ValueError(f"sia: p must be in (0, 1], got {p}")
        self.p = p
        self.feasible = feasible

    def schedule(self, request: ScheduleRequest, estimator: EstimatorLike) -> ScheduleReply:
        t0 = time.perf_counter()
        cfg, cluster = request.config, request.cluster
        fixed: dict[str, Placement]
        jobs: list[JobRequest]
        reasons: dict[str, str]
        if cfg.allow_resize:  # Sia re-optimises every job each round but the unmovable ones
            fixed, jobs, reasons = split_static(cluster, request.jobs)
        else:
            fixed, jobs, reasons = split_fixed(cluster, request.jobs, False, cfg)
        options, cells = {}, 0
        caps = {t: sum(g * k for g, k in cluster.node_sizes(t)) for t in cluster.gpu_types()}
        for job in jobs:
            ests = []
            for t, cap in caps.items():
                if job.gpu_types is not None and t not in job.gpu_types:
                    continue
                hi = min(job.max_gpus or cap, cap)
                n = 1
                while n <= hi:
                    if n >= job.min_gpus:
                        for cell in layouts(cluster, t, n):
                            cells += 1
                            est = dp_estimate(job, cell, estimator, self.feasible)
                            if est is not None:
                                ests.append(est)
                                break
                    n *= 2
            ref = objective.reference(job, ests)
            if ref is None:
                reasons[job.job_id] = "no feasible configuration"
                continue
            current = job.current
            stay = current is not None and fits(cluster, current, _used(fixed))
            if stay and current is not None and all(e.cell != current.cell for e in ests):
                stay = False
            restart = objective.restart_factor(job, cfg, penalty=1.0, at_least=0.0)
            picks = option_picks(job, ests, ref, 1.0, self.p, restart, stay, cfg.max_cells_per_job)
            options[job.job_id] = make_options(job, ests, picks)
        t1 = time.perf_counter()
        result = place_jobs(
            Space.of(cluster, fixed), jobs, options, cfg, preferred={j.job_id: j.current for j in jobs if j.current}
        )
        for job in jobs:
            if job.job_id not in result.placements and job.job_id not in reasons:
                reasons[job.job_id] = "waiting: not chosen by the goodput ILP this round"
        return reply(fixed, result, sum(len(v) for v in options.values()), reasons, t1 - t0, request)


def _used(fixed: Mapping[str, Placement]) -> dict[str, int]:
    used: dict[str, int] = {}
    for p in fixed.values():
        for n, g in p.nodes:
            used[n] = used.get(n, 0) + g
    return used
