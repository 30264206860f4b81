"""The dev cluster's shape names each node's network card; `devcluster.sh
network` turns it into the controller's [network] section."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

from slurm_ext.config import from_dict

SCRIPT = Path(__file__).resolve().parents[2] / "contrib" / "dev-cluster" / "devcluster.sh"


def _network(shape: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DEVCLUSTER_SHAPE"}
    if shape is not None:
        env["DEVCLUSTER_SHAPE"] = shape
    return subprocess.run(["bash", str(SCRIPT), "network"], env=env, capture_output=True, text=True, timeout=30)


def test_the_shipped_shape_gives_every_node_its_card():
    out = _network()
    assert out.returncode == 0, out.stderr
    net = from_dict(tomllib.loads(out.stdout)).network
    assert [net.nic_of(n, "x") for n in ("n1", "n3", "n4", "n6")] == [200.0, 100.0, 25.0, 25.0]


def test_a_node_without_a_card_takes_its_type_default_and_cpus_still_parse():
    out = _network("n1:a100:4:16:nic=10,n2:a40:2")
    assert out.returncode == 0, out.stderr
    net = from_dict(tomllib.loads(out.stdout)).network
    assert net.nic_of("n1", "a100") == 10.0 and net.nic_of("n2", "a40") == 100.0


def test_a_bad_card_is_refused_with_the_node_named():
    out = _network("n1:a100:4:nic=fast")
    assert out.returncode != 0
    assert "node n1: nic must be a positive number" in out.stderr
