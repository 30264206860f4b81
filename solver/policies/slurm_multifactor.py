"""slurm-multifactor: what Slurm itself does with the site's policy
(priority/multifactor, then sched/backfill), on static typed GPU requests.

Priority (Slurm's multifactor plugin, the factors a GPU site sets):

    P = W_age * min(age / PriorityMaxAge, 1)
      + W_fairshare * F(account)
      + W_jobsize * min(GPUs / cluster GPUs, 1)        (PriorityFavorSmall=NO)

with F the fair-share factor the site gives the job's association
(SitePolicy.fairshare: Slurm's sshare FairShare, whatever algorithm the
site runs; in the simulator the classic 2^(-U/S) of the job's account,
slurm_ext.sim.site); a job whose association and account have none gets 0,
and with no factors at all (no site policy) every job gets 1. The default weights (`MultifactorWeights`):
PriorityWeightFairshare 10000, PriorityWeightAge 1000, PriorityWeightJobSize
1000, PriorityMaxAge 7 days: fair share dominates, age and size break the
ties, as sites that share GPUs among groups commonly configure it. Equal
priorities go by submit time, then job id (by number, as Slurm orders them: job 9
before job 10).

Scheduling (sched/backfill): running jobs keep their placement (static:
never resized or moved). Pending jobs, in priority order, each on its
requested GPU type and count (JobRequest.requested_gpu_type /
requested_gpus, else the first allowed type and min_gpus), best locality
first as FCFS does (`common.layouts`). A job that would put an account,
user or QOS over a GPU or job-count limit of SitePolicy.limits (headroom:
the limit less `used_outside`; which limit binds which job and the count
are solver.limits') does not start, and holds nothing: it waits, as Slurm's
AssocGrpGRES / AssocGrpJobsLimit / QOSMaxGRESPerUser reasons do, and the
jobs behind it go on (its reason: solver.site.reason_limit).
Otherwise the job's expected start is the earliest time at which a layout
fits the nodes' free GPUs over the whole of its expected run, counting the
running jobs' expected ends and the reservations of higher-priority jobs;
when that is now it starts, else it reserves those nodes from that time
for its run (for the first `max_reservations` jobs, Slurm's
bf_max_job_test), so a lower-priority job starts now only if it delays
none of them (backfill). A job's expected run is its time limit
(JobRequest.time_limit_s) when it has one, else its remaining iterations at
the estimated iteration time of the cell (Slurm uses the limit; the
simulated traces have none). A job no layout of which is feasible is
skipped.

Not modelled: partition and QOS priority factors, preemption, the GPU-type
limits of a limit that names a type are counted on that type only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from solver.estimator.protocol import EstimatorLike
from solver.limits import Loads, bindings, held_in
from solver.placement import Space, split_fixed
from solver.placement.candidates import Option
from solver.placement.greedy import try_place
from solver.policies.common import Feasible, dp_estimate, heuristic_reply, layouts
from solver.policies.fcfs import requested
from solver.site import SitePolicy
from solver.types import Cell, JobRequest, NodeView, Placement, ScheduleReply, ScheduleRequest


@dataclass(frozen=True)
class MultifactorWeights:
    """Slurm's PriorityWeightAge / Fairshare / JobSize and PriorityMaxAge (s)."""

    age: float = 1000.0
    fairshare: float = 10000.0
    job_size: float = 1000.0
    max_age_s: float = 7 * 86400.0

    def __post_init__(self) -> None:
        if min(self.age, self.fairshare, self.job_size) < 0 or not self.max_age_s > 0:
            raise ValueError("multifactor weights must be >= 0 and max_age_s > 0")


def id_order(job_id: str) -> tuple[int, str]:
    """Job ids in Slurm's order: by number (job 9 before job 10), then as text."""
    head = job_id.split("_", 1)[0]
    return (int(head) if head.isdigit() else -1, job_id)


def fairshare_factor(job: JobRequest, site: SitePolicy) -> float:
    """The fair-share factor of the job's association as the site gives it (module doc)."""
    if not site.fairshare:
        return 1.0
    got = site.fair_factor(job.account, job.user)
    return 0.0 if got is None else got


