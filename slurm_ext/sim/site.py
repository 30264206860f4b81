"""The site's policy in a simulation (docs/simulator.md#the-sites-policy):
accounts of trace jobs, Slurm's decayed usage, and the `SitePolicy` the
policies get in `ScheduleRequest.site` every round.

* `assign_accounts`: a trace job without an account (every Arena/Philly
  job: those traces have no user, VC or account field) gets one by a
  deterministic rule: u = the first 64 bits of sha256("account:" + job id)
  over 2^64, and the account is the one whose slice of [0, 1) holds u, the
  slices laid out in the cluster file's order, each as wide as its
  ``trace_weight`` over their sum; its user is ``<account>-u<k>`` with k =
  sha256("user:" + job id) mod the account's ``users``. A job keeps the
  account and user a trace gives it (sacct). Its QOS: the trace's, else
  by the same rule with v = the first 64 bits of sha256("qos:" + job id)
  over 2^64: the QOS in the file's order take slices of [0, 1) as wide as
  their ``trace_fraction``, and a job whose v falls in none gets the
  site's ``default_qos``.
* `SiteUsage`: an observer of the world that keeps each account's usage as
  Slurm does with PriorityDecayHalfLife H: the GPU-seconds its jobs hold,
  each second's worth decayed by 2^(-age/H). Slurm applies the decay every
  PriorityCalcPeriod (5 min); here it is continuous (the limit of short
  periods). Usage counts allocated GPUs, restart stalls included, as
  Slurm's billing does. Normalised usage (Slurm's EffectvUsage in a flat
  tree of accounts under root): an account's usage (its sub-accounts'
  included) over all jobs'. Its fair-share factor is Slurm's classic one,
  F = 2^(-usage / share) with the account's share normalised along the
  tree (the product of its share among its siblings and its parent's), and
  a job's is its account's: the simulator keeps the classic formula (not
  Slurm's default Fair Tree, and no usage of the parent blended in, nor
  shares of users within an account). The policies take it as they take
  sshare's FairShare from a real Slurm (SitePolicy.fairshare).
  It also records, for the benchmark, each account's GPU-seconds held and
  entitled (`SiteUsage.summary`): at every instant the cluster's GPUs split
  among the accounts with demand (GPUs asked for by their unfinished jobs,
  at most the account's GPU limit) by share, the rest lent by share
  (`water_fill`). And it is Slurm's limits at a job's start (`gate`): a
  released job that fits but would put its account (or an account above
  it), user or QOS over a GPU limit or a job-count limit stays pending
  (AssocGrpJobsLimit, AssocMaxJobsLimit, AssocGrpGRES, QOSGrpGRES,
  QOSMaxGRESPerUser, QOSMaxGRESPerJob; the job counts first, as slurmctld
  checks them before it selects nodes) until it would not, as slurmctld
  keeps it; each such start is counted (a policy that respects the limits
  never meets one).
* `SiteFeed`: the policy as the controller calls it, the request given the
  jobs' accounts, users, QOS and multifactor priority, and the site's
  `SitePolicy` of the moment (shares normalised along the tree, the
  normalised usage, the classic factors, the limits of the cluster file,
  and what the running plain jobs of a `plain` QOS hold under them, as the
  live controller counts jobs it does not manage: slurm_ext.site.outside_limits).

A simulation without a site (no ``[site]`` in the cluster file) has none
of this: its policies see an empty SitePolicy, as before there was one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from slurm_ext.records import ClusterSnapshot, SlurmJob
from slurm_ext.sim.types import SiteSpec, TraceJob
from slurm_ext.sim.world import Observer, SimJob
from slurm_ext.site import outside_limits
from solver.estimator.protocol import EstimatorLike
from solver.limits import Bucket, Holder, Loads, bindings
from solver.policies import Policy
from solver.policies.slurm_multifactor import MultifactorWeights, multifactor_priority
from solver.site import GpuLimit, LimitKind, LimitScope, SitePolicy
from solver.types import ScheduleReply, ScheduleRequest


def unit(text: str) -> float:
    """A number in [0, 1) from sha256(text): the first 64 bits over 2^64."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:16], 16) / 2.0**64


