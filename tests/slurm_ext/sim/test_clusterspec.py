"""Cluster specs: Arena's shipped cluster, our TOML/JSON format, node names."""

from __future__ import annotations

import json
import pathlib

import pytest

from slurm_ext.sim.clusterspec import ClusterSpecError, arena_cluster, load_cluster_spec, node_names
from slurm_ext.sim.types import NodeGroup

ROOT = pathlib.Path(__file__).resolve().parents[3]
DEV_CONF = ROOT / "contrib" / "dev-cluster" / "cluster.conf"


def test_arena_cluster_is_the_shipped_1280_gpu_one():
    spec = arena_cluster()
    assert spec.total_gpus == 1280
    assert spec.gpus_by_type() == {"a100": 320, "v100": 320, "a40": 320, "a10": 320}
    assert [(g.gpu_type, g.count, g.gpus_per_node, g.mem_gb) for g in spec.groups] == [
        ("a100", 80, 4, 40.0),
        ("v100", 20, 16, 32.0),
        ("a40", 160, 2, 48.0),
        ("a10", 160, 2, 24.0),
    ]
    names = node_names(spec)
    assert len(names) == 420
    assert names[0] == ("a100-01", "a100", 4) and names[79] == ("a100-80", "a100", 4)
    assert names[100] == ("a40-001", "a40", 2) and names[-1] == ("a10-160", "a10", 2)
    assert len({n for n, _, _ in names}) == 420


def test_shipped_example_matches_dev_cluster_shape():
    spec = load_cluster_spec(ROOT / "slurm_ext" / "admin" / "sim-cluster.toml")
    assert spec.name == "dev"
    dev = [line.split() for line in DEV_CONF.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert [(t, g) for _, t, g in node_names(spec)] == [(t, int(g)) for _, t, g, *_ in dev]
    assert [n for n, _, _ in node_names(spec)] == ["a100-1", "a100-2", "v100-1", "a40-1", "a40-2", "a10-1"]
    assert spec.groups[0] == NodeGroup("a100", 2, 4, 40.0)


def test_json_form_and_numbering_across_groups(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps(
            {
                "nodes": [
                    {"gpu_type": "a100", "count": 9, "gpus_per_node": 4},
                    {"gpu_type": "a100", "count": 3, "gpus_per_node": 8},
                ]
            }
        )
    )
    spec = load_cluster_spec(path)
    assert spec.total_gpus == 9 * 4 + 3 * 8 and spec.groups[1].mem_gb is None
    names = node_names(spec)
    assert names[0][0] == "a100-01" and names[9] == ("a100-10", "a100", 8) and names[-1][0] == "a100-12"


def test_arena_format_without_gpus_per_node_uses_node_capacity(tmp_path):
    path = tmp_path / "arena.json"
    path.write_text(json.dumps({"cluster": {"v100": {"node_num": 2}}}))
    assert load_cluster_spec(path).groups == (NodeGroup("v100", 2, 16, 32.0),)
    path.write_text(json.dumps({"cluster": {"v100": {"node_num": 2, "gpus_per_node": 16, "total_gpus": 30}}}))
    with pytest.raises(ClusterSpecError, match=r"arena.json: cluster.v100: field 'total_gpus'"):
        load_cluster_spec(path)


@pytest.mark.parametrize(
    "body,message",
    [
        (
            '[[nodes]]\ngpu_type = "a100"\ncount = 0\ngpus_per_node = 4\n',
            r"c.toml: nodes\[0\]: field 'count' must be a positive integer, got 0",
        ),
        ('[[nodes]]\ngpu_type = "A100"\ncount = 1\ngpus_per_node = 4\n', r"nodes\[0\]: field 'gpu_type'"),
        ('[[nodes]]\ngpu_type = "a100"\ncount = 1\n', r"nodes\[0\]: missing field 'gpus_per_node'"),
        ('[[nodes]]\ngpu_type = "a100"\ncount = 1\ngpus_per_node = 4\ngpus = 3\n', r"nodes\[0\]: unknown field 'gpus'"),
        ('[[nodes]]\ngpu_type = "a100"\ncount = 1\ngpus_per_node = 4\nmem_gb = "lots"\n', r"field 'mem_gb'"),
        ("nodes = []\n", r"field 'nodes' must be a non-empty list"),
        ('[[nodes]]\ngpu_type = "a100"\ncount = 1\ngpus_per_node = 4\nnic_gbps = 0\n', r"field 'nic_gbps'"),
        ('[[nodes]]\ngpu_type = "a100"\ncount = 1\ngpus_per_node = 4\nrack = "A B"\n', r"field 'rack'"),
        (
            '[uplink_gbps]\nr9 = 40\n[[nodes]]\ngpu_type = "a100"\ncount = 1\ngpus_per_node = 4\nrack = "r1"\n',
            r"uplink_gbps.r9: no node group is in rack 'r9'",
        ),
        ('name = "x"\n', r"missing field 'nodes'"),
        ("[[nodes]\n", r"c.toml: not valid TOML"),
    ],
)
def test_errors_name_file_and_field(tmp_path, body, message):
    path = tmp_path / "c.toml"
    path.write_text(body)
    with pytest.raises(ClusterSpecError, match=message):
        load_cluster_spec(path)