def multifactor_priority(
    job: JobRequest, site: SitePolicy, now: float, total_gpus: int, weights: MultifactorWeights
) -> float:
    """The job's multifactor priority (module doc)."""
    age = min(max(0.0, now - job.submit_time) / weights.max_age_s, 1.0)
    gpus = job.requested_gpus or job.min_gpus
    size = min(gpus / total_gpus, 1.0) if total_gpus > 0 else 0.0
    return weights.age * age + weights.fairshare * fairshare_factor(job, site) + weights.job_size * size


class Profile:
    """Free GPUs per node over time: free now, the running jobs' expected
    ends, and the reservations of higher-priority pending jobs."""

    def __init__(self, free_now: Mapping[str, int], now: float) -> None:
        self.now = now
        self.free = dict(free_now)
        self.releases: dict[str, list[tuple[float, int]]] = {}  # node -> (time, GPUs freed then)
        self.holds: dict[str, list[tuple[float, float, int]]] = {}  # node -> (from, to, GPUs)

    def release(self, at: float, node: str, gpus: int) -> None:
        self.releases.setdefault(node, []).append((max(at, self.now), gpus))

    def hold(self, start: float, end: float, node: str, gpus: int) -> None:
        self.holds.setdefault(node, []).append((start, end, gpus))

    def free_at(self, node: str, t: float) -> int:
        got = self.free.get(node, 0) + sum(g for at, g in self.releases.get(node, ()) if at <= t)
        return got - sum(g for a, b, g in self.holds.get(node, ()) if a <= t < b)

    def min_free(self, node: str, start: float, end: float) -> int:
        """The least free GPUs of `node` over [start, end)."""
        points = [start] + [a for a, _, _ in self.holds.get(node, ()) if start < a < end]
        return min(self.free_at(node, t) for t in points)

    def starts(self, nodes: Sequence[str]) -> list[float]:
        """The times a job may start on `nodes`: now, and whenever GPUs come free there."""
        ts = {self.now}
        for n in nodes:
            ts.update(at for at, _ in self.releases.get(n, ()))
            ts.update(b for _, b, _ in self.holds.get(n, ()) if math.isfinite(b))
        return sorted(t for t in ts if t >= self.now and math.isfinite(t))

    def earliest(self, cell: Cell, nodes: Sequence[str], duration: float) -> tuple[float, list[str]] | None:
        """The earliest start of `cell` on `nodes` for `duration` and the
        nodes it gets there (best fit: the least free fitting nodes first), or None."""
        for t in self.starts(nodes):
            end = t + duration
            ok = sorted((f, n) for f, n in ((self.min_free(n, t, end), n) for n in nodes) if f >= cell.gpus_per_node)
            if len(ok) >= cell.num_nodes:
                return t, [n for _, n in ok[: cell.num_nodes]]
        return None


