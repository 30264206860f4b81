"""Gavel-like heterogeneity-aware max-min fairness (Narayanan et al., OSDI'20).

1. Throughput matrix T[j, t]: job j at its requested GPU count (else
   min_gpus), DP-only, best locality on GPU type t (0 when infeasible).
2. LP (GLOP): time fractions X[j, t] >= 0 with sum_t X[j, t] <= 1 and
   sum_j gpus_j * X[j, t] <= free GPUs of type t; maximise
   min_j sum_t X[j, t] * T[j, t] / max_t T[j, t] (normalised effective
   throughput), then, at that minimum, the total.
3. Integral placements for this round: Gavel's priority X[j, t] / share the
   job has received so far, highest first. The policy is stateless, so the
   received share is estimated from the request: the time the job's done
   iterations took at its best speed over its age (a job not yet served has
   share 0, i.e. top priority). Each job is placed at most once, on the
   type of its pair if the cell fits (best locality, then relaxed). A
   running job is not preempted (the controller never does): it keeps its
   nodes on its own type, moves when its pair's type has room, and keeps
   running when it gets no turn.
"""

from __future__ import annotations

import time

from ortools.linear_solver import pywraplp

from solver.estimator.protocol import EstimatorLike
from solver.placement import Result, Space, split_fixed, split_static
from solver.placement.candidates import Option
from solver.placement.greedy import release, try_place
from solver.policies.common import Feasible, dp_estimate, layouts, reply
from solver.types import Estimate, JobRequest, Placement, ScheduleReply, ScheduleRequest, SolverStatus


def max_min_fractions(
    jobs: list[JobRequest], tput: dict[tuple[str, str], float], gpus: dict[str, int], capacity: dict[str, int]
) -> dict[tuple[str, str], float]:
    """Gavel's max-min fair time fractions X[j, t] (see the module doc)."""
    types = sorted(capacity)
    solver = pywraplp.Solver.CreateSolver("GLOP")
    x = {(j.job_id, t): solver.NumVar(0.0, 1.0, "") for j in jobs for t in types if tput.get((j.job_id, t), 0) > 0}
    if not x:
        return {}
    best = {j.job_id: max(tput.get((j.job_id, t), 0.0) for t in types) for j in jobs}
    by_job: dict[str, list[tuple[str, pywraplp.Variable]]] = {}
    by_type: dict[str, list[tuple[str, pywraplp.Variable]]] = {}
    for (jid, t), v in x.items():
        by_job.setdefault(jid, []).append((t, v))
        by_type.setdefault(t, []).append((jid, v))
    for mine in by_job.values():
        solver.Add(solver.Sum([v for _, v in mine]) <= 1.0)
    for t, mine in by_type.items():
        solver.Add(solver.Sum([gpus[jid] * v for jid, v in mine]) <= capacity[t])
    eff = {jid: solver.Sum([tput[(jid, t)] / best[jid] * v for t, v in mine]) for jid, mine in by_job.items()}
    m = solver.NumVar(0.0, 1.0, "min")
    for e in eff.values():
        solver.Add(e >= m)
    solver.Maximize(m)
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return {}
    floor = m.solution_value() * (1 - 1e-6)
    solver.Add(m >= floor)
    solver.Maximize(solver.Sum(list(eff.values())))
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return {}
    return {k: v.solution_value() for k, v in x.items()}


