"""The site's policy read from Slurm each round (docs/site-policy.md).

`SiteReader.read` asks Slurm (its accounting through slurmdbd, and
slurmctld) for the standing policy: GPU and job-count limits of
associations (the account tree: a parent's Grp limits bind its
sub-accounts), QOS and partition QOS, fair share (the factor sshare
reports), reservations, partition access (MaxTime included) and
PriorityTier, and the multifactor priority settings. `round_policy` adds
what this round's snapshot shows: what jobs the solver does not carry hold
under each limit (`GpuLimit.used_outside`), the pending plain sbatch GPU jobs
(`UnmanagedDemand`) and, where a partition has AllowGroups, the Unix groups
of the managed jobs' users on this host (`UnixGroups`). The controller puts
the result on `ScheduleRequest.site`.

Every backend offers the reading as ``read_site() -> SiteReading`` (the
Backend protocol: the CLI and pyslurm backends through Slurm's commands;
the simulated one reads an empty one, as does any without accounting: the
solver then behaves as before there was a site policy). Which limit binds
which job is solver.limits'; `holder` maps Slurm's job records onto what it
needs, for the GPUs running jobs hold outside the round (`outside_limits`).
"""

from __future__ import annotations

import grp
import os
import pwd
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from slurm_ext.parse import accounting as acc
from slurm_ext.records import ClusterSnapshot, SlurmJob
from solver.limits import Bucket, Held, Holder, bucket_of
from solver.site import GpuLimit, LimitKind, LimitScope, PartitionAccess, Reservation, SitePolicy, UnmanagedDemand
from solver.types import ScheduleRequest

#: the most bytes one command's output may have (a larger one is refused, not read)
MAX_OUTPUT = 4 << 20
#: the most rows of each kind kept (associations, QOS, reservations, ...)
MAX_ROWS = 20000
#: the most Unix groups of one user read (AllowGroups)
MAX_GROUPS = 1024
#: pending reasons of a plain job that waits for GPUs (and so claims them):
#: the others wait for something else (a hold, a dependency, a begin time, their own limit)
WAITING_FOR_GPUS = frozenset({"", "None", "Priority", "Resources"})
_CLUSTER = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class PriorityModel:
    """Enough of Slurm's multifactor priority to rank a held job (whose
    priority Slurm shows as 0): PriorityWeightFairShare x the FairShare of
    its association (sshare) + PriorityWeightAge x min(1, age /
    PriorityMaxAge) + PriorityWeightQOS x its QOS's priority / the largest.
    The job-size, partition, association, nice and TRES factors are left out."""

    settings: acc.PrioritySettings = field(default_factory=acc.PrioritySettings)
    #: "account/user" -> sshare's FairShare factor (0..1)
    fairshare: Mapping[str, float] = field(default_factory=dict)
    #: QOS -> its priority / the largest QOS priority (0..1)
    qos: Mapping[str, float] = field(default_factory=dict)

    def priority(self, job: SlurmJob, now: float) -> float:
        """Slurm's priority of the job, or for a held one (0) the estimate above."""
        if job.priority:
            return float(job.priority)
        s = self.settings
        if not s.multifactor:
            return 0.0
        age = max(0.0, now - job.submit_time) if job.submit_time else 0.0
        return (
            s.weight_fairshare * self.fairshare.get(f"{job.account}/{job.user}", 0.0)
            + s.weight_age * min(1.0, age / s.max_age_s)
            + s.weight_qos * self.qos.get(job.qos, 0.0)
        )


def no_groups(user: str) -> tuple[str, ...] | None:
    """A user in no group (where nobody reads them)."""
    return ()


class UnixGroups:
    """A user's Unix groups on this host, as slurmctld reads them for a
    partition's AllowGroups (its primary group and those that list it);
    None for root and SlurmUser (`exempt`), whom AllowGroups does not bind.
    Read through the C library (pwd, grp: no command run, nothing of the
    user's read), only for a plain name, at most MAX_GROUPS; a user the
    host does not know is in none."""

    def __init__(self, exempt: Collection[str] = ("root",)) -> None:
        self.exempt = frozenset(exempt) | {"root"}

    def __call__(self, user: str) -> tuple[str, ...] | None:
        if user in self.exempt:
            return None
        if not acc.plain_name(user):
            return ()
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            return ()
        if pw.pw_uid == 0:
            return None
        names = []
        for gid in os.getgrouplist(user, pw.pw_gid)[:MAX_GROUPS]:
            try:
                names.append(grp.getgrgid(gid).gr_name)
            except KeyError:
                continue
        return tuple(names)


