"""A site's own files as the simulated site (`cellsched simulate --site-dump
--partitions`, docs/simulator.md#a-sites-own-files): the records of
slurm_ext.parse.sitefiles mapped onto the cluster file's `SiteSpec`, so that
the simulated Slurm and the policies see the site's tree, shares, limits,
QOS and partitions as they see a ``[site]`` table.

What each field becomes:

* an ``Account`` line: an `AccountSpec`: Fairshare -> `share`, its Parent ->
  `parent` (root: none), GrpTRES's ``gres/gpu`` -> `gpus`, GrpJobs -> `jobs`,
  MaxJobs -> `user_jobs`; `users` the users listed in it (at least 1);
* a ``User`` line: its GrpTRES's ``gres/gpu`` -> its account's `user_gpus`
  and its MaxJobs -> its account's `user_jobs` where the account sets none
  (the simulated site has one of each per account: users of one account
  with different values are an error naming the line); a user's Fairshare is
  read and not applied (the simulator gives no shares to users within an
  account), nor are associations bound to one partition;
* the QOS named in the QOS lists: a `QosSpec` each; with `qos` rows (the
  ``sacctmgr show qos`` of slurm_ext.parse.accounting) their GrpTRES ->
  `gpus`, MaxTRESPerUser -> `user_gpus`, MaxTRES -> `job_gpus`, Priority ->
  `priority`; the cluster line's DefaultQOS (else, when every association
  lists one QOS, that one) -> `default_qos`;
* the ``Cluster`` line (root's association): its QOS list and DefaultQOS
  (above); its limits are read and not applied;
* a partition: its AllowAccounts, AllowQos, DenyAccounts, DenyQos ->
  `SiteSpec.partitions` (slurm_ext.site.partition_access, the live
  controller's own mapping), its PriorityTier -> `priority_tiers`; MaxTime
  is read and not applied (trace jobs carry no time limit, and a job
  without one is admitted by no partition with a MaxTime), nor AllowGroups
  (the simulator has no Unix groups) nor the partition's QOS.

`SiteFiles.notes` lists what was read and not applied, and the fields
accepted and not used, each with its file and line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from slurm_ext.parse.accounting import QosRow
from slurm_ext.parse.sitefiles import (
    DumpEntity,
    DumpFile,
    PartitionFile,
    SiteFileError,
    parse_dump,
    parse_partition_file,
    read_text,
)
from slurm_ext.sim.types import AccountSpec, ClusterSpec, QosSpec, SiteSpec
from slurm_ext.site import partition_access


@dataclass(frozen=True)
class SiteFiles:
    """The simulated site a dump (and partitions) make, and what of them was not applied."""

    site: SiteSpec
    notes: tuple[str, ...] = field(default_factory=tuple)


def site_of_files(
    dump: DumpFile,
    dump_path: str | os.PathLike,
    partitions: PartitionFile | None = None,
    partitions_path: str | os.PathLike = "",
    qos: Sequence[QosRow] = (),
) -> SiteFiles:
    """The `SiteSpec` of a dump, its partitions and QOS (module doc)."""
    notes = [_unused(dump_path, dump.ignored)] if dump.ignored else []
    root = sorted(k for k in dump.cluster.values if k in ("GrpTRES", "GrpJobs", "MaxJobs", "Partition"))
    if root:
        notes.append(f"{dump_path}:{dump.cluster.line}: the cluster's (root's) {', '.join(root)}: not applied")
    accounts = {a.name: _account(a, dump_path) for a in dump.accounts}
    if not accounts:
        raise SiteFileError(dump_path, dump.cluster.line, "the dump lists no account")
    if not any(a.share > 0 for a in accounts.values()):
        raise SiteFileError(dump_path, dump.accounts[0].line, "every account's Fairshare is 0")
    per_user: dict[tuple[str, str], tuple[int | None, int]] = {}
    users: dict[str, set[str]] = {}
    for u in dump.users:
        if u.values.get("Partition"):
            notes.append(f"{dump_path}:{u.line}: user {u.name} in {u.parent} bound to a partition: not applied")
            continue
        if u.parent not in accounts:  # a user of root: no account of the simulated site
            notes.append(f"{dump_path}:{u.line}: user {u.name} of root: not applied")
            continue
        users.setdefault(u.parent, set()).add(u.name)
        if u.values.get("Fairshare", "1") not in ("1", "parent"):
            notes.append(f"{dump_path}:{u.line}: user {u.name}'s Fairshare in {u.parent}: not applied")
        gpus, jobs = u.gpus("GrpTRES", dump_path), u.count("MaxJobs", dump_path)
        _one_per_account(per_user, u, "GrpTRES", gpus, dump_path)
        _one_per_account(per_user, u, "MaxJobs", jobs, dump_path)
        a = accounts[u.parent]  # an account's own MaxJobs stays: slurmdbd copies it to users that set none
        accounts[u.parent] = replace(
            a,
            user_gpus=a.user_gpus if gpus is None else gpus,
            user_jobs=a.user_jobs if a.user_jobs is not None or jobs is None else jobs,
        )
    accounts = {n: replace(a, users=max(1, len(users.get(n, ())))) for n, a in accounts.items()}
    qos_specs, default_qos, qos_notes = _qos(dump, dump_path, qos)
    notes += qos_notes
    parts, tiers = {}, {}
    if partitions is not None:
        notes += [_unused(partitions_path, partitions.ignored)] if partitions.ignored else []
        for name, access in partition_access(partitions.partitions).items():
            line = partitions.lines.get(name, 0)
            if access.max_time_s is not None:
                notes.append(f"{partitions_path}:{line}: partition {name} MaxTime: not applied (no job time limits)")
            if access.groups:
                notes.append(f"{partitions_path}:{line}: partition {name} AllowGroups: not applied")
            parts[name] = replace(access, max_time_s=None, groups=())
        tiers = {p.name: p.priority_tier for p in partitions.partitions if p.priority_tier != 1}
        notes += [
            f"{partitions_path}:{partitions.lines.get(p.name, 0)}: partition {p.name} QOS {p.qos}: not applied"
            for p in partitions.partitions
            if p.qos
        ]
    site = SiteSpec(
        tuple(accounts.values()),
        qos_specs,
        default_qos,
        partitions={n: a for n, a in parts.items() if a.accounts or a.qos or a.deny_accounts or a.deny_qos},
        priority_tiers=tiers,
    )
    return SiteFiles(site, tuple(notes))


def _unused(path: str | os.PathLike, fields: Mapping[str, int]) -> str:
    return f"{path}: accepted, not used: " + ", ".join(f"{k} (line {n})" for k, n in fields.items())


def _account(a: DumpEntity, path: str | os.PathLike) -> AccountSpec:
    share = a.values.get("Fairshare", "1")
    if not share.isdigit():
        raise SiteFileError(path, a.line, f"account {a.name}: Fairshare={share!r} is not modelled (a number only)")
    return AccountSpec(
        a.name,
        share=float(share),
        gpus=a.gpus("GrpTRES", path),
        parent="" if a.parent == "root" else a.parent,
        jobs=a.count("GrpJobs", path),
        user_jobs=a.count("MaxJobs", path),
    )


def _one_per_account(
    seen: dict[tuple[str, str], tuple[int | None, int]],
    user: DumpEntity,
    key: str,
    value: int | None,
    path: str | os.PathLike,
) -> None:
    """The simulated site has one user limit of each kind per account: users of one account that differ are an error."""
    first = seen.setdefault((user.parent, key), (value, user.line))
    if first[0] != value:
        raise SiteFileError(
            path,
            user.line,
            f"user {user.name} in {user.parent}: {key} differs from line {first[1]}'s "
            "(the simulated site has one per account)",
        )


def _qos(dump: DumpFile, path: str | os.PathLike, rows: Sequence[QosRow]) -> tuple[tuple[QosSpec, ...], str, list[str]]:
    """The site's QOS: those the dump's QOS lists name and those of `rows`; its default QOS; notes."""
    named: dict[str, int] = {}
    lists: set[tuple[str, ...]] = set()
    for e in (dump.cluster, *dump.accounts, *dump.users):
        names = tuple(q for q in e.values.get("QOS", "").split(",") if q)
        for q in names:
            named.setdefault(q.lstrip("+-"), e.line)
        if names:
            lists.add(tuple(sorted(names)))
    notes: list[str] = []
    specs: dict[str, QosSpec] = {q: QosSpec(q) for q in named}
    for r in rows:
        specs[r.name] = QosSpec(
            r.name,
            gpus=_any_type(r.grp_gpus, r.name, "GrpTRES", path),
            user_gpus=_any_type(r.max_gpus_per_user, r.name, "MaxTRESPerUser", path),
            job_gpus=_any_type(r.max_gpus_per_job, r.name, "MaxTRES", path),
            priority=float(r.priority),
        )
        if r.max_gpus_per_account or r.grp_jobs is not None or r.max_jobs_per_user is not None:
            notes.append(f"QOS {r.name}: MaxTRESPerAccount, GrpJobs, MaxJobsPerUser: not applied")
    default = dump.cluster.values.get("DefaultQOS", "")
    if not default and len(lists) == 1 and len(next(iter(lists))) == 1:
        default = next(iter(lists))[0]
    if default and default not in specs:
        specs[default] = QosSpec(default)
    if named and not rows:
        notes.append(f"{path}: the QOS {', '.join(named)} have no limits (a dump lists none: give --site-qos)")
    return tuple(specs.values()), default, notes


def _any_type(gpus: dict[str | None, int], qos: str, key: str, path: str | os.PathLike) -> int | None:
    if any(t is not None for t in gpus):
        raise SiteFileError(path, 0, f"QOS {qos} {key}: a limit of one GPU type is not modelled")
    return gpus.get(None)


def load_site_files(
    cluster: ClusterSpec, dump_path: str, partitions_path: str | None = None, qos_path: str | None = None
) -> SiteFiles:
    """The site of the files at these paths (module doc), for `cluster`:
    a partition the cluster does not have is an error naming its line."""
    from slurm_ext.parse.accounting import parse_qos
    from slurm_ext.parse.values import ParseError

    dump = parse_dump(read_text(dump_path), dump_path)
    parts = parse_partition_file(read_text(partitions_path), partitions_path) if partitions_path else None
    try:
        qos = parse_qos(read_text(qos_path)) if qos_path else []
    except ParseError as exc:  # its message names the line
        raise SiteFileError(qos_path or "", 0, str(exc)) from None
    if parts is not None:
        have = {g.gpu_type for g in cluster.groups} | {"all"}
        for p in parts.partitions:
            if p.name not in have:
                raise SiteFileError(
                    partitions_path or "",
                    parts.lines.get(p.name, 0),
                    f"partition {p.name!r} is not one of the simulated cluster's ({', '.join(sorted(have))})",
                )
    return site_of_files(dump, dump_path, parts, partitions_path or "", qos)


__all__ = ["SiteFiles", "load_site_files", "site_of_files"]
