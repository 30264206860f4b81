"""cellsched inside the Sia artifact's simulator (issue 56).

Runs the simulator that Sia's authors published (repository
``siasosp23/artifacts``, folder ``sia-simulator/``) from a checkout the user
gives with ``--artifact DIR``, without changing any of its files: this
driver imports the artifact's modules at run time (the repository has no
licence, so nothing of it is copied here) and drives one workload the way
its ``multi_simulator.py`` (Sia, Gavel, cellsched) and
``multi_simulator_unaware.py`` (Pollux) do, with the cluster of its
``simulator_config.py`` (Saturn: 6x4 T4 "aws", 2x8 A100 "dgx-ext", 3x8
RTX 2080Ti "rtx") and the round intervals and parameters of its
``run_experiment.sh``:

* ``sia``: interval 60 s, p = -0.5, lambda_a = 0.01, lambda_n = 1.1,
  project_throughputs, share_max_replicas (its Sia solves with CBC);
* ``gavel``: interval 360 s (max_sum_throughput_perf, batch sizes fixed);
* ``pollux``: heterogeneity-unaware, interval 60 s, p = -1;
* ``cellsched`` / ``cellsched-unaware``: cellsched's own policy through
  the adapter of benchmarks/sia_policy.py, interval 60 s, on the cluster
  and jobs Sia's run gets (batch sizes adapted by the simulator as for
  Sia). ``cellsched`` is told each job's total work as a user would
  declare it (a multiplicative error, ``--declared-sigma``);
  ``cellsched-unaware`` is told nothing of it;
* ``sia-ours``: the project's re-implementation of Sia (solver/policies/sia.py,
  its defaults: p = 0.5, a fixed restart horizon, no statistical efficiency of
  its own: it is given the same goodput as cellsched) through the same adapter,
  told no sizes: how far our Sia is from theirs on the same jobs.

The artifact needs older libraries than cellsched (numpy 1.23), so each
(workload, policy) runs in a child process of the artifact's environment
(``--venv DIR``, created when absent with the pinned versions of `PINS`);
cellsched's policy runs in a grandchild of this project's interpreter and
answers one JSON request per round over a pipe (benchmarks/sia_policy.py).

Prints one JSON line per (workload, policy): workload, policy, jobs,
avg_jct_h, p99_jct_h (the job at index int(0.99 n) of the sorted JCTs, as
the artifact's utils/print_run_stats.py reports it), makespan_h (last
completion minus first submission), gpu_hours_per_job (GPU time held,
restart stalls included: the simulator's attained service),
restarts_per_job, wall_s; and, for cellsched, the policy's own seconds.
Beside each run's log (``--logs``) it writes the run's jobs (``.jobs.csv``)
and its allocations round by round (``.rounds.jsonl``): two runs compared
model by model with benchmarks/sia_compare.py.

    python benchmarks/sia_artifact.py --artifact DIR --venv /work/sia-venv \\
        --workload DIR/sia-simulator/workloads/saturn/workload-1.csv --policy sia --policy gavel
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: the artifact's environment: Python 3.11 and these, all pinned (what installs from PyPI for
#: CPython 3.11 on x86-64 Linux with numpy 1.23.5: cvxpy 1.4 with CBC through cylp and GLPK
#: through cvxopt; pandas below 2 for DataFrame.append; pymoo 0.4.2.1 for Pollux, whose
#: matplotlib must stay below 3.8 so that numpy stays 1.23.5; psutil for its Gavel)
PINS = (
    "numpy==1.23.5",
    "pandas==1.5.3",
    "scipy==1.10.1",
    "cvxpy==1.4.4",
    "cylp==0.92.3",
    "cvxopt==1.3.2",
    "ecos==2.0.14",
    "osqp==1.1.3",
    "scs==3.3.1",
    "clarabel==0.11.1",
    "pymoo==0.4.2.1",
    "matplotlib==3.7.5",
    "contourpy==1.2.1",
    "autograd==1.9.1",
    "cma==2.7.0",
    "psutil==7.2.2",
)
PYTHON = "python3.11"
POLICIES = ("cellsched", "cellsched-unaware", "sia", "gavel", "pollux", "sia-ours")
#: the policies answered by one of the project's own through the bridge: (its name, told job sizes)
BRIDGED = {"cellsched": ("cellsched", True), "cellsched-unaware": ("cellsched", False), "sia-ours": ("sia", False)}
#: the round interval (s) of each policy, from the artifact's run_experiment.sh (cellsched: Sia's)
INTERVALS = {"sia": 60, "gavel": 360, "pollux": 60, "cellsched": 60, "cellsched-unaware": 60, "sia-ours": 60}
#: the artifact's environment for its solvers: one BLAS thread (its fits ran 3x faster so)
CHILD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class SetupError(RuntimeError):
    """The artifact or its environment is not usable (the message says why)."""


def ensure_venv(venv: Path, python: str = PYTHON, run: Callable[..., Any] = subprocess.run) -> Path:
    """The artifact's environment at `venv`, created when absent (``python -m
    venv``, then ``pip install`` of `PINS`): returns its interpreter. An
    existing one is used when it records the same pins (``cellsched-pins.txt``)."""
    marker = venv / "cellsched-pins.txt"
    interp = venv / "bin" / "python"
    want = "\n".join(PINS) + "\n"
    if interp.exists() and marker.exists() and marker.read_text() == want:
        return interp
    if not interp.exists():
        run([python, "-m", "venv", str(venv)], check=True)
    run([str(interp), "-m", "pip", "install", "--quiet", *PINS], check=True)
    marker.write_text(want)
    return interp


def simulator_dir(artifact: Path) -> Path:
    sim = artifact / "sia-simulator"
    for name in ("cluster.py", "cluster_unaware.py", "sia.py", "gavel.py", "pollux_unaware.py", "simulator_config.py"):
        if not (sim / name).is_file():
            raise SetupError(f"{sim}: no {name} (is --artifact a checkout of siasosp23/artifacts?)")
    return sim


# ---------------------------------------------------------------- the child (artifact's venv)


def p99(values: Sequence[float]) -> float:
    """The artifact's p99: the value at index int(0.99 n) of the sorted values."""
    v = sorted(values)
    return v[min(len(v) - 1, int(0.99 * len(v)))] if v else 0.0