@dataclass(frozen=True)
class SiteReading:
    """What a backend read of the site: the standing policy (no
    used_outside, no unmanaged demand, no users' groups: `round_policy` adds
    those from the round's snapshot), how to rank held jobs, how to read a
    user's groups, and what it left out."""

    policy: SitePolicy = field(default_factory=SitePolicy)
    priority: PriorityModel = field(default_factory=PriorityModel)
    #: what was read but not used (names cellsched does not keep, limits it cannot express)
    dropped: tuple[str, ...] = ()
    #: a user's groups for AllowGroups (`UnixGroups`; None: AllowGroups does not bind the user)
    groups: Callable[[str], tuple[str, ...] | None] = no_groups


# --- reading -------------------------------------------------------------------


class SiteReader:
    """Reads the site's policy with `run` (an argument list -> the command's
    standard output, SlurmError when it fails). The cluster's name and
    priority settings are read once."""

    def __init__(self, run: Callable[[list[str]], str]) -> None:
        self._run = run
        self._settings: acc.PrioritySettings | None = None

    def _out(self, args: list[str]) -> str:
        out = self._run(args)
        if len(out) > MAX_OUTPUT:
            raise acc.ParseError(f"{args[0]} printed more than {MAX_OUTPUT} bytes: not read")
        return out

    def settings(self) -> acc.PrioritySettings:
        if self._settings is None:
            self._settings = acc.parse_config(self._out(["scontrol", "show", "config"]))
        return self._settings

    def read(self, now: float) -> SiteReading:
        """The standing policy now; SlurmError / ParseError when Slurm's
        accounting cannot be read (no slurmdbd, say)."""
        settings = self.settings()
        where = ["where", f"cluster={settings.cluster}"] if _CLUSTER.match(settings.cluster) else []
        assocs = acc.parse_assocs(
            self._out(["sacctmgr", "-n", "-P", "show", "assoc", *where, "format=" + ",".join(acc.ASSOC_FORMAT)])
        )
        qos = acc.parse_qos(self._out(["sacctmgr", "-n", "-P", "show", "qos", "format=" + ",".join(acc.QOS_FORMAT)]))
        shares = acc.parse_sshare(self._out(["sshare", "-n", "-P", "-a", "-o", ",".join(acc.SSHARE_FORMAT)]))
        res = acc.parse_reservations(self._out(["scontrol", "-o", "show", "reservation"]))
        parts = acc.parse_partition_access(self._out(["scontrol", "-o", "show", "partition"]))
        reading = standing_policy(settings, assocs, qos, shares, res, parts, now)
        return replace(reading, groups=UnixGroups((settings.slurm_user,)))


# --- the standing policy ----------------------------------------------------------


def _limits(
    scope: LimitScope, name: str, kind: LimitKind, gpus: Mapping[str | None, int], below: frozenset[str] = frozenset()
) -> list[GpuLimit]:
    return [
        GpuLimit(scope, name, kind, n, gpu_type=t, below=below)
        for t, n in sorted(gpus.items(), key=lambda kv: str(kv[0]))
    ]


def _jobs(
    scope: LimitScope, name: str, kind: LimitKind, jobs: int | None, below: frozenset[str] = frozenset()
) -> list[GpuLimit]:
    return [] if jobs is None else [GpuLimit(scope, name, kind, jobs, below=below)]


