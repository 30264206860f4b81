"""Shared test fixtures.

`slurm_cluster` starts the real local Slurm dev cluster
(contrib/dev-cluster/devcluster.sh) once per test session, on its own LAB
and ports so it never meets a dev cluster started by hand, and stops it at
the end. Only tests that ask for it start it; if it cannot start, those
tests ERROR (never skip). Tests using it are marked `slurm`.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEVCLUSTER = ROOT / "contrib" / "dev-cluster" / "devcluster.sh"
SHAPE = ROOT / "contrib" / "dev-cluster" / "cluster.conf"
TEST_CLUSTER_ENV = {"LAB": "/tmp/cellsched-test-cluster", "CTLD_PORT": "16817", "SLURMD_BASEPORT": "16900"}


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
        return subprocess.run(["bash", str(DEVCLUSTER), command], env=self.env, capture_output=True, text=True, timeout=timeout, check=False)


def read_shape(path: Path) -> dict[str, tuple[str, int]]:
    shape = {}
    for line in path.read_text().splitlines():
        parts = line.split("#", 1)[0].split()
        if parts:
            shape[parts[0]] = (parts[1], int(parts[2]))
    return shape


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[DevCluster]:
    env = {k: v for k, v in os.environ.items() if k not in ("DEVCLUSTER_SHAPE", "JOB_SUBMIT_LUA")}
    env.update(TEST_CLUSTER_ENV)
    lab = Path(env["LAB"])
    cluster = DevCluster(lab=lab, conf=lab / "etc" / "slurm.conf", shape=read_shape(SHAPE), env=env)
    started = cluster.devcluster("up", timeout=300)
    if started.returncode != 0:
        cluster.devcluster("down")
        pytest.fail(f"the Slurm dev cluster did not start (devcluster.sh up, exit {started.returncode}):\n{started.stderr[-4000:]}", pytrace=False)
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        cluster.devcluster("down")
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


def wait_for(predicate: Callable[[], Any], *, timeout: float = 20.0, interval: float = 0.2, what: str = "a condition") -> Any:
    """Poll `predicate` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def wait_until() -> Callable[..., Any]:
    """wait_until(predicate, timeout=20, what="...") -> predicate's first truthy value."""
    return wait_for


@pytest.fixture
def wait_job_state() -> Callable[..., Any]:
    """wait_job_state(backend, job_id, "RUNNING" | {"PENDING", ...}, timeout=20)
    -> the job once it is in one of the states; AssertionError (with the last
    state seen) after the timeout."""

    def wait(backend: Any, job_id: str, states: str | set[str], timeout: float = 20.0) -> Any:
        wanted = {states} if isinstance(states, str) else set(states)
        seen: list[Any] = []

        def check() -> Any:
            job = backend.observe().job(job_id)
            seen.append(job)
            return job if job.state in wanted else None

        try:
            return wait_for(check, timeout=timeout, what=f"job {job_id} to be {sorted(wanted)}")
        except AssertionError as exc:
            last = seen[-1] if seen else None
            raise AssertionError(f"{exc}; last seen: {last.state if last else '?'} ({last.reason if last else ''})") from None

    return wait


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)