class SlurmMultifactorPolicy:
    """Slurm's multifactor priority and backfill (module doc)."""

    def __init__(
        self, weights: MultifactorWeights | None = None, max_reservations: int = 500, feasible: Feasible = None
    ) -> None:
        self.weights = weights or MultifactorWeights()
        if max_reservations < 0:
            raise ValueError("max_reservations must be >= 0")
        self.max_reservations = max_reservations
        self.feasible = feasible
        self.name = "slurm-multifactor"

    def order(self, request: ScheduleRequest, jobs: Sequence[JobRequest]) -> list[JobRequest]:
        """`jobs` by priority, highest first (then submit time, job id)."""
        total = sum(n.gpus_total for n in request.cluster.nodes)
        prio = {j.job_id: multifactor_priority(j, request.site, request.now, total, self.weights) for j in jobs}
        return sorted(jobs, key=lambda j: (-prio[j.job_id], j.submit_time, id_order(j.job_id)))

    def _run_s(self, job: JobRequest, cell: Cell, iter_time_s: float) -> float:
        if job.time_limit_s is not None:
            return float(job.time_limit_s)
        return job.remaining_iterations * iter_time_s

    def _expected_end(self, job: JobRequest, p: Placement, now: float, estimator: EstimatorLike) -> float:
        if job.time_limit_s is not None and job.running_since is not None:
            return job.running_since + job.time_limit_s
        it = p.iter_time_s
        if not it > 0:
            est = estimator.estimate(job, p.cell)
            it = est.iter_time_s if est.feasible else math.inf
        return now + job.remaining_iterations * it

    def schedule(self, request: ScheduleRequest, estimator: EstimatorLike) -> ScheduleReply:
        t0 = time.perf_counter()
        cluster, now = request.cluster, request.now
        fixed, pending, reasons = split_fixed(cluster, request.jobs, False, request.config)
        space = Space.of(cluster, fixed)
        ledger = space.ledger()
        by_id = {j.job_id: j for j in request.jobs}
        limits = request.site.limits
        book = Loads()  # the GPUs each limit's buckets hold: running jobs and those started this round
        profile = Profile({n.name: ledger.free.get(n.name, 0) for n in cluster.nodes}, now)
        for jid, p in fixed.items():
            book.add(bindings(limits, by_id[jid]), held_in(p.cell))
            end = self._expected_end(by_id[jid], p, now, estimator)
            for node, g in p.nodes:
                profile.release(end, node, g)
        placed: dict[str, Placement] = {}
        cells = reserved = 0
        for job in self.order(request, pending):
            gpu_type, gpus = requested(job, cluster.gpu_types())
            if gpu_type is None:
                reasons[job.job_id] = "no GPU type of the cluster is allowed"
                continue
            options = []
            for cell in layouts(cluster, gpu_type, gpus):
                cells += 1
                est = dp_estimate(job, cell, estimator, self.feasible)
                if est is not None and est.plan is not None:
                    options.append(Option(job.job_id, cell, est.plan, est.iter_time_s, 0, None, est.source))
            if not options:
                reasons[job.job_id] = f"no feasible layout of {gpus} x {gpu_type}"
                continue
            binding = bindings(limits, job)
            blocked = book.blocking(binding, held_in(options[0].cell))
            if blocked is not None:
                reasons[job.job_id] = blocked[0].reason(blocked[1])
                continue
            best = self._earliest(profile, cluster.nodes_of(gpu_type), job, options)
            if best is None:
                reasons[job.job_id] = f"waiting for {gpus} x {gpu_type} GPUs (no expected start)"
                continue
            start, opt, nodes = best
            run_s = self._run_s(job, opt.cell, opt.iter_time_s)
            if start <= now:
                got = try_place(space, ledger, job, opt, tuple(nodes))
                if got is not None:
                    placed[job.job_id] = opt.placement(*got)
                    book.add(binding, held_in(opt.cell))
                    for node in nodes:
                        profile.free[node] -= opt.cell.gpus_per_node
                        profile.release(now + run_s, node, opt.cell.gpus_per_node)
                    continue
            reasons[job.job_id] = (
                f"waiting for {gpus} x {gpu_type} GPUs (expected start in {max(0, start - now):.0f} s)"
            )
            if reserved < self.max_reservations:
                reserved += 1
                for node in nodes:
                    profile.hold(start, start + run_s, node, opt.cell.gpus_per_node)
        return heuristic_reply(fixed, placed, cells, reasons, t0, request)

    def _earliest(
        self, profile: Profile, type_nodes: Sequence[NodeView], job: JobRequest, options: Sequence[Option]
    ) -> tuple[float, Option, list[str]] | None:
        """The option (best locality first among equal starts) that can start earliest."""
        names = [n.name for n in type_nodes if job.partitions is None or set(n.partitions) & set(job.partitions)]
        best: tuple[float, Option, list[str]] | None = None
        for opt in options:
            got = profile.earliest(opt.cell, names, self._run_s(job, opt.cell, opt.iter_time_s))
            if got is not None and (best is None or got[0] < best[0]):
                best = (got[0], opt, got[1])
        return best