def assign_accounts(trace: Sequence[TraceJob], site: SiteSpec) -> tuple[TraceJob, ...]:
    """The trace's jobs with accounts, users and QOS (module doc)."""
    weights = [(a, a.trace_weight) for a in site.accounts if a.trace_weight > 0]
    total = sum(w for _, w in weights)
    out = []
    for job in trace:
        account, user = job.account, job.user
        if not account:
            if not weights:
                raise ValueError("no account of the site has trace_weight > 0 to take jobs without an account")
            u, acc = unit(f"account:{job.job_id}") * total, 0.0
            spec = weights[-1][0]
            for a, w in weights:
                acc += w
                if u < acc:
                    spec = a
                    break
            account = spec.name
            user = f"{account}-u{int(hashlib.sha256(f'user:{job.job_id}'.encode()).hexdigest(), 16) % spec.users}"
        out.append(dataclasses.replace(job, account=account, user=user, qos=job.qos or _trace_qos(job, site)))
    return tuple(out)


def _trace_qos(job: TraceJob, site: SiteSpec) -> str:
    """The QOS of a trace job that names none (module doc)."""
    if not any(q.trace_fraction for q in site.qos):
        return site.default_qos
    v, edge = unit(f"qos:{job.job_id}"), 0.0
    for q in site.qos:
        edge += q.trace_fraction
        if v < edge:
            return q.name
    return site.default_qos


def normalized_shares(site: SiteSpec) -> dict[str, float]:
    """Each account's share of the cluster: its share over its siblings'
    (those of its parent) times its parent's (Slurm's classic shares_norm;
    a flat tree: its share over all accounts')."""
    siblings: dict[str, float] = {}
    for a in site.accounts:
        siblings[a.parent] = siblings.get(a.parent, 0.0) + a.share
    out: dict[str, float] = {}
    for a in site.accounts:
        norm = a.share / siblings[a.parent] if siblings[a.parent] > 0 else 0.0
        for up in site.above(a.name):
            spec = site.account(up)
            norm *= spec.share / siblings[spec.parent] if spec is not None and siblings[spec.parent] > 0 else 0.0
        out[a.name] = norm
    return out


def classic_factor(usage: float, share: float) -> float:
    """Slurm's classic fair-share factor 2^(-usage / share) (0 without a share)."""
    return float(2.0 ** (-usage / share)) if share > 0 else 0.0


def site_limits(site: SiteSpec, users: Mapping[str, set[str]]) -> tuple[GpuLimit, ...]:
    """The limits of the cluster file as solver.site.GpuLimits (an
    account's Grp limits bind the accounts below it); a per-user account
    limit for each user of `users` (account -> users)."""
    out: list[GpuLimit] = []
    for a in site.accounts:
        below = site.below(a.name)
        if a.gpus is not None:
            out.append(GpuLimit(LimitScope.ACCOUNT, a.name, LimitKind.GRP, a.gpus, below=below))
        if a.jobs is not None:
            out.append(GpuLimit(LimitScope.ACCOUNT, a.name, LimitKind.GRP_JOBS, a.jobs, below=below))
        if a.user_gpus is not None:
            for u in sorted(users.get(a.name, ())):
                out.append(GpuLimit(LimitScope.USER, f"{a.name}/{u}", LimitKind.GRP, a.user_gpus))
        user_jobs = site.user_jobs(a.name)
        if user_jobs is not None:
            for u in sorted(users.get(a.name, ())):
                out.append(GpuLimit(LimitScope.USER, f"{a.name}/{u}", LimitKind.MAX_JOBS, user_jobs))
    for q in site.qos:
        if q.gpus is not None:
            out.append(GpuLimit(LimitScope.QOS, q.name, LimitKind.GRP, q.gpus))
        if q.user_gpus is not None:
            out.append(GpuLimit(LimitScope.QOS_PER_USER, q.name, LimitKind.PER_USER, q.user_gpus))
        if q.job_gpus is not None:
            out.append(GpuLimit(LimitScope.QOS, q.name, LimitKind.PER_JOB, q.job_gpus))
    return tuple(out)


