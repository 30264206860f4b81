"""Contention on 64 GPUs: Wang et al.'s setup (16 nodes x 4 GPUs, 10 Gb/s
Ethernet, etc/sim-64-10g.toml) with the simulator's contention as truth.

The trace: the first --jobs jobs of Arena's Philly trace, every job on the
cluster's one GPU type (v100), arrivals scaled by the cluster's size (64 /
1,280) times --load. Why this trace: its GPU requests (1 to 16, 43% of its
jobs at 8 or 16) put most static jobs across nodes on 4-GPU nodes, where
10 Gb/s cards decide, and its models (BERT, MoE, wide ResNet up to 6.8B
parameters) are large enough that some elastic jobs cannot fit on one node
either; it is also the trace every other comparison in docs/benchmarks.md uses.

Policies (one `cellsched simulate --realistic --contention` run, the same
seed, restart model, truth and noise for all): cellsched,
cellsched:contention_aware=false, ada-srsf, srsf-avoid (SRSF(1)),
srsf-accept (SRSF(2)), and first-fit placement against LWF-kappa for the
three SRSF policies. Prints one JSON line per policy (finished, avg
JCT, and the ratio to ada-srsf over the jobs both finished), a summary line,
and writes OUT/contention.md. The run is kept in OUT/results.json (not run
again when there).

    python benchmarks/contention_64.py --out /tmp/c64 [--jobs 150] [--load 4] [--workers 2]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "etc" / "sim-64-10g.toml"
POLICIES = (
    "cellsched",
    "cellsched:contention_aware=false",
    "ada-srsf",
    "srsf-avoid",
    "srsf-accept",
    "ada-srsf:node_placement=first-fit",
    "srsf-accept:node_placement=first-fit",
    "srsf-avoid:node_placement=first-fit",
)
BASE = "ada-srsf"


def trace(out: Path, jobs: int) -> Path:
    """The first `jobs` Philly jobs with gpu_type v100 (the cluster's one type)."""
    from solver.contract.profiles.arena import TRACE_FILE, shipped_path

    src = shipped_path(TRACE_FILE)
    path = out / "philly-v100.csv"
    with open(src, newline="") as f, open(path, "w", newline="") as g:
        reader = csv.DictReader(f)
        writer = csv.DictWriter(g, fieldnames=reader.fieldnames)
        writer.writeheader()
        for i, row in enumerate(reader):
            if i >= jobs:
                break
            writer.writerow({**row, "gpu_type": "v100"})
    return path


def run(out: Path, jobs: int, load: float, policies: tuple[str, ...], workers: int, seed: int) -> Path:
    results = out / "results.json"
    if results.exists():
        return results
    from slurm_ext.sim.clusterspec import arena_cluster, load_cluster_spec

    rate = load * load_cluster_spec(CLUSTER).total_gpus / arena_cluster().total_gpus
    cmd = [sys.executable, "-m", "slurm_ext", "simulate", "--realistic", "--contention", "--seed", str(seed)]
    cmd += ["--trace", str(trace(out, jobs)), "--cluster", str(CLUSTER), "--arrival-rate", f"{rate:.6g}"]
    for p in policies:
        cmd += ["--policy", p]
    cmd += ["--workers", str(workers), "--no-plots", "--json", "--out", str(out)]
    print(f"# {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return results


def numbers(results: Path) -> list[dict[str, object]]:
    doc = json.loads(results.read_text())
    jct = {
        policy: {j["job_id"]: j["jct"] for j in r["jobs"] if j["finished"] and j["jct"] is not None}
        for policy, r in doc["runs"].items()
    }
    base = jct.get(BASE, {})
    out = []
    for policy, r in doc["runs"].items():
        done = jct[policy]
        common = sorted(set(done) & set(base))
        mine = statistics.mean(done[j] for j in common) if common else None
        theirs = statistics.mean(base[j] for j in common) if common else None
        out.append(
            {
                "policy": policy,
                "finished": len(done),
                "total": len(r["jobs"]),
                "avg_jct_s": round(statistics.mean(done.values()), 1) if done else None,
                "jobs_common": len(common),
                f"vs_{BASE}": round(mine / theirs, 4) if mine and theirs else None,
            }
        )
    return out


def markdown(rows: list[dict[str, object]]) -> str:
    lines = [f"| policy | finished | avg JCT s | vs {BASE} (jobs both finished) |", "|---|---|---|---|"]
    for n in rows:
        ratio = n[f"vs_{BASE}"]
        lines.append(
            f"| {n['policy']} | {n['finished']}/{n['total']} | {n['avg_jct_s']:,.0f} | "
            + (f"{ratio:.3f}x" if ratio is not None else "-")
            + " |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=150)
    ap.add_argument("--load", type=float, default=4.0, help="arrival rate relative to Philly on 1,280 GPUs")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    policies = tuple(p for p in args.policies.split(",") if p)
    rows = numbers(run(args.out, args.jobs, args.load, policies, args.workers, args.seed))
    for n in rows:
        print(json.dumps(n), flush=True)
    by = {n["policy"]: n for n in rows}

    def avg(p: str) -> float | None:
        return by[p]["avg_jct_s"] if p in by else None

    summary = {
        "summary": True,
        "cellsched_finished_every_job": by.get("cellsched", {}).get("finished") == by.get("cellsched", {}).get("total"),
        "cellsched_vs_unaware": _ratio(avg("cellsched"), avg("cellsched:contention_aware=false")),
        "cellsched_vs_ada_srsf": _ratio(avg("cellsched"), avg("ada-srsf")),
        "ada_srsf_vs_srsf_avoid": _ratio(avg("ada-srsf"), avg("srsf-avoid")),
        "ada_srsf_vs_srsf_accept": _ratio(avg("ada-srsf"), avg("srsf-accept")),
    }
    for p in ("srsf-avoid", "srsf-accept", "ada-srsf"):  # the paper's measure: first-fit's JCT / LWF-kappa's
        summary[f"lwf_speedup_over_first_fit_{p}"] = _ratio(avg(f"{p}:node_placement=first-fit"), avg(p))
    print(json.dumps(summary))
    (args.out / "contention.md").write_text(markdown(rows))
    return 0


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


if __name__ == "__main__":
    sys.exit(main())
