"""What `cellsched-launch` adds to a task's start-up.

Times, alternating so load drifts hit all alike, N runs each of::

    python -c pass                          (bare interpreter)
    cellsched-launch -- python -c pass      (launcher, then exec)
    python -c "import torch"                (what any training task pays anyway)

with the SLURM_* variables of one task of a 2-node step and an inline plan
(no scontrol). Prints one JSON line per command (median, p90 seconds) and a
summary line with the launcher's overhead; the target is an overhead well
under 1 s, i.e. the launcher costs less than the torch import it precedes.

    python benchmarks/launcher_overhead.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

PLAN = {"pp": 2, "dp": 2, "tp": 2, "micro_batches": 4}
TASK = {
    "SLURM_JOB_ID": "7",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "8",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "CELLSCHED_PLAN": json.dumps(PLAN),
    "CELLSCHED_MASTER_ADDR": "127.0.0.1",
}


def commands() -> dict[str, list[str]]:
    py = sys.executable
    launcher = shutil.which("cellsched-launch")
    launch = [launcher] if launcher else [py, "-m", "launch"]
    return {
        "python": [py, "-c", "pass"],
        "launch+python": [*launch, "--", py, "-c", "pass"],
        "python+torch": [py, "-c", "import torch"],
    }


def run_once(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, timeout=120, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CELLSCHED_"))} | TASK
    cmds = commands()
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for cmd in cmds.values():  # warm the page cache
        run_once(cmd, env)
    for _ in range(args.repeat):
        for name, cmd in cmds.items():
            times[name].append(run_once(cmd, env))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, ts in times.items():
        p90 = sorted(ts)[max(0, int(round(0.9 * len(ts))) - 1)]
        print(
            json.dumps(
                {
                    "command": " ".join(cmds[name]),
                    "name": name,
                    "runs": len(ts),
                    "median_s": round(med[name], 4),
                    "p90_s": round(p90, 4),
                }
            )
        )
    overhead = med["launch+python"] - med["python"]
    print(
        json.dumps(
            {
                "summary": "launcher overhead",
                "overhead_s": round(overhead, 4),
                "torch_import_s": round(med["python+torch"] - med["python"], 4),
                "target_s": 1.0,
                "ok": overhead < 1.0,
            }
        )
    )
    return 0 if overhead < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
