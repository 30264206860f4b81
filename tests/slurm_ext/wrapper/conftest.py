"""Fixtures of the wrapper tests.

* `snapshot`: the dev cluster's shape (contrib/dev-cluster/cluster.conf) as
  a ClusterSnapshot, for tests that need no Slurm.
* `Recorder`: a backend whose observe() returns a given snapshot and which
  records submit() calls, raising if `forbid_submit` (it proves that bad
  input never reaches Slurm).
* `cli_recorder`: the real cli backend over that snapshot, recording the
  commands it would run (sbatch answers with job 4242).
* `wrap_cluster(plugin)`: a real Slurm dev cluster of its own (LAB
  /tmp/cellsched-wrap, ports 14817/14900+), started with or without
  slurm_ext/admin/job_submit.lua; one instance, restarted only when the mode
  changes, stopped at the end of the session.
* `users`: local users cs_alice and cs_bob, and how to run `cellsched` as
  them (an interpreter they can execute, reading this checkout).
"""

from __future__ import annotations

import os
import pathlib
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import click
import pytest
from golden import ArgvRecorder
from support import console_script

from slurm_ext.backends.base import SubmitRequest
from slurm_ext.backends.cli import CliBackend
from slurm_ext.records import ClusterSnapshot, SlurmNode, SlurmPartition

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # wrapper_cases

ROOT = pathlib.Path(__file__).resolve().parents[3]
DEVCLUSTER = ROOT / "contrib" / "dev-cluster" / "devcluster.sh"
SHAPE = ROOT / "contrib" / "dev-cluster" / "cluster.conf"
PLUGIN = ROOT / "slurm_ext" / "admin" / "job_submit.lua"
HELLO = ROOT / "contrib" / "examples" / "hello_job.sh"
#: CELLSCHED_TEST_WRAP_LAB / _CTLD_PORT / _SLURMD_BASEPORT move it, so that two test runs can share a machine
LAB = pathlib.Path(os.environ.get("CELLSCHED_TEST_WRAP_LAB", "/tmp/cellsched-wrap"))
CLUSTER_ENV = {
    "LAB": str(LAB),
    "CTLD_PORT": os.environ.get("CELLSCHED_TEST_WRAP_CTLD_PORT", "14817"),
    "SLURMD_BASEPORT": os.environ.get("CELLSCHED_TEST_WRAP_SLURMD_BASEPORT", "14900"),
}
USERS = ("cs_alice", "cs_bob")


def shape() -> list[tuple[str, str, int]]:
    rows = []
    for line in SHAPE.read_text().splitlines():
        parts = line.split("#", 1)[0].split()
        if parts:
            rows.append((parts[0], parts[1], int(parts[2])))
    return rows


@pytest.fixture(scope="session")
def snapshot() -> ClusterSnapshot:
    rows = shape()
    nodes = tuple(
        SlurmNode(
            name=n, gpu_type=t, gpus_total=g, partitions=(t, "all"), features=(t,), state="idle", cpus_total=max(8, g)
        )
        for n, t, g in rows
    )
    types = list(dict.fromkeys(t for _, t, _ in rows))
    parts = tuple(SlurmPartition(t, tuple(n for n, tt, _ in rows if tt == t)) for t in types)
    parts += (SlurmPartition("all", tuple(n for n, _, _ in rows), default=True),)
    return ClusterSnapshot(nodes=nodes, partitions=parts, jobs=(), taken_at=0.0)


@dataclass
class Recorder:
    """A backend over a fixed snapshot that records what would be submitted."""

    snap: ClusterSnapshot
    forbid_submit: bool = True
    job_id: str = "4242"
    name: str = "recorder"
    submitted: list[SubmitRequest] = field(default_factory=list)
    observed: int = 0

    def observe(self) -> ClusterSnapshot:
        self.observed += 1
        return self.snap

    def submit(self, req: SubmitRequest) -> str:
        self.submitted.append(req)
        if self.forbid_submit:
            raise AssertionError(f"submit() reached the backend: {req}")
        return self.job_id


@pytest.fixture
def make_recorder(snapshot: ClusterSnapshot):
    """make_recorder(forbid_submit=True, snap=None) -> Recorder."""

    def make(forbid_submit: bool = True, snap: ClusterSnapshot | None = None) -> Recorder:
        return Recorder(snap or snapshot, forbid_submit=forbid_submit)

    return make


class SnapshotCliBackend(CliBackend):
    """The real cli backend over a fixed snapshot: `runner.calls` are the
    commands it would run (sbatch answers with job 4242)."""

    def __init__(self, snap: ClusterSnapshot) -> None:
        self.runner = ArgvRecorder(lambda args: "4242\n")
        super().__init__(run=self.runner)
        self.snap = snap

    def observe(self) -> ClusterSnapshot:
        return self.snap


@pytest.fixture
def cli_recorder(snapshot: ClusterSnapshot) -> SnapshotCliBackend:
    """A SnapshotCliBackend over the dev cluster's shape."""
    return SnapshotCliBackend(snapshot)


