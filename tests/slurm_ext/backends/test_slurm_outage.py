"""A slurmctld outage: observe fails fast with SlurmUnavailable and works
again once slurmctld is back."""

import time

import pytest

from slurm_ext.backends import SlurmUnavailable, get_backend

pytestmark = pytest.mark.slurm


def test_observe_fails_fast_while_slurmctld_is_down(slurm_cluster):
    backend = get_backend("cli", timeout=10.0, ping_timeout=3.0)
    before = backend.observe()
    stopped = slurm_cluster.devcluster("stop-ctld")
    assert stopped.returncode == 0, stopped.stderr
    try:
        t0 = time.monotonic()
        with pytest.raises(SlurmUnavailable, match="slurmctld"):
            backend.observe()
        assert time.monotonic() - t0 < 5.0
    finally:
        started = slurm_cluster.devcluster("start-ctld")
    assert started.returncode == 0, started.stderr
    after = backend.observe()
    assert {n.name for n in after.nodes} == {n.name for n in before.nodes}
    assert all(n.available for n in after.nodes)