class _Dropped:
    """The names and rows left out, for the reading's `dropped`."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def plain(self, what: str, *names: str) -> bool:
        bad = [n for n in names if n and not acc.plain_name(n)]
        if bad:
            self.notes.append(f"{what} {bad[0]!r}: not a plain name")
        return not bad


def account_tree(assocs: Iterable[acc.AssocRow]) -> dict[str, frozenset[str]]:
    """Account -> the accounts below it at every depth, from the account
    rows' ParentName (a user's row has none: it hangs from its account)."""
    parent = {a.account: a.parent for a in assocs if not a.user and not a.partition and a.parent != a.account}
    below: dict[str, set[str]] = {a: set() for a in parent}
    for a in parent:
        up, seen = parent.get(a, ""), {a}
        while up and up not in seen:  # a cycle (not from Slurm) ends the walk
            below.setdefault(up, set()).add(a)
            seen.add(up)
            up = parent.get(up, "")
    return {a: frozenset(b) for a, b in below.items()}


def assoc_limits(assocs: Iterable[acc.AssocRow], drop: _Dropped) -> list[GpuLimit]:
    """GrpTRES / MaxTRES (per job) of gres/gpu and GrpJobs of accounts (a
    Grp limit binds the accounts below it too: `account_tree`) and of users
    within accounts, and a user association's MaxJobs. An account's MaxJobs
    binds through its users' rows, which slurmdbd gives it (a user's own
    one, where set, instead)."""
    rows = list(assocs)[:MAX_ROWS]
    tree = account_tree(rows)
    out: list[GpuLimit] = []
    for a in rows:
        if not drop.plain("association", a.account, a.user):
            continue
        if a.partition and (a.grp_gpus or a.max_gpus_per_job or a.grp_jobs is not None or a.max_jobs is not None):
            drop.notes.append(f"association {a.account}/{a.user} in partition {a.partition}: limits not used")
            continue
        if a.user:
            scope, name, below = LimitScope.USER, f"{a.account}/{a.user}", frozenset[str]()
        else:
            scope, name, below = LimitScope.ACCOUNT, a.account, tree.get(a.account, frozenset())
        out += _limits(scope, name, LimitKind.GRP, a.grp_gpus, below)
        out += _limits(scope, name, LimitKind.PER_JOB, a.max_gpus_per_job)
        out += _jobs(scope, name, LimitKind.GRP_JOBS, a.grp_jobs, below)
        if a.user:
            out += _jobs(scope, name, LimitKind.MAX_JOBS, a.max_jobs)
    return out


def qos_limits(qos: Iterable[acc.QosRow], drop: _Dropped) -> list[GpuLimit]:
    """GrpTRES, MaxTRES (per job), MaxTRESPerUser and MaxTRESPerAccount of
    gres/gpu, and GrpJobs, MaxJobsPerUser and MaxJobsPerAccount, of each QOS."""
    out: list[GpuLimit] = []
    for q in list(qos)[:MAX_ROWS]:
        if not drop.plain("QOS", q.name):
            continue
        out += _limits(LimitScope.QOS, q.name, LimitKind.GRP, q.grp_gpus)
        out += _limits(LimitScope.QOS, q.name, LimitKind.PER_JOB, q.max_gpus_per_job)
        out += _limits(LimitScope.QOS_PER_USER, q.name, LimitKind.PER_USER, q.max_gpus_per_user)
        out += _limits(LimitScope.QOS_PER_ACCOUNT, q.name, LimitKind.PER_ACCOUNT, q.max_gpus_per_account)
        out += _jobs(LimitScope.QOS, q.name, LimitKind.GRP_JOBS, q.grp_jobs)
        out += _jobs(LimitScope.QOS_PER_USER, q.name, LimitKind.JOBS_PER_USER, q.max_jobs_per_user)
        out += _jobs(LimitScope.QOS_PER_ACCOUNT, q.name, LimitKind.JOBS_PER_ACCOUNT, q.max_jobs_per_account)
    return out


def partition_limits(parts: Iterable[acc.PartitionAccessRow], qos: Iterable[acc.QosRow]) -> list[GpuLimit]:
    """The GPU and job-count limits of each partition's QOS, as limits of the partition."""
    by_name = {q.name: q for q in qos}
    out: list[GpuLimit] = []
    for p in parts:
        q = by_name.get(p.qos)
        if q is None or not acc.plain_name(p.name):
            continue
        out += _limits(LimitScope.PARTITION, p.name, LimitKind.GRP, q.grp_gpus)
        out += _limits(LimitScope.PARTITION, p.name, LimitKind.PER_JOB, q.max_gpus_per_job)
        out += _limits(LimitScope.PARTITION, p.name, LimitKind.PER_USER, q.max_gpus_per_user)
        out += _limits(LimitScope.PARTITION, p.name, LimitKind.PER_ACCOUNT, q.max_gpus_per_account)
        out += _jobs(LimitScope.PARTITION, p.name, LimitKind.GRP_JOBS, q.grp_jobs)
        out += _jobs(LimitScope.PARTITION, p.name, LimitKind.JOBS_PER_USER, q.max_jobs_per_user)
        out += _jobs(LimitScope.PARTITION, p.name, LimitKind.JOBS_PER_ACCOUNT, q.max_jobs_per_account)
    return out


