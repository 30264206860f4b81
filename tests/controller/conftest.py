"""Fixtures of the controller tests.

`slurm_cluster` here is a dev cluster of the controller tests' own (its own
LAB and ports), so these tests never share a cluster with others running at
the same time. It starts once per session and stops at the end; if it cannot
start, the tests that need it ERROR.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from controller_support import CLUSTER_ENV, Cluster  # noqa: E402


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    env = {k: v for k, v in os.environ.items() if k not in ("DEVCLUSTER_SHAPE", "JOB_SUBMIT_LUA", "SLURM_CONF")}
    env.update(CLUSTER_ENV)
    lab = Path(env["LAB"])
    cluster = Cluster(lab, lab / "etc" / "slurm.conf", env)
    started = cluster.devcluster("up", timeout=300)
    if started.returncode != 0:
        cluster.devcluster("down")
        pytest.fail(f"dev cluster did not start: {started.stderr[-3000:]}", pytrace=False)
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
