"""The dev cluster's preemption settings (DEVCLUSTER_PREEMPT, _PREEMPT_MODE,
_GRACE_S) are checked before anything starts: a bad one is refused with a
message that names it, and no daemon is started. (The cluster with
preemption itself: tests/slurm_ext/controller/test_slurm_preemption_slurm.py.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "contrib" / "dev-cluster" / "devcluster.sh"


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"DEVCLUSTER_PREEMPT": "qos"}, "DEVCLUSTER_PREEMPT=qos needs DEVCLUSTER_ACCOUNTING=1"),
        ({"DEVCLUSTER_PREEMPT": "both"}, "DEVCLUSTER_PREEMPT must be qos, partition or 0, got 'both'"),
        (
            {"DEVCLUSTER_PREEMPT": "partition", "DEVCLUSTER_PREEMPT_MODE": "SUSPEND"},
            "DEVCLUSTER_PREEMPT_MODE must be REQUEUE or CANCEL, got 'SUSPEND'",
        ),
        (
            {"DEVCLUSTER_PREEMPT": "partition", "DEVCLUSTER_GRACE_S": "1m"},
            "DEVCLUSTER_GRACE_S must be a number of seconds, got '1m'",
        ),
    ],
)
def test_a_bad_preemption_setting_is_refused_before_anything_starts(tmp_path, settings, message):
    if os.geteuid() != 0:
        pytest.skip("devcluster.sh up runs as root")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVCLUSTER_")}
    env.update({"LAB": str(tmp_path / "lab"), "CTLD_PORT": "1", "SLURMD_BASEPORT": "2", **settings})
    out = subprocess.run(["bash", str(SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr
    assert not (tmp_path / "lab").exists()  # nothing written, nothing started
