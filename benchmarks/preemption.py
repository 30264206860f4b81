"""Preemption to zero GPUs (issue 57): cellsched with preemption = "priority"
against itself with preemption off, on the multi-tenant cluster where a
fraction of the jobs run in an urgent QOS, in the simulator's realistic mode.

The cluster: --cluster (default etc/sim-multitenant-88.toml: 88 GPUs of four
types shared by three accounts, shares 50 / 30 / 20, one of them limited to
32 GPUs) with two QOS added to its [site]: `normal` (priority 0, every job's
default) and `urgent` (priority --priority, 100), which the simulator gives
a --fraction (0.1) of the trace's jobs by its rule (slurm_ext.sim.site:
v = the first 64 bits of sha256("qos:" + job id) over 2^64 below the
fraction). The file is written to OUT/cluster.toml. The trace: the first
--jobs jobs of Arena's Philly trace, arrivals at --load times the trace's
rate per GPU (as benchmarks/multitenant.py). One `cellsched simulate
--realistic` run for both variants (the same seed, truth, noise and restart
model), kept in OUT/results.json (not run again when there); --min-run-s sets
the restart governor of both (default: the config's default).

Measured per variant and class of job (urgent, the others): jobs, finished,
average wait (first start - submit), average JCT, restarts per job (mean,
99th percentile). Prints one JSON line per variant, then a summary line with
the issue's targets: the urgent jobs' average wait with preemption at most
0.5x without it, and the other jobs' average JCT at most 1.1x; writes
OUT/preemption.md.

    python benchmarks/preemption.py --out /tmp/pre [--jobs 150] [--load 1] [--seed 0] [--fraction 0.1]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

# benchmarks/multitenant.py, beside this script: the run (one `cellsched simulate --realistic`
# of the given policies on a cluster with a [site]) and the trace as the simulator assigns it
from multitenant import emit, parser, run, site_trace

URGENT = "urgent"
VARIANTS = {"off": "cellsched:preemption=off", "priority": "cellsched:preemption=priority"}


def cluster_file(base: Path, out: Path, fraction: float, priority: float) -> Path:
    """`base` with the QOS normal and urgent in its [site] (module doc), as OUT/cluster.toml."""
    text = base.read_text()
    if "[site]" not in text or "[site.qos." in text or "default_qos" in text:
        raise SystemExit(f"{base}: needs a [site] without QOS of its own")
    text = text.replace("[site]\n", '[site]\ndefault_qos = "normal"\n', 1)
    text += f"\n[site.qos.normal]\n\n[site.qos.{URGENT}]\npriority = {priority:g}\ntrace_fraction = {fraction:g}\n"
    path = out / "cluster.toml"
    path.write_text(text)
    return path


def qos_of(jobs: int, cluster: Path) -> dict[str, str]:
    """Trace job id -> QOS, by the simulator's rule (the same jobs it ran)."""
    return {j.job_id: j.qos for j in site_trace(jobs, cluster)}


def _mean(xs: list[float]) -> float | None:
    return round(statistics.mean(xs), 1) if xs else None


def _p99(xs: list[int]) -> float | None:
    """The 99th percentile, linear between ranks (the simulator's report's rule)."""
    from slurm_ext.sim.report import percentile

    p = percentile(xs, 99)
    return None if p is None else round(p, 2)


def numbers(results: Path, qos: dict[str, str]) -> tuple[list[dict[str, object]], dict[str, object]]:
    """(one dict per variant, the summary) of a run (module doc)."""
    doc = json.loads(results.read_text())
    rows = []
    for variant, label in VARIANTS.items():
        run_ = next(r for name, r in doc["runs"].items() if name.startswith(label))
        row: dict[str, object] = {"variant": variant, "policy": next(n for n in doc["runs"] if n.startswith(label))}
        for cls in (URGENT, "other"):
            jobs = [j for j in run_["jobs"] if (qos.get(j["job_id"]) == URGENT) == (cls == URGENT)]
            waits = [j["queueing"] for j in jobs if j["queueing"] is not None]
            jcts = [j["jct"] for j in jobs if j["finished"] and j["jct"] is not None]
            restarts = [int(j["restarts"]) for j in jobs]
            row[cls] = {
                "jobs": len(jobs),
                "finished": len(jcts),
                "avg_wait_s": _mean(waits),
                "avg_jct_s": _mean(jcts),
                "restarts_mean": round(statistics.mean(restarts), 3) if restarts else None,
                "restarts_p99": _p99(restarts),
            }
        rows.append(row)
    off, on = rows
    wait = _ratio(on[URGENT]["avg_wait_s"], off[URGENT]["avg_wait_s"])  # type: ignore[index]
    jct = _ratio(on["other"]["avg_jct_s"], off["other"]["avg_jct_s"])  # type: ignore[index]
    summary = {
        "summary": True,
        "urgent_wait_ratio": wait,
        "other_jct_ratio": jct,
        "target_met": wait is not None and jct is not None and wait <= 0.5 and jct <= 1.1,
        "every_job_finished": all(r[c]["finished"] == r[c]["jobs"] for r in rows for c in (URGENT, "other")),  # type: ignore[index]
        "wall_s": doc["meta"].get("wall_s"),
        "arrival_rate": doc["meta"].get("arrival_rate"),
    }
    return rows, summary


def _ratio(a: object, b: object) -> float | None:
    return round(float(a) / float(b), 4) if a is not None and b else None  # type: ignore[arg-type]


def markdown(rows: list[dict[str, object]]) -> str:
    def num(x: object) -> str:
        return "-" if x is None else f"{x:,.0f}"

    head = ["preemption", "class", "jobs", "finished", "avg wait s", "avg JCT s", "restarts per job mean / p99"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        for cls in (URGENT, "other"):
            c: dict[str, object] = r[cls]  # type: ignore[assignment]
            cells = [str(r["variant"]), cls, str(c["jobs"]), str(c["finished"]), num(c["avg_wait_s"])]
            cells += [num(c["avg_jct_s"]), f"{c['restarts_mean']:.2f} / {c['restarts_p99']:.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = parser(__doc__, "cluster spec with a [site] and no QOS")
    ap.add_argument("--fraction", type=float, default=0.1, help="the share of the jobs in the urgent QOS")
    ap.add_argument("--priority", type=float, default=100.0, help="the urgent QOS's priority (normal: 0)")
    ap.add_argument("--min-run-s", type=float, default=None, help="the restart governor (default: the config's)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cluster = cluster_file(args.cluster, args.out, args.fraction, args.priority)
    governor = f",min_run_s={args.min_run_s:g}" if args.min_run_s is not None else ""
    policies = tuple(p + governor for p in VARIANTS.values())
    results = run(args.out, args.jobs, args.load, args.workers, args.seed, cluster, policies, args.checkpoint_dir)
    rows, summary = numbers(results, qos_of(args.jobs, cluster))
    emit(rows, summary, markdown(rows), args.out / "preemption.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
