"""How faithful is "Slurm's order"? A slice of an Arena trace replayed on a
real slurmctld (the dev cluster with accounting, multifactor priority and
backfill), then simulated with the project's re-implementations
(`slurm-multifactor`, `fcfs-backfill`) on the same jobs, cluster and time scale.

1. The jobs: `--jobs` jobs of the Arena trace CSV `--trace` from the
   `--skip`-th on (its order by submit time), each on its requested GPU type
   (Arena's types are the dev cluster's: a100, v100, a40, a10) with its GPU
   count capped at the type's GPUs on the dev cluster (a100 8, v100 8, a40 4,
   a10 2), on the fewest nodes. Its run time is its iterations (num_iteration
   // 5, Arena's convention) at Arena's measured iteration time of that cell
   (solver.arena.lookup.ArenaTable); a job whose cell Arena has no time for
   (out of memory) is left out, and the next one taken. Time is compressed
   by `--compress` (F, default 6000): a job is submitted (its trace submit
   time - the slice's first) / F seconds after the replay starts and sleeps
   its run time / F, clamped to [`--min-run`, `--max-run`] (5 s, 90 s) and
   rounded to a second. Its time limit is `--limit-factor` (2) times its run,
   rounded up to Slurm's minutes (users declare limits above their runs). Its
   account is the simulator's rule over the accounts of `--cluster`
   (slurm_ext.sim.site.assign_accounts), which the benchmark creates on the
   cluster (sacctmgr: Fairshare = the share, user root in each).
2. The real run: `contrib/dev-cluster/devcluster.sh up` under `--lab` with
   DEVCLUSTER_ACCOUNTING=1 (MariaDB, slurmdbd, priority/multifactor:
   PriorityWeightFairshare 10000, Age 1000, QOS 1000, JobSize 0, MaxAge and
   DecayHalfLife one day, PriorityCalcPeriod one minute; sched/backfill with
   sched_interval=1, bf_interval=1), DEVCLUSTER_GPU_TYPE_TRES=1 (AllocTRES names
   the type) and DEVCLUSTER_SCHED_PARAMS=bf_resolution=1 (backfill plans to the
   second, as the simulator does; Slurm's default is 60 s). Each job is
   `sbatch -p TYPE -N NODES --gres=gpu:TYPE:PER_NODE -t LIMIT -A ACCOUNT -q normal`
   of a script that sleeps its run time, submitted at its time. The benchmark
   then polls squeue until no job of the replay is left (bounded by
   `--bound-s`), and sacct until each has its End, and exports
   `sacct -a -P -X -o JobID,JobName,User,Account,QOS,Submit,Start,End,State,
   AllocTRES,ReqTRES,NNodes,Timelimit,Partition` to OUT/recorded.sacct.txt.
   `--recorded FILE` skips steps 1-2 and takes that export.
3. The simulation: the export read as `cellsched simulate --trace-format
   sacct` reads it (slurm_ext.sim.traces: submit times, run times, GPU type and
   count, account, time limit) on `--cluster` (the dev cluster's shape and the
   accounts), each policy in the simulator's engine: truth `arena-filled` at
   the requested cell (iterations = the recorded run over its iteration time),
   no noise, no restart cost, no contention, controller rounds every second
   (`--interval`, slurmctld's sched_interval and bf_interval) and early after
   arrivals and ends. `slurm-multifactor` gets the dev cluster's weights
   (fair share 10000, age 1000 over one day, job size 0).
4. Compared per policy against the record, over the jobs both started:
   `mean_wait_err_pct` = |mean simulated wait - mean recorded wait| / mean
   recorded wait x 100, `median_wait_err_pct` likewise with medians,
   `start_order_tau` = Kendall's tau-b of the jobs' start times (simulated
   against recorded; scipy.stats.kendalltau, or the same count of pairs when scipy is
   missing: `kendall_tau_b`), and the mean per-job
   |simulated - recorded| wait (`job_wait_mae_s`).

Prints one JSON line per policy and writes OUT/fidelity.jsonl.

    python benchmarks/slurm_fidelity.py --trace TRACE.csv --out /tmp/fid [--skip 0] [--jobs 60]
        [--lab /tmp/cellsched-fidelity --ctld-port 19817 --slurmd-baseport 19900] [--keep]
        [--recorded OUT/recorded.sacct.txt]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from solver.estimator import EstimatorBase
from solver.types import Cell, Estimate, EstimateSource, JobRequest, ParallelPlan

REPO = Path(__file__).resolve().parents[1]
DEVCLUSTER = REPO / "contrib" / "dev-cluster" / "devcluster.sh"
CLUSTER = REPO / "etc" / "sim-dev-fidelity.toml"
CAP = {"a100": 8, "v100": 8, "a40": 4, "a10": 2}  # the dev cluster's GPUs per type (cluster.conf)
SACCT_FORMAT = "JobID,JobName,User,Account,QOS,Submit,Start,End,State,AllocTRES,ReqTRES,NNodes,Timelimit,Partition"
POLICIES = ("slurm-multifactor", "fcfs-backfill")


@dataclass(frozen=True)
class Replayed:
    """One trace job as the replay submits it."""

    name: str
    submit_s: int
    run_s: int
    gpu_type: str
    nodes: int
    per_node: int
    limit_min: int
    account: str


def replay_jobs(args: argparse.Namespace) -> tuple[list[Replayed], int]:
    """The slice's jobs (module doc, step 1) and how many were left out."""
    from slurm_ext.sim.clusterspec import load_cluster_spec
    from slurm_ext.sim.site import assign_accounts
    from slurm_ext.sim.submit import best_layout
    from slurm_ext.sim.traces import read_arena_trace
    from solver.arena.lookup import ArenaTable

    cluster = load_cluster_spec(args.cluster)
    assert cluster.site is not None, f"{args.cluster} has no [site]"
    table = ArenaTable()
    trace = read_arena_trace(args.trace, iteration_scale=5)[args.skip :]
    picked, left_out = [], 0
    for job in trace:
        if len(picked) == args.jobs:
            break
        gpu_type = job.requested_gpu_type
        if gpu_type not in CAP:
            left_out += 1
            continue
        layout = best_layout(cluster, gpu_type, min(job.requested_gpus, CAP[gpu_type]))
        t = table.iter_time(job.model, job.global_batch, *layout) if layout is not None else None
        if t is None or job.iterations is None:
            left_out += 1
            continue
        picked.append((job, layout, t * job.iterations))
    accounts = {j.job_id: j.account for j in assign_accounts([j for j, _, _ in picked], cluster.site)}
    t0 = picked[0][0].submit_time
    out = []
    for i, (job, (gpu_type, nodes, per), duration) in enumerate(picked):
        run = int(round(min(max(duration / args.compress, args.min_run), args.max_run)))
        out.append(
            Replayed(
                name=f"fid-{args.skip + i}",
                submit_s=int(round((job.submit_time - t0) / args.compress)),
                run_s=run,
                gpu_type=gpu_type,
                nodes=nodes,
                per_node=per,
                limit_min=max(1, math.ceil(run * args.limit_factor / 60)),
                account=accounts[job.job_id],
            )
        )
    return out, left_out


