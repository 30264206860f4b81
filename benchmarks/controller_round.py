"""One in-process `Controller.round()` on the real dev cluster with many pending jobs.

    python benchmarks/controller_round.py [--nodes 96 | --shape SHAPE] [--jobs 300] [--rounds 2] [--workers 1,4,8]

Starts its own dev cluster (LAB=/tmp/cellsched-bench, `--nodes` nodes that
cycle through a100 x4, a40 x2, v100 x8, a10 x2; --use-running to take the
one $SLURM_CONF points at instead), then for each `--workers` value (the
cli backend's concurrent ``scontrol`` update calls; a fresh cluster each):
submits `--jobs` held
managed jobs of mixed models, builds one Controller in this process, runs a
dry-run round (plan only; it warms the estimator's caches) and `--rounds`
real rounds (the first places what fits), and cancels the jobs. One JSON
line per round: its phases (observe_s, solve_s, apply_s, total_s: the
round's own timings), the actions and actions_per_s (actions / apply_s).
Target (issue: the controller at cluster scale): 300 jobs on 96 nodes in at
most 3 s total.

This is a round of the daemon (`cellsched controller run`): it leaves out
interpreter start-up, imports, config loading and building the Controller.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurm_ext.backends import SubmitRequest, get_backend
from slurm_ext.config import Config, ControllerConfig, MetricsConfig
from slurm_ext.controller.round import Controller
from solver.contract.jobspec import JobSpec
from solver.types import SolverConfig

ROOT = Path(__file__).resolve().parents[1]

DEVCLUSTER = ROOT / "contrib" / "dev-cluster" / "devcluster.sh"
CLUSTER_ENV = {"LAB": "/tmp/cellsched-bench", "CTLD_PORT": "15417", "SLURMD_BASEPORT": "15500"}
MODELS = ("gpt-125m", "gpt-350m", "gpt-1.3b", "bert__760M", "bert__1.3B", "moe__690M", "wide_resnet__500M", "gpt-2.7b")
NODE_TYPES = (("a100", 4), ("a40", 2), ("v100", 8), ("a10", 2))


def devcluster(command: str, env: dict[str, str]) -> None:
    subprocess.run(
        ["bash", str(DEVCLUSTER), command], env={**os.environ, **env}, check=True, capture_output=True, timeout=600
    )


def shape(nodes: int) -> str:
    """A dev-cluster shape of `nodes` nodes cycling through NODE_TYPES."""
    return ",".join(f"b{i + 1}:{t}:{g}" for i, (t, g) in ((i, NODE_TYPES[i % len(NODE_TYPES)]) for i in range(nodes)))


def submit(backend, script: Path, jobs: int) -> list[str]:
    ids = []
    for k in range(jobs):
        spec = JobSpec(model=MODELS[k % len(MODELS)], global_batch=(16, 32, 64, 128)[k % 4], iterations=1000)
        req = SubmitRequest(
            script=str(script),
            hold=True,
            gres_per_node=1,
            comment=spec.to_comment(),
            output="/dev/null",
            job_name=f"bench{k}",
        )
        ids.append(backend.submit(req))
    return ids


def drain(backend, ids: list[str]) -> None:
    """Cancel the jobs and wait until none holds a node."""
    for i in ids:
        try:
            backend.cancel(i)
        except Exception:
            pass
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and any(j.holds_resources for j in backend.observe().jobs if j.job_id in ids):
        time.sleep(0.5)


def rounds(args: argparse.Namespace, workers: int) -> int:
    backend = get_backend("cli")
    ids: list[str] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "job.sh"
            script.write_text("#!/bin/bash\nsleep 30\n")
            t0 = time.perf_counter()
            ids = submit(backend, script, args.jobs)
            print(json.dumps({"submitted": len(ids), "submit_s": round(time.perf_counter() - t0, 3)}), flush=True)
            config = Config(
                controller=ControllerConfig(
                    state_path=f"{tmp}/state.sqlite",
                    profiles_path=f"{tmp}/profiles.sqlite",
                    kick_file="",
                    checkpoint_root=tmp,
                    slurm_workers=workers,
                ),
                solver=SolverConfig(allow_resize=False),
                metrics=MetricsConfig(port=0),
            )
            ctl = Controller(config)
            nodes = len(ctl.backend.observe().nodes)
            for k in range(-1, args.rounds):
                r = ctl.round(dry_run=k < 0)
                print(
                    json.dumps(
                        {
                            "nodes": nodes,
                            "workers": workers,
                            "round": "dry-run" if k < 0 else k + 1,
                            "status": r.status,
                            "jobs": r.num_jobs,
                            "actions": len(r.actions),
                            "solver": r.solver_status,
                            **{f: round(getattr(r, f), 3) for f in ("observe_s", "solve_s", "apply_s", "total_s")},
                            "actions_per_s": round(len(r.actions) / r.apply_s, 1) if k >= 0 and r.apply_s else None,
                        }
                    ),
                    flush=True,
                )
                if r.status != "ok":
                    print(r.error, file=sys.stderr)
                    return 1
            ctl.state.close()
    finally:
        drain(backend, ids)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=96, help="nodes of the cluster this starts")
    ap.add_argument("--shape", help="the cluster's shape instead (a DEVCLUSTER_SHAPE: a file, or 'n1:a100:4,...')")
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", default="8", help="comma-separated: concurrent scontrol updates, one run each")
    ap.add_argument("--lab", default=CLUSTER_ENV["LAB"], help="where the cluster this starts lives")
    ap.add_argument("--use-running", action="store_true", help="use the cluster $SLURM_CONF points at")
    args = ap.parse_args()
    env = {**CLUSTER_ENV, "LAB": args.lab, "DEVCLUSTER_SHAPE": args.shape or shape(args.nodes)}
    worst = 0
    for w in args.workers.split(","):
        if not args.use_running:  # a fresh cluster for each run: no jobs of the run before in its queue
            devcluster("up", env)
            os.environ["SLURM_CONF"] = f"{args.lab}/etc/slurm.conf"
        try:
            worst = max(worst, rounds(args, int(w)))
        finally:
            if not args.use_running:
                devcluster("down", env)
    return worst


if __name__ == "__main__":
    sys.exit(main())
