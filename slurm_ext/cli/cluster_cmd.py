"""`cellsched cluster`: the cluster's GPUs per partition and node."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from slurm_ext.records import ClusterSnapshot, SlurmNode

TABLE_HEADER = ("PARTITION", "NODE", "GPU", "FREE/TOTAL", "STATE")


def node_state_text(node: SlurmNode) -> str:
    """``idle``, ``mixed+drain``, ``idle+not_responding`` ..."""
    return "+".join([node.state, *(f.lower() for f in node.flags)])


def table_rows(snapshot: ClusterSnapshot) -> list[tuple[str, ...]]:
    """One row per (partition, node); the default partition is marked with *."""
    by_name = {n.name: n for n in snapshot.nodes}
    rows: list[tuple[str, ...]] = []
    for part in snapshot.partitions:
        for name in part.nodes:
            node = by_name.get(name)
            if node is None:
                continue
            free = node.gpus_free if node.available else 0
            rows.append(
                (
                    part.name + ("*" if part.default else ""),
                    node.name,
                    node.gpu_type or "-",
                    f"{free}/{node.gpus_total}",
                    node_state_text(node),
                )
            )
    return rows


def format_table(snapshot: ClusterSnapshot) -> str:
    rows = [TABLE_HEADER, *table_rows(snapshot)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def snapshot_json(snapshot: ClusterSnapshot) -> dict[str, Any]:
    """Nodes and partitions as plain JSON values (stable keys)."""
    return {
        "taken_at": snapshot.taken_at,
        "nodes": [
            {
                "name": n.name,
                "address": n.address,
                "port": n.port,
                "partitions": list(n.partitions),
                "features": list(n.features),
                "gpu_type": n.gpu_type,
                "gpus_total": n.gpus_total,
                "gpus_alloc": n.gpus_alloc,
                "gpus_free": n.gpus_free if n.available else 0,
                "cpus_total": n.cpus_total,
                "cpus_alloc": n.cpus_alloc,
                "memory_mb": n.memory_mb,
                "state": n.state,
                "flags": list(n.flags),
                "reason": n.reason,
                "available": n.available,
            }
            for n in snapshot.nodes
        ],
        "partitions": [
            {"name": p.name, "nodes": list(p.nodes), "state": p.state, "default": p.default, "max_time": p.max_time}
            for p in snapshot.partitions
        ],
    }


def _one_line(exc: BaseException) -> str:
    return " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print nodes and partitions as JSON instead of a table.")
@click.option("--backend", default="auto", show_default=True, help="Slurm backend: auto, cli or pyslurm.")
def cluster(as_json: bool, backend: str) -> None:
    """Show every partition's nodes: GPU type, GPUs free/total and state.

    GPUs free counts 0 on nodes that cannot take work (down, drained, not
    responding). Exits with status 2 when slurmctld cannot be reached.
    """
    from slurm_ext.backends import SlurmError, SlurmUnavailable, get_backend

    try:
        snapshot = get_backend(backend).observe()
    except SlurmUnavailable as exc:
        click.echo(f"cellsched cluster: Slurm unavailable: {_one_line(exc)}", err=True)
        sys.exit(2)
    except (SlurmError, ValueError) as exc:
        click.echo(f"cellsched cluster: {_one_line(exc)}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(snapshot_json(snapshot), indent=2, sort_keys=True))
    else:
        click.echo(format_table(snapshot))
