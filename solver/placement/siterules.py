"""The site's policy (solver.site) in a placement round: GPU and job-count
limits as rows of the joint model and checks of every other path, partition
access, reservations, time limits, fair-share weights and the GPUs pending
plain sbatch jobs claim (docs/site-policy.md).

Limits. Which limit binds which job, its *buckets* and a bucket's load
against its cap are solver.limits' (one place); here they meet the round.
A bucket's row in the joint model is

    sum over options o of its jobs: what the limit counts of o (GPUs, or 1 job) * x[o]  <=  headroom - fixed

(`fixed`: the GPUs its jobs that keep their placement hold; `SiteRules.cap`).
Where the running jobs that must stay already hold more than that (a limit
lowered under them), the row gets a slack column that costs more than any
plan can gain: the plan then shrinks the elastic ones as far as it can,
grows none, and starts nothing else under that limit. The greedy plan and
the repair of a CP-SAT plan check the same caps (`Tally`); `site_problems`
is the guard every policy's plan can be checked with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from solver.contract.models import ModelSpec
from solver.contract.runtimes import ADAPTIVE
from solver.limits import Bucket, Loads, bindings, headroom, held_in
from solver.placement.candidates import Option
from solver.placement.nodes import RESERVED
from solver.site import (
    LimitKind,
    LimitScope,
    Reservation,
    SitePolicy,
    UnmanagedDemand,
    reason_fairshare,
    reason_partition,
    reason_reservation,
)
from solver.types import (
    Cell,
    ClusterView,
    JobRequest,
    ParallelPlan,
    Placement,
    ScheduleReply,
    ScheduleRequest,
    SolverConfig,
)

#: fair-share factors are kept in [FAIR_FLOOR, 1]
FAIR_FLOOR = 1 / 64
#: job ids of the stand-ins for pending plain sbatch jobs (`claim_jobs`)
UNMANAGED_PREFIX = "@unmanaged:"


def _placement_gpus(p: Placement) -> int:
    return sum(g for _, g in p.nodes)


def all_partitions(cluster: ClusterView) -> tuple[str, ...]:
    return tuple(sorted({p for ps in cluster.node_partitions.values() for p in ps} | set(cluster.partitions)))


def allowed_partitions(job: JobRequest, site: SitePolicy, cluster: ClusterView) -> tuple[str, ...] | None:
    """The job's partitions less those that do not admit it (`SitePolicy.admits`:
    its account, QOS, user's groups and time limit); unchanged when none refuses it."""
    if not site.partition_access:
        return job.partitions
    names = job.partitions if job.partitions is not None else all_partitions(cluster)
    keep = tuple(p for p in names if site.admits(p, job.account, job.qos, job.user, job.time_limit_s))
    return job.partitions if len(keep) == len(names) else keep


def fair_factors(site: SitePolicy) -> dict[str, float]:
    """The weight of each association (or account) of `SitePolicy.fairshare`:
    the fair-share factor the site gives it (Slurm's sshare FairShare,
    whatever algorithm the site runs; the simulator's classic one), divided
    by the largest, kept >= FAIR_FLOOR (all 1 when every factor is 0).
    (What an account holds now is the entitlement's business,
    `share_targets`: a weight that followed it would move every round and
    move jobs with it.)"""
    top = max(site.fairshare.values(), default=1.0)
    return {a: max(FAIR_FLOOR, f / top) if top > 0 else 1.0 for a, f in site.fairshare.items()}


