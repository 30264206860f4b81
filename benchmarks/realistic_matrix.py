"""The fair race: traces x clusters x policies in the simulator's realistic
mode (`cellsched simulate --realistic`: Arena's profiler estimates against
its measured times, per-job noise, the same restart model for every policy).

Rows (name: simulate options):
  philly-x1-arena, philly-x2-arena, philly-x4-arena: Arena's Philly trace
      (1,938 jobs) at 1x, 2x and 4x its arrival rate on Arena's 1,280 GPUs;
  philly-x1-mixed88, philly-x2-mixed88, philly-x4-mixed88: the first
      --small-jobs jobs of it on etc/sim-mixed-88.toml (88 GPUs, four
      types), arrivals scaled by the cluster's size (88 / 1,280) times 1, 2
      and 4, so that each load is the one of the same row on Arena's
      cluster (unscaled, 88 GPUs would meet 15x the load).

Each (row, policy) is one `cellsched simulate` run with the row's seed, so
every policy of a row meets the same truth, noise and restart model; it is
kept in OUT/ROW/POLICY/results.json with the commit it ran on, and a run
already there is not run again: the matrix is built over several sittings,
and after a change to one policy only its runs are deleted and redone. A
run is checkpointed into its folder every 10 minutes (`simulate
--checkpoint-dir`): one stopped part-way goes on from there next time.
Up to --workers runs go at once. Prints one JSON line per (row,
policy): finished, total, avg JCT, avg JCT over the jobs that policy and
sia both finished, and the ratio of the two averages; then a summary line
with the mean ratio to sia over the rows of the first cellsched policy
given ("cellsched", or e.g. "cellsched:hesrpt=false"). Writes OUT/matrix.md and,
with matplotlib, OUT/matrix.png.

    python benchmarks/realistic_matrix.py --out /tmp/matrix [--rows ROW,...] [--policies P,P:k=v,k=v]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POLICIES = ("cellsched", "sia", "gavel", "fcfs")
RATES = (1, 2, 4)
SMALL = REPO / "etc" / "sim-mixed-88.toml"


def rows(small_jobs: int) -> dict[str, list[str]]:
    from slurm_ext.sim.clusterspec import arena_cluster, load_cluster_spec

    out = {}
    # Arena's cluster is the simulator's default: 1x is the trace's own load there
    scale = load_cluster_spec(SMALL).total_gpus / arena_cluster().total_gpus
    for rate in RATES:
        out[f"philly-x{rate}-arena"] = ["--arrival-rate", str(rate)]
        out[f"philly-x{rate}-mixed88"] = [
            "--arrival-rate",
            f"{rate * scale:.6g}",
            "--cluster",
            str(SMALL),
            "--limit-jobs",
            str(small_jobs),
        ]
    return out


def commit() -> str:
    """This tree's commit (with "+dirty" when it has uncommitted changes)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True)
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def cpu_model() -> str:
    """The machine's CPU, as /proc/cpuinfo names it ("" where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        return ""


def run_cmd(args: list[str], policy: str, out: Path, seed: int) -> list[str]:
    """The `cellsched simulate` command of one (row, policy) run into OUT."""
    return [
        sys.executable,
        "-m",
        "slurm_ext",
        "simulate",
        "--realistic",
        "--seed",
        str(seed),
        *args,
        "--policy",
        policy,
        "--workers",
        "1",
        "--no-plots",
        "--json",
        "--out",
        str(out),
        "--checkpoint-dir",
        str(out),
    ]


def run_all(runs: list[tuple[str, str, list[str]]], out: Path, workers: int, seed: int) -> None:
    """Simulate each (row, policy, args) whose OUT/ROW/POLICY/results.json is
    missing, up to `workers` at once; a run that fails is reported and left
    missing (the others go on)."""
    todo = [(r, p, a) for r, p, a in runs if not (out / r / p / "results.json").exists()]
    running: list[tuple[str, str, subprocess.Popen]] = []
    failed = []
    while todo or running:
        while todo and len(running) < workers:
            row, policy, args = todo.pop(0)
            dest = out / row / policy
            dest.mkdir(parents=True, exist_ok=True)
            go_on = any(dest.glob("*.ckpt"))  # a run stopped before: it goes on from its checkpoint
            with open(dest / "commit.txt", "a" if go_on else "w") as f:
                f.write(("continued at " if go_on else "") + commit() + "\n")
            cmd = run_cmd(args, policy, dest, seed)
            print(f"# {row} {policy}: {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
            with open(dest / "simulate.log", "a" if go_on else "w") as log:  # the child keeps its own copy
                proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
            running.append((row, policy, proc))
        done = [entry for entry in running if entry[2].poll() is not None]
        if not done:
            time.sleep(2)
            continue
        row, policy, proc = done[0]
        running.remove(done[0])
        if proc.returncode:
            failed.append(f"{row}/{policy}")
            print(f"# {row} {policy}: failed ({proc.returncode}), see its simulate.log", file=sys.stderr)
    if failed:
        print(f"# failed: {', '.join(failed)}", file=sys.stderr)


def row_numbers(name: str, out: Path, policies: tuple[str, ...]) -> list[dict[str, object]]:
    """One dict per policy of a row that has its results (see the module doc)."""
    docs = {}
    for p in policies:
        path = out / name / p / "results.json"
        if path.exists():
            docs[p] = (json.loads(path.read_text()), (out / name / p / "commit.txt").read_text().strip())
    jct = {
        policy: {
            j["job_id"]: j["jct"]
            for j in next(iter(doc["runs"].values()))["jobs"]
            if j["finished"] and j["jct"] is not None
        }
        for policy, (doc, _) in docs.items()
    }
    sia = jct.get("sia", {})
    out = []
    for policy, (doc, ran_on) in docs.items():
        run = next(iter(doc["runs"].values()))
        done = jct[policy]
        common = sorted(set(done) & set(sia))
        mine = statistics.mean(done[j] for j in common) if common else None
        theirs = statistics.mean(sia[j] for j in common) if common else None
        out.append(
            {
                "row": name,
                "policy": policy,
                "finished": len(done),
                "total": len(run["jobs"]),
                "avg_jct_s": round(statistics.mean(done.values()), 1) if done else None,
                "jobs_common_with_sia": len(common),
                "avg_jct_common_s": round(mine, 1) if mine is not None else None,
                "sia_avg_jct_common_s": round(theirs, 1) if theirs is not None else None,
                "vs_sia": round(mine / theirs, 4) if mine and theirs else None,
                "wall_s": doc["meta"].get("wall_s"),
                "commit": ran_on,
            }
        )
    return out


def markdown(numbers: list[dict[str, object]], policies: tuple[str, ...]) -> str:
    head = "| row | " + " | ".join(f"{p}: finished, avg JCT s (vs sia)" for p in policies) + " |"
    lines = [head, "|" + "---|" * (len(policies) + 1)]
    for row in dict.fromkeys(n["row"] for n in numbers):
        cells = []
        for p in policies:
            n = next((x for x in numbers if x["row"] == row and x["policy"] == p), None)
            if n is None:
                cells.append("-")
                continue
            ratio = f" ({n['vs_sia']:.3f}x)" if n["vs_sia"] is not None and p != "sia" else ""
            avg = f"{n['avg_jct_s']:,.0f}" if n["avg_jct_s"] is not None else "-"
            cells.append(f"{n['finished']}/{n['total']}, {avg}{ratio}")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(numbers: list[dict[str, object]], policies: tuple[str, ...], path: Path) -> bool:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return False
    rows_ = list(dict.fromkeys(n["row"] for n in numbers))
    fig = Figure(figsize=(9, 4))
    ax = fig.subplots()
    width = 0.8 / len(policies)
    for i, p in enumerate(policies):
        ys = [next((x["vs_sia"] for x in numbers if x["row"] == r and x["policy"] == p), None) or 0 for r in rows_]
        ax.bar([k + i * width for k in range(len(rows_))], ys, width, label=p)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(rows_))], rows_, rotation=20, fontsize=8)
    ax.set_ylabel("avg JCT / sia's (jobs both finished)")
    ax.set_title("Realistic mode: average JCT relative to Sia")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def split_policies(text: str) -> tuple[str, ...]:
    """'sia;cellsched:a=1,b=2' or 'sia,cellsched:a=1,b=2' -> ('sia', 'cellsched:a=1,b=2'):
    a part with '=' and no ':' is one more option of the policy before it."""
    out: list[str] = []
    for part in filter(None, (p.strip() for p in re.split("[;,]", text))):
        if out and "=" in part and ":" not in part:
            out[-1] += "," + part
        else:
            out.append(part)
    return tuple(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default=None, help="comma-separated row names (default: all six)")
    ap.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help="policies by ',' or ';' (an option joins its policy): 'sia,cellsched:hesrpt=true,calibrate=false'",
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--small-jobs", type=int, default=300, help="jobs of the trace on the small cluster")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    policies = split_policies(args.policies)
    table = rows(args.small_jobs)
    chosen = args.rows.split(",") if args.rows else list(table)
    unknown = [r for r in chosen if r not in table]
    if unknown:
        ap.error(f"unknown row {unknown[0]!r} (known: {', '.join(table)})")
    args.out.mkdir(parents=True, exist_ok=True)
    run_all([(r, p, table[r]) for r in chosen for p in policies], args.out, args.workers, args.seed)
    numbers = []
    for name in chosen:
        for n in row_numbers(name, args.out, policies):
            print(json.dumps(n), flush=True)
            numbers.append(n)
    ours = next((p for p in policies if p.startswith("cellsched")), "cellsched")  # the first cellsched given
    ratios = [n["vs_sia"] for n in numbers if n["policy"] == ours and n["vs_sia"] is not None]
    all_done = all(n["finished"] == n["total"] for n in numbers if n["policy"] == ours)
    summary = {
        "summary": True,
        "policy": ours,
        "rows": len(ratios),
        "cellsched_mean_vs_sia": round(statistics.mean(ratios), 4) if ratios else None,
        "cellsched_worst_vs_sia": max(ratios) if ratios else None,
        "cellsched_finished_every_job": all_done,
    }
    print(json.dumps(summary))
    (args.out / "matrix.md").write_text(markdown(numbers, policies))
    plot(numbers, policies, args.out / "matrix.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
