"""Backends: the one protocol through which cellsched talks to Slurm.

``get_backend("cli" | "pyslurm" | "auto", **opts)``; "auto" takes pyslurm
when it imports and was built for the running Slurm's major.minor, else the
CLI. Asking for "pyslurm" without it raises solver.contract.extras.MissingExtra.

Further backends (the simulated cluster, ``sim``) are declared by the
package that holds them in the ``cellsched.backends`` entry-point group
(pyproject.toml), as ``name = "module:factory"``, and imported only when
asked for by name; this module names none of them.
"""

from __future__ import annotations

import importlib
import subprocess
from collections.abc import Callable
from importlib.metadata import entry_points
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


#: name -> factory(**opts): the backends of a real Slurm
BACKENDS: dict[str, Callable[..., Backend]] = {"cli": _cli, "pyslurm": _pyslurm}
#: the entry-point group in which other packages declare backends
ENTRY_POINTS = "cellsched.backends"


def plugin_backends() -> dict[str, str]:
    """name -> "module:factory" of the backends declared in ENTRY_POINTS."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINTS)}


def _factory(name: str) -> Callable[..., Backend]:
    """The factory of backend `name`: BACKENDS', else the declared one's (imported now)."""
    if name in BACKENDS:
        return BACKENDS[name]
    target = plugin_backends().get(name)
    if target is None:
        known = ", ".join(sorted(set(BACKENDS) | set(plugin_backends())))
        raise ValueError(f"unknown backend {name!r}; choose one of: auto, {known}")
    module, attr = target.split(":")
    factory: Callable[..., Backend] = getattr(importlib.import_module(module), attr)
    return factory


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
    """A backend by name: "cli", "pyslurm", "auto", or one declared in ENTRY_POINTS ("sim").

    `opts` go to the backend's constructor (for "cli": timeout,
    ping_timeout, mode, slurm_conf, run).
    """
    if name == "auto":
        name = "pyslurm" if pyslurm_matches() else "cli"
        if name == "pyslurm":
            opts = {}  # CLI-only options do not apply
    return _factory(name)(**opts)


__all__ = [
    "ALL",
    "BATCH",
    "JOB_FAILURES",
    "STEPS",
    "check_signal_target",
    "BACKENDS",
    "ENTRY_POINTS",
    "Backend",
    "JobUpdate",
    "SlurmCommandError",
    "SlurmError",
    "SlurmUnavailable",
    "SubmitRequest",
    "UpdateNotApplied",
    "get_backend",
    "plugin_backends",
]