class SiteRules:
    """The site policy of one round, against the round's jobs and cluster."""

    def __init__(
        self,
        site: SitePolicy,
        cluster: ClusterView,
        jobs: Sequence[JobRequest],
        fixed: Mapping[str, Placement],
        now: float,
    ) -> None:
        self.site, self.cluster, self.now = site, cluster, now
        #: the buckets of the round's jobs (solver.limits), by key; each job's, by job id
        self.buckets: dict[str, Bucket] = {}
        self.of_job: dict[str, list[str]] = {}
        self.per_job: dict[str, list[Bucket]] = {}
        fixed_load, current_load = Loads(), Loads()
        for job in jobs:
            groups = []
            for b in bindings(site.limits, job):
                if b.per_job:
                    self.per_job.setdefault(job.job_id, []).append(b)
                else:
                    self.buckets.setdefault(b.key, b)
                    groups.append(b)
            self.of_job[job.job_id] = [b.key for b in groups]
            cur = fixed.get(job.job_id) or job.current
            if cur is not None and groups:
                current_load.add(groups, held_in(cur.cell))
            if job.job_id in fixed and groups:
                fixed_load.add(groups, held_in(fixed[job.job_id].cell))
        #: bucket key -> the GPUs its jobs that keep their placement hold / its jobs hold now
        self.fixed_load, self.current_load = fixed_load.load, current_load.load
        total = sum(n.gpus_total for n in cluster.nodes) or 1
        #: association ("account/user") or account -> the weight of its jobs' values (`fair_factors`)
        self.fair = fair_factors(site)
        #: account -> the GPUs its share entitles it to (share x the cluster's GPUs)
        self.entitled = {a: round(s * total) for a, s in site.shares.items() if s > 0}
        self.account_of = {j.job_id: j.account for j in jobs if j.account in self.entitled}
        #: account -> the GPUs its jobs that keep their placement hold
        self.fixed_by_account: dict[str, int] = {}
        for jid, p in fixed.items():
            a = self.account_of.get(jid)
            if a is not None:
                self.fixed_by_account[a] = self.fixed_by_account.get(a, 0) + _placement_gpus(p)
        self.total_gpus = total
        self.marks: dict[str, tuple[str, ...]] = {}
        self.reservations = {r.name: r for r in site.reservations if r.end is None or r.end > now}
        #: job -> the reservation reason of its first option kept off reserved nodes (`options`)
        self.held_off: dict[str, str] = {}
        for r in self.reservations.values():
            for n in r.nodes:
                self.marks[n] = (*self.marks.get(n, ()), RESERVED + r.name)

    def fair_weight(self, job: JobRequest) -> float:
        """The weight of the job's value: its association's fair-share
        weight (`fair`), else its account's, else 1."""
        got = self.fair.get(f"{job.account}/{job.user}")
        return got if got is not None else self.fair.get(job.account, 1.0)

    # ---- limits
    def cap(self, key: str) -> int:
        """GPUs the movable jobs of a bucket may hold together this round."""
        return self.buckets[key].limit.headroom - self.fixed_load.get(key, 0)

    def groups(self, job_id: str) -> list[Bucket]:
        """The buckets that count the job's GPUs together with other jobs'."""
        return [self.buckets[k] for k in self.of_job.get(job_id, ())]

    def allowed(self, b: Bucket) -> int:
        """The most GPUs a whole plan may hold under a bucket: its headroom,
        or what its jobs hold now where that is more (a limit lowered under them)."""
        return max(b.limit.headroom, self.current_load.get(b.key, 0))

    def job_cap(self, job: JobRequest, cell: Cell) -> str | None:
        """Why `cell` breaks a per-job limit (MaxTRESPerJob) of the job, or None."""
        over = Loads().blocking(self.per_job.get(job.job_id, ()), held_in(cell))
        return None if over is None else over[0].reason(over[1])

    def share_bonus(self, options: Mapping[str, Sequence[Option]]) -> int:
        """What each GPU an account lacks of its fair-share target costs a
        plan (0 without shares): more than any one option is worth, so a
        plan first gives each account with demand as much of its
        entitlement as its jobs can use, then lends what is left."""
        if not self.entitled:
            return 0
        # managed options only: a stand-in for a plain sbatch job (claim_jobs) is worth more than any
        # shortfall, or a managed job could take the GPUs it claims to meet its account's target
        managed = (opts for jid, opts in options.items() if not jid.startswith(UNMANAGED_PREFIX))
        return 1 + max((o.value for opts in managed for o in opts), default=0)

    def penalty_unit(self, options: Mapping[str, Sequence[Option]]) -> int:
        """What one GPU over a limit costs: more than every option together
        is worth, with every fair-share shortfall."""
        top = sum(max((o.value for o in opts), default=0) for opts in options.values())
        return 1 + top + self.share_bonus(options) * self.total_gpus

    def share_targets(self, options: Mapping[str, Sequence[Option]]) -> dict[str, int]:
        """Account -> the GPUs fair share asks the plan to give it: its
        entitlement, or less when its jobs cannot use that many (the GPUs
        its fixed jobs hold, plus each other job's largest option) or its
        own GPU limit (GrpTRES of the account, all GPU types) allows fewer."""
        demand = dict(self.fixed_by_account)
        for jid, opts in options.items():
            a = self.account_of.get(jid)
            if a is not None and opts:
                demand[a] = demand.get(a, 0) + max(o.cell.num_gpus for o in opts)
        cap: dict[str, int] = {}  # an account's own GPU limit (all types) caps its target too
        for b in self.buckets.values():
            lim = b.limit
            if lim.scope == LimitScope.ACCOUNT and lim.kind == LimitKind.GRP and lim.gpu_type is None:
                for a in (lim.name, *lim.below):
                    cap[a] = min(cap.get(a, lim.headroom), lim.headroom)
        return {a: min(e, demand[a], cap.get(a, e)) for a, e in self.entitled.items() if demand.get(a, 0) > 0}

    def shortfall(self, targets: Mapping[str, int], chosen: Iterable[tuple[str, Cell]]) -> int:
        """GPUs the accounts lack of their `targets` with these (job, cell) choices."""
        used = dict(self.fixed_by_account)
        for jid, cell in chosen:
            a = self.account_of.get(jid)
            if a is not None:
                used[a] = used.get(a, 0) + cell.num_gpus
        return sum(max(0, t - used.get(a, 0)) for a, t in targets.items())

    # ---- reservations and time limits
    def est_end(self, job: JobRequest, o: Option, moved: bool, config: SolverConfig) -> float:
        """When the job would end with option `o`: now + its remaining
        iterations x the option's iteration time (+ its restart cost when it
        moves a running job), or earlier at its time limit."""
        restart = 0.0
        if moved and job.current is not None:
            restart = job.restart_cost_s if job.restart_cost_s is not None else config.default_restart_cost_s
        end = self.now + restart + job.remaining_iterations * o.iter_time_s
        deadline = _deadline(job, self.now)
        return min(end, deadline) if deadline is not None else end

    def blocked(self, job: JobRequest, o: Option, config: SolverConfig) -> tuple[frozenset[str], Reservation | None]:
        """The reservation marks whose nodes option `o` may not use, and the
        first such reservation: one that does not admit the job and is
        active now, or opens before the job's estimated end."""
        if not self.reservations or o.pinned is not None:
            return frozenset(), None
        end = self.est_end(job, o, job.current is not None, config)
        out, first = set(), None
        for r in self.reservations.values():
            if r.admits(job.account, job.user, job.reservation):
                continue
            if r.start <= self.now or end > r.start:
                out.add(RESERVED + r.name)
                first = first or r
        return frozenset(out), first

    def move_misses_limit(self, job: JobRequest, o: Option, config: SolverConfig) -> bool:
        """True when moving the running job to option `o` would make it miss
        its time limit while it would finish within it where it runs."""
        cur, deadline = job.current, _deadline(job, self.now)
        if cur is None or deadline is None or o.pinned is not None:
            return False
        if self.now + job.remaining_iterations * cur.iter_time_s > deadline:
            return False  # it misses it anyway: the move is not what makes it miss it
        restart = job.restart_cost_s if job.restart_cost_s is not None else config.default_restart_cost_s
        return self.now + restart + job.remaining_iterations * o.iter_time_s > deadline

    def options(
        self, jobs: Sequence[JobRequest], options: Mapping[str, Sequence[Option]], config: SolverConfig
    ) -> tuple[dict[str, list[Option]], dict[str, str]]:
        """The options the site allows (per-job caps, moves within time
        limits; `blocked` reservation marks set), and a reason for each job
        left with none."""
        out: dict[str, list[Option]] = {}
        why: dict[str, str] = {}
        by_id = {j.job_id: j for j in jobs}
        for jid, opts in options.items():
            job = by_id[jid]
            if not self.reservations and jid not in self.per_job and (job.current is None or job.time_limit_s is None):
                out[jid] = list(opts)  # nothing here can refuse an option
                continue
            kept: list[Option] = []
            for o in opts:
                over = self.job_cap(job, o.cell)
                if over is not None and o.pinned is None:
                    why.setdefault(jid, over)
                    continue
                if self.move_misses_limit(job, o, config):
                    continue
                marks, res = self.blocked(job, o, config)
                if marks:
                    o = replace(o, blocked=marks)
                    if res is not None and jid not in why:
                        why[jid] = reason_reservation(res.name, res.start, self.est_end(job, o, False, config))
                kept.append(o)
            out[jid] = kept
        self.held_off = {j: w for j, w in why.items() if w.startswith("reservation ")}
        return out, {j: w for j, w in why.items() if not out.get(j)}

    def fair_reason(self, job: JobRequest, held: Mapping[str, int]) -> str | None:
        """``fairshare ...`` when the job's account is at or past its share:
        its decayed usage, or the GPUs it holds in the plan (`held`, per
        account) over the cluster's."""
        share = self.site.shares.get(job.account)
        if share is None:
            return None
        u = max(self.site.usage.get(job.account, 0.0), held.get(job.account, 0) / max(self.total_gpus, 1))
        return reason_fairshare(job.account, u, share) if u >= share else None

    def limit_reason(self, job: JobRequest, loads: Loads, min_cell: Cell | None) -> str | None:
        """``limit ...`` for the first bucket of the job that its smallest
        cell would put over its limit, given the plan's `loads` (`loads`)."""
        if min_cell is None:
            return None
        over = loads.blocking(self.groups(job.job_id), held_in(min_cell))
        return None if over is None else over[0].reason(over[1])

    def loads(self, placed: Mapping[str, Placement], cap: Callable[[Bucket], int] = headroom) -> Loads:
        """The loads of the buckets with these placements, against `cap` (default: the headroom)."""
        out = Loads(cap)
        for jid, p in placed.items():
            out.add(self.groups(jid), held_in(p.cell))
        return out


