"""The site's policy as the solver sees it: what Slurm's accounting says the
scheduler must respect (docs/site-policy.md).

A `SitePolicy` rides on `ScheduleRequest.site`; every field is read from
Slurm each round by the shell (or from the cluster file in simulation) and
never configured in cellsched itself. The solver treats

* `limits` as hard constraints (a placement never puts an account, user, QOS
  or association over its GPU or job-count limit; a Grp limit of an account
  binds its sub-accounts' jobs too),
* `shares` / `usage` as fair share's entitlements, and `fairshare` (the
  factor Slurm computes for each association) as the weight of its jobs,
* `reservations` as windows in which nodes are offered only to jobs estimated
  to end before the window opens, or to the reservation's own jobs,
* `unmanaged` as demand of plain sbatch jobs that claims GPUs by Slurm's
  priority,
* `partition_access` as who may run where (and for how long: MaxTime),
* `priority_tiers` as each partition's PriorityTier, for a policy's priority use.

Pure data: this module imports nothing of ours.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class LimitScope(StrEnum):
    """Whom a limit binds."""

    ACCOUNT = "account"  # an account association (its users, and its sub-accounts' for a Grp limit)
    USER = "user"  # a user association within an account (name "account/user")
    QOS = "qos"  # a QOS's group limit (GrpTRES, GrpJobs)
    QOS_PER_USER = "qos-per-user"  # MaxTRESPerUser / MaxJobsPerUser of a QOS (per user of it)
    QOS_PER_ACCOUNT = "qos-per-account"  # MaxTRESPerAccount / MaxJobsPerAccount of a QOS (per account)
    PARTITION = "partition"  # a partition QOS's limit


class LimitKind(StrEnum):
    """Slurm's name of the limit: what it counts (GPUs, or running jobs:
    `jobs`) and for whom apart (`per`)."""

    GRP = "GrpTRES"
    PER_USER = "MaxTRESPerUser"
    PER_ACCOUNT = "MaxTRESPerAccount"
    PER_JOB = "MaxTRESPerJob"
    GRP_JOBS = "GrpJobs"
    MAX_JOBS = "MaxJobs"  # of a user association (slurmdbd copies an account's down to its users)
    JOBS_PER_USER = "MaxJobsPerUser"
    JOBS_PER_ACCOUNT = "MaxJobsPerAccount"

    @property
    def jobs(self) -> bool:
        """Does it count running jobs (each one, whatever it holds) instead of GPUs?"""
        return self in (LimitKind.GRP_JOBS, LimitKind.MAX_JOBS, LimitKind.JOBS_PER_USER, LimitKind.JOBS_PER_ACCOUNT)

    @property
    def per(self) -> str:
        """Whom it counts apart: "user", "account", "job", or "" (all its jobs together)."""
        if self in (LimitKind.PER_USER, LimitKind.JOBS_PER_USER):
            return "user"
        if self in (LimitKind.PER_ACCOUNT, LimitKind.JOBS_PER_ACCOUNT):
            return "account"
        return "job" if self == LimitKind.PER_JOB else ""


@dataclass(frozen=True)
class GpuLimit:
    """One limit Slurm enforces: at most `gpus` GPUs (of `gpu_type`, or of
    any type when None) at once for `name` in `scope`, or, for a kind that
    counts jobs (`LimitKind.jobs`: GrpJobs, MaxJobs, ...), at most `gpus`
    running jobs. `used_outside` counts what jobs this request does not
    carry (plain sbatch jobs, other schedulers' jobs) already hold under the
    same limit (GPUs, or jobs). `below`: the accounts under an account in
    Slurm's association tree, whose jobs its Grp limits bind too."""

    scope: LimitScope
    name: str
    kind: LimitKind
    gpus: int
    gpu_type: str | None = None
    used_outside: int = 0
    below: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.used_outside < 0:
            raise ValueError(f"GPU limit {self.scope}:{self.name}: counts must be >= 0")

    @property
    def key(self) -> str:
        t = f":{self.gpu_type}" if self.gpu_type else ""
        return f"{self.scope}:{self.name}:{self.kind}{t}"

    @property
    def headroom(self) -> int:
        """GPUs (jobs) the jobs this request carries may hold together under it."""
        return max(0, self.gpus - self.used_outside)

    @property
    def unit(self) -> str:
        """What it counts, as a reason says it: ``jobs``, ``gres/gpu`` or ``gres/gpu:TYPE``."""
        if self.kind.jobs:
            return "jobs"
        return "gres/gpu" + (f":{self.gpu_type}" if self.gpu_type else "")


@dataclass(frozen=True)
class Reservation:
    """A Slurm reservation: `nodes` from `start` to `end` (epoch seconds;
    `end` None: open-ended) belong to its `accounts` / `users`. A maintenance
    reservation names nobody: no job may overlap it."""

    name: str
    nodes: tuple[str, ...]
    start: float
    end: float | None = None
    accounts: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    maintenance: bool = False

    def admits(self, account: str, user: str, reservation: str | None = None) -> bool:
        """May a job of `account`/`user` (that asked for `reservation`) use the nodes?"""
        if self.maintenance:
            return False
        return reservation == self.name or account in self.accounts or user in self.users


@dataclass(frozen=True)
class UnmanagedDemand:
    """A pending plain sbatch GPU job: Slurm's priority orders it among the
    managed jobs; what it asks for is fixed."""

    job_id: str
    gpus: int
    gpu_type: str | None
    partitions: tuple[str, ...]
    priority: float
    account: str = ""
    user: str = ""
    nodes: int = 1
    submit_time: float = 0.0


@dataclass(frozen=True)
class PartitionAccess:
    """Who may use a partition (empty tuple: everybody; Slurm's ALL), and
    for how long (`max_time_s`, Slurm's MaxTime; None: UNLIMITED)."""

    accounts: tuple[str, ...] = ()
    qos: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    deny_accounts: tuple[str, ...] = ()
    deny_qos: tuple[str, ...] = ()
    max_time_s: float | None = None

    def allows(
        self, account: str, qos: str = "", groups: Collection[str] | None = (), time_limit_s: float | None = None
    ) -> bool:
        """May a job of `account` and `qos`, whose user is in `groups` (None:
        AllowGroups does not bind the user, as Slurm's root and SlurmUser),
        with time limit `time_limit_s` (None: none), run here? A job whose
        time limit is above MaxTime may not (Slurm keeps it pending,
        PartitionTimeLimit), nor one without a limit: Slurm would run it
        with MaxTime as its limit, and cellsched does not cut a job's time
        limit by where it places it."""
        if account and account in self.deny_accounts:
            return False
        if self.accounts and account not in self.accounts:
            return False
        if (self.qos and qos not in self.qos) or (qos and qos in self.deny_qos):
            return False
        if self.max_time_s is not None and (time_limit_s is None or time_limit_s > self.max_time_s):
            return False
        return not self.groups or groups is None or any(g in self.groups for g in groups)


@dataclass(frozen=True)
class SitePolicy:
    """Everything the site says, for one round. Empty: no policy (the
    solver behaves as it did before there was one)."""

    limits: tuple[GpuLimit, ...] = ()
    #: account -> normalised share of the cluster (Slurm's NormShares, 0..1)
    shares: Mapping[str, float] = field(default_factory=dict)
    #: account -> normalised decayed usage (Slurm's EffectvUsage, 0..1)
    usage: Mapping[str, float] = field(default_factory=dict)
    #: "account/user" (an association) or "account" -> the fair-share factor the
    #: site's algorithm gives it (sshare's FairShare, 0..1), as it is given
    fairshare: Mapping[str, float] = field(default_factory=dict)
    reservations: tuple[Reservation, ...] = ()
    unmanaged: tuple[UnmanagedDemand, ...] = ()
    partition_access: Mapping[str, PartitionAccess] = field(default_factory=dict)
    #: user -> the Unix groups Slurm's AllowGroups sees them in (None: AllowGroups does
    #: not bind them); a user not here is in none
    user_groups: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)
    #: partition -> its PriorityTier where it is not Slurm's default 1 (for a policy's priority use)
    priority_tiers: Mapping[str, int] = field(default_factory=dict)
    #: QOS -> its Priority (sacctmgr's; a QOS not named: 0): the first part of a
    #: job's preemption rank (solver.placement.preempt), nothing else; not part of `empty`
    qos_priority: Mapping[str, float] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (
            self.limits
            or self.shares
            or self.fairshare
            or self.reservations
            or self.unmanaged
            or self.partition_access
            or self.priority_tiers
        )

    def fair_factor(self, account: str, user: str) -> float | None:
        """The fair-share factor of the association `account/user` as given
        (`fairshare`), else its account's; None when neither is given."""
        got = self.fairshare.get(f"{account}/{user}")
        return got if got is not None else self.fairshare.get(account)

    def admits(self, partition: str, account: str, qos: str, user: str, time_limit_s: float | None) -> bool:
        """May a job of `account`/`user` in `qos` with time limit `time_limit_s`
        run in `partition` (PartitionAccess.allows; a partition without one: yes)?"""
        access = self.partition_access.get(partition)
        return access is None or access.allows(account, qos, self.user_groups.get(user, ()), time_limit_s)

    def tier(self, partition: str) -> int:
        """The partition's PriorityTier (Slurm's default 1)."""
        return self.priority_tiers.get(partition, 1)