def account_shares(rows: Iterable[acc.ShareRow]) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """(account -> share of the cluster, account -> effective usage,
    "account/user" -> FairShare factor). sshare normalises an account's shares
    and usage within its parent: an account's share of the cluster is the
    product along its path from the root (the root's own row is left out)."""
    shares: dict[str, float] = {}
    usage: dict[str, float] = {}
    factor: dict[str, float] = {}
    path: list[tuple[float, float]] = []  # (share, usage) of the accounts above, by depth
    for r in list(rows)[:MAX_ROWS]:
        if r.user:
            if r.fairshare is not None and acc.plain_name(r.account) and acc.plain_name(r.user):
                factor[f"{r.account}/{r.user}"] = r.fairshare
            continue
        del path[max(0, r.depth) :]
        up_share, up_usage = path[-1] if path else (1.0, 1.0)
        share, used = (1.0, 1.0) if r.depth == 0 else (up_share * r.norm_shares, up_usage * r.effective_usage)
        path.append((share, used))
        if r.depth > 0 and acc.plain_name(r.account):
            shares[r.account] = share
            usage[r.account] = used
    return shares, usage, factor


def reservations(rows: Iterable[acc.ReservationRow], now: float, drop: _Dropped) -> list[Reservation]:
    """The reservations that have not ended; MAINT ones admit nobody. A
    negated list (``-acct``) admits nobody by it (cellsched stays out)."""
    out = []
    for r in list(rows)[:MAX_ROWS]:
        if (r.end is not None and r.end <= now) or not r.nodes or not drop.plain("reservation", r.name):
            continue
        out.append(
            Reservation(
                name=r.name,
                nodes=r.nodes,
                start=r.start,
                end=r.end,
                accounts=tuple(a for a in r.accounts if acc.plain_name(a)),
                users=tuple(u for u in r.users if acc.plain_name(u)),
                maintenance="MAINT" in r.flags,
            )
        )
    return out


def partition_access(rows: Iterable[acc.PartitionAccessRow]) -> dict[str, PartitionAccess]:
    """The partitions that limit who may use them, or for how long (MaxTime)."""
    out = {}
    for p in rows:
        if not (p.allow_accounts or p.allow_qos or p.allow_groups or p.deny_accounts or p.deny_qos):
            if p.max_time_s is None:
                continue
        out[p.name] = PartitionAccess(
            accounts=p.allow_accounts,
            qos=p.allow_qos,
            groups=p.allow_groups,
            deny_accounts=p.deny_accounts,
            deny_qos=p.deny_qos,
            max_time_s=p.max_time_s,
        )
    return out


def standing_policy(
    settings: acc.PrioritySettings,
    assocs: list[acc.AssocRow],
    qos: list[acc.QosRow],
    shares: list[acc.ShareRow],
    res: list[acc.ReservationRow],
    parts: list[acc.PartitionAccessRow],
    now: float,
) -> SiteReading:
    """The reading of the parsed outputs (rows of other clusters left out)."""
    drop = _Dropped()
    mine = [a for a in assocs if not settings.cluster or not a.cluster or a.cluster == settings.cluster]
    limits = assoc_limits(mine, drop) + qos_limits(qos, drop) + partition_limits(parts, qos)
    share, usage, factor = account_shares(shares)
    top = max((q.priority for q in qos), default=0)
    policy = SitePolicy(
        limits=tuple(limits),
        shares=share,
        usage=usage,
        fairshare=factor,
        reservations=tuple(reservations(res, now, drop)),
        partition_access=partition_access(parts),
        priority_tiers={p.name: p.priority_tier for p in parts if p.priority_tier != 1 and acc.plain_name(p.name)},
        qos_priority={q.name: float(q.priority) for q in qos if q.priority and acc.plain_name(q.name)},
    )
    qos_norm = {q.name: q.priority / top for q in qos} if top > 0 else {}
    return SiteReading(policy, PriorityModel(settings, factor, qos_norm), tuple(drop.notes))


# --- this round -----------------------------------------------------------------


def job_gpus(job: SlurmJob) -> int:
    return (job.gpus_per_node or 0) * max(1, len(job.nodes) or job.num_nodes)


def holder(job: SlurmJob) -> Holder:
    """A Slurm job record as the limits see it (solver.limits; the one place
    Slurm's records map onto it): its account, user, QOS and the partition
    it runs in."""
    return Holder(job.account, job.user, job.qos, tuple(p for p in job.partition.split(",") if p))