#: the reason squeue shows for a job a limit keeps from starting, by the limit's scope and kind
SLURM_REASONS = {
    (LimitScope.ACCOUNT, LimitKind.GRP_JOBS): "AssocGrpJobsLimit",
    (LimitScope.USER, LimitKind.MAX_JOBS): "AssocMaxJobsLimit",
    (LimitScope.ACCOUNT, LimitKind.GRP): "AssocGrpGRES",
    (LimitScope.USER, LimitKind.GRP): "AssocGrpGRES",
    (LimitScope.QOS, LimitKind.GRP): "QOSGrpGRES",
    (LimitScope.QOS_PER_USER, LimitKind.PER_USER): "QOSMaxGRESPerUser",
    (LimitScope.QOS, LimitKind.PER_JOB): "QOSMaxGRESPerJob",
}


def water_fill(capacity: float, demand: Mapping[str, float], shares: Mapping[str, float]) -> dict[str, float]:
    """What each account with demand is entitled to: `capacity` split in
    proportion to the shares, no account above its demand, what one cannot
    use lent to the others by their shares (max-min by share); accounts of
    share 0 share what is left equally."""
    out = {a: 0.0 for a in demand}
    left = min(capacity, sum(demand.values()))
    for weight in (lambda a: shares.get(a, 0.0), lambda a: 1.0 if shares.get(a, 0.0) <= 0 else 0.0):
        open_ = {a for a, d in demand.items() if d - out[a] > 1e-12 and weight(a) > 0}
        while open_ and left > 1e-12:
            level = left / sum(weight(a) for a in open_)
            full = {a for a in open_ if demand[a] - out[a] <= weight(a) * level}
            if not full:
                for a in open_:
                    out[a] += weight(a) * level
                left = 0.0
                break
            for a in full:
                left -= demand[a] - out[a]
                out[a] = demand[a]
            open_ -= full
    return out