# ---------- why a job waits: one line each, stable and parseable ----------
#
# Every reason a policy gives for a pending job under a site policy starts
# with one of these words; `parse_reason` reads any of them back.
#
#   limit <scope>:<name> <kind> gres/gpu[:<type>]|jobs used <used>/<allowed>
#   fairshare <account> usage <usage> >|>= share <share>
#   reservation <name> from <iso start> (job est. end <iso end>)
#   partition <account>/<qos> may use none of <p1,p2,...>
#   unmanaged <job id> (priority <priority>) claims <gpus> <type|any> GPUs
#   no cell fits: <why>
#   outbid by job <id> (value <value>)[, job <id> (value <value>)...]
#   preempted by job <id> (<why>)
#   settling: waited <s> s; takes a cell at most that much slower over its run than <cell> of its size
#
# and why a placed job is where it is (ScheduleReply.notes; read back the same way):
#
#   preempting job <id>[, job <id>...]
#   governor: ran <s> s of min_run_s <s> s
#   stays in <cell>: <why>

REASON_KINDS = (
    "limit",
    "fairshare",
    "reservation",
    "partition",
    "unmanaged",
    "no cell fits",
    "outbid",
    "preempted",
    "settling",
    "preempting",
    "governor",
    "stays",
)


def iso(t: float) -> str:
    """Epoch seconds as UTC ISO 8601 to the second (``2026-11-27T10:40:43Z``)."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def reason_limit(limit: GpuLimit, used: int, member: str | None = None) -> str:
    """``limit account:acctA GrpTRES gres/gpu used 4/4``: `used` counts every
    GPU (or job: ``limit account:acctA GrpJobs jobs used 2/2``) under the
    limit (used_outside included) against `limit.gpus`. A per-user or
    per-account limit names whom it counts: ``qos-per-user:normal/alice``."""
    name = limit.name if member is None or "/" in limit.name else f"{limit.name}/{member}"
    return f"limit {limit.scope}:{name} {limit.kind} {limit.unit} used {used}/{limit.gpus}"


def reason_fairshare(account: str, usage: float, share: float) -> str:
    """``fairshare acctA usage 0.62 > share 0.50`` (``>=`` when they are equal
    to two decimals)."""
    op = ">" if f"{usage:.2f}" != f"{share:.2f}" and usage > share else ">="
    return f"fairshare {account} usage {usage:.2f} {op} share {share:.2f}"


def reason_reservation(name: str, start: float, est_end: float | None) -> str:
    end = iso(est_end) if est_end is not None else "unknown"
    return f"reservation {name} from {iso(start)} (job est. end {end})"


def reason_partition(account: str, qos: str, partitions: tuple[str, ...]) -> str:
    return f"partition {account}/{qos} may use none of {','.join(partitions) or '-'}"


def reason_unmanaged(job_id: str, priority: float, gpus: int, gpu_type: str | None) -> str:
    return f"unmanaged {job_id} (priority {priority:g}) claims {gpus} {gpu_type or 'any'} GPUs"


def reason_no_cell(why: str) -> str:
    return f"no cell fits: {why}"


def reason_outbid(jobs: tuple[tuple[str, float], ...]) -> str:
    """``outbid by job 12 (value 1.25), job 14 (value 0.80)``: the jobs that
    hold the GPUs it could use, most valuable first (values in objective units)."""
    return "outbid by " + ", ".join(f"job {j} (value {v:.2f})" for j, v in jobs)


def reason_preempted(job_id: str, why: str) -> str:
    """``preempted by job 12 (qos urgent priority 100 > normal priority 0)``:
    the job of higher preemption rank that takes its GPUs (a running job
    preempted to zero, or a pending one whose placement it takes), and why
    it outranks it."""
    return f"preempted by job {job_id} ({why})"


def reason_settling(waited_s: float, best_cell: str) -> str:
    """``settling: waited 120 s; takes a cell at most that much slower over
    its run than a100:1x4``: a pending job that will keep its first placement
    (JobRequest.settles) waits for a GPU type near the fastest of its size
    (objective.settle_limits; the cell named is the fastest of the smallest
    size it waits on)."""
    waited = f"{max(0.0, waited_s):.0f}"
    return f"settling: waited {waited} s; takes a cell at most that much slower over its run than {best_cell}"


def reason_preempting(victims: tuple[str, ...]) -> str:
    """``preempting job 7, job 9``: the jobs preempted to zero for this one."""
    return "preempting " + ", ".join(f"job {v}" for v in victims)


def reason_governor(ran_s: float, min_run_s: float) -> str:
    """``governor: ran 120 s of min_run_s 600 s``: a running job kept where
    it runs because its current run is younger than min_run_s."""
    return f"governor: ran {ran_s:.0f} s of min_run_s {min_run_s:.0f} s"


def reason_stays(cell: str, why: str) -> str:
    """``stays in a40:1x2: <why>``: why a running elastic job is neither
    grown, shrunk nor moved this round."""
    return f"stays in {cell}: {why}"


_PATTERNS = {
    "limit": r"limit (?P<scope>[a-z-]+):(?P<name>\S+) (?P<kind>\S+) "
    r"(?:gres/gpu(?::(?P<gpu_type>\S+))?|(?P<unit>jobs)) used (?P<used>\d+)/(?P<allowed>\d+)$",
    "fairshare": r"fairshare (?P<account>\S+) usage (?P<usage>[0-9.]+) (?P<op>>=?) share (?P<share>[0-9.]+)$",
    "reservation": r"reservation (?P<name>\S+) from (?P<start>\S+) \(job est\. end (?P<end>\S+)\)$",
    "partition": r"partition (?P<account>[^/\s]*)/(?P<qos>\S*) may use none of (?P<partitions>\S+)$",
    "unmanaged": r"unmanaged (?P<job>\S+) \(priority (?P<priority>\S+)\) claims (?P<gpus>\d+) (?P<gpu_type>\S+) GPUs$",
    "no cell fits": r"no cell fits: (?P<why>.*)$",
    "outbid": r"outbid by (?P<jobs>.*)$",
    "preempted": r"preempted by job (?P<job>\S+) \((?P<why>.*)\)$",
    "settling": r"settling: waited (?P<waited>\d+) s; takes a cell at most that much slower over its run than "
    r"(?P<cell>\S+)$",
    "preempting": r"preempting (?P<jobs>job .*)$",
    "governor": r"governor: ran (?P<ran>\d+) s of min_run_s (?P<min_run>\d+) s$",
    "stays": r"stays in (?P<cell>\S+): (?P<why>.*)$",
}


def parse_reason(text: str) -> tuple[str, dict[str, str]]:
    """(kind, fields) of a reason in the forms above; ("other", {"text": text})
    for any other reason (those of a round without a site policy)."""
    import re

    for kind, pattern in _PATTERNS.items():
        m = re.match(pattern, text)
        if m:
            fields = {k: v for k, v in m.groupdict().items() if v is not None}
            if kind == "outbid":
                fields["jobs"] = ",".join(re.findall(r"job (\S+) \(value", text))
            elif kind == "preempting":
                fields["jobs"] = ",".join(re.findall(r"job ([^,;\s]+)", text))
            return kind, fields
    return "other", {"text": text}
