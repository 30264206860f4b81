"""Records from ``scontrol show job|node|partition`` text.

Both the one-line form (``scontrol show -o ...``) and the multi-line form
(``scontrol [-d] show ...``, records separated by blank lines) are read.
Values may contain spaces (``OS=Linux 6.1 #1 SMP``); a new field starts at
whitespace followed by ``Key=`` where Key starts with an upper-case letter.
Use ``-d`` for nodes: only it prints ``GresUsed``.
"""

from __future__ import annotations

import re

from slurm_ext.parse.values import (
    ParseError,
    exit_status,
    gpu_gres,
    integer,
    job_state,
    minutes,
    node_state,
    text,
    text_time,
    words,
)
from slurm_ext.records import FINISHED, SlurmJob, SlurmNode, SlurmPartition, expand_hostlist

#: scontrol appends " [user@time]" to a node's reason; JSON does not
_REASON_STAMP = re.compile(r"\s*\[[^\]]*@[^\]]*\]$")
_KEY = re.compile(r"(?:^|(?<=\s))([A-Z][A-Za-z0-9_/:]*)=")


def fields(record: str) -> dict[str, str]:
    """``Key=Value Key2=Va lue`` -> {"Key": "Value", "Key2": "Va lue"}.
    The first occurrence of a repeated key wins (detail lines repeat keys)."""
    out: dict[str, str] = {}
    matches = list(_KEY.finditer(record))
    for m, nxt in zip(matches, matches[1:] + [None], strict=True):
        end = nxt.start() if nxt else len(record)
        out.setdefault(m.group(1), record[m.end() : end].strip())
    return out


def records(output: str, first_key: str) -> list[dict[str, str]]:
    """Split scontrol output into records that start with `first_key`=."""
    chunks: list[list[str]] = []
    for line in output.splitlines():
        if line.startswith(f"{first_key}="):
            chunks.append([line])
        elif line.strip() and chunks:
            chunks[-1].append(line)
        elif line.strip() and not line.startswith(" "):
            raise ParseError(f"expected a line starting with {first_key}=, got {line[:60]!r}")
    return [fields(" ".join(c)) for c in chunks]


def parse_jobs(output: str) -> tuple[SlurmJob, ...]:
    """Jobs from ``scontrol show -o job`` or ``scontrol -d show job``."""
    if output.strip() == "No jobs in the system":
        return ()
    return tuple(job_record(f) for f in records(output, "JobId"))


def parse_nodes(output: str) -> tuple[SlurmNode, ...]:
    """Nodes from ``scontrol -d show -o node`` (or without -d / -o)."""
    return tuple(node_record(f) for f in records(output, "NodeName"))


def parse_partitions(output: str) -> tuple[SlurmPartition, ...]:
    """Partitions from ``scontrol show -o partition``."""
    if output.strip() == "No partitions in the system":
        return ()
    return tuple(partition_record(f) for f in records(output, "PartitionName"))


def _user(value: str) -> str:
    """``root(0)`` -> ``root``."""
    return value.split("(", 1)[0]


def _uid(value: str) -> int | None:
    """``root(0)`` -> 0 (None when not given)."""
    inside = value.partition("(")[2].rstrip(")")
    return int(inside) if inside.isdigit() else None


def _tasks_per_node(value: str | None) -> int | None:
    """The node part of ``NtasksPerN:B:S:C=2:0:*:*`` (0 or * = not set)."""
    first = (value or "").split(":", 1)[0]
    return int(first) if first.isdigit() and int(first) > 0 else None


