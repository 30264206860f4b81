"""Run the reference trainer across emulated srun steps and read its results."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from srun_local import Task, srun
from support import free_port

TRAIN = "contrib/examples/train_gpt.py"


@dataclass(frozen=True)
class Run:
    losses: list[float]  #: the whole loss sequence rank 0 wrote to --out
    printed: list[int]  #: steps rank 0 printed (a resumed run prints only its own)


def train(plan: dict, out: Path, steps: int, *flags: str, timeout: float = 300) -> Run:
    """Train under PLAN on pp*dp*tp local tasks."""
    n = plan.get("pp", 1) * plan.get("dp", 1) * plan.get("tp", 1)
    tasks = srun(
        [sys.executable, TRAIN, "--steps", str(steps), "--out", str(out), *flags],
        n,
        env={"CELLSCHED_PLAN": json.dumps(plan), "CELLSCHED_MASTER_PORT": str(free_port())},
        timeout=timeout,
    )
    check(tasks)
    printed = [json.loads(line)["step"] for line in tasks[0].stdout.splitlines()]
    return Run(json.loads(out.read_text())["losses"], printed)


def check(tasks: list[Task], expect: int = 0) -> None:
    bad = [t for t in tasks if t.returncode != expect]
    assert not bad, f"rank {bad[0].rank} exited {bad[0].returncode}:\n{bad[0].stderr[-3000:]}"


def checkpoint_state(directory: Path) -> dict:
    step = int((directory / "LATEST").read_text())
    return torch.load(directory / f"step-{step:08d}.pt", weights_only=True)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))
