"""A month at a large site, generated: a seeded 30-day ``sacct -P`` log of about
40,000 GPU jobs on a 2,048-GPU cluster of four types, with the site's files
(``sacctmgr dump``, ``sacctmgr show qos``, ``scontrol show partition``) and the
simulator's cluster file, so that this runs on it::

    python benchmarks/month_trace.py --out /tmp/month
    cellsched simulate --trace-format sacct --trace /tmp/month/sacct.txt \\
        --cluster /tmp/month/cluster.toml --site-dump /tmp/month/sacctmgr_dump.txt \\
        --site-qos /tmp/month/sacctmgr_show_qos.txt --partitions /tmp/month/scontrol_show_partition.txt \\
        --policy recorded --policy slurm-multifactor --policy cellsched --out /tmp/month-run

Where each part comes from (no distribution here is made up):

- **Jobs** are drawn, with replacement and seeded, from Arena's Philly trace
  (the shipped ``simulate_trace_philly.csv``: 1,938 jobs Arena sampled from
  Microsoft's Philly trace, Jeon et al., ATC'19): each job takes one row's
  GPU count (1: 5%, 2: 15%, 4: 37%, 8: 33%, 16: 10% of the rows), GPU type,
  model, batch and iterations (num_iteration // 5, as the simulator reads
  Arena's trace). Its spec rides in the job's Comment as ``cellsched sbatch``
  writes it, so the simulator runs the job's own model.
- **Arrivals** are the trace's own inter-arrival gaps, drawn with
  replacement, each scaled by one factor so that --jobs jobs arrive in
  --days days (Philly's 1,938 arrivals span 19.8 days).
- **Durations** are each job's iterations at Arena's measured iteration time of
  its requested cell (``profiles_optimal.json``, best locality); the 71
  rows (of 1,938) whose cell Arena did not measure are not drawn. Then every job's iterations are
  scaled by one factor so that the offered load (GPU-seconds asked for over
  the cluster's GPU-seconds in the month) is --load: unscaled, 40,000
  Philly jobs a month would ask for several times the cluster. The factor is
  printed and written into README.md.
- **The cluster**: 2,048 GPUs split among the four types in proportion to
  the GPU-seconds the jobs ask of each (whole nodes, Arena's node shapes:
  a100 4, v100 16, a40 2, a10 2 GPUs a node), so that no type is idle by
  construction. Partitions: one per type and ``all``.
- **Accounts** (site configuration, not a workload statistic): eight accounts
  in two groups, with the shares, GPU limits and job weights of ACCOUNTS
  below; a job's account is drawn by weight, its user is one of the
  account's USERS_PER_ACCOUNT. One QOS, ``normal``.
- **Start and End** (the recorded run) come from a simple replay, not from a
  real Slurm: conservative backfill per GPU type's pool, in submit order,
  each job at the earliest time its type has its GPUs free for its whole
  run without moving any job placed before it. Nodes (fragmentation), fair
  share and the GPU limits are not part of it; how far the replay went over
  a limit is written into README.md. The replay stands in for a site's
  Slurm so that ``--policy recorded`` has something to show; it is no
  measurement of one.

Prints one JSON line (jobs, days, GPUs per type, the scale factors, the
replay's mean wait, wall time).
"""

from __future__ import annotations

import argparse
import bisect
import csv
import datetime as dt
import json
import math
import random
import time
from collections import Counter
from pathlib import Path

from solver.contract.jobspec import JobSpec

ARENA = Path("/work/shared/data/arena")
#: the shipped trace and Arena's measured table (the simulator's defaults)
TRACE = "simulate_trace_philly.csv"
PROFILES = "profiles_optimal.json"
#: GPUs a node, as on Arena's cluster (its cluster_spec.json)
NODE_GPUS = {"a100": 4, "v100": 16, "a40": 2, "a10": 2}
#: name: (parent, Fairshare, GrpTRES gres/gpu or None, weight of its jobs)
ACCOUNTS = {
    "research": (None, 60, None, 0),
    "production": (None, 40, None, 0),
    "nlp": ("research", 30, 768, 30),
    "vision": ("research", 20, 640, 20),
    "speech": ("research", 10, 384, 10),
    "rl": ("research", 10, 256, 8),
    "search": ("production", 20, 1024, 14),
    "ads": ("production", 20, 1024, 18),
}
USERS_PER_ACCOUNT = 12
EPOCH = dt.datetime(2026, 10, 1)
SACCT_HEADER = "JobID|JobName|User|Account|QOS|Partition|Submit|Start|End|State|AllocTRES|ReqTRES|NNodes|Comment"


