"""A site's own policy files, as an admin saves them: ``sacctmgr dump
CLUSTER`` (the association tree with shares and limits) and ``scontrol show
partition`` (who may use each partition). One parser per format; each reads
the whole file, keeps every line's number, and raises SiteFileError naming
the file and line for a line it cannot read, a field it does not know or a
value of the wrong shape. Fields cellsched knows but does not use are
accepted and listed (`DumpFile.ignored`, `PartitionFile.ignored`), by name,
with the first line each was seen on. What becomes of the rest is
slurm_ext.sim.sitefiles's (docs/simulator.md#a-sites-own-files).

The dump (Slurm 22.05, ``sacctmgr dump CLUSTER file=F``): ``#`` comments,
then one entity a line, ``Kind - 'name'`` and ``:Key=Value`` pairs (a value
may be quoted with single quotes, and holds ``=`` in a TRES list). Kinds:
``Cluster`` (first), ``Parent`` (the account the next lines are under),
``Account`` and ``User``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from slurm_ext.errors import CellschedError
from slurm_ext.parse.accounting import (
    PartitionAccessRow,
    gpu_tres,
    parse_partition_access,
    partition_max_time,
    plain_name,
)
from slurm_ext.parse.scontrol_text import fields
from slurm_ext.parse.values import ParseError

#: the largest file read (bytes): an admin's dump of a large site is a few MB
MAX_BYTES = 64 * 1024 * 1024


class SiteFileError(ValueError, CellschedError):
    """A site file cellsched cannot read: ``<path>:<line>: <message>``."""

    def __init__(self, path: str | os.PathLike, line: int, message: str) -> None:
        self.path, self.line = str(path), line
        super().__init__(f"{self.path}:{line}: {message}" if line else f"{self.path}: {message}")


def read_text(path: str | os.PathLike) -> str:
    """The file's text (at most MAX_BYTES, UTF-8), or SiteFileError."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise SiteFileError(path, 0, f"cannot read ({exc.strerror})") from None
    if len(data) > MAX_BYTES:
        raise SiteFileError(path, 0, f"larger than {MAX_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SiteFileError(path, line, "not UTF-8 text") from None


# ---- sacctmgr dump ---------------------------------------------------------------------

#: the dump's fields cellsched reads, by their canonical name (aliases: _ALIASES)
DUMP_USED = ("Fairshare", "GrpTRES", "GrpJobs", "MaxJobs", "QOS", "DefaultQOS", "Partition")
#: the dump's fields accepted and not used (docs/site-policy-slurm.md says why of each)
DUMP_IGNORED = (
    "Description",
    "Organization",
    "DefaultAccount",
    "DefaultWCKey",
    "AdminLevel",
    "Coordinator",
    "WCKeys",
    "Classification",
    "Priority",
    "GrpJobsAccrue",
    "GrpSubmitJobs",
    "GrpTRESMins",
    "GrpTRESRunMins",
    "GrpWall",
    "MaxJobsAccrue",
    "MaxSubmitJobs",
    "MaxTRESMinsPerJob",
    "MaxTRESPerJob",
    "MaxTRESPerNode",
    "MaxWallDurationPerJob",
    "MinPrioThreshold",
)
#: other spellings sacctmgr accepts for a field (lower case) -> its canonical name
_ALIASES = {
    "fairshare": "Fairshare",
    "shares": "Fairshare",
    "maxtres": "MaxTRESPerJob",
    "maxtresperjob": "MaxTRESPerJob",
    "maxtresmins": "MaxTRESMinsPerJob",
    "maxwall": "MaxWallDurationPerJob",
    "maxwallduration": "MaxWallDurationPerJob",
    "maxsubmit": "MaxSubmitJobs",
    "grpsubmit": "GrpSubmitJobs",
    "qoslevel": "QOS",
    "defaultqos": "DefaultQOS",
}
_CANONICAL = {name.lower(): name for name in DUMP_USED + DUMP_IGNORED} | _ALIASES
_KINDS = ("Cluster", "Parent", "Account", "User")
_HEAD = re.compile(r"^(?P<kind>[A-Za-z]+) - '(?P<name>[^']*)'")
_KEY = re.compile(r":(?P<key>[A-Za-z]+)=")
#: a TRES name awaiting its type, the last item of a value so far (``...,gres/gpu``): the
#: ``:`` after it is the type's (``GrpTRES=gres/gpu:a100=4``), not the next field's
_TRES_NAME = re.compile(r"(?:^|,)[a-z]+/[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class DumpEntity:
    """One association line of a dump: an account's (`kind` "Account") or a
    user's (`kind` "User", in `parent`, its account), or the cluster's own
    (`kind` "Cluster", name the cluster); `parent` the account it is listed
    under ("root" at the top; "" for the cluster). `values`: the fields it
    sets that cellsched reads, by canonical name, unquoted."""

    kind: str
    name: str
    parent: str
    line: int
    values: Mapping[str, str] = field(default_factory=dict)

    def gpus(self, key: str, path: str | os.PathLike) -> int | None:
        """The untyped ``gres/gpu`` count of the TRES field `key` (None: not set);
        a typed one (``gres/gpu:a100``) is an error: the simulated site's limits are of every type."""
        value = self.values.get(key, "")
        if not value:
            return None
        got = gpu_tres(value)
        if any(t is not None for t in got):
            raise SiteFileError(path, self.line, f"{key}={value}: a limit of one GPU type is not modelled")
        return got.get(None)

    def count(self, key: str, path: str | os.PathLike) -> int | None:
        """The job count of `key` (GrpJobs, MaxJobs; None: not set)."""
        value = self.values.get(key, "")
        if not value:
            return None
        if not value.isdigit():
            raise SiteFileError(path, self.line, f"{key}={value!r}: not a number of jobs")
        return int(value)


@dataclass(frozen=True)
class DumpFile:
    """A parsed dump: its cluster, the account and user associations in
    the file's order, and the ignored fields (name -> first line)."""

    cluster: DumpEntity
    accounts: tuple[DumpEntity, ...]
    users: tuple[DumpEntity, ...]
    ignored: Mapping[str, int] = field(default_factory=dict)


def parse_dump(text: str, path: str | os.PathLike = "<dump>") -> DumpFile:
    """The entities of a ``sacctmgr dump`` file (module doc)."""
    cluster: DumpEntity | None = None
    parent = ""
    accounts: dict[str, DumpEntity] = {}
    users: list[DumpEntity] = []
    ignored: dict[str, int] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        kind, name, values = _dump_line(line, n, path, ignored)
        if kind != "Cluster" and cluster is None:
            raise SiteFileError(path, n, f"{kind} line before the Cluster line")
        if kind == "Cluster":
            if cluster is not None:
                raise SiteFileError(path, n, f"a second Cluster line (the first on line {cluster.line})")
            cluster = DumpEntity("Cluster", name, "", n, values)
        elif kind == "Parent":
            if values:
                raise SiteFileError(path, n, "a Parent line has no fields")
            if name != "root" and name not in accounts:
                raise SiteFileError(path, n, f"Parent {name!r} is no account listed above")
            parent = name
        elif not parent:
            raise SiteFileError(path, n, f"{kind} line before any Parent line")
        elif kind == "Account":
            if name in accounts or name == "root":
                raise SiteFileError(path, n, f"account {name!r} listed twice")
            accounts[name] = DumpEntity("Account", name, parent, n, values)
        else:
            users.append(DumpEntity("User", name, parent, n, values))
    if cluster is None:
        raise SiteFileError(path, 0, "no Cluster line: not the output of `sacctmgr dump CLUSTER`")
    return DumpFile(cluster, tuple(accounts.values()), tuple(users), ignored)


def _dump_line(line: str, n: int, path: str | os.PathLike, ignored: dict[str, int]) -> tuple[str, str, dict[str, str]]:
    """(kind, name, the fields cellsched reads) of one entity line."""
    head = _HEAD.match(line)
    if head is None:
        raise SiteFileError(path, n, f"expected \"Kind - 'name'\" (Cluster, Parent, Account, User), got {line[:60]!r}")
    kind, name = head.group("kind"), head.group("name")
    if kind not in _KINDS:
        raise SiteFileError(path, n, f"unknown kind {kind!r} (known: {', '.join(_KINDS)})")
    if not plain_name(name):
        raise SiteFileError(path, n, f"{kind} name {name!r} is not a plain name (letters, digits, _.@+-)")
    values: dict[str, str] = {}
    rest, pos = line[head.end() :], 0
    while pos < len(rest):
        m = _KEY.match(rest, pos)
        if m is None:
            raise SiteFileError(path, n, f"expected ':Key=Value' at {rest[pos : pos + 40]!r}")
        key = _CANONICAL.get(m.group("key").lower())
        if key is None:
            raise SiteFileError(path, n, f"unknown field {m.group('key')!r}")
        if key in values:
            raise SiteFileError(path, n, f"field {key!r} given twice")
        value, pos = _dump_value(rest, m.end(), n, path)
        if key in DUMP_USED:
            values[key] = value
        else:
            ignored.setdefault(key, n)
    return kind, name, values


def _dump_value(rest: str, pos: int, n: int, path: str | os.PathLike) -> tuple[str, int]:
    """The value at `pos` (quoted: to its closing quote; else to the next
    ``:`` that is not a TRES type's) and where it ends."""
    if rest.startswith("'", pos):
        end = rest.find("'", pos + 1)
        if end < 0:
            raise SiteFileError(path, n, f"unclosed quote at {rest[pos : pos + 40]!r}")
        return rest[pos + 1 : end], end + 1
    end = pos
    while True:
        end = rest.find(":", end)
        if end < 0:
            end = len(rest)
            break
        if not _TRES_NAME.search(rest[pos:end]):
            break
        end += 1
    value = rest[pos:end]
    if "'" in value:
        raise SiteFileError(path, n, f"a quote inside the unquoted value {value[:40]!r}")
    return value, end


# ---- scontrol show partition -----------------------------------------------------------

#: the partition fields cellsched reads (parse_partition_access)
PARTITION_USED = (
    "PartitionName",
    "AllowAccounts",
    "AllowQos",
    "AllowGroups",
    "DenyAccounts",
    "DenyQos",
    "QoS",
    "MaxTime",
    "PriorityTier",
)
#: the fields of Slurm 22.05's ``scontrol show partition`` accepted and not used
PARTITION_IGNORED = (
    "AllocNodes",
    "Default",
    "DefaultTime",
    "DisableRootJobs",
    "ExclusiveUser",
    "GraceTime",
    "Hidden",
    "MaxNodes",
    "MinNodes",
    "LLN",
    "MaxCPUsPerNode",
    "Nodes",
    "PriorityJobFactor",
    "RootOnly",
    "ReqResv",
    "OverSubscribe",
    "OverTimeLimit",
    "PreemptMode",
    "State",
    "TotalCPUs",
    "TotalNodes",
    "SelectTypeParameters",
    "JobDefaults",
    "DefMemPerNode",
    "DefMemPerCPU",
    "MaxMemPerNode",
    "MaxMemPerCPU",
    "TRES",
    "TRESBillingWeights",
    "MaxCPUsPerSocket",
    "Alternate",
    "NodeSets",
    "ResumeTimeout",
    "SuspendTime",
    "SuspendTimeout",
    "PowerDownOnIdle",
    "CpuBind",
)
_PARTITION_KEYS = frozenset(PARTITION_USED + PARTITION_IGNORED)
_PART_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_/:]*)=")


