"""The part of a Slurm step's environment the launcher needs, as a typed value.

srun sets SLURM_* variables in every task; ``SlurmEnv.from_environ`` reads
them once (step values before job values) and expands the compressed forms:
host lists such as ``gpu-[01-03],cpu1`` and task counts such as ``4(x2),2``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from launch.errors import LauncherError
from solver.contract import hostlist


class SlurmEnvError(ValueError, LauncherError):
    """A SLURM_* variable is missing or malformed."""


@dataclass(frozen=True)
class SlurmEnv:
    """One task of a Slurm job step."""

    job_id: str
    step_id: str
    procid: int
    localid: int
    ntasks: int
    nnodes: int
    nodeid: int
    nodelist: tuple[str, ...]
    tasks_per_node: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 0 <= self.procid < self.ntasks:
            raise SlurmEnvError(f"SLURM_PROCID={self.procid} is outside 0..{self.ntasks - 1}")
        if len(self.nodelist) != self.nnodes:
            raise SlurmEnvError(f"node list has {len(self.nodelist)} nodes but SLURM_NNODES={self.nnodes}")
        if len(self.tasks_per_node) != self.nnodes or sum(self.tasks_per_node) != self.ntasks:
            raise SlurmEnvError(
                f"tasks per node {list(self.tasks_per_node)} do not add up to {self.ntasks} tasks "
                f"on {self.nnodes} nodes"
            )
        if not 0 <= self.nodeid < self.nnodes:
            raise SlurmEnvError(f"SLURM_NODEID={self.nodeid} is outside 0..{self.nnodes - 1}")
        if not 0 <= self.localid < self.tasks_per_node[self.nodeid]:
            raise SlurmEnvError(f"SLURM_LOCALID={self.localid} is outside the {self.local_ntasks} tasks of this node")

    @property
    def local_ntasks(self) -> int:
        """Tasks of this step on this node."""
        return self.tasks_per_node[self.nodeid]

    @property
    def head_node(self) -> str:
        """The step's first node (where rank 0 runs with block distribution)."""
        return self.nodelist[0]

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> SlurmEnv:
        env = os.environ if env is None else env

        def first(*names: str) -> str:
            for n in names:
                if env.get(n, "").strip():
                    return env[n].strip()
            raise SlurmEnvError(f"{names[0]} is not set (not inside an srun step?)")

        def integer(*names: str) -> int:
            text = first(*names)
            try:
                return int(text)
            except ValueError:
                raise SlurmEnvError(f"{names[0]}={text!r} is not an integer") from None

        return cls(
            job_id=first("SLURM_JOB_ID", "SLURM_JOBID"),
            step_id=first("SLURM_STEP_ID", "SLURM_STEPID"),
            procid=integer("SLURM_PROCID"),
            localid=integer("SLURM_LOCALID"),
            ntasks=integer("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
            nnodes=integer("SLURM_STEP_NUM_NODES", "SLURM_NNODES"),
            nodeid=integer("SLURM_NODEID"),
            nodelist=expand_hostlist(first("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")),
            tasks_per_node=expand_tasks_per_node(first("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")),
        )


_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def expand_hostlist(text: str) -> tuple[str, ...]:
    """``"n[1-3,5],gpu-[08-10]"`` -> ``("n1", "n2", "n3", "n5", "gpu-08", "gpu-09", "gpu-10")``."""
    try:
        return hostlist.expand_hostlist(text)
    except hostlist.HostlistError as exc:
        raise SlurmEnvError(f"host list {text!r}: {exc}") from None


def expand_tasks_per_node(text: str) -> tuple[int, ...]:
    """``"4(x2),2"`` -> ``(4, 4, 2)``."""
    counts: list[int] = []
    for part in text.strip().split(","):
        m = _TASKS.match(part.strip())
        if not m:
            raise SlurmEnvError(f"tasks per node {text!r} has a bad entry {part!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return tuple(counts)
