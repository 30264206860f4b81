"""Which limit binds which job, and a bucket's load against its cap: the
one place that decides both (docs/site-policy.md#limits), for the GPU
limits (GrpTRES, MaxTRESPerUser, ...) and the job-count limits (GrpJobs,
MaxJobs, ...) alike.

Every path that counts GPUs or jobs under the site's limits calls this
module: the rows of the joint model and the greedy and repair plans
(solver.placement.siterules), the guard (`site_problems`, `enforce_site`),
slurm-multifactor, the controller's check at a release
(slurm_ext.controller.limits), the simulated Slurm's limits at a job's start
(slurm_ext.sim.site) and what jobs a round does not carry hold under each
limit (slurm_ext.site, which maps Slurm's job records onto `Holder`).

A limit binds a job (`binds`) by its scope:

========================  ===================================================
scope                     the jobs it binds
========================  ===================================================
``account``               those of the account (an empty account: none) and
                          of the accounts below it in Slurm's tree
                          (`GpuLimit.below`: a Grp limit of a parent account
                          binds every sub-account's jobs, as Slurm's does)
``user``                  those of ``account/user``
``qos``                   those of the QOS (an empty QOS: none)
``qos-per-user``          those of the QOS
``qos-per-account``       those of the QOS
``partition``             those that run in the partition (below)
========================  ===================================================

and a per-user or per-account limit (`LimitKind.per`, or the scopes
``qos-per-user`` / ``qos-per-account``) named ``<name>/<user>`` (or
``<name>/<account>``) binds that user's (account's) jobs only. A
partition QOS's limit binds, as Slurm's does, the jobs that run in the
partition: a job Slurm runs by the partition it runs in (`Holder.partitions`
of a Slurm record); a job the solver is to place by every partition it may
be placed in (`JobRequest.partitions`; None: it names none, so every one),
since its partition is settled only with its placement: the plan keeps the
limit whichever of them it lands in.

By kind, the jobs a limit binds fall into *buckets* (`bucket_of`): GrpTRES
and GrpJobs have one for all of them; a per-user (per-account) limit one per
user (account) unless it names its user (account); MaxTRESPerJob caps each
job alone (a `Bucket` with `per_job`, which holds no load). A bucket counts
the GPUs of its limit's type, or of every type, or, for a kind that counts
jobs (`LimitKind.jobs`), each running job once whatever it holds
(`Bucket.count`).

`Loads` keeps what each bucket holds and compares it with a cap: the
headroom (the limit less `used_outside`) by default, or whatever cap the
caller's moment gives it (the round's cap less what fixed jobs hold, the
GPUs the jobs hold now where that is more).

Pure: imports only solver.site and solver.types.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from solver.site import GpuLimit, LimitKind, LimitScope, reason_limit
from solver.types import Cell

#: GPUs a job holds or asks for, by GPU type: (type, GPUs) parts (type None: not known)
Held = Sequence[tuple[str | None, int]]


class Subject(Protocol):
    """Who a job is, as the limits see it (a JobRequest is one)."""

    @property
    def account(self) -> str: ...

    @property
    def user(self) -> str: ...

    @property
    def qos(self) -> str: ...

    @property
    def partitions(self) -> tuple[str, ...] | None: ...


@dataclass(frozen=True)
class Holder:
    """A `Subject` of a job that is not a JobRequest (a Slurm record, a
    simulated Slurm job). `partitions`: where it runs (None: anywhere)."""

    account: str = ""
    user: str = ""
    qos: str = ""
    partitions: tuple[str, ...] | None = None


def held_in(cell: Cell) -> Held:
    """The GPUs of `cell`, by type."""
    return tuple((t, n * cell.gpus_per_node) for t, n in cell.by_type())


def per_member(limit: GpuLimit) -> str:
    """Whom the limit counts apart: "user" (MaxTRESPerUser, MaxJobsPerUser, a
    QOS's per-user limit), "account" (MaxTRESPerAccount, ...), or ""."""
    if limit.scope == LimitScope.QOS_PER_USER:
        return "user"
    if limit.scope == LimitScope.QOS_PER_ACCOUNT:
        return "account"
    per = limit.kind.per
    return per if per in ("user", "account") else ""


def _member(who: Subject, per: str) -> str:
    return who.user if per == "user" else who.account


def binds(limit: GpuLimit, who: Subject) -> bool:
    """Does `limit` bind the job of `who`? (the module doc's table)"""
    name = limit.name
    per = per_member(limit)
    if per and "/" in name:  # one user's (account's): "<name>/<member>"
        name, _, member = name.rpartition("/")
        if _member(who, per) != member:
            return False
    s = limit.scope
    if s == LimitScope.ACCOUNT:
        return bool(who.account) and (who.account == name or who.account in limit.below)
    if s == LimitScope.USER:
        return f"{who.account}/{who.user}" == name
    if s in (LimitScope.QOS, LimitScope.QOS_PER_USER, LimitScope.QOS_PER_ACCOUNT):
        return bool(who.qos) and who.qos == name
    return who.partitions is None or name in who.partitions


@dataclass(frozen=True)
class Bucket:
    """The jobs one limit binds together: all of them, or one user's or
    account's (`member`); a per-job limit's bucket holds no load (`per_job`)."""

    limit: GpuLimit
    member: str | None = None

    @property
    def key(self) -> str:
        return self.limit.key + (f"/{self.member}" if self.member is not None else "")

    @property
    def per_job(self) -> bool:
        return self.limit.kind == LimitKind.PER_JOB

    def count(self, held: Held) -> int:
        """What the limit counts of one job holding `held`: the job itself
        (1) for a limit of jobs, else its GPUs (those of its GPU type, or all)."""
        if self.limit.kind.jobs:
            return 1
        t = self.limit.gpu_type
        return sum(g for ht, g in held if t is None or ht == t)

    def gpus(self, cell: Cell) -> int:
        """What the limit counts of a job in `cell` (its GPUs, or 1 job)."""
        return self.count(held_in(cell))

    def reason(self, used: int) -> str:
        """Why a job waits under it (solver.site.reason_limit), `used` GPUs (jobs) counted."""
        return reason_limit(self.limit, used, self.member)

    def alone(self, used_outside: int) -> GpuLimit:
        """A per-user (per-account) bucket as a limit of its own, named ``<name>/<member>``."""
        return dataclasses.replace(self.limit, name=f"{self.limit.name}/{self.member}", used_outside=used_outside)


def bucket_of(limit: GpuLimit, who: Subject) -> Bucket | None:
    """The bucket of `limit` that counts the job of `who` (None: it does not bind it)."""
    if not binds(limit, who):
        return None
    per = per_member(limit)
    return Bucket(limit, _member(who, per) if per and "/" not in limit.name else None)


def bindings(limits: Iterable[GpuLimit], who: Subject) -> list[Bucket]:
    """The buckets (per-job limits included) that bind the job of `who`, in the limits' order, each once."""
    out: dict[str, Bucket] = {}
    for lim in limits:
        b = bucket_of(lim, who)
        if b is not None:
            out.setdefault(b.key, b)
    return list(out.values())


def headroom(bucket: Bucket) -> int:
    """The default cap: the GPUs (jobs) the jobs a request carries may hold under the limit."""
    return bucket.limit.headroom


class Loads:
    """What each bucket holds (GPUs, or jobs), against its cap (`cap`, by
    bucket; default: the limit's headroom). Per-job limits hold nothing: a
    job is over one when it alone asks for more than its cap."""

    def __init__(self, cap: Callable[[Bucket], int] = headroom, load: Mapping[str, int] | None = None) -> None:
        self.cap = cap
        self.load: dict[str, int] = dict(load or {})
        self.buckets: dict[str, Bucket] = {}

    def blocking(self, buckets: Iterable[Bucket], held: Held) -> tuple[Bucket, int] | None:
        """The first of `buckets` that one more job holding `held` would put
        over its cap, and what is counted under it as a reason says it (Bucket.reason):
        those it holds with `used_outside` (a per-job limit: the job's own);
        None when every one allows them."""
        for b in buckets:
            g = b.count(held)
            have = 0 if b.per_job else self.load.get(b.key, 0)
            if g and have + g > self.cap(b):
                return b, g if b.per_job else have + b.limit.used_outside
        return None

    def fits(self, buckets: Iterable[Bucket], held: Held) -> bool:
        return self.blocking(buckets, held) is None

    def add(self, buckets: Iterable[Bucket], held: Held, sign: int = 1) -> None:
        for b in buckets:
            if not b.per_job:
                self.buckets.setdefault(b.key, b)
                self.load[b.key] = self.load.get(b.key, 0) + sign * b.count(held)

    def excess(self, key: str) -> int:
        """What bucket `key` holds over its cap (0: within it)."""
        b = self.buckets.get(key)
        return 0 if b is None else max(0, self.load.get(key, 0) - self.cap(b))

    def over(self) -> int:
        """What is over the caps, all buckets together (GPUs and jobs)."""
        return sum(self.excess(k) for k in self.load)

    def overs(self) -> list[tuple[Bucket, int]]:
        """(bucket, its load) of each bucket over its cap, by key."""
        return [(self.buckets[k], self.load[k]) for k in sorted(self.load) if self.excess(k)]
