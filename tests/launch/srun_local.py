"""Run a command the way ``srun`` would: N local processes with SLURM_* set.

Tasks are spread over emulated nodes in blocks (srun's default), and every
task runs through the real launcher: ``python -m launch -- CMD``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from support import wait_for

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Task:
    rank: int
    returncode: int
    stdout: str
    stderr: str


def task_envs(ntasks: int, nnodes: int = 1, job_id: str = "4242", step_id: str = "0") -> list[dict[str, str]]:
    """The SLURM_* variables of each task of a step (block distribution)."""
    per_node = [ntasks // nnodes + (1 if i < ntasks % nnodes else 0) for i in range(nnodes)]
    nodelist = f"n[1-{nnodes}]" if nnodes > 1 else "n1"
    tpn = ",".join(f"{c}(x{per_node.count(c)})" if per_node.count(c) > 1 else str(c) for c in dict.fromkeys(per_node))
    envs, rank = [], 0
    for node, count in enumerate(per_node):
        for local in range(count):
            envs.append(
                {
                    "SLURM_JOB_ID": job_id,
                    "SLURM_STEP_ID": step_id,
                    "SLURM_PROCID": str(rank),
                    "SLURM_LOCALID": str(local),
                    "SLURM_NTASKS": str(ntasks),
                    "SLURM_NNODES": str(nnodes),
                    "SLURM_NODEID": str(node),
                    "SLURM_JOB_NODELIST": nodelist,
                    "SLURM_STEP_NODELIST": nodelist,
                    "SLURM_TASKS_PER_NODE": tpn,
                    "SLURM_STEP_TASKS_PER_NODE": tpn,
                }
            )
            rank += 1
    return envs


def start(
    cmd: list[str], ntasks: int, nnodes: int = 1, env: dict[str, str] | None = None, **kw
) -> list[subprocess.Popen]:
    """Start every task of the step; each is ``python -m launch -- CMD``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CELLSCHED_"))}
    base.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **(env or {})})
    procs = []
    for task in task_envs(ntasks, nnodes, **kw):
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "launch", "--", *cmd],
                env={**base, **task},
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def wait(procs: list[subprocess.Popen], timeout: float = 300) -> list[Task]:
    """Wait for every task; kill the rest if one runs past TIMEOUT."""
    out = []
    try:
        for rank, p in enumerate(procs):
            stdout, stderr = p.communicate(timeout=timeout)
            out.append(Task(rank, p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return out


def srun(
    cmd: list[str], ntasks: int, nnodes: int = 1, env: dict[str, str] | None = None, timeout: float = 300, **kw
) -> list[Task]:
    return wait(start(cmd, ntasks, nnodes, env, **kw), timeout)


def wait_for_pid(path: Path, procs: list[subprocess.Popen], timeout: float = 60) -> int:
    """The pid a child wrote to PATH once it was ready. The file can exist
    before its writer has written it, so this waits for a whole number."""

    def pid() -> int | None:
        text = path.read_text() if path.exists() else ""
        if text.strip().isdigit():
            return int(text)
        assert all(p.poll() is None for p in procs), "the script died"
        return None

    return wait_for(pid, timeout=timeout, interval=0.01, what=f"a pid in {path}")
