"""Backends: the one protocol through which cellsched talks to Slurm.

``get_backend("cli" | "pyslurm" | "auto", **opts)``; "auto" takes pyslurm
when it imports and was built for the running Slurm's major.minor, else the
CLI. Asking for "pyslurm" without it raises solver.contract.extras.MissingExtra.
Further backends (the simulated cluster) register in BACKENDS.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

from slurm_ext.backends.base import (
    ALL,
    BATCH,
    JOB_FAILURES,
    STEPS,
    Backend,
    JobUpdate,
    SlurmCommandError,
    SlurmError,
    SlurmUnavailable,
    SubmitRequest,
    UpdateNotApplied,
    check_signal_target,
)


def _cli(**opts: Any) -> Backend:
    from slurm_ext.backends.cli import CliBackend

    return CliBackend(**opts)


def _pyslurm(**opts: Any) -> Backend:
    from slurm_ext.backends.pyslurm_backend import PyslurmBackend

    return PyslurmBackend(**opts)


def _sim(**opts: Any) -> Backend:
    """The simulated Slurm (slurm_ext.sim.backend.SimBackend); `cluster` (a
    ClusterSpec) defaults to Arena's simulated cluster."""
    from slurm_ext.sim.backend import SimBackend

    cluster = opts.pop("cluster", None)
    if cluster is None:
        from slurm_ext.sim.clusterspec import arena_cluster

        cluster = arena_cluster()
    return SimBackend(cluster, **opts)


#: name -> factory(**opts)
BACKENDS: dict[str, Callable[..., Backend]] = {"cli": _cli, "pyslurm": _pyslurm, "sim": _sim}


def running_slurm_version(timeout: float = 5.0) -> tuple[int, int] | None:
    """(major, minor) of the installed Slurm commands, None if unknown."""
    from slurm_ext.backends.cli import slurm_version

    try:
        out = subprocess.run(
            ["sinfo", "--version"], capture_output=True, text=True, timeout=timeout, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return slurm_version(out)


def pyslurm_matches() -> bool:
    """pyslurm imports and was built for the running Slurm's major.minor."""
    from slurm_ext.backends.pyslurm_backend import import_pyslurm, pyslurm_version

    try:
        module = import_pyslurm()
    except ImportError:  # MissingExtra: not installed, or built for another Slurm
        return False
    mine = pyslurm_version(module)
    return mine is not None and mine == running_slurm_version()


def get_backend(name: str = "auto", **opts: Any) -> Backend:
    """A backend by name: "cli", "pyslurm", "auto" (or one registered later).

    `opts` go to the backend's constructor (for "cli": timeout,
    ping_timeout, mode, slurm_conf, run).
    """
    if name == "auto":
        name = "pyslurm" if pyslurm_matches() else "cli"
        if name == "pyslurm":
            opts = {}  # CLI-only options do not apply
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of: auto, {', '.join(sorted(BACKENDS))}")
    return BACKENDS[name](**opts)


__all__ = [
    "ALL",
    "BATCH",
    "JOB_FAILURES",
    "STEPS",
    "check_signal_target",
    "BACKENDS",
    "Backend",
    "JobUpdate",
    "SlurmCommandError",
    "SlurmError",
    "SlurmUnavailable",
    "SubmitRequest",
    "UpdateNotApplied",
    "get_backend",
]
