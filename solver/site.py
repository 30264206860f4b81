"""The site's policy as the solver sees it: what Slurm's accounting says the
scheduler must respect (docs/site-policy.md).

A `SitePolicy` rides on `ScheduleRequest.site`; every field is read from
Slurm each round by the shell (or from the cluster file in simulation) and
never configured in cellsched itself. The solver treats

* `limits` as hard constraints (a placement never puts an account, user, QOS
  or association over its GPU limit),
* `shares` / `usage` as weights of its objective (fair share),
* `reservations` as windows in which nodes are offered only to jobs estimated
  to end before the window opens, or to the reservation's own jobs,
* `unmanaged` as demand of plain sbatch jobs that claims GPUs by Slurm's
  priority,
* `partition_access` as who may run where.

Pure data: this module imports nothing of ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class LimitScope(StrEnum):
    """Whom a GPU limit binds."""

    ACCOUNT = "account"  # an account association (GrpTRES over all its users)
    USER = "user"  # a user association within an account (name "account/user")
    QOS = "qos"  # a QOS's group limit (GrpTRES)
    QOS_PER_USER = "qos-per-user"  # MaxTRESPerUser of a QOS (per user of it)
    PARTITION = "partition"  # a partition QOS's limit


class LimitKind(StrEnum):
    """Slurm's name of the limit."""

    GRP = "GrpTRES"
    PER_USER = "MaxTRESPerUser"
    PER_JOB = "MaxTRESPerJob"


@dataclass(frozen=True)
class GpuLimit:
    """One GPU limit Slurm enforces: at most `gpus` GPUs (of `gpu_type`, or of
    any type when None) at once for `name` in `scope`. `used_outside` counts
    the GPUs that jobs this request does not carry (plain sbatch jobs, other
    schedulers' jobs) already hold under the same limit."""

    scope: LimitScope
    name: str
    kind: LimitKind
    gpus: int
    gpu_type: str | None = None
    used_outside: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.used_outside < 0:
            raise ValueError(f"GPU limit {self.scope}:{self.name}: counts must be >= 0")

    @property
    def key(self) -> str:
        t = f":{self.gpu_type}" if self.gpu_type else ""
        return f"{self.scope}:{self.name}:{self.kind}{t}"

    @property
    def headroom(self) -> int:
        """GPUs the jobs this request carries may hold together under it."""
        return max(0, self.gpus - self.used_outside)


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
    """Who may use a partition (empty tuple: everybody; Slurm's ALL)."""

    accounts: tuple[str, ...] = ()
    qos: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    deny_accounts: tuple[str, ...] = ()

    def allows(self, account: str, qos: str = "", groups: tuple[str, ...] = ()) -> bool:
        if account and account in self.deny_accounts:
            return False
        if self.accounts and account not in self.accounts:
            return False
        if self.qos and qos not in self.qos:
            return False
        return not self.groups or any(g in self.groups for g in groups)


@dataclass(frozen=True)
class SitePolicy:
    """Everything the site says, for one round. Empty: no policy (the
    solver behaves as it did before there was one)."""

    limits: tuple[GpuLimit, ...] = ()
    #: account -> normalised share of the cluster (Slurm's NormShares, 0..1)
    shares: Mapping[str, float] = field(default_factory=dict)
    #: account -> normalised decayed usage (Slurm's EffectvUsage, 0..1)
    usage: Mapping[str, float] = field(default_factory=dict)
    reservations: tuple[Reservation, ...] = ()
    unmanaged: tuple[UnmanagedDemand, ...] = ()
    partition_access: Mapping[str, PartitionAccess] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.limits or self.shares or self.reservations or self.unmanaged or self.partition_access)