class SiteUsage(Observer):
    """Each account's decayed usage and its GPUs held and entitled over the
    run (module doc). `now` is the world's clock; `register` tells it the
    account of each Slurm job as it is submitted."""

    def __init__(self, site: SiteSpec, capacity: int, now: Callable[[], float], start: float) -> None:
        self.site = site
        self.shares = normalized_shares(site)
        self.capacity = capacity
        self.now = now
        self.half_life_s = site.decay_half_life_s
        self.t = start
        self.next_calc = start + site.calc_period_s  # PriorityCalcPeriod's next tick (calc_period_s > 0)
        self.calculated: dict[str, float] = {}  # the normalized usage as of the last tick
        self.usage: dict[str, float] = {}  # account -> decayed GPU-seconds
        self.gpus_held: dict[str, int] = {}  # account -> GPUs its jobs hold
        self.demand: dict[str, int] = {}  # account -> GPUs its unfinished jobs ask for
        self.held_s: dict[str, float] = {}  # account -> GPU-seconds held
        self.entitled_s: dict[str, float] = {}  # account -> GPU-seconds entitled (water_fill)
        self.jobs: dict[str, tuple[str, str, str, int]] = {}  # Slurm id -> account, user, QOS, GPUs asked
        self.users: dict[str, set[str]] = {}
        self.peak: dict[str, int] = {}  # account -> most GPUs its jobs held at once
        self.over: set[str] = set()  # Slurm ids of the jobs that ended (not requeued since)
        #: the limits' buckets (solver.limits) that bind each job, by Slurm id, and the GPUs each holds
        self.bindings: dict[str, list[Bucket]] = {}
        self.loads = Loads()
        self.held_back: set[tuple[str, int]] = set()  # (Slurm id, start) Slurm's limits kept from starting
        self.plain: set[str] = set()  # Slurm ids of the plain (not managed) jobs
        self.plain_running: dict[str, SlurmJob] = {}  # the running ones, as Slurm shows them

    def register(self, slurm_id: str, job: TraceJob, plain: bool = False) -> None:
        """A trace job submitted as Slurm job `slurm_id` (`plain`: not managed)."""
        self.advance()
        if plain:
            self.plain.add(slurm_id)
        self.jobs[slurm_id] = (job.account, job.user, job.qos, job.requested_gpus)
        self.users.setdefault(job.account, set()).add(job.user)
        self.demand[job.account] = self.demand.get(job.account, 0) + job.requested_gpus
        mine = site_limits(self.site, {job.account: {job.user}})  # the cluster file's limits that may bind it
        self.bindings[slurm_id] = self._slurm_order(bindings(mine, Holder(job.account, job.user, job.qos)), job)

    def _slurm_order(self, buckets: list[Bucket], job: TraceJob) -> list[Bucket]:
        """`buckets` in the order slurmctld checks them, so that a job over
        several waits with Slurm's reason: the job counts before the GPUs
        (it counts jobs before it selects nodes), the counts from the job's
        own association up (its user's, its account's, the one above, ...);
        the GPU limits in the file's order."""
        path = (job.account, *self.site.above(job.account))

        def level(b: Bucket) -> tuple[int, int]:
            if not b.limit.kind.jobs:
                return (1, 0)
            name = b.limit.name
            return (0, 0 if b.limit.scope == LimitScope.USER else 1 + (path.index(name) if name in path else len(path)))

        return sorted(buckets, key=level)

    def advance(self) -> None:
        """Decay and accrue up to now (the GPUs held constant since the last change),
        taking the usage as of each PriorityCalcPeriod tick on the way."""
        t = self.now()
        period = self.site.calc_period_s
        while period > 0 and self.next_calc <= t:
            self._accrue(self.next_calc)
            self.calculated = self._normalized()
            self.next_calc += period
        self._accrue(t)

    def _accrue(self, t: float) -> None:
        dt = t - self.t
        if dt <= 0:
            return
        f = 2.0 ** (-dt / self.half_life_s)
        gain = self.half_life_s / math.log(2) * (1.0 - f)  # integral of 2^(-(t-s)/H) ds over (t - dt, t]
        for a in set(self.usage) | set(self.gpus_held):
            self.usage[a] = self.usage.get(a, 0.0) * f + self.gpus_held.get(a, 0) * gain
            self.held_s[a] = self.held_s.get(a, 0.0) + self.gpus_held.get(a, 0) * dt
        active = {a: float(min(d, self._cap(a))) for a, d in self.demand.items() if d > 0}
        for a, e in water_fill(self.capacity, active, self.shares).items():
            self.entitled_s[a] = self.entitled_s.get(a, 0.0) + e * dt
        self.t = t

    def gate(self, job: SimJob) -> str:
        """Slurm's limits when `job` would start (SimWorld's gate): the
        reason it may not, as squeue shows it, or "" (it may). The cluster
        file's limits are of every GPU type: a job's GPUs count whatever their type."""
        bs = self.bindings.get(job.job_id)
        if not bs:
            return ""
        over = self.loads.blocking(bs, ((None, max(job.gres, 0) * job.num_nodes),))
        if over is None:
            return ""
        self.held_back.add((job.job_id, job.starts))
        return SLURM_REASONS[over[0].limit.scope, over[0].limit.kind]

    def started(self, job: SimJob, cell: str) -> None:
        if job.job_id in self.jobs:
            self.advance()
            a = self.jobs[job.job_id][0]
            self.gpus_held[a] = self.gpus_held.get(a, 0) + job.gpus
            self.peak[a] = max(self.peak.get(a, 0), self.gpus_held[a])
            self.loads.add(self.bindings[job.job_id], ((None, job.gpus),))
            if job.job_id in self.plain:
                _, user, qos, _ = self.jobs[job.job_id]
                self.plain_running[job.job_id] = SlurmJob(
                    job.job_id,
                    user=user,
                    account=a,
                    qos=qos,
                    state="RUNNING",
                    nodes=job.nodes,
                    gpus_per_node=job.gres,
                    gpu_type=cell.split(":")[0],
                )

    def stopped(self, job: SimJob, held_s: float) -> None:
        if job.job_id in self.jobs:
            self.advance()
            a = self.jobs[job.job_id][0]
            self.gpus_held[a] = self.gpus_held.get(a, 0) - job.gpus
            self.loads.add(self.bindings[job.job_id], ((None, job.gpus),), -1)
            self.plain_running.pop(job.job_id, None)

    def ended(self, job: SimJob) -> None:
        # a checkpointed job ends too (FAILED, exit 75) and is requeued later: its demand comes back then
        got = self.jobs.get(job.job_id)
        if got is not None and job.job_id not in self.over:
            self.advance()
            self.over.add(job.job_id)
            self.demand[got[0]] -= got[3]

    def requeued(self, job: SimJob) -> None:
        got = self.jobs.get(job.job_id)
        if got is not None and job.job_id in self.over:
            self.advance()
            self.over.discard(job.job_id)
            self.demand[got[0]] += got[3]

    def _cap(self, account: str) -> float:
        spec = self.site.account(account)
        return math.inf if spec is None or spec.gpus is None else spec.gpus

    def normalized_usage(self) -> dict[str, float]:
        """Each account's usage, its sub-accounts' included, over all jobs': now, or as of
        the last PriorityCalcPeriod tick when the site has one (none before the first)."""
        self.advance()
        return dict(self.calculated) if self.site.calc_period_s > 0 else self._normalized()

    def _normalized(self) -> dict[str, float]:
        total = sum(self.usage.values())
        tree: dict[str, float] = dict(self.usage)
        for a, u in self.usage.items():
            for up in self.site.above(a):
                tree[up] = tree.get(up, 0.0) + u
        return {a: (u / total if total > 0 else 0.0) for a, u in tree.items()}

    def site_policy(self) -> SitePolicy:
        usage = self.normalized_usage()
        limits = site_limits(self.site, self.users)
        if self.plain_running:  # what they hold counts under the limits (slurm_ext.site.outside_limits)
            plain = list(self.plain_running.values())
            limits = tuple(outside_limits(limits, plain, ClusterSnapshot((), (), (), self.now())))
        return SitePolicy(
            limits=limits,
            shares=dict(self.shares),
            usage=usage,
            fairshare={a: classic_factor(usage.get(a, 0.0), s) for a, s in self.shares.items()},
            qos_priority={q.name: q.priority for q in self.site.qos if q.priority},
            partition_access=dict(self.site.partitions),
            priority_tiers=dict(self.site.priority_tiers),
        )

    def summary(self) -> dict[str, Any]:
        """Per account: share, the starts Slurm's limits held back (the
        policy asked for a start over a limit), the most GPUs held at once,
        GPU-seconds held and entitled, and their fractions of all held / all
        entitled (the run's meta["site"])."""
        self.advance()
        held, ent = sum(self.held_s.values()), sum(self.entitled_s.values())
        names = [a.name for a in self.site.accounts] + sorted(set(self.held_s) - {a.name for a in self.site.accounts})
        held_back: dict[str, int] = {}
        for sid, _ in self.held_back:
            held_back[self.jobs[sid][0]] = held_back.get(self.jobs[sid][0], 0) + 1
        return {
            a: {
                "share": self.shares.get(a, 0.0),
                "held_back_starts": held_back.get(a, 0),
                "peak_gpus": self.peak.get(a, 0),
                "gpu_s": round(self.held_s.get(a, 0.0), 3),
                "entitled_gpu_s": round(self.entitled_s.get(a, 0.0), 3),
                "used_frac": self.held_s.get(a, 0.0) / held if held else 0.0,
                "entitled_frac": self.entitled_s.get(a, 0.0) / ent if ent else 0.0,
            }
            for a in names
            if a in self.held_s or a in self.entitled_s or a in self.demand
        }


class SiteFeed:
    """`inner` with the site given to it (module doc): each request's jobs
    get their account, user, QOS and multifactor priority, and the request
    the SitePolicy of the moment."""

    def __init__(self, inner: Policy, usage: SiteUsage, weights: MultifactorWeights | None = None) -> None:
        self.inner = inner
        self.usage = usage
        self.weights = weights or MultifactorWeights()
        self.name = inner.name

    def schedule(self, request: ScheduleRequest, estimator: EstimatorLike) -> ScheduleReply:
        site = self.usage.site_policy()
        total = sum(n.gpus_total for n in request.cluster.nodes)
        jobs = []
        for j in request.jobs:
            got = self.usage.jobs.get(j.job_id)
            if got is not None:
                j = dataclasses.replace(j, account=got[0], user=got[1], qos=got[2])
            j = dataclasses.replace(j, priority=multifactor_priority(j, site, request.now, total, self.weights))
            jobs.append(j)
        return self.inner.schedule(dataclasses.replace(request, jobs=tuple(jobs), site=site), estimator)
