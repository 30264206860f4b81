"""The site's policy read from Slurm each round (docs/site-policy.md).

`SiteReader.read` asks Slurm (its accounting through slurmdbd, and
slurmctld) for the standing policy: GPU limits of associations, QOS and
partition QOS, fair share, reservations, partition access, and the
multifactor priority settings. `round_policy` adds what this round's
snapshot shows: the GPUs that jobs the solver does not carry hold under each
limit (`GpuLimit.used_outside`) and the pending plain sbatch GPU jobs
(`UnmanagedDemand`). The controller puts the result on
`ScheduleRequest.site`.

Every backend offers the reading as ``read_site() -> SiteReading`` (the
Backend protocol: the CLI and pyslurm backends through Slurm's commands;
the simulated one reads an empty one, as does any without accounting: the
solver then behaves as before there was a site policy). Which limit binds
which job is solver.limits'; `holder` maps Slurm's job records onto what it
needs, for the GPUs running jobs hold outside the round (`outside_limits`).
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class SiteReading:
    """What a backend read of the site: the standing policy (no
    used_outside, no unmanaged demand: `round_policy` adds those from the
    round's snapshot), how to rank held jobs, and what it left out."""

    policy: SitePolicy = field(default_factory=SitePolicy)
    priority: PriorityModel = field(default_factory=PriorityModel)
    #: what was read but not used (names cellsched does not keep, limits it cannot express)
    dropped: tuple[str, ...] = ()


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
        return standing_policy(settings, assocs, qos, shares, res, parts, now)


# --- the standing policy ----------------------------------------------------------


def _limits(scope: LimitScope, name: str, kind: LimitKind, gpus: Mapping[str | None, int]) -> list[GpuLimit]:
    return [GpuLimit(scope, name, kind, n, gpu_type=t) for t, n in sorted(gpus.items(), key=lambda kv: str(kv[0]))]


class _Dropped:
    """The names and rows left out, for the reading's `dropped`."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def plain(self, what: str, *names: str) -> bool:
        bad = [n for n in names if n and not acc.plain_name(n)]
        if bad:
            self.notes.append(f"{what} {bad[0]!r}: not a plain name")
        return not bad


def assoc_limits(assocs: Iterable[acc.AssocRow], drop: _Dropped) -> list[GpuLimit]:
    """GrpTRES / MaxTRES (per job) of gres/gpu of accounts and of users within accounts."""
    out: list[GpuLimit] = []
    for a in list(assocs)[:MAX_ROWS]:
        if not drop.plain("association", a.account, a.user):
            continue
        if a.partition and (a.grp_gpus or a.max_gpus_per_job):
            drop.notes.append(f"association {a.account}/{a.user} in partition {a.partition}: limits not used")
            continue
        scope, name = (LimitScope.USER, f"{a.account}/{a.user}") if a.user else (LimitScope.ACCOUNT, a.account)
        out += _limits(scope, name, LimitKind.GRP, a.grp_gpus)
        out += _limits(scope, name, LimitKind.PER_JOB, a.max_gpus_per_job)
    return out


def qos_limits(qos: Iterable[acc.QosRow], drop: _Dropped) -> list[GpuLimit]:
    """GrpTRES, MaxTRES (per job) and MaxTRESPerUser of gres/gpu of each QOS."""
    out: list[GpuLimit] = []
    for q in list(qos)[:MAX_ROWS]:
        if not drop.plain("QOS", q.name):
            continue
        out += _limits(LimitScope.QOS, q.name, LimitKind.GRP, q.grp_gpus)
        out += _limits(LimitScope.QOS, q.name, LimitKind.PER_JOB, q.max_gpus_per_job)
        out += _limits(LimitScope.QOS_PER_USER, q.name, LimitKind.PER_USER, q.max_gpus_per_user)
        if q.max_gpus_per_account:
            drop.notes.append(f"QOS {q.name}: MaxTRESPerAccount not used")
    return out


def partition_limits(parts: Iterable[acc.PartitionAccessRow], qos: Iterable[acc.QosRow]) -> list[GpuLimit]:
    """The GPU limits of each partition's QOS, as limits of the partition."""
    by_name = {q.name: q for q in qos}
    out: list[GpuLimit] = []
    for p in parts:
        q = by_name.get(p.qos)
        if q is None or not acc.plain_name(p.name):
            continue
        out += _limits(LimitScope.PARTITION, p.name, LimitKind.GRP, q.grp_gpus)
        out += _limits(LimitScope.PARTITION, p.name, LimitKind.PER_JOB, q.max_gpus_per_job)
        out += _limits(LimitScope.PARTITION, p.name, LimitKind.PER_USER, q.max_gpus_per_user)
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


def partition_access(rows: Iterable[acc.PartitionAccessRow], drop: _Dropped) -> dict[str, PartitionAccess]:
    """The partitions that limit who may use them (DenyQos is not used: a note in `drop`)."""
    out = {}
    for p in rows:
        if p.deny_qos:
            drop.notes.append(f"partition {p.name}: DenyQos not used")
        if not (p.allow_accounts or p.allow_qos or p.allow_groups or p.deny_accounts):
            continue
        out[p.name] = PartitionAccess(
            accounts=p.allow_accounts, qos=p.allow_qos, groups=p.allow_groups, deny_accounts=p.deny_accounts
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
        reservations=tuple(reservations(res, now, drop)),
        partition_access=partition_access(parts, drop),
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
    jobs; a per-user limit gets one limit per user who holds GPUs under it
    outside (``<name>/<user>``: solver.limits.Bucket.alone), next to the general one."""
    node_types = {n.name: n.gpu_type for n in snapshot.nodes}
    held = [(holder(j), held_gpus(j, node_types)) for j in outside]
    out = []
    for lim in limits:
        used = 0
        per_user: dict[str, tuple[Bucket, int]] = {}
        for who, gpus in held:
            b = bucket_of(lim, who)
            if b is None or b.per_job:
                continue
            if b.user is None:
                used += b.count(gpus)
            else:
                per_user[b.user] = (b, per_user.get(b.user, (b, 0))[1] + b.count(gpus))
        out.append(replace(lim, used_outside=used) if used else lim)
        out += [b.alone(n) for _, (b, n) in sorted(per_user.items()) if n]
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
    (not in `managed`) that claim GPUs. An empty reading stays empty."""
    policy = reading.policy
    if policy.empty:
        return policy
    outside = [j for j in snapshot.jobs if j.holds_resources and j.gpus_per_node and j.job_id not in carried]
    return replace(
        policy,
        limits=tuple(outside_limits(policy.limits, outside, snapshot)),
        unmanaged=unmanaged_demand(snapshot, managed, reading.priority),
    )


def allowed_partitions(request: ScheduleRequest) -> dict[str, tuple[str, ...]]:
    """job -> the partitions it may be placed in, for each job that the
    site's partition access (AllowAccounts / AllowQos / DenyAccounts; a job
    is in no group cellsched knows) allows fewer than its own (all the
    cluster's when it names none)."""
    access = request.site.partition_access
    if not access:
        return {}
    every = tuple(sorted(request.cluster.partitions))
    out = {}
    for job in request.jobs:
        names = job.partitions if job.partitions is not None else every
        keep = tuple(p for p in names if p not in access or access[p].allows(job.account, job.qos))
        if len(keep) < len(names):
            out[job.job_id] = keep
    return out