def held_gpus(job: SlurmJob, node_types: Mapping[str, str | None]) -> Held:
    """The GPUs a running job holds, by type: its request's type, else its node's."""
    if not job.nodes:
        return ((job.gpu_type, job_gpus(job)),)
    return tuple((job.gpu_type or node_types.get(n), job.gpus_per_node or 0) for n in job.nodes)


def outside_limits(limits: Iterable[GpuLimit], outside: list[SlurmJob], snapshot: ClusterSnapshot) -> list[GpuLimit]:
    """The limits with `used_outside` counted from the `outside` running
    jobs (GPUs, or jobs: solver.limits.Bucket.count); a per-user
    (per-account) limit gets one limit per user (account) who holds some
    under it outside (``<name>/<member>``: solver.limits.Bucket.alone), next
    to the general one."""
    node_types = {n.name: n.gpu_type for n in snapshot.nodes}
    held = [(holder(j), held_gpus(j, node_types)) for j in outside]
    out = []
    for lim in limits:
        used = 0
        per_member: dict[str, tuple[Bucket, int]] = {}
        for who, gpus in held:
            b = bucket_of(lim, who)
            if b is None or b.per_job:
                continue
            if b.member is None:
                used += b.count(gpus)
            else:
                per_member[b.member] = (b, per_member.get(b.member, (b, 0))[1] + b.count(gpus))
        out.append(replace(lim, used_outside=used) if used else lim)
        out += [b.alone(n) for _, (b, n) in sorted(per_member.items()) if n]
    return out


def unmanaged_demand(
    snapshot: ClusterSnapshot, managed: Collection[str], model: PriorityModel
) -> tuple[UnmanagedDemand, ...]:
    """The pending plain sbatch GPU jobs that wait for GPUs: not managed,
    not held, eligible (their begin time reached), with a reason in
    WAITING_FOR_GPUS. Their priority is Slurm's."""
    now = snapshot.taken_at
    out = []
    for j in snapshot.jobs:
        if j.job_id in managed or not j.pending or j.held or not j.gpus_per_node:
            continue
        if j.reason not in WAITING_FOR_GPUS or (j.eligible_time is not None and j.eligible_time > now):
            continue
        out.append(
            UnmanagedDemand(
                job_id=j.job_id,
                gpus=job_gpus(j),
                gpu_type=j.gpu_type,
                partitions=tuple(p for p in j.partition.split(",") if p),
                priority=model.priority(j, now),
                account=j.account,
                user=j.user,
                nodes=max(1, j.num_nodes),
                submit_time=j.submit_time or 0.0,
            )
        )
    return tuple(out[:MAX_ROWS])


def round_policy(
    reading: SiteReading, snapshot: ClusterSnapshot, carried: Collection[str], managed: Collection[str]
) -> SitePolicy:
    """The round's SitePolicy: the standing one, with the GPUs that running
    jobs the request does not carry (`carried`: the managed jobs on a
    placement of ours) hold under each limit, and the pending plain jobs
    (not in `managed`) that claim GPUs, and the groups of the managed jobs'
    users where a partition has AllowGroups (`SiteReading.groups`). An
    empty reading stays empty. A job that holds no GPU counts under the
    job-count limits."""
    policy = reading.policy
    if policy.empty:
        return policy
    outside = [j for j in snapshot.jobs if j.holds_resources and j.job_id not in carried]
    groups: dict[str, tuple[str, ...] | None] = {}
    if any(a.groups for a in policy.partition_access.values()):
        users = sorted({j.user for j in snapshot.jobs if j.job_id in managed and j.user})
        groups = {u: reading.groups(u) for u in users[:MAX_ROWS]}
    return replace(
        policy,
        limits=tuple(outside_limits(policy.limits, outside, snapshot)),
        unmanaged=unmanaged_demand(snapshot, managed, reading.priority),
        user_groups=groups,
    )


def allowed_partitions(request: ScheduleRequest) -> dict[str, tuple[str, ...]]:
    """job -> the partitions it may be placed in, for each job that the
    site's partition access (`SitePolicy.admits`: AllowAccounts, AllowQos,
    AllowGroups, DenyAccounts, DenyQos, MaxTime) allows fewer than its own
    (all the cluster's when it names none)."""
    site = request.site
    if not site.partition_access:
        return {}
    every = tuple(sorted(request.cluster.partitions))
    out = {}
    for job in request.jobs:
        names = job.partitions if job.partitions is not None else every
        keep = tuple(p for p in names if site.admits(p, job.account, job.qos, job.user, job.time_limit_s))
        if len(keep) < len(names):
            out[job.job_id] = keep
    return out
