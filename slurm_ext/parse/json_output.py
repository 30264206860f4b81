"""Records from Slurm's JSON output.

Accepts the 22.05 openapi v0.0.38 shape (``squeue --json``, ``sinfo --json``,
slurmrestd) and the data_parser shapes of later releases (v0.0.39+: NO_VAL
numbers as {"set", "infinite", "number"} objects; v0.0.40+: job and node
states as flag arrays, exit codes as objects, features as lists, partitions
with nested ``nodes`` / ``partition`` / ``maximums`` objects).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from slurm_ext.parse.values import (
    ParseError,
    epoch,
    exit_status,
    gpu_gres,
    integer,
    job_state,
    minutes,
    node_state,
    text,
    words,
)
from slurm_ext.records import FINISHED, SlurmJob, SlurmNode, SlurmPartition, expand_hostlist


def load(data: str | bytes | Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    """The list under `key` of a Slurm JSON document; its errors raise."""
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise ParseError(f"not JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ParseError(f"expected a JSON object with {key!r}, got {type(data).__name__}")
    errors = [e for e in data.get("errors") or [] if e]
    if errors:
        msgs = "; ".join(
            text(e.get("description") or e.get("error") or e) if isinstance(e, dict) else str(e) for e in errors
        )
        raise ParseError(f"Slurm reported errors: {msgs}")
    if key not in data or not isinstance(data[key], list):
        raise ParseError(f"JSON has no {key!r} list (keys: {sorted(data)})")
    return data[key]


def slurm_version(data: str | bytes | Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(major, minor, micro) from a document's meta block, if present."""
    doc: Mapping[str, Any] = json.loads(data) if isinstance(data, (str, bytes)) else data
    v = ((doc.get("meta") or {}).get("Slurm") or (doc.get("meta") or {}).get("slurm") or {}).get("version") or {}
    try:
        return int(v["major"]), int(v["minor"]), int(v["micro"])
    except (KeyError, TypeError, ValueError):
        return None


def parse_jobs(data: str | bytes | Mapping[str, Any]) -> tuple[SlurmJob, ...]:
    """Jobs from ``squeue --json`` / ``scontrol show job --json`` / slurmrestd."""
    return tuple(job_record(j) for j in load(data, "jobs"))


def parse_nodes(data: str | bytes | Mapping[str, Any]) -> tuple[SlurmNode, ...]:
    """Nodes from ``sinfo --json`` (22.05) / ``scontrol show node --json``."""
    return tuple(node_record(n) for n in load(data, "nodes"))


def parse_partitions(data: str | bytes | Mapping[str, Any]) -> tuple[SlurmPartition, ...]:
    """Partitions from slurmrestd v0.0.38 or ``scontrol show partition --json``."""
    return tuple(partition_record(p) for p in load(data, "partitions"))


def _field(d: Mapping[str, Any], key: str, what: str) -> Any:
    if key not in d:
        raise ParseError(f"{what} record has no {key!r} field")
    return d[key]