def summarize(jobs: Sequence[Any], policy: str, workload: str) -> dict[str, Any]:
    """The JSON line's measures from the simulator's finished jobs."""
    done = [j for j in jobs if j.completion_time is not None]
    jcts = [j.completion_time - j.submission_time for j in done]
    first = min((j.submission_time for j in jobs), default=0.0)
    last = max((j.completion_time for j in done), default=first)
    n = max(1, len(jobs))
    return {
        "workload": workload,
        "policy": policy,
        "jobs": len(jobs),
        "finished": len(done),
        "avg_jct_h": round(sum(jcts) / max(1, len(jcts)) / 3600, 4),
        "p99_jct_h": round(p99(jcts) / 3600, 4),
        "makespan_h": round((last - first) / 3600, 4),
        "gpu_hours_per_job": round(sum(j.attained_service for j in jobs) / 3600 / n, 4),
        "restarts_per_job": round(sum(j.num_restarts or 0 for j in jobs) / n, 4),
    }


def write_jobs(jobs: Sequence[Any], path: Path) -> None:
    """Each job's submission, completion (empty: unfinished), JCT and restarts,
    beside the run's log: to compare two policies job by job."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["job", "submit_s", "completion_s", "jct_s", "restarts", "gpu_s"])
        for j in jobs:
            end = j.completion_time
            jct = "" if end is None else round(end - j.submission_time, 1)
            out.writerow(
                [
                    j.name,
                    j.submission_time,
                    "" if end is None else end,
                    jct,
                    j.num_restarts or 0,
                    round(j.attained_service, 1),
                ]
            )


def write_rounds(logs: Sequence[Any], gpus: dict[str, int], path: Path) -> None:
    """Each round's allocations, beside the run's log: a first line with the
    GPUs of each type ({"gpus": {type: n}}), then one line per round,
    {"t": s, "jobs": [[job, GPU type, GPUs], ...]} for each unfinished job
    (0 GPUs: waiting); benchmarks/sia_compare.py reads two runs' files."""
    with open(path, "w") as f:
        f.write(json.dumps({"gpus": gpus}) + "\n")
        for rec in logs:
            live = [j for j in rec["submitted_jobs"] if j["completion_time"] is None]
            jobs = [[j["name"], j["cluster"], int(sum(j["placement"]))] for j in live]
            f.write(json.dumps({"t": float(rec["timestamp"]), "jobs": jobs}) + "\n")


