"""Run every rank of a plan on this machine as one node of a Slurm step would
start them (the step's SLURM_* variables, a rank per process), through the
launcher (`python -m launch`): for the benchmarks that time real steps
(estimator_accuracy.py, mixed_real.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_step(
    plan: dict,
    worker: Sequence[str],
    *,
    pythonpath: Sequence[Path],
    timeout: float,
    rank_env: Callable[[int], Mapping[str, str]] = lambda r: {},
) -> list[dict]:
    """Start `python -m launch -- python WORKER...` once per rank of `plan`
    (pp x dp x tp), rank r with `rank_env(r)` besides the step's variables;
    each rank's last line on stdout, a JSON object, in rank order. A rank
    that exits non-zero raises RuntimeError with its stderr; every rank is
    killed after `timeout` s."""
    n = plan.get("pp", 1) * plan.get("dp", 1) * plan.get("tp", 1)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CELLSCHED_"))}
    base.update(
        {
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath),
            "CELLSCHED_PLAN": json.dumps(plan),
            "CELLSCHED_MASTER_PORT": str(free_port()),
        }
    )
    step = {
        "SLURM_JOB_ID": "1",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": str(n),
        "SLURM_NNODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_TASKS_PER_NODE": str(n),
    }
    cmd = [sys.executable, "-m", "launch", "--", sys.executable, *worker]
    procs = [
        subprocess.Popen(
            cmd,
            env={**base, **step, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r), **rank_env(r)},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(n)
    ]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    bad = [(r, p.returncode, outs[r][1]) for r, p in enumerate(procs) if p.returncode != 0]
    if bad:
        raise RuntimeError(f"plan {plan}: rank {bad[0][0]} exited {bad[0][1]}:\n{bad[0][2][-2000:]}")
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