@dataclass(frozen=True)
class PartitionFile:
    """The partitions of a ``scontrol show partition`` file (as
    parse_partition_access reads them), the line each starts on, and the
    ignored fields (name -> first line)."""

    partitions: tuple[PartitionAccessRow, ...]
    lines: Mapping[str, int] = field(default_factory=dict)
    ignored: Mapping[str, int] = field(default_factory=dict)


def parse_partition_file(text: str, path: str | os.PathLike = "<partitions>") -> PartitionFile:
    """The partitions of ``scontrol show partition`` (one ``Key=Value`` list
    over several indented lines per partition, or ``-o``: one line each),
    every line checked: a record starts with ``PartitionName=``, every field
    is one Slurm 22.05 prints, none twice in a record."""
    ignored: dict[str, int] = {}
    starts: dict[str, int] = {}
    seen: set[str] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line == "No partitions in the system":
            continue
        if raw.startswith("PartitionName="):
            seen = set()
            name = fields(line)["PartitionName"]
            if not plain_name(name):
                raise SiteFileError(path, n, f"partition name {name!r} is not a plain name")
            if name in starts:
                raise SiteFileError(path, n, f"partition {name!r} listed twice (first on line {starts[name]})")
            starts[name] = n
        elif not starts:
            raise SiteFileError(path, n, f"expected a line starting with PartitionName=, got {line[:60]!r}")
        keys = _PART_KEY.findall(line)
        if not keys or not _PART_KEY.match(line):
            raise SiteFileError(path, n, f"expected Key=Value fields, got {line[:60]!r}")
        if "MaxTime" in keys:
            try:
                partition_max_time(fields(line)["MaxTime"], list(starts)[-1])
            except ParseError as exc:
                raise SiteFileError(path, n, str(exc)) from None
        for key in keys:
            if key not in _PARTITION_KEYS:
                raise SiteFileError(path, n, f"unknown field {key!r}")
            if key in seen:
                raise SiteFileError(path, n, f"field {key!r} given twice in one partition")
            seen.add(key)
            if key not in PARTITION_USED:
                ignored.setdefault(key, n)
    return PartitionFile(tuple(parse_partition_access(text)), starts, ignored)  # each value checked above


__all__ = [
    "DUMP_IGNORED",
    "DUMP_USED",
    "DumpEntity",
    "DumpFile",
    "PARTITION_IGNORED",
    "PARTITION_USED",
    "PartitionFile",
    "SiteFileError",
    "parse_dump",
    "parse_partition_file",
    "read_text",
]