class GavelPolicy:
    name = "gavel"

    def __init__(self, feasible: Feasible = None) -> None:
        self.feasible = feasible

    def schedule(self, request: ScheduleRequest, estimator: EstimatorLike) -> ScheduleReply:
        t0 = time.perf_counter()
        cluster = request.cluster
        # Gavel re-allocates every round (running jobs may be preempted or
        # moved, never resized); with allow_resize false they all stay, and so
        # does a running job that may not be moved at all (JobRequest.movable).
        fixed: dict[str, Placement]
        jobs: list[JobRequest]
        reasons: dict[str, str]
        if request.config.allow_resize:
            fixed, jobs, reasons = split_static(cluster, request.jobs)
        else:
            fixed, jobs, reasons = split_fixed(cluster, request.jobs, False, request.config)
        space = Space.of(cluster, fixed)
        types = cluster.gpu_types()
        ests: dict[tuple[str, str], list[Estimate]] = {}
        tput: dict[tuple[str, str], float] = {}
        gpus: dict[str, int] = {}
        for job in jobs:
            gpus[job.job_id] = n = job.requested_gpus or job.min_gpus
            for t in types:
                if job.gpu_types is not None and t not in job.gpu_types:
                    continue
                found = [e for c in layouts(cluster, t, n) if (e := dp_estimate(job, c, estimator, self.feasible))]
                if found:
                    ests[(job.job_id, t)] = found
                    tput[(job.job_id, t)] = job.global_batch / found[0].iter_time_s
        capacity = {t: sum(space.free.get(nd.name, 0) for nd in cluster.nodes_of(t)) for t in types}
        t_est = time.perf_counter()
        x = max_min_fractions(jobs, tput, gpus, capacity)
        t1 = time.perf_counter()
        by_id = {j.job_id: j for j in jobs}
        order = {j.job_id: i for i, j in enumerate(jobs)}

        def share(job: JobRequest) -> float:
            fastest = max((tput[(job.job_id, t)] for t in types if (job.job_id, t) in tput), default=0.0)
            age = request.now - job.submit_time
            if fastest <= 0 or age <= 0:
                return 0.0
            return job.iterations_done * job.global_batch / fastest / age

        prio = sorted(
            ((v / max(share(by_id[j]), 1e-6), j, t) for (j, t), v in x.items() if v > 1e-6),
            key=lambda p: (-p[0], by_id[p[1]].current is None, order[p[1]], p[2]),
        )
        ledger = space.ledger()
        # The controller never preempts: a running job holds its GPUs until
        # its turn, then stays (its pair is its own type) or moves if the
        # new type has room; one that never gets a turn keeps running.
        currents = {j.job_id: j.current for j in jobs if j.current is not None}
        stays = {jid: Option(jid, cur.cell, cur.plan, cur.iter_time_s, 0, cur.nodes) for jid, cur in currents.items()}
        held = {jid: currents[jid] for jid, o in stays.items() if try_place(space, ledger, by_id[jid], o)}
        placed: dict[str, Placement] = {}
        for _, jid, t in prio:
            if jid in placed:
                continue
            job, cur = by_id[jid], held.get(jid)
            if cur is not None:
                if cur.cell.gpu_type == t:
                    placed[jid] = cur
                    continue
                release(ledger, stays[jid], cur.nodes)
            for est in ests[(jid, t)]:
                assert est.plan is not None  # dp_estimate's estimates are feasible
                opt = Option(jid, est.cell, est.plan, est.iter_time_s, 0, None, est.source)
                got = try_place(space, ledger, job, opt)
                if got is not None:
                    placed[jid] = opt.placement(*got)
                    break
            else:
                if cur is not None:  # no room on the new type: take its GPUs back
                    try_place(space, ledger, job, stays[jid])
        placed.update({jid: cur for jid, cur in held.items() if jid not in placed})
        for job in jobs:
            if job.job_id not in placed:
                reasons[job.job_id] = (
                    "no feasible GPU type"
                    if not any((job.job_id, t) in tput for t in types)
                    else "waiting: lower max-min priority this round"
                )
        fair = min(
            (
                sum(x.get((j.job_id, t), 0.0) * tput.get((j.job_id, t), 0.0) for t in types)
                / max(tput.get((j.job_id, t), 0.0) for t in types)
                for j in jobs
                if any((j.job_id, t) in tput for t in types)
            ),
            default=0.0,
        )
        result = Result(
            placed, SolverStatus.HEURISTIC, fair, fair, solve_s=t1 - t_est, place_s=time.perf_counter() - t1
        )
        return reply(fixed, result, sum(len(v) for v in ests.values()), reasons, t_est - t0, request)