def job_record(f: dict[str, str]) -> SlurmJob:
    job_id = f.get("JobId", "")
    if not job_id:
        raise ParseError("job record without JobId")
    try:
        state, flags = job_state(f["JobState"])
        reason = text(f.get("Reason"))
        reason = "" if reason == "None" else reason
        gtype, gcount = gpu_gres(f.get("TresPerNode"))
        nodes = expand_hostlist(text(f.get("NodeList")))
        priority = integer(f.get("Priority"))
        pending = state == "PENDING"
        num_nodes = integer((f.get("NumNodes") or "0").split("-")[0]) or len(nodes)
        return SlurmJob(
            job_id=job_id,
            name=text(f.get("JobName")),
            user=_user(text(f.get("UserId"))),
            uid=_uid(text(f.get("UserId"))),
            state=state,
            reason=reason,
            partition=text(f.get("Partition")),
            nodes=nodes,
            num_nodes=num_nodes,
            gpus_per_node=gcount or None,
            gpu_type=gtype,
            held=pending and (priority == 0 or reason.startswith("JobHeld")),
            features=text(f.get("Features")),
            required_nodes=expand_hostlist(text(f.get("ReqNodeList"))),
            excluded_nodes=expand_hostlist(text(f.get("ExcNodeList"))),
            comment=text(f.get("Comment")),
            admin_comment=text(f.get("AdminComment")),
            submit_time=text_time(f.get("SubmitTime")),
            start_time=text_time(f.get("StartTime")),
            eligible_time=text_time(f.get("EligibleTime")),
            end_time=text_time(f.get("EndTime")),
            exit_code=exit_status(f.get("ExitCode")) if state in FINISHED else None,
            time_limit=minutes(f.get("TimeLimit")),
            batch_host=text(f.get("BatchHost")),
            num_tasks=integer(f.get("NumTasks")) or None,
            tasks_per_node=_tasks_per_node(f.get("NtasksPerN:B:S:C")),
            work_dir=text(f.get("WorkDir")),
            account=text(f.get("Account")),
            qos=text(f.get("QOS")),
            priority=priority,
            reservation=text(f.get("Reservation")),
            state_flags=flags,
            preempted_at=text_time(f.get("PreemptTime")),
        )
    except KeyError as exc:
        raise ParseError(f"job {job_id}: missing field {exc.args[0]}") from exc
    except (ParseError, ValueError) as exc:
        raise ParseError(f"job {job_id}: {exc}") from exc


def node_record(f: dict[str, str]) -> SlurmNode:
    name = f.get("NodeName", "")
    if not name:
        raise ParseError("node record without NodeName")
    try:
        state, flags = node_state(f["State"])
        gtype, total = gpu_gres(f.get("Gres"))
        _, used = gpu_gres(f.get("GresUsed"))
        features = words(f.get("ActiveFeatures")) or words(f.get("AvailableFeatures"))
        return SlurmNode(
            name=name,
            address=text(f.get("NodeAddr")),
            port=integer(f.get("Port")),
            partitions=words(f.get("Partitions")),
            features=features,
            gpu_type=gtype,
            gpus_total=total,
            gpus_alloc=used,
            cpus_total=integer(f.get("CPUTot")) or 0,
            cpus_alloc=integer(f.get("CPUAlloc")) or 0,
            memory_mb=integer(f.get("RealMemory")) or 0,
            state=state,
            flags=flags,
            reason=_REASON_STAMP.sub("", text(f.get("Reason"))),
        )
    except KeyError as exc:
        raise ParseError(f"node {name}: missing field {exc.args[0]}") from exc
    except (ParseError, ValueError) as exc:
        raise ParseError(f"node {name}: {exc}") from exc


def partition_record(f: dict[str, str]) -> SlurmPartition:
    name = f.get("PartitionName", "")
    if not name:
        raise ParseError("partition record without PartitionName")
    try:
        return SlurmPartition(
            name=name,
            nodes=expand_hostlist(text(f.get("Nodes"))),
            state=text(f.get("State")).upper() or "UP",
            default=f.get("Default", "NO").upper() == "YES",
            max_time=minutes(f.get("MaxTime")),
        )
    except (ParseError, ValueError) as exc:
        raise ParseError(f"partition {name}: {exc}") from exc
