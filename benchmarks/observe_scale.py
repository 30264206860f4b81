"""How long the cli backend takes to read a large cluster: `observe()` over
generated Slurm output of `--jobs` jobs and `--nodes` nodes.

    python benchmarks/observe_scale.py [--jobs 10000] [--nodes 1000] [--repeat 5]

The output is made from the recorded real outputs in
tests/slurm_ext/backends/data (Slurm 22.05: ``squeue --json``, ``sinfo
--json``, ``scontrol -o show partition``; Slurm 24.11, data/24.11: ``squeue
--json``, ``scontrol --json show node`` at data_parser v0.0.42, ``scontrol -o
show partition``): their records
copied with new job ids and node names until the sizes are reached. The
commands are answered from memory (the backend's `run` seam), so this
measures cellsched's parsing and snapshot building, not slurmctld (for a
real slurmctld: benchmarks/observe_live.py). One JSON line per schema: the
sizes, the output's bytes, and the median of `--repeat` observes (observe_s)
with its parts. "22.05" and "24.11" read every job's whole JSON record;
"24.11 compact" is the round's read on 24.11 (slurm_ext.parse.squeue_fields:
the recorded data/compact/24.11 records copied to size), cold (a fresh
backend: every job parsed) and warm (`observe_warm_s`: the same backend
again, every job printed as before). Target (issue: the controller at
cluster scale): observe_s <= 1 s at 10,000 jobs, 1,000 nodes (the warm
compact read where there is one).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from slurm_ext.backends.cli import CliBackend
from slurm_ext.parse import json_output, scontrol_text, squeue_fields
from slurm_ext.records import compress_hostlist

ROOT = Path(__file__).resolve().parents[1]

DATA = ROOT / "tests" / "slurm_ext" / "backends" / "data"
#: stands for the token a compact query draws
TOKEN = "@TOKEN@"


def grow(records: list[dict], n: int, rename) -> list[dict]:
    """`n` copies of `records` in turn, each passed through rename(copy, k)."""
    out = []
    for k in range(n):
        r = copy.deepcopy(records[k % len(records)])
        rename(r, k)
        out.append(r)
    return out


def node_types(nodes: list[dict], n: int) -> dict[str, list[str]]:
    """partition -> generated node names (node k takes template k % len's partitions)."""
    parts: dict[str, list[str]] = {}
    for k in range(n):
        for p in nodes[k % len(nodes)].get("partitions", []):
            parts.setdefault(p, []).append(f"n{k + 1}")
    return parts


def outputs_2205(jobs: int, nodes: int) -> dict[tuple[str, ...], str]:
    squeue = json.loads((DATA / "squeue.json").read_text())
    sinfo = json.loads((DATA / "sinfo.json").read_text())
    squeue["jobs"] = grow(squeue["jobs"], jobs, lambda r, k: r.update(job_id=k + 1))
    parts = node_types(sinfo["nodes"], nodes)
    sinfo["nodes"] = grow(sinfo["nodes"], nodes, lambda r, k: r.update(name=f"n{k + 1}", hostname=f"n{k + 1}"))
    lines = []
    for line in (DATA / "scontrol_show_-o_partition.txt").read_text().splitlines():
        name = line.split()[0].split("=", 1)[1]
        members = parts.get(name, [])
        words = [
            f"Nodes={compress_hostlist(members)}"
            if w.startswith("Nodes=")
            else f"TotalNodes={len(members)}"
            if w.startswith("TotalNodes=")
            else w
            for w in line.split()
        ]
        lines.append(" ".join(words))
    return {
        ("sinfo", "--version"): "slurm-wlm 22.05.8\n",
        ("squeue", "--json", "--states=all"): json.dumps(squeue),
        ("sinfo", "--json"): json.dumps(sinfo),
        ("scontrol", "-o", "show", "partition"): "\n".join(lines) + "\n",
    }


def outputs_2411(jobs: int, nodes: int) -> dict[tuple[str, ...], str]:
    squeue = json.loads((DATA / "24.11" / "squeue_v0.0.42.json").read_text())
    shown = json.loads((DATA / "24.11" / "scontrol_show_node_v0.0.42.json").read_text())
    squeue["jobs"] = grow(squeue["jobs"], jobs, lambda r, k: r.update(job_id=k + 1))
    parts = node_types(shown["nodes"], nodes)
    shown["nodes"] = grow(shown["nodes"], nodes, lambda r, k: r.update(name=f"n{k + 1}", hostname=f"n{k + 1}"))
    lines = [f"PartitionName={p} Nodes={compress_hostlist(members)} State=UP" for p, members in parts.items()]
    return {
        ("sinfo", "--version"): "slurm-wlm 24.11.5\n",
        ("squeue", "--json", "--states=all"): json.dumps(squeue),
        ("scontrol", "--json", "show", "node"): json.dumps(shown),
        ("scontrol", "-o", "show", "partition"): "\n".join(lines) + "\n",
    }


def outputs_2411_compact(jobs: int, nodes: int) -> dict[tuple[str, ...], str]:
    """24.11's outputs with the round's compact query (squeue --Format, data/compact/24.11): its
    records that need no whole record, copied with new job ids, under the token TOKEN."""
    out = outputs_2411(jobs, nodes)
    fixture = DATA / "compact" / "24.11"
    fmt = squeue_fields.Format((fixture / "token.txt").read_text().strip())
    records = [
        r
        for r, j in zip(
            (fixture / "squeue_compact.txt").read_text().split(fmt.end + "\n")[:-1],
            squeue_fields.parse((fixture / "squeue_compact.txt").read_text(), fmt),
            strict=True,
        )
        if not squeue_fields.needs_full_record(j)
    ]
    rows = [f"{k + 1}{fmt.sep}{records[k % len(records)].split(fmt.sep, 1)[1]}{fmt.end}\n" for k in range(jobs)]
    out[("squeue", "--noheader")] = "".join(rows).replace(fmt.token, TOKEN)
    return out


def backend(outputs: dict[tuple[str, ...], str], compact: bool = False) -> CliBackend:
    def run(args: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        if args[:2] == ["scontrol", "ping"]:
            return subprocess.CompletedProcess(args, 0, "Slurmctld(primary) at ctl is UP\n", "")
        for prefix, text in outputs.items():
            if tuple(args[: len(prefix)]) == prefix:
                if prefix == ("squeue", "--noheader"):  # the token this query drew
                    text = text.replace(TOKEN, args[-1].rsplit("#", 1)[1].rstrip("$"))
                return subprocess.CompletedProcess(args, 0, text, "")
        raise AssertionError(f"no recorded output for {args}")

    return CliBackend(run=run, compact=compact)


def timed(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    worst = 0.0
    for schema, make in (("22.05", outputs_2205), ("24.11", outputs_2411), ("24.11 compact", outputs_2411_compact)):
        outputs = make(args.jobs, args.nodes)
        nodes_text = next(t for k, t in outputs.items() if k[-1] == "node" or k == ("sinfo", "--json"))
        if schema.endswith("compact"):  # a round's read: cold (a fresh backend), then warm (the same one again)
            observe_s, snap = timed(lambda o=outputs: backend(o, compact=True).observe(), args.repeat)
            warm = backend(outputs, compact=True)
            warm.observe()
            warm_s, _ = timed(warm.observe, args.repeat)
            jobs_text = outputs[("squeue", "--noheader")]
            fmt = squeue_fields.Format(TOKEN)
            jobs_s, _ = timed(functools.partial(squeue_fields.parse, jobs_text, fmt), args.repeat)
        else:
            observe_s, snap = timed(backend(outputs).observe, args.repeat)
            warm_s = None
            jobs_text = outputs[("squeue", "--json", "--states=all")]
            jobs_s, _ = timed(functools.partial(json_output.parse_jobs, jobs_text), args.repeat)
        nodes_s, _ = timed(functools.partial(json_output.parse_nodes, nodes_text), args.repeat)
        part_text = outputs[("scontrol", "-o", "show", "partition")]
        partitions_s, _ = timed(functools.partial(scontrol_text.parse_partitions, part_text), args.repeat)
        assert len(snap.jobs) == args.jobs and len(snap.nodes) == args.nodes, (len(snap.jobs), len(snap.nodes))
        worst = max(worst, observe_s if warm_s is None else warm_s)
        row = {
            "schema": schema,
            "jobs": len(snap.jobs),
            "nodes": len(snap.nodes),
            "partitions": len(snap.partitions),
            "bytes": len(jobs_text) + len(nodes_text) + len(part_text),
            "observe_s": round(observe_s, 3),
            **({"observe_warm_s": round(warm_s, 3)} if warm_s is not None else {}),
            "parse_jobs_s": round(jobs_s, 3),
            "parse_nodes_s": round(nodes_s, 3),
            "parse_partitions_s": round(partitions_s, 3),
        }
        print(json.dumps(row), flush=True)
    return 0 if worst <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
