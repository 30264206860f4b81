"""Helpers shared by the test suites (importable as `support`; pytest puts
tests/ on sys.path): the dev cluster handle and polling."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEVCLUSTER = ROOT / "contrib" / "dev-cluster" / "devcluster.sh"
SHAPE = ROOT / "contrib" / "dev-cluster" / "cluster.conf"
#: where the shared test cluster lives; CELLSCHED_TEST_LAB / _CTLD_PORT /
#: _SLURMD_BASEPORT override it so that two test runs can share a machine
TEST_CLUSTER_ENV = {
    "LAB": os.environ.get("CELLSCHED_TEST_LAB", "/tmp/cellsched-test-cluster"),
    "CTLD_PORT": os.environ.get("CELLSCHED_TEST_CTLD_PORT", "16817"),
    "SLURMD_BASEPORT": os.environ.get("CELLSCHED_TEST_SLURMD_BASEPORT", "16900"),
}


@dataclass(frozen=True)
class DevCluster:
    """A running dev cluster: where it lives and its shape
    (node -> (gpu type, gpus)), read from the shape file it was started with."""

    lab: Path
    conf: Path
    shape: dict[str, tuple[str, int]]
    env: dict[str, str] = field(repr=False)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self.shape)

    def devcluster(self, command: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        """Run `devcluster.sh <command>` for this cluster."""
        return subprocess.run(
            ["bash", str(DEVCLUSTER), command],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def read_shape(path: Path) -> dict[str, tuple[str, int]]:
    shape = {}
    for line in path.read_text().splitlines():
        parts = line.split("#", 1)[0].split()
        if parts:
            shape[parts[0]] = (parts[1], int(parts[2]))
    return shape


def wait_for(
    predicate: Callable[[], Any], *, timeout: float = 20.0, interval: float = 0.2, what: str = "a condition"
) -> Any:
    """Poll `predicate` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def console_script(name: str = "cellsched") -> str:
    """The installed console script `name`: next to this interpreter (the venv's
    bin/, whether or not it is on PATH), else on PATH. Fails, never skips, when
    it is not installed."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if os.access(beside, os.X_OK) else shutil.which(name)
    if found is None:
        raise AssertionError(
            f"the {name} console script is not installed next to {sys.executable} nor on PATH "
            f"(pip install -e . in the venv that runs pytest)"
        )
    return found
