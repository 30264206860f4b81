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
from slurm_ext.sim.types import ClusterSpec, NodeGroup
from solver.datafile import read_json_or_toml
from solver.profiles.arena import load_device_specs, shipped_path

_GPU_TYPE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
_GROUP_KEYS = {"gpu_type", "count", "gpus_per_node", "mem_gb", "nic_gbps", "rack"}


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
    unknown = sorted(set(data) - {"name", "nodes", "uplink_gbps"})
    if unknown:
        raise ClusterSpecError(f"{where}: unknown field {unknown[0]!r} (known: name, nodes, uplink_gbps)")
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
    return ClusterSpec(tuple(groups), name, {k: float(v) for k, v in uplinks.items()})


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
    if not isinstance(value, str) or not _GPU_TYPE.match(value):
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
    if not isinstance(value, str) or (value and not _GPU_TYPE.match(value)):
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
