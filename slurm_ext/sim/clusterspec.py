"""Simulated cluster shapes: read a ClusterSpec from Arena's
``cluster_spec.json`` or from our own TOML/JSON node-group list, and name
the nodes.

Our format (TOML shown; JSON is ``{"name": ..., "nodes": [{...}, ...]}``)::

    name = "dev"
    [[nodes]]
    gpu_type = "a100"      # lower-case GPU type name
    count = 2              # nodes in this group
    gpus_per_node = 4
    mem_gb = 40            # optional: memory of ONE GPU, GB
    nic_gbps = 10          # optional: each node's network card, Gb/s (contention: --contention)
    rack = "r1"            # optional: the nodes' rack

    [uplink_gbps]          # optional: racks whose uplink is oversubscribed, Gb/s
    r1 = 40

    [site]                 # optional: the site's policy (docs/simulator.md)
    decay_half_life_s = 604800   # PriorityDecayHalfLife (default 7 days)
    default_qos = "normal"       # the QOS of a job that names none
    preempt_mode = "REQUEUE"     # PreemptMode of a QOS's preemption: REQUEUE (default) or CANCEL
    [site.accounts.physics]
    share = 50             # raw fair share (normalised over its parent's accounts)
    gpus = 32              # GrpTRES=gres/gpu=32 (optional; binds its sub-accounts too)
    user_gpus = 8          # each user's association GrpTRES (optional)
    jobs = 10              # GrpJobs: running jobs (optional; binds its sub-accounts too)
    user_jobs = 2          # MaxJobs: each user's running jobs (optional; sub-accounts inherit it)
    users = 4              # traces without accounts: users its jobs are spread over
    trace_weight = 1       # traces without accounts: its weight in the rule
    [site.accounts.theory]
    parent = "physics"     # a sub-account (default: under root)
    [site.qos.normal]
    gpus = 64              # GrpTRES (optional)
    user_gpus = 16         # MaxTRESPerUser (optional)
    job_gpus = 16          # MaxTRESPerJob (optional)
    priority = 0           # the QOS's Priority (preemption rank; default 0)
    trace_fraction = 0.1   # traces without a QOS: the share of their jobs given it (default 0)
    grace_s = 60           # GraceTime of its jobs when preempted, seconds (default 0)
    [site.qos.urgent]
    preempt = ["normal"]   # Preempt=: the QOS whose running jobs it preempts (default none)
    plain = true           # traces: its jobs are plain sbatch jobs, not cellsched's (default false)

Arena's format: ``{"cluster": {gpu: {"node_num", "gpus_per_node", ...}}}``
(gpus_per_node defaults to Arena's node capacity of that type; a
``total_gpus`` given must match). Its GPU memory comes from Arena's
device specs (A100 40, V100 32, A40 48, A10 24 GB).

Node names are ``<type>-<NNN>``: 1-based, zero-padded to the width of the
number of nodes of that type; several groups of one type continue the
numbering in file order.
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any

from slurm_ext.errors import CellschedError
from slurm_ext.sim.preempt import PREEMPT_MODES
from slurm_ext.sim.types import AccountSpec, ClusterSpec, NodeGroup, QosSpec, SiteSpec
from solver.contract.datafile import read_json_or_toml
from solver.contract.jobspec import GPU_TYPE
from solver.contract.profiles.arena import load_device_specs, shipped_path

_GROUP_KEYS = {"gpu_type", "count", "gpus_per_node", "mem_gb", "nic_gbps", "rack"}
_SITE_KEYS = {"accounts", "qos", "default_qos", "decay_half_life_s", "preempt_mode", "calc_period_s"}
_ACCOUNT_KEYS = {"share", "gpus", "user_gpus", "users", "trace_weight", "parent", "jobs", "user_jobs"}
_QOS_KEYS = {"gpus", "user_gpus", "job_gpus", "priority", "trace_fraction", "preempt", "grace_s", "plain"}
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


class ClusterSpecError(ValueError, CellschedError):
    """A malformed cluster spec; the message names the file and the field."""


def load_cluster_spec(path: str | os.PathLike) -> ClusterSpec:
    """Read a cluster spec (Arena's JSON, or our TOML/JSON)."""
    path = pathlib.Path(path)
    data = read_json_or_toml(path, ClusterSpecError)
    if not isinstance(data, dict):
        raise ClusterSpecError(f"{path}: expected a table/object at the top, got {type(data).__name__}")
    if "nodes" in data:
        return _ours(data, str(path))
    if "cluster" in data:
        return _arena(data, str(path))
    raise ClusterSpecError(f"{path}: missing field 'nodes' (a list of node groups) or Arena's 'cluster'")


def spec_from_dict(data: dict, where: str = "cluster spec") -> ClusterSpec:
    """A ClusterSpec from an already parsed mapping (either format)."""
    if isinstance(data, dict) and "cluster" in data and "nodes" not in data:
        return _arena(data, where)
    return _ours(data, where)


def arena_cluster() -> ClusterSpec:
    """Arena's simulated cluster: A100 80x4, V100 20x16, A40 160x2, A10 160x2 (1,280 GPUs)."""
    return load_cluster_spec(shipped_path("cluster_spec.json"))


def node_names(spec: ClusterSpec) -> list[tuple[str, str, int]]:
    """(node name, GPU type, GPUs) of every node, in group order."""
    per_type: dict[str, int] = {}
    for g in spec.groups:
        per_type[g.gpu_type] = per_type.get(g.gpu_type, 0) + g.count
    width = {t: len(str(n)) for t, n in per_type.items()}
    used: dict[str, int] = {}
    out: list[tuple[str, str, int]] = []
    for g in spec.groups:
        for _ in range(g.count):
            used[g.gpu_type] = used.get(g.gpu_type, 0) + 1
            out.append((f"{g.gpu_type}-{used[g.gpu_type]:0{width[g.gpu_type]}d}", g.gpu_type, g.gpus_per_node))
    return out


def node_type(name: str) -> str:
    """The GPU type in a node name of `node_names` (``a40-03`` -> ``a40``)."""
    return name.rsplit("-", 1)[0]


# ---- formats -----------------------------------------------------------------------


def _ours(data: dict, where: str) -> ClusterSpec:
    unknown = sorted(set(data) - {"name", "nodes", "uplink_gbps", "site"})
    if unknown:
        raise ClusterSpecError(f"{where}: unknown field {unknown[0]!r} (known: name, nodes, site, uplink_gbps)")
    name = data.get("name", "")
    if not isinstance(name, str):
        raise ClusterSpecError(f"{where}: field 'name' must be a string, got {name!r}")
    nodes = data["nodes"]
    if not isinstance(nodes, list) or not nodes:
        raise ClusterSpecError(f"{where}: field 'nodes' must be a non-empty list of node groups")
    groups = []
    for i, g in enumerate(nodes):
        at = f"{where}: nodes[{i}]"
        if not isinstance(g, dict):
            raise ClusterSpecError(f"{at}: expected a table/object, got {type(g).__name__}")
        bad = sorted(set(g) - _GROUP_KEYS)
        if bad:
            raise ClusterSpecError(f"{at}: unknown field {bad[0]!r} (known: {', '.join(sorted(_GROUP_KEYS))})")
        for key in ("gpu_type", "count", "gpus_per_node"):
            if key not in g:
                raise ClusterSpecError(f"{at}: missing field {key!r}")
        groups.append(
            NodeGroup(
                _gpu_type(g["gpu_type"], at),
                _positive(g["count"], f"{at}: field 'count'"),
                _positive(g["gpus_per_node"], f"{at}: field 'gpus_per_node'"),
                _mem(g.get("mem_gb"), f"{at}: field 'mem_gb'"),
                _gbps(g.get("nic_gbps"), f"{at}: field 'nic_gbps'"),
                _rack(g.get("rack", ""), f"{at}: field 'rack'"),
            )
        )
    uplinks = data.get("uplink_gbps", {})
    if not isinstance(uplinks, dict):
        raise ClusterSpecError(f"{where}: field 'uplink_gbps' must be a table of rack = Gb/s")
    racks = {g.rack for g in groups if g.rack}
    for rack, v in uplinks.items():
        if rack not in racks:
            raise ClusterSpecError(f"{where}: uplink_gbps.{rack}: no node group is in rack {rack!r}")
        _gbps(v, f"{where}: field 'uplink_gbps.{rack}'")
    site = _site(data["site"], f"{where}: site") if "site" in data else None
    return ClusterSpec(tuple(groups), name, {k: float(v) for k, v in uplinks.items()}, site)


def _site(data: Any, at: str) -> SiteSpec:
    """The ``[site]`` table (module doc)."""
    table = _table(data, at, _SITE_KEYS)
    accounts_t = _table(table.get("accounts", {}), f"{at}.accounts", None)
    if not accounts_t:
        raise ClusterSpecError(f"{at}: field 'accounts' must name at least one account")
    accounts = []
    for name, a in accounts_t.items():
        where = f"{at}.accounts.{_name(name, f'{at}.accounts')}"
        a = _table(a, where, _ACCOUNT_KEYS)
        accounts.append(
            AccountSpec(
                name,
                _share(a.get("share", 1), f"{where}: field 'share'"),
                _limit(a.get("gpus"), f"{where}: field 'gpus'"),
                _limit(a.get("user_gpus"), f"{where}: field 'user_gpus'"),
                _positive(a.get("users", 1), f"{where}: field 'users'"),
                _share(a.get("trace_weight", 1), f"{where}: field 'trace_weight'"),
                _parent(a.get("parent", ""), f"{where}: field 'parent'", set(accounts_t), name),
                _limit(a.get("jobs"), f"{where}: field 'jobs'", "jobs"),
                _limit(a.get("user_jobs"), f"{where}: field 'user_jobs'", "jobs"),
            )
        )
    if not any(a.share > 0 for a in accounts):
        raise ClusterSpecError(f"{at}.accounts: every share is 0 (at least one must be > 0)")
    _no_cycle(accounts, f"{at}.accounts")
    qos = []
    qos_t = _table(table.get("qos", {}), f"{at}.qos", None)
    for name, q in qos_t.items():
        where = f"{at}.qos.{_name(name, f'{at}.qos')}"
        q = _table(q, where, _QOS_KEYS)
        qos.append(
            QosSpec(
                name,
                _limit(q.get("gpus"), f"{where}: field 'gpus'"),
                _limit(q.get("user_gpus"), f"{where}: field 'user_gpus'"),
                _limit(q.get("job_gpus"), f"{where}: field 'job_gpus'"),
                _share(q.get("priority", 0), f"{where}: field 'priority'"),
                _fraction(q.get("trace_fraction", 0), f"{where}: field 'trace_fraction'"),
                _preempt(q.get("preempt", []), f"{where}: field 'preempt'", set(qos_t), name),
                _share(q.get("grace_s", 0), f"{where}: field 'grace_s'"),
                _flag(q.get("plain", False), f"{where}: field 'plain'"),
            )
        )
    if sum(q.trace_fraction for q in qos) > 1.0 + 1e-9:
        raise ClusterSpecError(f"{at}.qos: the trace_fractions add up to more than 1")
    default_qos = table.get("default_qos", "")
    if not isinstance(default_qos, str) or (default_qos and default_qos not in {q.name for q in qos}):
        known = ", ".join(q.name for q in qos) or "none"
        raise ClusterSpecError(
            f"{at}: field 'default_qos' must name a QOS of {at}.qos (known: {known}), got {default_qos!r}"
        )
    half = table.get("decay_half_life_s", 7 * 86400)
    if isinstance(half, bool) or not isinstance(half, (int, float)) or not 0 < half < 1e9:
        raise ClusterSpecError(f"{at}: field 'decay_half_life_s' must be a positive number of seconds, got {half!r}")
    mode = table.get("preempt_mode", "REQUEUE")
    if mode not in PREEMPT_MODES:
        raise ClusterSpecError(f"{at}: field 'preempt_mode' must be one of {', '.join(PREEMPT_MODES)}, got {mode!r}")
    period = table.get("calc_period_s", 0)
    if isinstance(period, bool) or not isinstance(period, (int, float)) or not 0 <= period < 1e9:
        raise ClusterSpecError(f"{at}: field 'calc_period_s' must be a number of seconds >= 0, got {period!r}")
    return SiteSpec(tuple(accounts), tuple(qos), default_qos, float(half), mode, calc_period_s=float(period))


def _preempt(value: Any, at: str, names: set[str], name: str) -> tuple[str, ...]:
    """The QOS a QOS preempts: a list of the file's other QOS."""
    known = ", ".join(sorted(names - {name})) or "none"
    if not isinstance(value, list) or any(not isinstance(v, str) or v not in names or v == name for v in value):
        raise ClusterSpecError(f"{at} must be a list of the other QOS of the site (known: {known}), got {value!r}")
    return tuple(dict.fromkeys(value))


def _flag(value: Any, at: str) -> bool:
    if not isinstance(value, bool):
        raise ClusterSpecError(f"{at} must be true or false, got {value!r}")
    return value


def _table(value: Any, at: str, keys: set[str] | None) -> dict:
    """`value` as a table whose fields are among `keys` (None: any)."""
    if not isinstance(value, dict):
        raise ClusterSpecError(f"{at} must be a table/object, got {type(value).__name__}")
    bad = sorted(set(value) - keys) if keys is not None else []
    if bad:
        raise ClusterSpecError(f"{at}: unknown field {bad[0]!r} (known: {', '.join(sorted(keys or ()))})")
    return value


def _name(value: str, at: str) -> str:
    if not _SLURM_NAME.match(value):
        raise ClusterSpecError(f"{at}: {value!r} is not a Slurm name (letters, digits, _ . -)")
    return value


def _share(value: Any, at: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
        raise ClusterSpecError(f"{at} must be a number >= 0, got {value!r}")
    return float(value)


def _fraction(value: Any, at: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ClusterSpecError(f"{at} must be a number from 0 to 1, got {value!r}")
    return float(value)


def _limit(value: Any, at: str, what: str = "GPUs") -> int | None:
    """A limit of GPUs (or jobs): an integer >= 0 (None when absent)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ClusterSpecError(f"{at} must be a number of {what} (an integer >= 0), got {value!r}")
    return value


def _parent(value: Any, at: str, names: set[str], name: str) -> str:
    """A parent account: "" (root) or another account of the file."""
    if value == "":
        return ""
    if not isinstance(value, str) or value not in names or value == name:
        known = ", ".join(sorted(names - {name})) or "none"
        raise ClusterSpecError(f"{at} must name another account of the file (known: {known}), got {value!r}")
    return value


def _no_cycle(accounts: list[AccountSpec], at: str) -> None:
    """No account is its own ancestor."""
    parent = {a.name: a.parent for a in accounts}
    for a in accounts:
        seen, n = {a.name}, a.parent
        while n:
            if n in seen:
                raise ClusterSpecError(f"{at}.{a.name}: field 'parent' makes a cycle ({a.name} is under itself)")
            seen.add(n)
            n = parent[n]


def _arena(data: dict, where: str) -> ClusterSpec:
    cluster = data["cluster"]
    if not isinstance(cluster, dict) or not cluster:
        raise ClusterSpecError(f"{where}: field 'cluster' must be a non-empty object of GPU types")
    specs = load_device_specs()
    capacity = specs["node_capacity_gpus_per_node"]
    memory = specs["simulator_gpu_specs"]
    groups = []
    for gpu, entry in cluster.items():
        at = f"{where}: cluster.{gpu}"
        gpu_type = _gpu_type(gpu, f"{where}: cluster")
        if not isinstance(entry, dict) or "node_num" not in entry:
            raise ClusterSpecError(f"{at}: missing field 'node_num'")
        count = _positive(entry["node_num"], f"{at}: field 'node_num'")
        if "gpus_per_node" in entry:
            per = _positive(entry["gpus_per_node"], f"{at}: field 'gpus_per_node'")
        elif gpu_type in capacity:
            per = int(capacity[gpu_type])
        else:
            raise ClusterSpecError(f"{at}: missing field 'gpus_per_node' (no Arena node capacity for {gpu_type!r})")
        if "total_gpus" in entry and entry["total_gpus"] != count * per:
            raise ClusterSpecError(
                f"{at}: field 'total_gpus' = {entry['total_gpus']!r} but node_num x gpus_per_node = {count * per}"
            )
        mem = memory.get(gpu_type, {}).get("max_mem_gb")
        groups.append(NodeGroup(gpu_type, count, per, None if mem is None else float(mem)))
    return ClusterSpec(tuple(groups), "arena")


def _gpu_type(value: Any, at: str) -> str:
    if not isinstance(value, str) or not GPU_TYPE.match(value):
        raise ClusterSpecError(
            f"{at}: field 'gpu_type' must be a lower-case GPU type name (letters, digits, - or _), got {value!r}"
        )
    return value


def _positive(value: Any, at: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ClusterSpecError(f"{at} must be a positive integer, got {value!r}")
    return value


def _gbps(value: Any, at: str) -> float | None:
    return _amount(value, at, "Gb/s")


def _rack(value: Any, at: str) -> str:
    if not isinstance(value, str) or (value and not GPU_TYPE.match(value)):
        raise ClusterSpecError(f"{at} must be a rack name (lower-case letters, digits, - or _), got {value!r}")
    return value


def _mem(value: Any, at: str) -> float | None:
    return _amount(value, at, "GB")


def _amount(value: Any, at: str, unit: str) -> float | None:
    """A positive number of `unit` (None when absent)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e6:
        raise ClusterSpecError(f"{at} must be a positive number of {unit}, got {value!r}")
    return float(value)