def cluster_env(args: argparse.Namespace) -> dict[str, str]:
    return {
        **os.environ,
        "LAB": args.lab,
        "CTLD_PORT": str(args.ctld_port),
        "SLURMD_BASEPORT": str(args.slurmd_baseport),
        "DEVCLUSTER_ACCOUNTING": "1",
        "DEVCLUSTER_GPU_TYPE_TRES": "1",
        "DEVCLUSTER_SCHED_PARAMS": "bf_resolution=1",
    }


def run(cmd: list[str], env: dict[str, str], timeout: float = 60) -> str:
    return subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=timeout).stdout


def start_cluster(args: argparse.Namespace) -> dict[str, str]:
    """The dev cluster with accounting up, the accounts of --cluster made; its clients' environment."""
    from slurm_ext.sim.clusterspec import load_cluster_spec

    env = cluster_env(args)
    subprocess.run(["bash", str(DEVCLUSTER), "up"], env=env, check=True, timeout=600)
    env["SLURM_CONF"] = str(Path(args.lab) / "etc" / "slurm.conf")
    site = load_cluster_spec(args.cluster).site
    assert site is not None
    for a in site.accounts:
        share = int(a.share)
        run(["sacctmgr", "-i", "add", "account", a.name, "Cluster=cellsched", f"Fairshare={share}"], env)
    run(["sacctmgr", "-i", "add", "user", "root", "Account=" + ",".join(a.name for a in site.accounts)], env)
    wait_fairshare(env, [a.name for a in site.accounts])
    return env


def wait_fairshare(env: dict[str, str], accounts: list[str], bound_s: float = 180) -> None:
    """Until slurmctld has computed the new associations' fair share (every PriorityCalcPeriod;
    0 before): a site's accounts exist long before its jobs."""
    deadline = time.monotonic() + bound_s
    while True:
        rows = [r.split("|") for r in run(["sshare", "-a", "-n", "-P", "-o", "Account,User,FairShare"], env).split()]
        got = {r[0].strip() for r in rows if len(r) == 3 and r[1] == "root" and r[2] and float(r[2]) > 0}
        if set(accounts) <= got:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"no fair share for {sorted(set(accounts) - got)} after {bound_s:.0f} s")
        time.sleep(2)