def _deadline(job: JobRequest, now: float) -> float | None:
    """When Slurm ends the job at its time limit (from its start; a pending
    job: from now)."""
    if job.time_limit_s is None:
        return None
    start = job.running_since if job.current is not None and job.running_since is not None else now
    return start + job.time_limit_s


class Tally:
    """The GPUs each bucket holds in a plan being built (greedy, repair),
    by job id, against the round's caps (`SiteRules.cap`)."""

    def __init__(self, rules: SiteRules) -> None:
        self.rules = rules
        self.loads = Loads(lambda b: rules.cap(b.key))

    def fits(self, job_id: str, cell: Cell) -> bool:
        return self.loads.fits(self.rules.groups(job_id), held_in(cell))

    def add(self, job_id: str, cell: Cell, sign: int = 1) -> None:
        self.loads.add(self.rules.groups(job_id), held_in(cell), sign)

    def over(self) -> int:
        """GPUs over the caps, all buckets together."""
        return self.loads.over()


def site_problems(
    site: SitePolicy,
    cluster: ClusterView,
    jobs: Sequence[JobRequest],
    placements: Mapping[str, Placement],
    now: float = 0.0,
) -> list[str]:
    """What in a plan breaks the site's hard rules: a bucket over its limit
    (unless no higher than the GPUs its jobs hold now: a limit lowered under
    running jobs), a job over its per-job limit, a placement in a partition
    its account may not use, or on nodes of a reservation active at `now`
    that does not admit it (the last three unless the job keeps its
    placement). Empty: none. (A reservation that opens later is checked
    where the estimates are: a plan alone does not say when a job ends.)"""
    if site.empty:
        return []
    rules = SiteRules(site, cluster, jobs, {}, 0.0)
    by_id = {j.job_id: j for j in jobs}
    out: list[str] = []
    for b, load in rules.loads(placements, rules.allowed).overs():
        out.append(f"{b.reason(load + b.limit.used_outside)} planned ({rules.allowed(b)} allowed to managed jobs)")
    parts = cluster.node_partitions
    for jid, p in sorted(placements.items()):
        job = by_id.get(jid)
        if job is None:
            continue
        stays = job.current is not None and p.same_resources(job.current)
        over = rules.job_cap(job, p.cell)
        if over is not None and not stays:
            out.append(f"job {jid}: {over} for one job")
        if site.partition_access and not stays:
            allowed_parts = allowed_partitions(job, site, cluster)
            if allowed_parts is not None and not _in_some(p, parts, allowed_parts):
                out.append(f"job {jid}: {reason_partition(job.account, job.qos, tuple(sorted(set(allowed_parts))))}")
        if not stays:
            for r in site.reservations:
                active = r.start <= now and (r.end is None or r.end > now)
                if active and not r.admits(job.account, job.user, job.reservation) and set(p.node_names) & set(r.nodes):
                    out.append(f"job {jid}: on nodes of reservation {r.name}, which does not admit it")
                    break
    return out