def occupancy(logs: Sequence[Any]) -> dict[str, float]:
    """Per round, from the simulator's round logs: GPUs held by unfinished
    jobs and jobs waiting with none (means over the rounds)."""
    busy, waiting = [], []
    for rec in logs:
        live = [j for j in rec["submitted_jobs"] if j["completion_time"] is None]
        busy.append(sum(sum(j["placement"]) for j in live))
        waiting.append(sum(1 for j in live if not sum(j["placement"])))
    n = max(1, len(logs))
    return {"mean_busy_gpus": round(sum(busy) / n, 2), "mean_waiting_jobs": round(sum(waiting) / n, 2)}


def build_cluster(policy: str, workload: Any, opts: dict[str, Any]) -> tuple[Any, Callable[[], None]]:
    """The artifact's cluster and policy for one run, as its multi_simulator.py
    (or multi_simulator_unaware.py for Pollux) sets them up; and what closes
    the policy (cellsched's server) after the run."""
    import simulator_config as cfg  # the artifact's modules: on sys.path in the child

    nnodes = dict(cfg.cluster_nnodes)
    per_node = {k: cfg.cluster_ngpus_per_node[k] for k in nnodes}
    closing: Callable[[], None] = lambda: None  # noqa: E731
    if policy == "pollux":
        from cluster_unaware import ClusterUnaware
        from pollux_unaware import PolluxPolicyUnaware

        max_replicas = min(
            min(
                cfg.cluster_ngpus_per_node[k] * nnodes[k],
                cfg.cluster_ngpus_per_node[k] * cfg.cluster_max_physical_nnodes[k],
            )
            for k in nnodes
        )
        pol = PolluxPolicyUnaware(-1.0)
        return ClusterUnaware(
            workload,
            pol,
            nnodes,
            cfg.cluster_ngpus_per_node,
            max_num_replicas=max_replicas,
            max_physical_nodes=cfg.cluster_max_physical_nnodes,
        ), closing
    from cluster import Cluster

    if policy == "gavel":
        from gavel import GavelPolicy

        pol = GavelPolicy(INTERVALS["gavel"], policy=cfg.gavel_default_policy)
    elif policy == "sia":
        from sia import SiaPolicy

        pol = SiaPolicy(
            p_fairness=-0.5,
            restart_penalty=30,
            lambda_a=0.01,
            lambda_n=1.1,
            project_throughputs=True,
            share_max_replicas=True,
            enable_bsz_tuning=True,
        )
    else:
        sys.path.insert(0, str(HERE))
        import sia_bridge

        scheduler, aware = BRIDGED[policy]
        pol = sia_bridge.make_policy(
            opts["cellsched_python"],
            aware=aware,
            sigma=opts["sigma"],
            seed=opts["seed"],
            sets=opts.get("sets", []),
            scheduler=scheduler,
        )
        closing = pol.close
    pol.populate_valid_configs(nnodes, per_node, cfg.cluster_max_physical_nnodes)
    cluster = Cluster(workload, pol, nnodes, per_node, max_physical_nodes=cfg.cluster_max_physical_nnodes)
    if policy == "gavel":
        cluster.disable_bsz_tuning()
    if policy != "gavel":
        for job in cluster.jobs:
            if job.category == "rigid":
                job.seed_profiles_rigid(per_node)
    if policy in BRIDGED:
        pol.attach(cluster)
    return cluster, closing


