"""Heterogeneity (issue 15): cellsched with mixed-type cells and state
sharding against the same policy without them, in the simulator's
realistic mode.

One `cellsched simulate --realistic` run (same seed, truth, noise and
restart model for both policies): ``cellsched`` against
``cellsched:mixed_cells=false,state_sharding=false`` (``state_sharding``
only where solver.types.SolverConfig has the key; without it the
comparison is of mixed cells alone, and the JSON says so).

The cluster, etc/sim-hetero-24.toml: 24 GPUs of four types (A100 1x4,
V100 1x4, A40 4x2, A10 4x2), no type with more than 8. The trace: Arena's
Philly trace (the one every comparison in docs/benchmarks.md uses) cut to its jobs
of large models, 2.4B parameters and up (BERT 2.6B and 6.7B, MoE 2.4B, 10B
and 27B, wide ResNet 4B and 6.8B: 47% of its jobs), the first --jobs of
them in submit order. Why: in Arena's measured table these models need 4 to
16 GPUs of a type (most of them out of memory below 4 on every type, and
below 8 on V100 and A10), so on this cluster a job that wants to grow has
at most one type's 4 or 8 GPUs, and jobs queue for one type while another
type's GPUs sit idle. That is where a cell spanning two types can pay; on
a cluster with many GPUs of each type (Arena's 1,280) or with small models
it rarely would, and this benchmark says nothing about those. Arrivals are
scaled so that the GPUs asked for per GPU of the cluster and per second are
--load times those of the whole Philly trace on Arena's cluster (rate =
load x 24 / 1,280 / the slice's share of the trace's jobs); no other knob
is set, and the policies run with their defaults. No network cards are
given, so no contention is modelled (mixed cells are multi-node by nature;
the contention truth prices a mixed cell as its first type only).

The cluster and slice were set before any mixed cell was offered (commit
f1a4277) and not changed after the results. What makes heterogeneity pay
here (benchmarks/results/heterogeneity.md): the one V100 node is poor for
these models on its own (out of memory or 2-3x an A100's time), so without
mixed cells it sits idle half the time, while an A100 + V100 cell (a
pipeline, or data parallel) runs the longest large-model jobs faster than
the A100 node alone.

Limits of the realistic mode worth knowing when reading the result: the
policies decide with Arena's profiler estimates and the truth is Arena's
measured table, both tables of single-type cells without memory figures
(an out-of-memory entry stays infeasible, so no single-type cell is made
feasible by sharding). A data-parallel mixed cell is composed from its
parts' table times (each part able to run the whole batch alone,
slurm_ext.sim.conditions); a pipeline across types from our per-layer
costs, each type's put on the table's scale (``layer_scale``:
solver.arena.estimates), with our memory model; the estimates
from Arena's estimated table, the truth from the measured one. No plan was
state-sharded in the runs reported: what sharding adds is not measured here.
The result depends on the seed (the noise on the truth, and so the order of
events): see the results file for five seeds and two other loads.

Prints one JSON line per policy (finished, avg JCT over its finished jobs
and over the jobs both finished, and its placements and job-hours per kind
of cell: single, mixed-dp, mixed-pipeline, state-sharded), then a summary
line (the ratio of the two averages over the jobs both finished, and
whether it meets the issue's goal of at least 10% lower), and writes
OUT/heterogeneity.md. The run is kept in OUT/results.json (not run again
when there). With the default 150 jobs it takes 1 to 3 minutes on two
busy cores (both policies in parallel), up to 5 at --load 2.
`--cluster` and `--models all` run another cluster and slice (the first
--jobs of every model, rate = load x GPUs / 1,280): 300 jobs on
etc/sim-mixed-88.toml took 15 minutes while other simulations shared the
cores.

    python benchmarks/heterogeneity.py --out /tmp/hetero [--jobs 150] [--load 1] [--seed 0] [--workers 2]
        [--cluster etc/sim-hetero-24.toml] [--models large|all]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "etc" / "sim-hetero-24.toml"
#: the trace's models of 2.4B parameters and up
LARGE = ("bert__2.6B", "bert__6.7B", "moe__2.4B", "moe__10B", "moe__27B", "wide_resnet__4B", "wide_resnet__6.8B")
WITH = "cellsched"
KINDS = ("single", "mixed-dp", "mixed-pipeline", "state-sharded")


def without() -> str:
    """The policy without mixed cells and sharding (sharding where the solver has the key)."""
    from solver.types import SolverConfig

    keys = {f.name for f in dataclasses.fields(SolverConfig)}
    return "cellsched:mixed_cells=false" + (",state_sharding=false" if "state_sharding" in keys else "")


def trace(out: Path, jobs: int, models: str = "large") -> tuple[Path, float]:
    """The first `jobs` Philly jobs of LARGE models (`models` "all": of every
    model), and the share of the trace's jobs that the slice's models make."""
    from solver.contract.profiles.arena import TRACE_FILE, shipped_path

    path = out / f"philly-{models}.csv"
    kept = total = taken = 0
    with open(shipped_path(TRACE_FILE), newline="") as f, open(path, "w", newline="") as g:
        reader = csv.DictReader(f)
        writer = csv.DictWriter(g, fieldnames=reader.fieldnames)
        writer.writeheader()
        for row in reader:
            total += 1
            if models == "large" and row["model_name"] not in LARGE:
                continue
            taken += 1
            if kept < jobs:
                writer.writerow(row)
                kept += 1
    return path, taken / total


def run(
    out: Path, jobs: int, load: float, workers: int, seed: int, cluster: Path = CLUSTER, models: str = "large"
) -> Path:
    results = out / "results.json"
    if results.exists():
        return results
    from slurm_ext.sim.clusterspec import arena_cluster, load_cluster_spec

    path, share = trace(out, jobs, models)
    rate = load * load_cluster_spec(cluster).total_gpus / arena_cluster().total_gpus / share
    cmd = [sys.executable, "-m", "slurm_ext", "simulate", "--realistic", "--seed", str(seed)]
    cmd += ["--trace", str(path), "--cluster", str(cluster), "--arrival-rate", f"{rate:.6g}"]
    cmd += ["--policy", WITH, "--policy", without(), "--workers", str(workers), "--no-plots", "--json"]
    cmd += ["--out", str(out)]
    print(f"# {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return results


def numbers(results: Path) -> tuple[list[dict[str, object]], dict[str, object]]:
    """(one dict per policy, the summary) of a run (module doc)."""
    doc = json.loads(results.read_text())
    jct = {
        policy: {j["job_id"]: j["jct"] for j in r["jobs"] if j["finished"] and j["jct"] is not None}
        for policy, r in doc["runs"].items()
    }
    other = next(p for p in doc["runs"] if p != WITH)
    common = sorted(set(jct.get(WITH, {})) & set(jct[other]))
    rows = []
    for policy, r in doc["runs"].items():
        done = jct[policy]
        kinds = doc["summary"][policy].get("cell_kinds", {})
        row: dict[str, object] = {
            "policy": policy,
            "finished": len(done),
            "total": len(r["jobs"]),
            "avg_jct_s": round(statistics.mean(done.values()), 1) if done else None,
            "jobs_common": len(common),
            "avg_jct_common_s": round(statistics.mean(done[j] for j in common), 1) if common else None,
            "restarts": doc["summary"][policy]["restarts"],
            "infeasible_starts": r["meta"]["infeasible_starts"],
        }
        for k in KINDS:
            c = kinds.get(k, {})
            row[f"{k}_placements"] = c.get("placements", 0)
            row[f"{k}_jobs"] = c.get("jobs", 0)
            row[f"{k}_job_hours"] = round(c.get("job_hours", 0.0), 2)
        rows.append(row)
    by = {r["policy"]: r for r in rows}
    a, b = by[WITH]["avg_jct_common_s"], by[other]["avg_jct_common_s"]
    ratio = round(a / b, 4) if a and b else None
    summary = {
        "summary": True,
        "with": WITH,
        "without": other,
        "state_sharding_compared": "state_sharding" in other,
        "jobs_common": len(common),
        "ratio_avg_jct_common": ratio,
        "jct_reduction_pct": round(100 * (1 - ratio), 1) if ratio else None,
        "goal_10pct_met": ratio is not None and ratio <= 0.9,
        "every_job_finished": all(r["finished"] == r["total"] for r in rows),
        "wall_s": doc["meta"].get("wall_s"),
        "cluster": doc["meta"].get("cluster"),
        "arrival_rate": doc["meta"].get("arrival_rate"),
    }
    return rows, summary


def markdown(rows: list[dict[str, object]], summary: dict[str, object]) -> str:
    head = ["policy", "finished", "avg JCT s", f"avg JCT s, {summary['jobs_common']} jobs both finished", "vs without"]
    head += [f"{k}: placements / jobs / job-h" for k in KINDS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:

        def num(x: object) -> str:
            return "-" if x is None else f"{x:,.0f}"

        vs = "1.000x" if r["policy"] == summary["without"] else f"{summary['ratio_avg_jct_common'] or 0:.3f}x"
        cells = [str(r["policy"]), f"{r['finished']}/{r['total']}", num(r["avg_jct_s"]), num(r["avg_jct_common_s"]), vs]
        cells += [f"{r[f'{k}_placements']} / {r[f'{k}_jobs']} / {r[f'{k}_job_hours']:.1f}" for k in KINDS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=150, help="the first N jobs of large models")
    ap.add_argument("--load", type=float, default=1.0, help="arrival rate relative to Philly on 1,280 GPUs")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cluster", type=Path, default=CLUSTER, help="cluster spec (default etc/sim-hetero-24.toml)")
    ap.add_argument("--models", choices=("large", "all"), default="large", help="the slice: LARGE models or all")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows, summary = numbers(run(args.out, args.jobs, args.load, args.workers, args.seed, args.cluster, args.models))
    for r in rows:
        print(json.dumps(r), flush=True)
    print(json.dumps(summary), flush=True)
    table = markdown(rows, summary)
    (args.out / "heterogeneity.md").write_text(table)
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
