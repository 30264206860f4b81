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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import SHAPE, TEST_CLUSTER_ENV, DevCluster, Dist, build_dist, read_shape, wait_for

# One torch (OpenMP) thread per process, in the test processes and what they
# start (trainer ranks set it themselves): the suite runs two xdist workers
# beside trainer ranks and Slurm jobs on a few cores, where torch's default,
# a spinning thread per core, makes an in-process training run 10 to 50 times
# slower. Set before any test module imports torch; a value given is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[DevCluster]:
    env = {k: v for k, v in os.environ.items() if k not in ("DEVCLUSTER_SHAPE", "JOB_SUBMIT_LUA")}
    env.update(TEST_CLUSTER_ENV)
    lab = Path(env["LAB"])
    cluster = DevCluster(lab=lab, conf=lab / "etc" / "slurm.conf", shape=read_shape(SHAPE), env=env)
    started = cluster.devcluster("up", timeout=300)
    if started.returncode != 0:
        cluster.devcluster("down")
        pytest.fail(
            f"the Slurm dev cluster did not start (devcluster.sh up, exit {started.returncode}):\n"
            f"{started.stderr[-4000:]}",
            pytrace=False,
        )
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


@pytest.fixture(autouse=True)
def _slurm_jobs_cleaned_up(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests share one cluster: after each test that used it, cancel every job
    still pending or running and wait until none holds resources, so a test
    that failed half-way cannot leave GPUs taken for the next one."""
    yield
    if "slurm_cluster" not in request.fixturenames:
        return
    cluster = request.getfixturevalue("slurm_cluster")
    env = {**cluster.env, "SLURM_CONF": str(cluster.conf)}

    def live() -> list[str]:
        out = subprocess.run(
            ["squeue", "-h", "-t", "PD,R,CG,CF,S", "-o", "%i"],
            env=env,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
        return out.split()

    jobs = live()
    if jobs:
        subprocess.run(["scancel", "--full", *jobs], env=env, capture_output=True, timeout=20, check=False)
        wait_for(lambda: not live(), timeout=60, what="the test's leftover jobs to end")


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
            raise AssertionError(
                f"{exc}; last seen: {last.state if last else '?'} ({last.reason if last else ''})"
            ) from None

    return wait


@pytest.fixture(scope="session")
def built_dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """The project's sdist and wheel (`python -m build` of a copy of the tree), built once per session."""
    return build_dist(tmp_path_factory.mktemp("build"))


#: Slurm test files run as group "slurm-a" when the suite runs in parallel;
#: the others as "slurm-b" (the two take about the same time)
SLURM_GROUP_A = frozenset(
    {"test_chaos_slurm.py", "test_controller_slurm.py", "test_controller_cli_slurm.py", "test_mixed_slurm.py"}
)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that use a dev cluster `slurm`, and split them in two
    groups for a parallel run (`-n 2 --dist loadgroup`): each group runs its
    tests one at a time on one worker, against that worker's own cluster
    (support.TEST_CLUSTER_ENV); the other tests fill in beside them."""
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)
        if item.get_closest_marker("slurm") is not None:
            group = "slurm-a" if item.path.name in SLURM_GROUP_A else "slurm-b"
            item.add_marker(pytest.mark.xdist_group(group))
