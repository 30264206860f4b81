"""Slurm's accounting and policy outputs as records: associations and QOS
(``sacctmgr -n -P show assoc|qos format=...``), fair share (``sshare -n -P
-a -o ...``), reservations (``scontrol -o show reservation``), partition
access (``scontrol -o show partition``) and the priority settings (``scontrol
show config``). slurm_ext.site turns them into the solver's SitePolicy.

Every parser takes the command's whole output (bounded by the caller), checks
the shape of each line and raises ParseError for one it cannot read; names
are kept only when they are plain (`plain_name`), the others are dropped and
named in `dropped` by the caller.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm_ext.parse.scontrol_text import records
from slurm_ext.parse.values import ParseError, text, text_time
from slurm_ext.records import expand_hostlist

#: the columns of each command, in the order they are asked for (and parsed)
ASSOC_FORMAT = (
    "cluster",
    "account",
    "user",
    "partition",
    "share",
    "grptres",
    "maxtres",
    "qos",
    "parentname",
    "grpjobs",
    "maxjobs",
)
QOS_FORMAT = ("name", "priority", "grptres", "maxtres", "maxtrespu", "maxtrespa", "grpjobs", "maxjobspu", "maxjobspa")
SSHARE_FORMAT = ("Account", "User", "RawShares", "NormShares", "RawUsage", "EffectvUsage", "FairShare")

#: a name Slurm's admins gave (account, user, QOS, partition, reservation) that cellsched keeps
_PLAIN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,127}$")
_TRES_GPU = re.compile(r"^gres/gpu(?::(?P<type>[A-Za-z0-9_.-]+))?=(?P<n>\d+)$")


def plain_name(value: str) -> bool:
    """Is `value` a name cellsched keeps (letters, digits and ``_.@+-``, at most 128)?"""
    return bool(_PLAIN.match(value))


def gpu_tres(value: str) -> dict[str | None, int]:
    """The GPU counts of a TRES list: ``cpu=4,gres/gpu=4,gres/gpu:a100=2`` ->
    {None: 4, "a100": 2} (None: any type). Other TRES are ignored."""
    out: dict[str | None, int] = {}
    for item in text(value).split(","):
        m = _TRES_GPU.match(item.strip())
        if m:
            out[m.group("type")] = int(m.group("n"))
    return out


def job_count(value: str, where: str) -> int | None:
    """A job-count limit (GrpJobs, MaxJobs, ...): "" is none."""
    v = value.strip()
    if not v:
        return None
    if not v.isdigit():
        raise ParseError(f"{where}: not a number of jobs: {value!r}")
    return int(v)


def _rows(output: str, width: int, what: str) -> list[list[str]]:
    rows = []
    for n, line in enumerate(output.splitlines(), 1):
        if not line.strip():
            continue
        cells = line.split("|")
        if len(cells) < width:
            raise ParseError(f"{what} line {n}: {width} '|'-separated fields expected, got {len(cells)}")
        rows.append(cells[:width])
    return rows


@dataclass(frozen=True)
class AssocRow:
    """One association: an account's (`user` "") or a user's within an
    account. `parent`: an account's parent account (sacctmgr's ParentName;
    "" for a user's, whose parent is its account, and for root). Its
    GrpJobs and MaxJobs (None: none); slurmdbd copies an account's MaxJobs
    (and MaxTRES) down to the associations below it, so a user's row shows
    the one that binds it."""

    cluster: str
    account: str
    user: str
    partition: str
    shares: str
    grp_gpus: dict[str | None, int]
    max_gpus_per_job: dict[str | None, int]
    qos: tuple[str, ...]
    parent: str = ""
    grp_jobs: int | None = None
    max_jobs: int | None = None


def parse_assocs(output: str) -> list[AssocRow]:
    """``sacctmgr -n -P show assoc format=<ASSOC_FORMAT>``."""
    out = []
    for n, c in enumerate(_rows(output, len(ASSOC_FORMAT), "sacctmgr show assoc"), 1):
        where = f"sacctmgr show assoc line {n}"
        out.append(
            AssocRow(
                cluster=c[0].strip(),
                account=c[1].strip(),
                user=c[2].strip(),
                partition=c[3].strip(),
                shares=c[4].strip(),
                grp_gpus=gpu_tres(c[5]),
                max_gpus_per_job=gpu_tres(c[6]),
                qos=tuple(q for q in c[7].strip().split(",") if q),
                parent=c[8].strip(),
                grp_jobs=job_count(c[9], where),
                max_jobs=job_count(c[10], where),
            )
        )
    return out


@dataclass(frozen=True)
class QosRow:
    """One QOS and its GPU and job-count limits (None: none)."""

    name: str
    priority: int
    grp_gpus: dict[str | None, int]
    max_gpus_per_job: dict[str | None, int]
    max_gpus_per_user: dict[str | None, int]
    max_gpus_per_account: dict[str | None, int]
    grp_jobs: int | None = None
    max_jobs_per_user: int | None = None
    max_jobs_per_account: int | None = None


def parse_qos(output: str) -> list[QosRow]:
    """``sacctmgr -n -P show qos format=<QOS_FORMAT>``."""
    out = []
    for n, c in enumerate(_rows(output, len(QOS_FORMAT), "sacctmgr show qos"), 1):
        where = f"sacctmgr show qos line {n}"
        prio = c[1].strip()
        out.append(
            QosRow(
                name=c[0].strip(),
                priority=int(prio) if prio.isdigit() else 0,
                grp_gpus=gpu_tres(c[2]),
                max_gpus_per_job=gpu_tres(c[3]),
                max_gpus_per_user=gpu_tres(c[4]),
                max_gpus_per_account=gpu_tres(c[5]),
                grp_jobs=job_count(c[6], where),
                max_jobs_per_user=job_count(c[7], where),
                max_jobs_per_account=job_count(c[8], where),
            )
        )
    return out


@dataclass(frozen=True)
class ShareRow:
    """One line of sshare: `depth` is the association's level in the tree
    (the root 0, its accounts 1, ...); `user` "" for an account."""

    depth: int
    account: str
    user: str
    norm_shares: float
    effective_usage: float
    fairshare: float | None


def _float(value: str, where: str) -> float:
    v = value.strip()
    if v in ("", "inf", "nan"):
        return 0.0
    try:
        return float(v)
    except ValueError:
        raise ParseError(f"{where}: not a number: {value!r}") from None


def parse_sshare(output: str) -> list[ShareRow]:
    """``sshare -n -P -a -o <SSHARE_FORMAT>`` (accounts indented by their depth)."""
    out = []
    for n, c in enumerate(_rows(output, len(SSHARE_FORMAT), "sshare"), 1):
        where = f"sshare line {n}"
        fs = c[6].strip()
        out.append(
            ShareRow(
                depth=len(c[0]) - len(c[0].lstrip(" ")),
                account=c[0].strip(),
                user=c[1].strip(),
                norm_shares=_float(c[3], where),
                effective_usage=_float(c[5], where),
                fairshare=_float(fs, where) if fs else None,
            )
        )
    return out


@dataclass(frozen=True)
class ReservationRow:
    """One reservation; times in epoch seconds (`end` None: open-ended)."""

    name: str
    nodes: tuple[str, ...]
    start: float
    end: float | None
    flags: tuple[str, ...]
    users: tuple[str, ...]
    accounts: tuple[str, ...]


def _names(value: str | None) -> tuple[str, ...]:
    """``a,b`` -> (a, b); "(null)", "ALL", "" -> ()."""
    s = text(value)
    if s in ("", "ALL", "N/A"):
        return ()
    return tuple(x for x in s.split(",") if x)


def parse_reservations(output: str) -> list[ReservationRow]:
    """``scontrol -o show reservation`` (times in local time, as scontrol prints them)."""
    if output.strip() in ("", "No reservations in the system"):
        return []
    out = []
    for f in records(output, "ReservationName"):
        name = f.get("ReservationName", "")
        try:
            start = text_time(f.get("StartTime"))
            if start is None:
                raise ParseError("no StartTime")
            out.append(
                ReservationRow(
                    name=name,
                    nodes=expand_hostlist(text(f.get("Nodes"))),
                    start=start,
                    end=text_time(f.get("EndTime")),
                    flags=_names(f.get("Flags")),
                    users=_names(f.get("Users")),
                    accounts=_names(f.get("Accounts")),
                )
            )
        except (ParseError, ValueError) as exc:
            raise ParseError(f"reservation {name!r}: {exc}") from exc
    return out


@dataclass(frozen=True)
class PartitionAccessRow:
    """Who may use a partition (empty: everybody), its partition QOS ("" none),
    its MaxTime (seconds; None: UNLIMITED) and PriorityTier."""

    name: str
    allow_accounts: tuple[str, ...]
    allow_qos: tuple[str, ...]
    allow_groups: tuple[str, ...]
    deny_accounts: tuple[str, ...]
    deny_qos: tuple[str, ...]
    qos: str
    max_time_s: float | None = None
    priority_tier: int = 1


def partition_max_time(value: str | None, name: str) -> float | None:
    """MaxTime as scontrol prints it (``UNLIMITED``, ``[D-]HH:MM:SS``) in seconds; None: unlimited."""
    v = text(value)
    if v in ("", "UNLIMITED", "INFINITE", "NONE"):
        return None
    got = _duration_s(v)
    if got is None:
        raise ParseError(f"partition {name!r}: MaxTime {v!r} is not a time")
    return got


def parse_partition_access(output: str) -> list[PartitionAccessRow]:
    """``scontrol -o show partition``: AllowAccounts / AllowQos / AllowGroups /
    DenyAccounts / DenyQos, the partition QOS, MaxTime and PriorityTier."""
    if output.strip() in ("", "No partitions in the system"):
        return []
    out = []
    for f in records(output, "PartitionName"):
        name = f.get("PartitionName", "")
        qos = text(f.get("QoS"))
        tier = text(f.get("PriorityTier"))
        out.append(
            PartitionAccessRow(
                name=name,
                allow_accounts=_names(f.get("AllowAccounts")),
                allow_qos=_names(f.get("AllowQos")),
                allow_groups=_names(f.get("AllowGroups")),
                deny_accounts=_names(f.get("DenyAccounts")),
                deny_qos=_names(f.get("DenyQos")),
                qos="" if qos == "N/A" else qos,
                max_time_s=partition_max_time(f.get("MaxTime"), name),
                priority_tier=int(tier) if tier.isdigit() else 1,
            )
        )
    return out


@dataclass(frozen=True)
class PrioritySettings:
    """What ``scontrol show config`` says about the cluster and its priorities."""

    cluster: str = ""
    #: SlurmUser's name (AllowGroups does not bind it, nor root)
    slurm_user: str = "root"
    multifactor: bool = False
    weight_fairshare: float = 0.0
    weight_age: float = 0.0
    weight_qos: float = 0.0
    max_age_s: float = 7 * 86400.0


def _duration_s(value: str) -> float | None:
    """``7-00:00:00`` / ``1:00:00`` / ``00:01:00`` -> seconds (None: not a duration)."""
    m = re.match(r"^(?:(\d+)-)?(\d+):(\d+):(\d+)$", value.strip())
    if not m:
        return None
    d, h, mi, s = (int(g) if g else 0 for g in m.groups())
    return float(((d * 24 + h) * 60 + mi) * 60 + s)


def parse_config(output: str) -> PrioritySettings:
    """``scontrol show config`` (``Key = value`` lines)."""
    kv: dict[str, str] = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            kv[key.strip()] = value.strip()

    def weight(key: str) -> float:
        v = kv.get(key, "")
        return float(v) if v.isdigit() else 0.0

    max_age = _duration_s(kv.get("PriorityMaxAge", ""))
    return PrioritySettings(
        cluster=kv.get("ClusterName", ""),
        slurm_user=kv.get("SlurmUser", "root").partition("(")[0] or "root",
        multifactor=kv.get("PriorityType", "") == "priority/multifactor",
        weight_fairshare=weight("PriorityWeightFairShare"),
        weight_age=weight("PriorityWeightAge"),
        weight_qos=weight("PriorityWeightQOS"),
        max_age_s=max_age if max_age else 7 * 86400.0,
    )