def job_record(j: Mapping[str, Any]) -> SlurmJob:
    job_id = str(integer(_field(j, "job_id", "job")))
    try:
        state, flags = job_state(_field(j, "job_state", f"job {job_id}"))
        reason = text(j.get("state_reason"))
        reason = "" if reason == "None" else reason
        gtype, gcount = gpu_gres(j.get("tres_per_node"))
        nodes = expand_hostlist(text(j.get("nodes")))
        priority = integer(j.get("priority"))
        pending = state == "PENDING"
        if "hold" in j and isinstance(j["hold"], bool):
            held = pending and j["hold"]
        else:
            held = pending and (priority == 0 or reason.startswith("JobHeld"))
        time_limit = minutes(j.get("time_limit"))
        end = epoch(j.get("end_time"))
        if state not in FINISHED and time_limit is None:
            end = None  # 22.05 reports start + 1 year for unlimited jobs
        return SlurmJob(
            job_id=job_id,
            name=text(j.get("name")),
            user=text(j.get("user_name")) or text(j.get("user_id")),
            uid=integer(j.get("user_id")),
            state=state,
            reason=reason,
            partition=text(j.get("partition")),
            nodes=nodes,
            num_nodes=integer(j.get("node_count")) or len(nodes),
            gpus_per_node=gcount or None,
            gpu_type=gtype,
            held=held,
            features=text(j.get("features")),
            required_nodes=expand_hostlist(text(j.get("required_nodes"))),
            excluded_nodes=expand_hostlist(text(j.get("excluded_nodes"))),
            comment=text(j.get("comment")),
            admin_comment=text(j.get("admin_comment")),
            submit_time=epoch(j.get("submit_time")),
            start_time=epoch(j.get("start_time")),
            eligible_time=epoch(j.get("eligible_time")),
            end_time=end,
            exit_code=exit_status(j.get("exit_code")) if state in FINISHED else None,
            time_limit=time_limit,
            batch_host=text(j.get("batch_host")),
            num_tasks=integer(j.get("tasks")) or None,
            tasks_per_node=integer(j.get("tasks_per_node")) or None,
            work_dir=text(j.get("current_working_directory")),
            account=text(j.get("account")),
            qos=text(j.get("qos")),
            priority=integer(j.get("priority")),
            reservation=text(j.get("resv_name")),
            state_flags=flags,
            preempted_at=epoch(j.get("preempt_time")),
        )
    except (ParseError, ValueError, TypeError) as exc:
        raise ParseError(f"job {job_id}: {exc}") from exc


def node_record(n: Mapping[str, Any]) -> SlurmNode:
    name = text(_field(n, "name", "node"))
    try:
        state, flags = node_state(_field(n, "state", f"node {name}"), n.get("state_flags"))
        gtype, total = gpu_gres(n.get("gres"))
        _, used = gpu_gres(n.get("gres_used"))
        features = words(n.get("active_features")) or words(n.get("features"))
        return SlurmNode(
            name=name,
            address=text(n.get("address")),
            port=integer(n.get("port")),
            partitions=words(n.get("partitions")),
            features=features,
            gpu_type=gtype,
            gpus_total=total,
            gpus_alloc=used,
            cpus_total=integer(n.get("cpus")) or 0,
            cpus_alloc=integer(n.get("alloc_cpus")) or 0,
            memory_mb=integer(n.get("real_memory")) or 0,
            state=state,
            flags=flags,
            reason=text(n.get("reason")),
        )
    except (ParseError, ValueError, TypeError) as exc:
        raise ParseError(f"node {name}: {exc}") from exc


def partition_record(p: Mapping[str, Any]) -> SlurmPartition:
    name = text(_field(p, "name", "partition"))
    try:
        nodes_field = p.get("nodes")
        if isinstance(nodes_field, Mapping):  # v0.0.40+: {"configured": "n[1-2]", ...}
            nodes = expand_hostlist(text(nodes_field.get("configured")))
        else:
            nodes = expand_hostlist(text(nodes_field))
        inner_field = p.get("partition")
        inner = inner_field if isinstance(inner_field, Mapping) else {}
        state_field = inner.get("state", p.get("state", "UP"))
        state = (state_field[0] if isinstance(state_field, list) and state_field else text(state_field) or "UP").upper()
        flags = {str(f).upper() for f in list(p.get("flags") or []) + list(inner.get("flags") or [])}
        default = "DEFAULT" in flags or bool(p.get("default", False))
        if isinstance(p.get("maximums"), Mapping):
            max_time = minutes(p["maximums"].get("time"))
        else:
            max_time = minutes(p.get("max_time_limit", p.get("max_time")))
        return SlurmPartition(name=name, nodes=nodes, state=state, default=default, max_time=max_time)
    except (ParseError, ValueError, TypeError) as exc:
        raise ParseError(f"partition {name}: {exc}") from exc
