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
from hypothesis import settings
from support import SHAPE, TEST_CLUSTER_ENV, DevCluster, Dist, build_dist, read_shape, wait_for

from slurm_ext.backends import SlurmUnavailable

# One torch (OpenMP) thread per process, in the test processes and what they
# start (trainer ranks set it themselves): the suite runs two xdist workers
# beside trainer ranks and Slurm jobs on a few cores, where torch's default,
# a spinning thread per core, makes an in-process training run 10 to 50 times
# slower. Set before any test module imports torch; a value given is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Property tests check results, not speed (performance is measured in
# benchmarks): no per-example deadline, which a loaded CI machine would trip
# (a 0.1 ms example took 550 ms once beside the Slurm tests).
settings.register_profile("cellsched", deadline=None)
settings.load_profile("cellsched")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[DevCluster]:
    env = {k: v for k, v in os.environ.items() if k not in ("DEVCLUSTER_SHAPE", "JOB_SUBMIT_LUA")}
    env.update(TEST_CLUSTER_ENV)
    lab = Path(env["LAB"])
    cluster = DevCluster(lab=lab, conf=lab / "etc" / "slurm.conf", shape=read_shape(SHAPE), env=env)
    with cluster.running():
        yield cluster


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
            try:
                job = backend.observe().job(job_id)
            except SlurmUnavailable:  # a call a loaded slurmctld dropped: ask again
                return None
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
    {
        "test_chaos_slurm.py",
        "test_controller_slurm.py",
        "test_controller_cli_slurm.py",
        "test_mixed_slurm.py",
        "test_hetero_controller_slurm.py",
    }
)
TESTS = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        default="cli",
        choices=("cli", "pyslurm"),
        help="the backend that the Slurm backend contract tests (tests/slurm_ext/backends, marked slurm) drive",
    )


def pytest_configure(config: pytest.Config) -> None:
    """With `--dist loadgroup`, xdist hands out the work units in the order
    pytest_collection_modifyitems leaves them (not by their number of tests):
    the two Slurm groups first, one to each worker."""
    if getattr(config.option, "dist", None) == "loadgroup":
        config.option.loadscopereorder = False


def _shared_fixture_groups(items: list[pytest.Item]) -> dict[str, str]:
    """nodeid -> a group name, for the tests (not in a group yet) that share
    a module- or session-scoped fixture of this suite (a venv, a built wheel,
    training runs): xdist would otherwise make it on each worker that runs
    one of them. Tests linked through several such fixtures share a group."""
    parent: dict[Any, Any] = {}

    def find(x: Any) -> Any:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        for name in getattr(item, "fixturenames", ()):
            fixturedef = defs[name][-1] if defs.get(name) else None
            if fixturedef is None or fixturedef.scope == "function":
                continue
            code = getattr(fixturedef.func, "__code__", None)
            if code is None or not Path(code.co_filename).resolve().is_relative_to(TESTS):
                continue  # pytest's own (tmp_path_factory, ...)
            key = (name, str(item.path) if fixturedef.scope == "module" else "")
            parent[find(item.nodeid)] = find(key)
    members: dict[Any, list[Any]] = {}
    for x in parent:
        members.setdefault(find(x), []).append(x)
    groups = {}
    for xs in members.values():
        ids = [x for x in xs if isinstance(x, str)]
        if len(ids) > 1:
            fixture, module = min(x for x in xs if isinstance(x, tuple))
            name = "-".join(filter(None, ("shares", fixture, Path(module).stem if module else "")))
            groups.update(dict.fromkeys(ids, name))
    return groups


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that use a dev cluster `slurm`, and split them in two
    groups for a parallel run (`-n 2 --dist loadgroup`): each group runs its
    tests one at a time on one worker, against that worker's own cluster
    (support.TEST_CLUSTER_ENV); the other tests fill in beside them, those
    that share an expensive fixture (_shared_fixture_groups) on one worker,
    these groups before the single tests."""
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)
        if item.get_closest_marker("slurm") is not None:
            group = "slurm-a" if item.path.name in SLURM_GROUP_A else "slurm-b"
            item.add_marker(pytest.mark.xdist_group(group))
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # one process: the files' own order
    shared = _shared_fixture_groups(items)
    for item in items:
        if item.nodeid in shared:
            item.add_marker(pytest.mark.xdist_group(shared[item.nodeid]))
    order = {"slurm-a": 0, "slurm-b": 1}

    def rank(item: pytest.Item) -> int:
        marker = item.get_closest_marker("xdist_group")
        return 3 if marker is None else order.get(marker.args[0], 2)

    items.sort(key=rank)  # stable: each file's tests keep their order