def _in_some(p: Placement, parts: Mapping[str, tuple[str, ...]], allowed: tuple[str, ...]) -> bool:
    """Does the placement lie in one of the allowed partitions (its own, or one holding all its nodes)?"""
    if p.partition is not None:
        return p.partition in allowed
    node_parts = [parts.get(n, ()) for n in p.node_names]
    if all(not ps for ps in node_parts):
        return True
    return any(all(a in ps or not ps for ps in node_parts) for a in allowed)


# ---- pending plain sbatch jobs


def claiming(site: SitePolicy, jobs: Sequence[JobRequest]) -> list[UnmanagedDemand]:
    """The pending plain sbatch jobs that claim GPUs this round: those whose
    Slurm priority is higher than some managed job's in the round."""
    if not site.unmanaged or not jobs:
        return []
    lowest = min(j.priority for j in jobs)
    return sorted(
        (u for u in site.unmanaged if u.priority > lowest), key=lambda u: (-u.priority, u.submit_time, u.job_id)
    )


_STAND_IN = ModelSpec("unmanaged", "custom", 1, 1, 1, 1, 1, 2.0)


def claim_jobs(
    claims: Sequence[UnmanagedDemand], cluster: ClusterView, value: int
) -> tuple[list[JobRequest], dict[str, list[Option]]]:
    """Stand-ins for the claiming jobs: each a job of fixed shape (its nodes
    x GPUs per node, on its GPU type or any, in its partitions) whose one
    option per GPU type is worth `value` (more than every managed option
    together, the higher priority first), so the joint model places it
    first and the managed jobs fit around it; the stand-ins' placements are
    dropped from the plan, leaving those GPUs free for Slurm to start them."""
    jobs: list[JobRequest] = []
    options: dict[str, list[Option]] = {}
    for rank, u in enumerate(claims):
        nodes = max(1, u.nodes)
        if u.gpus < 1 or u.gpus % nodes:
            continue
        per = u.gpus // nodes
        jid = UNMANAGED_PREFIX + u.job_id
        types = (u.gpu_type,) if u.gpu_type else cluster.gpu_types()
        job = JobRequest(
            jid,
            _STAND_IN,
            1,
            1,
            partitions=u.partitions or None,
            account=u.account,
            priority=u.priority,
            runtime=ADAPTIVE,
        )
        opts = [
            Option(jid, Cell(t, nodes, per), ParallelPlan(1, u.gpus, 1), 1.0, value * (len(claims) - rank))
            for t in types
            if any(n.gpus_total >= per for n in cluster.nodes_of(t))
        ]
        if opts:
            jobs.append(job)
            options[jid] = opts
    return jobs, options