def run_one(sim: Path, workload_file: Path, policy: str, opts: dict[str, Any]) -> dict[str, Any]:
    """One (workload, policy) in the artifact's simulator; its measures."""
    import pandas

    sys.path.insert(0, str(sim))
    os.chdir(sim)  # the artifact reads its traces/ relative to its folder
    workload = pandas.read_csv(workload_file)
    if opts.get("limit_jobs"):
        workload = workload.head(opts["limit_jobs"])
    t0 = time.time()
    cluster, close = build_cluster(policy, workload, opts)
    try:
        while not cluster.all_complete():
            cluster.step(INTERVALS[policy])
    finally:
        close()
    out = summarize(cluster.jobs, policy, str(workload_file))
    out["wall_s"] = round(time.time() - t0, 1)
    out["rounds"] = len(cluster.logs)
    out.update(occupancy(cluster.logs))
    write_jobs(cluster.jobs, Path(opts["log"]).with_suffix(".jobs.csv"))
    import simulator_config as cfg  # the artifact's: the cluster's GPUs of each type

    gpus = {k: int(n) * int(cfg.cluster_ngpus_per_node[k]) for k, n in cfg.cluster_nnodes.items()}
    write_rounds(cluster.logs, gpus, Path(opts["log"]).with_suffix(".rounds.jsonl"))
    if policy in BRIDGED:
        out.update(cluster.policy.stats)  # the bridge's own timings
    return out


def child_main(spec: str) -> None:
    """The child: run one (workload, policy), the artifact's prints to a log
    file (it prints every round), the JSON line to our stdout."""
    args = json.loads(spec)
    real = os.dup(1)
    with open(args["log"], "w") as log:
        os.dup2(log.fileno(), 1)
        sys.stdout = os.fdopen(os.dup(1), "w", buffering=1)
        result = run_one(Path(args["sim"]), Path(args["workload"]), args["policy"], args)
    os.write(real, (json.dumps(result) + "\n").encode())


# ---------------------------------------------------------------- the parent (project venv)


def run_child(interp: Path, sim: Path, workload: Path, policy: str, opts: dict[str, Any]) -> dict[str, Any]:
    spec = {"sim": str(sim), "workload": str(workload.resolve()), "policy": policy, **opts}
    spec["log"] = str(Path(opts["logs"]) / f"{workload.parent.name}-{workload.stem}-{policy}.log")
    env = {**os.environ, **CHILD_ENV}
    t0 = time.time()
    proc = subprocess.run(
        [str(interp), str(Path(__file__).resolve()), "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-15:]
        return {
            "workload": str(workload),
            "policy": policy,
            "error": "\n".join(tail),
            "wall_s": round(time.time() - t0, 1),
        }
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--artifact", type=Path, help="a checkout of siasosp23/artifacts (holding sia-simulator/)")
    ap.add_argument("--venv", type=Path, help="the artifact's environment (created with PINS when absent)")
    ap.add_argument("--policy", action="append", choices=POLICIES, help="repeatable (default: all)")
    ap.add_argument("--workload", action="append", type=Path, help="a workload CSV of the artifact (repeatable)")
    ap.add_argument("--limit-jobs", type=int, default=0, help="only the first N jobs of each workload")
    ap.add_argument("--workers", type=int, default=1, help="runs in parallel")
    ap.add_argument(
        "--declared-sigma",
        type=float,
        default=0.5,
        help="cellsched's declared total work = true x exp(N(0, sigma)) per job (0: exact)",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the declaration errors")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        help="KEY=VALUE of cellsched's SolverConfig (repeatable; default: its defaults)",
    )
    ap.add_argument("--logs", type=Path, default=Path("/tmp/sia-artifact-logs"), help="the artifact's own prints")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child_main(args.child)
        return 0
    if args.artifact is None or not args.workload:
        ap.error("--artifact and at least one --workload are needed")
    sim = simulator_dir(args.artifact.resolve())
    interp = ensure_venv((args.venv or args.artifact / ".venv-cellsched").resolve())
    args.logs.mkdir(parents=True, exist_ok=True)
    opts = {
        "limit_jobs": args.limit_jobs,
        "cellsched_python": sys.executable,
        "sigma": args.declared_sigma,
        "seed": args.seed,
        "logs": str(args.logs),
        "sets": args.set,
    }
    runs = [(w, p) for w in args.workload for p in (args.policy or POLICIES)]
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max(1, args.workers)) as pool:
        futures = [pool.submit(run_child, interp, sim, w, p, opts) for w, p in runs]
        for fut in futures:
            line = fut.result()
            failed += "error" in line
            print(json.dumps(line), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
