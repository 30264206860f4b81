"""`devcluster.sh down` stops the cluster's munged even when its pid file is
gone: a munged left serving the socket kept the next `up` from starting one
("Failed to lock munge.socket.lock"), which once failed a CI run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

SCRIPT = Path(__file__).resolve().parents[2] / "contrib" / "dev-cluster" / "devcluster.sh"
#: its own LAB and ports, beside the suite's clusters
ENV = {
    **os.environ,
    "LAB": os.environ.get("CELLSCHED_TEST_MUNGE_LAB", "/tmp/cellsched-test-munge"),
    "CTLD_PORT": "15817",
    "SLURMD_BASEPORT": "15900",
    "DEVCLUSTER_SHAPE": "n1:a100:1",
}


def devcluster(cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), cmd], env=ENV, capture_output=True, text=True, timeout=120)


def alive(pid: int) -> bool:
    try:
        return "Z" not in Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False


def test_down_stops_a_munged_whose_pid_file_is_gone_and_up_starts_again():
    pid_file = Path(ENV["LAB"]) / "munge" / "munged.pid"
    try:
        started = devcluster("up")
        assert started.returncode == 0, started.stderr
        munged = int(pid_file.read_text())
        pid_file.unlink()
        stopped = devcluster("down")
        assert stopped.returncode == 0, stopped.stderr
        assert not alive(munged), "down left the cluster's munged running"
        again = devcluster("up")
        assert again.returncode == 0, again.stderr
    finally:
        devcluster("down")