def submit_all(jobs: list[Replayed], env: dict[str, str], out: Path) -> list[str]:
    """Each job at its time (module doc, step 2); their Slurm job ids."""
    script = out / "sleep.sh"
    script.write_text('#!/bin/sh\nexec sleep "$1"\n')
    script.chmod(0o755)
    ids, t0 = [], time.monotonic()
    for j in jobs:
        delay = t0 + j.submit_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # the trace's arrival: the replay's clock, not a wait for an event
        cmd = ["sbatch", "--parsable", "-J", j.name, "-p", j.gpu_type, "-N", str(j.nodes)]
        cmd += [f"--gres=gpu:{j.gpu_type}:{j.per_node}", "-t", str(j.limit_min), "-A", j.account, "-q", "normal"]
        cmd += ["-o", "/dev/null", str(script), str(j.run_s)]
        ids.append(run(cmd, env).strip().split(";")[0])
    return ids


def wait_ended(ids: list[str], env: dict[str, str], bound_s: float) -> None:
    """Poll squeue until none of `ids` is left, then sacct until each has its End (bounded)."""
    deadline = time.monotonic() + bound_s
    while run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i"], env).split():
        if time.monotonic() > deadline:
            raise SystemExit(f"jobs still queued after {bound_s:.0f} s")
        time.sleep(2)
    while True:
        rows = run(["sacct", "-a", "-n", "-P", "-X", "-j", ",".join(ids), "-o", "JobID,End"], env).split()
        ended = [r for r in rows if r.split("|")[1] not in ("Unknown", "")]
        if len(ended) == len(ids):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"sacct has no End for {len(ids) - len(ended)} jobs after {bound_s:.0f} s")
        time.sleep(1)


def record(args: argparse.Namespace, out: Path) -> Path:
    """Steps 1-2 of the module doc: the replay on the dev cluster, its sacct export."""
    jobs, left_out = replay_jobs(args)
    gpu_s = sum(j.run_s * j.nodes * j.per_node for j in jobs)
    print(
        f"replay: {len(jobs)} jobs ({left_out} left out), arrivals over {jobs[-1].submit_s} s, "
        f"{gpu_s} GPU-s on 22 GPUs",
        file=sys.stderr,
    )
    (out / "replay.jsonl").write_text("".join(json.dumps(j.__dict__) + "\n" for j in jobs))
    env = start_cluster(args)
    try:
        ids = submit_all(jobs, env, out)
        wait_ended(ids, env, args.bound_s)
        path = out / "recorded.sacct.txt"
        path.write_text(run(["sacct", "-a", "-P", "-X", "-j", ",".join(ids), "-o", SACCT_FORMAT], env))
        (out / "slurm.conf").write_text((Path(args.lab) / "etc" / "slurm.conf").read_text())
        return path
    finally:
        if not args.keep:
            subprocess.run(["bash", str(DEVCLUSTER), "down"], env=cluster_env(args), check=False, timeout=120)


class SleepTable(EstimatorBase):
    """The replay's jobs sleep: one second per iteration on any cell, truth and estimate alike,
    so that a job of the export runs its recorded seconds (iterations = its run time)."""

    def speed(self, spec: object, gpu_type: str, num_nodes: int, gpus_per_node: int, plan: object) -> float:
        return 1.0

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), 1.0, 1.0, EstimateSource.MEASURED)


def simulate(policy_name: str, recorded: Path, args: argparse.Namespace) -> dict[str, tuple[float, float | None]]:
    """Step 3: each recorded job's (submit, first start) under the policy, by sacct JobID."""
    from slurm_ext.sim.clusterspec import load_cluster_spec
    from slurm_ext.sim.engine import FlatRestartCost, SimOptions, Simulator
    from slurm_ext.sim.traces import read_sacct
    from solver.policies import get_policy
    from solver.policies.slurm_multifactor import MultifactorWeights, SlurmMultifactorPolicy

    trace = read_sacct(recorded)
    cluster = load_cluster_spec(args.cluster)
    if policy_name == "slurm-multifactor":
        policy = SlurmMultifactorPolicy(MultifactorWeights(age=1000, fairshare=10000, job_size=0, max_age_s=86400))
    else:
        policy = get_policy(policy_name)
    options = SimOptions(interval_s=args.interval, min_gap_s=0.0, elastic=False, contention=False)
    options = replace(options, charge_first_start=False)
    sleep = SleepTable()
    sim = Simulator(
        trace,
        cluster,
        policy,
        speed=sleep.speed,
        estimator=sleep,
        options=options,
        restart_cost=FlatRestartCost(0.0, 0.0, False),
        label=policy_name,
    )
    got = sim.run()
    return {o.job_id: (o.submit_time, o.first_start) for o in got.jobs}


