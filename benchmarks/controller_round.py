"""One in-process `Controller.round()` on the real dev cluster with many pending jobs.

    python benchmarks/controller_round.py [--jobs 50] [--rounds 3]

Starts its own dev cluster (LAB=/tmp/cellsched-bench; --use-running to take
the one $SLURM_CONF points at), submits `--jobs` held managed jobs of mixed
models, builds one Controller in this process, then runs a dry-run round
(plan only) and `--rounds` real rounds (the first places what fits),
printing one JSON line per round with its phases: observe_s, solve_s,
apply_s, total_s (the round's own timings). Target: total_s < 2 s.

This is a round of the daemon (`cellsched controller run`): it leaves out
interpreter start-up, imports, config loading and building the Controller,
and the dry run warms the estimator's caches. `controller run --once` pays
all of these on top (a new process per round).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_ext.backends import SubmitRequest, get_backend  # noqa: E402
from slurm_ext.config import Config, ControllerConfig, MetricsConfig  # noqa: E402
from slurm_ext.controller.round import Controller  # noqa: E402
from slurm_ext.jobspec import JobSpec  # noqa: E402
from solver.types import SolverConfig  # noqa: E402

DEVCLUSTER = ROOT / "contrib" / "dev-cluster" / "devcluster.sh"
CLUSTER_ENV = {"LAB": "/tmp/cellsched-bench", "CTLD_PORT": "15417", "SLURMD_BASEPORT": "15500"}
MODELS = ("gpt-125m", "gpt-350m", "gpt-1.3b", "bert__760M", "bert__1.3B", "moe__690M", "wide_resnet__500M", "gpt-2.7b")


def devcluster(command: str) -> None:
    env = {**os.environ, **CLUSTER_ENV}
    subprocess.run(["bash", str(DEVCLUSTER), command], env=env, check=True, capture_output=True, timeout=300)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--use-running", action="store_true", help="use the cluster $SLURM_CONF points at")
    args = ap.parse_args()
    if not args.use_running:
        devcluster("up")
        os.environ["SLURM_CONF"] = f"{CLUSTER_ENV['LAB']}/etc/slurm.conf"
    backend = get_backend("cli")
    ids: list[str] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "job.sh"
            script.write_text("#!/bin/bash\nsleep 30\n")
            t0 = time.perf_counter()
            for k in range(args.jobs):
                spec = JobSpec(model=MODELS[k % len(MODELS)], global_batch=(16, 32, 64, 128)[k % 4], iterations=1000)
                ids.append(
                    backend.submit(
                        SubmitRequest(
                            script=str(script),
                            hold=True,
                            gres_per_node=1,
                            comment=spec.to_comment(),
                            output="/dev/null",
                            job_name=f"bench{k}",
                        )
                    )
                )
            print(json.dumps({"submitted": len(ids), "submit_s": round(time.perf_counter() - t0, 3)}), flush=True)
            config = Config(
                controller=ControllerConfig(state_path=f"{tmp}/state.sqlite", kick_file="", checkpoint_root=tmp),
                solver=SolverConfig(allow_resize=False),
                metrics=MetricsConfig(port=0),
            )
            ctl = Controller(config)
            for k in range(-1, args.rounds):
                r = ctl.round(dry_run=k < 0)
                print(
                    json.dumps(
                        {
                            "round": "dry-run" if k < 0 else k + 1,
                            "status": r.status,
                            "jobs": r.num_jobs,
                            "actions": len(r.actions),
                            "solver": r.solver_status,
                            **{f: round(getattr(r, f), 3) for f in ("observe_s", "solve_s", "apply_s", "total_s")},
                        }
                    ),
                    flush=True,
                )
                if r.status != "ok":
                    print(r.error, file=sys.stderr)
                    return 1
            ctl.state.close()
    finally:
        for i in ids:
            try:
                backend.cancel(i)
            except Exception:
                pass
        if not args.use_running:
            devcluster("down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