def arena_rows(root: Path) -> tuple[list[dict[str, str]], dict[tuple[str, int, str, int], float]]:
    with open(root / "traces" / TRACE, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    records = json.loads((root / PROFILES).read_text())["records"]
    times = {
        (r["trace_model_name"], r["batch_size"], r["gpu_type"], r["num_gpus"]): r["iter_time_s"]
        for r in records
        if r.get("is_best_locality") and r.get("status") == "ok" and r.get("iter_time_s")
    }
    return rows, times


def draw_jobs(args: argparse.Namespace) -> list[dict]:
    rows, times = arena_rows(Path(args.arena))
    rng = random.Random(args.seed)
    usable = []
    for r in rows:
        key = (r["model_name"], int(r["batch_size"]), r["gpu_type"], int(r["num_gpu"]))
        if key in times:
            usable.append((r, times[key]))
    submits = sorted(float(r["submission_time"]) for r in rows)
    gaps = [b - a for a, b in zip(submits, submits[1:], strict=False)]
    gap_scale = args.days * 86400 / (args.jobs * (sum(gaps) / len(gaps)))
    weights = [w for _, _, _, w in ACCOUNTS.values()]
    names = list(ACCOUNTS)
    jobs, t = [], 0.0
    for i in range(args.jobs):
        r, it_s = rng.choice(usable)
        account = rng.choices(names, weights)[0]
        jobs.append(
            {
                "id": i + 1,
                "submit": t,
                "model": r["model_name"],
                "batch": int(r["batch_size"]),
                "iterations": max(1, int(r["num_iteration"]) // 5),
                "iter_s": it_s,
                "gpus": int(r["num_gpu"]),
                "type": r["gpu_type"],
                "account": account,
                "user": f"{account}-u{rng.randrange(USERS_PER_ACCOUNT)}",
            }
        )
        t += rng.choice(gaps) * gap_scale
    asked = sum(j["gpus"] * j["iterations"] * j["iter_s"] for j in jobs)
    it_scale = args.load * args.gpus * args.days * 86400 / asked
    for j in jobs:
        j["iterations"] = max(1, round(j["iterations"] * it_scale))
        j["duration"] = math.ceil(j["iterations"] * j["iter_s"])
    args.gap_scale, args.iteration_scale = gap_scale, it_scale
    return jobs


def cluster_shape(jobs: list[dict], total: int) -> dict[str, int]:
    """GPUs per type in proportion to the GPU-seconds asked of it, whole nodes."""
    asked = Counter()
    for j in jobs:
        asked[j["type"]] += j["gpus"] * j["duration"]
    whole = sum(asked.values())
    gpus = {t: max(16, round(total * a / whole / 16) * 16) for t, a in sorted(asked.items())}
    big = max(gpus, key=lambda t: gpus[t])
    gpus[big] += total - sum(gpus.values())  # 16 divides every node shape
    return gpus


class Pool:
    """A GPU type's free GPUs over time as a step function, for conservative backfill."""

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.times = [0.0]  # breakpoints
        self.used = [0]  # GPUs in use from times[i] to times[i + 1]

    def _split(self, t: float) -> int:
        i = bisect.bisect_right(self.times, t) - 1
        if self.times[i] != t:
            self.times.insert(i + 1, t)
            self.used.insert(i + 1, self.used[i])
            i += 1
        return i

    def earliest(self, submit: float, gpus: int, duration: float) -> float:
        i = max(0, bisect.bisect_right(self.times, submit) - 1)
        start = submit
        while True:
            end, j, ok = start + duration, i, True
            while j < len(self.times) and self.times[j] < end:
                if self.used[j] + gpus > self.gpus:
                    ok = False
                    break
                j += 1
            if ok:
                return start
            i = j + 1  # the first breakpoint after the one that does not fit
            start = self.times[j + 1] if j + 1 < len(self.times) else self.times[j]

    def place(self, start: float, gpus: int, duration: float) -> None:
        a = self._split(start)
        b = self._split(start + duration)
        for k in range(a, b):
            self.used[k] += gpus

    def forget_before(self, t: float) -> None:
        i = bisect.bisect_right(self.times, t) - 1
        if i > 0:
            del self.times[:i]
            del self.used[:i]


def replay(jobs: list[dict], gpus: dict[str, int]) -> None:
    pools = {t: Pool(n) for t, n in gpus.items()}
    for j in jobs:  # submit order
        pool = pools[j["type"]]
        pool.forget_before(j["submit"])
        j["start"] = pool.earliest(j["submit"], j["gpus"], j["duration"])
        pool.place(j["start"], j["gpus"], j["duration"])


def over_limits(jobs: list[dict]) -> dict[str, int]:
    """The most GPUs each limited account (its sub-accounts included) held at once in the replay."""
    events = sorted((t, d * j["gpus"], j["account"]) for j in jobs for t, d in ((j["start"], 1), (j["end_t"], -1)))
    held, peak = Counter(), Counter()
    for _, delta, account in events:
        a: str | None = account
        while a is not None:
            held[a] += delta
            peak[a] = max(peak[a], held[a])
            a = ACCOUNTS[a][0]
    return {a: peak[a] for a, (_, _, cap, _) in ACCOUNTS.items() if cap is not None and peak[a] > cap}


def stamp(seconds: float) -> str:
    return (EPOCH + dt.timedelta(seconds=round(seconds))).isoformat()


def write_sacct(path: Path, jobs: list[dict]) -> None:
    lines = [SACCT_HEADER]
    for j in jobs:
        nodes = math.ceil(j["gpus"] / NODE_GPUS[j["type"]])
        tres = f"billing={j['gpus']},cpu={j['gpus']},gres/gpu:{j['type']}={j['gpus']},gres/gpu={j['gpus']},node={nodes}"
        spec = JobSpec(
            model=j["model"],
            global_batch=j["batch"],
            iterations=j["iterations"],
            requested_gpus=j["gpus"],
            requested_gpu_type=j["type"],
        )
        lines.append(
            "|".join(
                [
                    str(j["id"]),
                    f"{j['model']}-{j['id']}",
                    j["user"],
                    j["account"],
                    "normal",
                    j["type"],
                    stamp(j["submit"]),
                    stamp(j["start"]),
                    stamp(j["end_t"]),
                    "COMPLETED",
                    tres,
                    tres,
                    str(nodes),
                    spec.to_comment(),
                ]
            )
        )
    path.write_text("\n".join(lines) + "\n")


def write_site(out: Path, gpus: dict[str, int]) -> None:
    dump = ["Cluster - 'month':Fairshare=1:QOS='normal'", "Parent - 'root'"]
    for parent in (None, *ACCOUNTS):
        children = [a for a, (p, *_rest) in ACCOUNTS.items() if p == parent]
        if parent is not None and not children and ACCOUNTS[parent][3] == 0:
            continue
        if parent is not None:
            dump.append(f"Parent - '{parent}'")
        for a in children:
            _, share, cap, _ = ACCOUNTS[a]
            grp = f":GrpTRES=gres/gpu={cap}" if cap is not None else ""
            dump.append(f"Account - '{a}':Description='{a}':Organization='month':Fairshare={share}{grp}:QOS='normal'")
        if parent is not None and ACCOUNTS[parent][3] > 0:
            dump += [f"User - '{parent}-u{k}':DefaultAccount='{parent}':Fairshare=1" for k in range(USERS_PER_ACCOUNT)]
    (out / "sacctmgr_dump.txt").write_text("\n".join(dump) + "\n")
    (out / "sacctmgr_show_qos.txt").write_text("normal|0|||||||\n")
    parts = [
        f"PartitionName={kind}\n   AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL\n"
        f"   Nodes={kind}[1-{n // NODE_GPUS[kind]}]"
        for kind, n in gpus.items()
    ]
    parts.append("PartitionName=all\n   AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL\n   Default=YES")
    (out / "scontrol_show_partition.txt").write_text("\n\n".join(parts) + "\n")
    groups = [
        f'[[nodes]]\ngpu_type = "{k}"\ncount = {n // NODE_GPUS[k]}\ngpus_per_node = {NODE_GPUS[k]}\n'
        for k, n in gpus.items()
    ]
    (out / "cluster.toml").write_text(
        f'# The generated month\'s cluster (benchmarks/month_trace.py): {sum(gpus.values())} GPUs\nname = "month"\n'
        + "\n".join(groups)
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder to write the log and the site's files into")
    ap.add_argument("--jobs", type=int, default=40_000)
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--gpus", type=int, default=2048, help="the cluster's GPUs (a multiple of 16)")
    ap.add_argument("--load", type=float, default=0.8, help="offered load: GPU-seconds asked over the month's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arena", default=str(ARENA), help="Arena's data folder (trace and profiles_optimal.json)")
    args = ap.parse_args(argv)
    if args.jobs < 1 or args.days <= 0 or args.gpus < 16 or args.gpus % 16 or not 0 < args.load:
        ap.error("--jobs, --days, --load must be positive and --gpus a positive multiple of 16")
    t0 = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = draw_jobs(args)
    gpus = cluster_shape(jobs, args.gpus)
    replay(jobs, gpus)
    for j in jobs:
        j["end_t"] = j["start"] + j["duration"]
    write_sacct(out / "sacct.txt", jobs)
    write_site(out, gpus)
    waits = sorted(j["start"] - j["submit"] for j in jobs)
    summary = {
        "jobs": len(jobs),
        "days": args.days,
        "gpus": gpus,
        "seed": args.seed,
        "load": args.load,
        "arrival_gap_scale": round(args.gap_scale, 6),
        "iteration_scale": round(args.iteration_scale, 6),
        "replay_mean_wait_s": round(sum(waits) / len(waits), 1),
        "replay_median_wait_s": waits[len(waits) // 2],
        "replay_over_limits": over_limits(jobs),
        "last_end_day": round(max(j["end_t"] for j in jobs) / 86400, 2),
        "wall_s": round(time.monotonic() - t0, 1),
    }
    (out / "README.md").write_text(
        "# A generated month (benchmarks/month_trace.py; its docstring says where each part comes from)\n\n"
        + json.dumps(summary, indent=1)
        + "\n"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