@dataclass
class WrapCluster:
    """The running test cluster: its env for clients and a backend on it."""

    plugin: bool
    env: dict[str, str]
    backend: CliBackend

    def run(
        self,
        args: list[str],
        *,
        user: str | None = None,
        users: Users | None = None,
        cwd: str = "/tmp",
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command (an argument list) with this cluster's SLURM_CONF,
        as root or as `user`; `cellsched` resolves to an install the user can run."""
        if args[0] == "cellsched":
            args = [*(users.cellsched if users else [console_script()]), *args[1:]]
        if user is not None:
            args = [
                "runuser",
                "-u",
                user,
                "--",
                "env",
                f"SLURM_CONF={self.env['SLURM_CONF']}",
                *((f"PYTHONPATH={users.pythonpath}",) if users and users.pythonpath else ()),
                *args,
            ]
        return subprocess.run(args, env=self.env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)

    def ctld_log(self) -> str:
        """slurmctld's log so far."""
        return (LAB / "log" / "slurmctld.log").read_text(errors="replace")

    def job_ids(self) -> set[str]:
        out = self.run(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout
        return set(out.split())


class _Lab:
    def __init__(self) -> None:
        self.mode: bool | None = None
        self.env = {
            k: v for k, v in os.environ.items() if k not in ("DEVCLUSTER_SHAPE", "JOB_SUBMIT_LUA", "SLURM_CONF")
        }
        self.env.update(CLUSTER_ENV)
        self.env["SLURM_CONF"] = str(LAB / "etc" / "slurm.conf")
        self.env.pop("CELLSCHED_PROFILES", None)

    def devcluster(self, command: str, plugin: bool) -> subprocess.CompletedProcess[str]:
        env = dict(self.env)
        if plugin:
            env["JOB_SUBMIT_LUA"] = str(PLUGIN)
        return subprocess.run(
            ["bash", str(DEVCLUSTER), command], env=env, capture_output=True, text=True, timeout=300, check=False
        )

    def ensure(self, plugin: bool) -> WrapCluster:
        if self.mode is not plugin:
            started = self.devcluster("up", plugin)  # `up` stops a previous instance under LAB first
            if started.returncode != 0:
                self.devcluster("down", plugin)
                self.mode = None
                pytest.fail(f"dev cluster did not start (plugin={plugin}):\n{started.stderr[-3000:]}", pytrace=False)
            self.mode = plugin
        return WrapCluster(plugin, dict(self.env), CliBackend(slurm_conf=self.env["SLURM_CONF"]))


@pytest.fixture(scope="session")
def _lab() -> Iterator[_Lab]:
    lab = _Lab()
    try:
        yield lab
    finally:
        if lab.mode is not None:
            lab.devcluster("down", lab.mode)


@pytest.fixture
def plain_cluster(_lab: _Lab) -> WrapCluster:
    """The test cluster without job_submit.lua."""
    return _lab.ensure(False)


@pytest.fixture
def lua_cluster(_lab: _Lab) -> WrapCluster:
    """The test cluster with slurm_ext/admin/job_submit.lua installed."""
    return _lab.ensure(True)


@dataclass(frozen=True)
class Users:
    """How to run `cellsched` as the test users: the command, and a
    PYTHONPATH when the interpreter is not this one."""

    cellsched: tuple[str, ...]
    pythonpath: str | None
    uids: dict[str, int]


def _runs_as(user: str, python: str, pythonpath: str | None) -> bool:
    env = ["env", f"PYTHONPATH={pythonpath}"] if pythonpath else []
    probe = ["runuser", "-u", user, "--", *env, python, "-c", "import click, slurm_ext.wrapper.command"]
    return subprocess.run(probe, cwd="/tmp", capture_output=True, timeout=60, check=False).returncode == 0


@pytest.fixture(scope="session")
def users() -> Users:
    """cs_alice and cs_bob (created when missing), and a `cellsched` they can run.

    When this interpreter lives where the users cannot reach it (e.g. under
    /root), they get the system python3 with this checkout and a copy of
    click on PYTHONPATH (what a site-wide install gives them)."""
    if os.geteuid() != 0:
        pytest.fail("the multi-user tests create users and must run as root", pytrace=False)
    for user in USERS:
        try:
            pwd.getpwnam(user)
        except KeyError:
            made = subprocess.run(
                ["useradd", "-m", "-s", "/bin/bash", user], capture_output=True, text=True, check=False
            )
            if made.returncode != 0:
                pytest.fail(f"useradd {user} failed: {made.stderr}", pytrace=False)
    uids = {u: pwd.getpwnam(u).pw_uid for u in USERS}
    if _runs_as(USERS[0], sys.executable, None):
        return Users((sys.executable, "-m", "slurm_ext"), None, uids)
    lib = LAB.parent / "cellsched-wrap-pylib"
    if not (lib / "click").is_dir():
        lib.mkdir(mode=0o755, exist_ok=True)
        shutil.copytree(pathlib.Path(click.__file__).parent, lib / "click", dirs_exist_ok=True)
        for p in [lib, *lib.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    python = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
    pythonpath = f"{lib}:{ROOT}"
    if not _runs_as(USERS[0], python, pythonpath):
        pytest.fail(
            f"{USERS[0]} cannot run cellsched ({python} with PYTHONPATH={pythonpath}); "
            f"is {ROOT} readable by other users?",
            pytrace=False,
        )
    return Users((python, "-m", "slurm_ext"), pythonpath, uids)