def recorded_waits(path: Path) -> dict[str, tuple[float, float]]:
    """Each job's (submit, start) in seconds from the first submit, by JobID."""
    import datetime as dt

    lines = path.read_text().splitlines()
    cols = lines[0].split("|")
    rows = [dict(zip(cols, ln.split("|"), strict=False)) for ln in lines[1:] if ln.strip()]
    t = {r["JobID"]: (dt.datetime.fromisoformat(r["Submit"]), dt.datetime.fromisoformat(r["Start"])) for r in rows}
    t0 = min(s for s, _ in t.values())
    return {k: ((s - t0).total_seconds(), (b - t0).total_seconds()) for k, (s, b) in t.items()}


def kendall_tau(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b: scipy.stats.kendalltau when scipy is installed, else the same
    statistic by counting pairs, (concordant - discordant) / sqrt((n0 - ties in x) (n0 - ties in y))."""
    try:
        from scipy.stats import kendalltau
    except ImportError:
        return kendall_tau_b(x, y)
    return float(kendalltau(x, y).statistic)


def kendall_tau_b(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b over all pairs (O(n^2); the replays have tens of jobs)."""
    concordant = discordant = tie_x = tie_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue  # tied in both: counted in neither denominator term's pairs
            if dx == 0:
                tie_x += 1
            elif dy == 0:
                tie_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denom = math.sqrt((concordant + discordant + tie_x) * (concordant + discordant + tie_y))
    return (concordant - discordant) / denom if denom else math.nan


def compare(policy: str, rec: dict[str, tuple[float, float]], sim: dict[str, tuple[float, float | None]]) -> dict:
    both = sorted(k for k in rec if k in sim and sim[k][1] is not None)
    rw = [rec[k][1] - rec[k][0] for k in both]
    sw = [sim[k][1] - sim[k][0] for k in both]  # type: ignore[operator]
    mean_r, med_r = statistics.mean(rw), statistics.median(rw)
    return {
        "policy": policy,
        "jobs": len(both),
        "jobs_recorded": len(rec),
        "recorded_mean_wait_s": round(mean_r, 2),
        "simulated_mean_wait_s": round(statistics.mean(sw), 2),
        "mean_wait_err_pct": round(abs(statistics.mean(sw) - mean_r) / mean_r * 100, 2) if mean_r else None,
        "recorded_median_wait_s": round(med_r, 2),
        "simulated_median_wait_s": round(statistics.median(sw), 2),
        "median_wait_err_pct": round(abs(statistics.median(sw) - med_r) / med_r * 100, 2) if med_r else None,
        "start_order_tau": round(kendall_tau([rec[k][1] for k in both], [sim[k][1] for k in both]), 4),  # type: ignore[misc]
        "job_wait_mae_s": round(statistics.mean(abs(a - b) for a, b in zip(sw, rw, strict=True)), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", help="Arena trace CSV to replay (not needed with --recorded)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--skip", type=int, default=0, help="start at this job of the trace (submit order)")
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--compress", type=float, default=6000.0, help="time compression factor F")
    ap.add_argument("--min-run", type=float, default=5.0)
    ap.add_argument("--max-run", type=float, default=90.0)
    ap.add_argument("--limit-factor", type=float, default=2.0)
    ap.add_argument("--cluster", default=str(CLUSTER))
    ap.add_argument("--lab", default="/tmp/cellsched-fidelity")
    ap.add_argument("--ctld-port", type=int, default=19817)
    ap.add_argument("--slurmd-baseport", type=int, default=19900)
    ap.add_argument("--bound-s", type=float, default=3600.0, help="give up waiting for the jobs after this long")
    ap.add_argument("--keep", action="store_true", help="leave the dev cluster up")
    ap.add_argument("--recorded", type=Path, help="a sacct export of an earlier replay: simulate only")
    ap.add_argument("--interval", type=float, default=1.0, help="simulated controller rounds (s)")
    ap.add_argument("--policy", action="append", help="policies to simulate (default: both)")
    args = ap.parse_args()
    if args.trace is None and args.recorded is None:
        ap.error("give --trace (replay it) or --recorded (simulate an export)")
    if args.jobs < 1 or args.skip < 0 or not args.compress > 0 or not 0 < args.min_run <= args.max_run:
        ap.error("need --jobs >= 1, --skip >= 0, --compress > 0, 0 < --min-run <= --max-run")
    args.out.mkdir(parents=True, exist_ok=True)
    recorded = args.recorded or record(args, args.out)
    rec = recorded_waits(recorded)
    lines = []
    for policy in args.policy or POLICIES:
        row = compare(policy, rec, simulate(policy, recorded, args))
        print(json.dumps(row), flush=True)
        lines.append(json.dumps(row) + "\n")
    (args.out / "fidelity.jsonl").write_text("".join(lines))


if __name__ == "__main__":
    main()