def enforce_site(request: ScheduleRequest, reply: ScheduleReply) -> ScheduleReply:
    """`reply` within the site's hard rules (`site_problems`), whatever
    policy made it: a running job that changed placement where the change
    breaks a rule keeps its current one instead; a pending job that breaks
    one stays pending (under an over-full limit, the lowest Slurm priority,
    then the latest submitted, then the last in the request, first), with the rule as its reason. The
    reply as it is when nothing breaks (always, with an empty SitePolicy)."""
    site = request.site
    if site.empty or not site_problems(site, request.cluster, request.jobs, reply.placements, request.now):
        return reply
    plan = dict(reply.placements)
    reasons = dict(reply.reasons)
    by_id = {j.job_id: j for j in request.jobs}

    def undo(jid: str, why: str) -> None:
        job = by_id[jid]
        if job.current is not None:
            plan[jid] = job.current
        else:
            plan.pop(jid, None)
            reasons[jid] = why

    rules = SiteRules(site, request.cluster, request.jobs, {}, request.now)
    index = {j.job_id: i for i, j in enumerate(request.jobs)}
    order = sorted(
        (jid for jid in plan if jid in by_id), key=lambda j: (by_id[j].priority, -by_id[j].submit_time, -index[j])
    )
    for jid in order:  # per-job rules first (they do not depend on the others)
        alone = site_problems(site, request.cluster, [by_id[jid]], {jid: plan[jid]}, request.now)
        if alone:
            undo(jid, alone[0])
    for key, b in sorted(rules.buckets.items()):
        for jid in order:
            loads = rules.loads(plan, rules.allowed)
            if not loads.excess(key):
                break
            p = plan.get(jid)
            if p is None or key not in rules.of_job.get(jid, ()) or by_id[jid].current is p:
                continue
            undo(jid, b.reason(loads.load[key] + b.limit.used_outside))
    return dataclasses.replace(reply, placements=plan, reasons={k: v for k, v in reasons.items() if k not in plan})
