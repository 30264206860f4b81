"""Helpers shared by the test suites (importable as `support`; pytest puts
tests/ on sys.path): the dev cluster handle, polling, and building the package."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import math
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from slurm_ext.backends.base import SlurmUnavailable
from slurm_ext.backends.cli import UNREACHABLE
from solver.estimator import EstimatorBase
from solver.types import Estimate, ParallelPlan

ROOT = Path(__file__).resolve().parents[1]
DEVCLUSTER = ROOT / "contrib" / "dev-cluster" / "devcluster.sh"
SHAPE = ROOT / "contrib" / "dev-cluster" / "cluster.conf"
#: the admin files (`cellsched admin files`): package data of slurm_ext
ADMIN = ROOT / "slurm_ext" / "admin"
#: the pytest-xdist worker this process is (gw0, gw1, ...; 0 without xdist)
WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
#: where the session's test cluster lives: one per xdist worker (its own LAB
#: and ports: two clusters run side by side); CELLSCHED_TEST_LAB /
#: _CTLD_PORT / _SLURMD_BASEPORT move worker 0's, so that two test runs can
#: share a machine
TEST_CLUSTER_ENV = {
    "LAB": os.environ.get("CELLSCHED_TEST_LAB", "/tmp/cellsched-test-cluster") + (f"-gw{WORKER}" if WORKER else ""),
    "CTLD_PORT": str(int(os.environ.get("CELLSCHED_TEST_CTLD_PORT", "16817")) + 200 * WORKER),
    "SLURMD_BASEPORT": str(int(os.environ.get("CELLSCHED_TEST_SLURMD_BASEPORT", "16900")) + 200 * WORKER),
}

#: ports `free_port` hands out: below the kernel's ephemeral range (where
#: gloo's own listeners and every outgoing connection take theirs, so a port
#: found free there can be gone a moment later), below the test clusters'
#: ports (12817 and up) and the launcher's default range (20000-32767), one
#: slice per xdist worker
FREE_PORTS = range(10000, 12800)
_SLICE = len(FREE_PORTS) // 8
_next_port = itertools.count(FREE_PORTS.start + _SLICE * (WORKER % 8) + os.getpid() % _SLICE)


def free_port() -> int:
    """A TCP port nobody listens on now and this worker has not handed out
    before (for MASTER_PORT and init_method): the next one of its slice that binds."""
    base = FREE_PORTS.start + _SLICE * (WORKER % 8)
    for _ in range(_SLICE):
        port = base + (next(_next_port) - base) % _SLICE
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {base}-{base + _SLICE - 1}")


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

    @contextlib.contextmanager
    def running(self, what: str = "the Slurm dev cluster") -> Iterator[DevCluster]:
        """Start it (`up`; the test fails with its stderr when it does not
        start), point SLURM_CONF at it, and take both back (`down`, the
        previous SLURM_CONF) at the end."""
        started = self.devcluster("up", timeout=300)
        if started.returncode != 0:
            self.devcluster("down")
            pytest.fail(
                f"{what} did not start (devcluster.sh up, exit {started.returncode}):\n{started.stderr[-4000:]}",
                pytrace=False,
            )
        previous = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(self.conf)
        try:
            yield self
        finally:
            self.devcluster("down")
            if previous is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = previous


def cluster_of(env: Mapping[str, str], shape: str) -> DevCluster:
    """The dev cluster that `env` (LAB and the devcluster.sh settings, with this
    process's environment) describes, of the inline `shape` ("n1:a40:2,n2:a100:4")."""
    full = {k: v for k, v in os.environ.items() if k != "JOB_SUBMIT_LUA"}
    full.update(env)
    lab = Path(full["LAB"])
    nodes = {n: (t, int(g)) for n, t, g in (x.split(":") for x in shape.split(","))}
    return DevCluster(lab=lab, conf=lab / "etc" / "slurm.conf", shape=nodes, env=full)


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
    """Poll `predicate` until it returns something truthy; return that. A
    slurmctld too loaded to answer one poll in time (SlurmUnavailable) is
    not the event waited for, nor its absence: the poll is made again until
    the deadline (the last such error is named if it comes)."""
    deadline = time.monotonic() + timeout
    missed: SlurmUnavailable | None = None
    while True:
        try:
            value = predicate()
        except SlurmUnavailable as exc:
            value, missed = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            last = f" (the last poll: {missed})" if missed is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{last}")
        time.sleep(interval)


def slurm(*argv: str, env: Mapping[str, str] | None = None, timeout: float = 30, attempts: int = 5) -> str:
    """Run a Slurm client command; its stdout. A call slurmctld did not take
    (the client killed by a signal, as scontrol is by SIGPIPE when a loaded
    slurmctld closes its connection, or one that reports a lost connection) is
    made again, up to `attempts` times in all; any other failure is an
    AssertionError naming the command."""
    for attempt in range(1, attempts + 1):
        done = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode == 0:
            return done.stdout
        if attempt == attempts or not (done.returncode < 0 or any(s in done.stderr for s in UNREACHABLE)):
            break
        time.sleep(0.5 * attempt)
    raise AssertionError(f"{shlex.join(argv)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")


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


#: what a copy of the source tree for a build leaves out: VCS, environments, caches, earlier builds
BUILD_IGNORE = (
    ".git",
    ".venv",
    "__pycache__",
    "*.egg-info",
    "build",
    "dist",
    ".pytest_cache",
    ".hypothesis",
    ".ruff_cache",
    "*.sqlite",
)


@dataclass(frozen=True)
class Dist:
    """What `python -m build` made: the sdist, the wheel built from it, and its log."""

    sdist: Path
    wheel: Path
    log: str


def build_dist(workdir: Path) -> Dist:
    """`python -m build` (isolated: setuptools comes from pip) of a copy of the
    source tree, so that nothing is written into the checkout. Skips when pip
    cannot install the build requirements (no index, no cache); fails on any
    other error."""
    for tool in ("build", "twine"):
        if importlib.util.find_spec(tool) is None:
            pytest.fail(f"the {tool!r} package is missing (part of the test extra: pip install -e '.[test]')")
    src, out = workdir / "src", workdir / "dist"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*BUILD_IGNORE), symlinks=True)
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    log = proc.stdout + proc.stderr
    if proc.returncode != 0 and "build-requirements" in log:
        pytest.skip(f"pip could not install the build requirements (no package index or cache?): {log[-500:]}")
    assert proc.returncode == 0, f"python -m build failed:\n{log[-4000:]}"
    sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(out.iterdir())
    return Dist(sdists[0], wheels[0], log)


class UnitSpeed(EstimatorBase):
    """One iteration a second on any cell of one stage, truth and estimate alike
    (simulator tests where speed is not the subject)."""

    def speed(self, spec, gpu_type, num_nodes, gpus_per_node, plan) -> float:
        return 1.0

    def estimate(self, job, cell) -> Estimate:
        if cell.pp != 1:
            return Estimate(cell, None, math.inf, 0.0, "none")
        return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), 1.0, 1.0, "measured")
