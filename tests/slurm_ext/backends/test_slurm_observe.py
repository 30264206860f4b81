"""Observing the real dev cluster: nodes, GPU types and counts, partitions,
drained nodes, and `cellsched cluster --json` against sinfo."""

import json
import subprocess

import pytest

from slurm_ext.backends import get_backend
from slurm_ext.view import to_cluster_view

pytestmark = pytest.mark.slurm


@pytest.fixture
def backend(contract_backend):
    return contract_backend


def test_nodes_and_partitions_match_the_shape(slurm_cluster, backend):
    snap = backend.observe()
    nodes = {n.name: n for n in snap.nodes}
    assert set(nodes) == set(slurm_cluster.nodes)
    for name, (gpu_type, gpus) in slurm_cluster.shape.items():
        n = nodes[name]
        assert (n.gpu_type, n.gpus_total, n.gpus_alloc) == (gpu_type, gpus, 0), name
        assert n.features == (gpu_type,) and n.available and n.state == "idle"
        assert n.cpus_total >= gpus and n.address == "127.0.0.1" and n.port is not None
        assert set(n.partitions) == {gpu_type, "all"}
    parts = {p.name: p for p in snap.partitions}
    types = {t for t, _ in slurm_cluster.shape.values()}
    assert set(parts) == types | {"all"}
    assert parts["all"].default and set(parts["all"].nodes) == set(slurm_cluster.nodes)
    for t in types:
        assert set(parts[t].nodes) == {n for n, (g, _) in slurm_cluster.shape.items() if g == t}
        assert not parts[t].default
    view = to_cluster_view(snap, managed_job_ids=set())
    assert {n.name: n.gpus_free for n in view.nodes} == {n: g for n, (_, g) in slurm_cluster.shape.items()}


def test_text_mode_sees_the_same_cluster(backend):
    text = get_backend("cli", mode="text").observe()
    js = backend.observe()
    assert text.nodes == js.nodes
    assert text.partitions == js.partitions


def test_drained_node_is_unavailable_until_undrained(slurm_cluster, backend, wait_until):
    node = "n6"
    drain = ["scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=cellsched test"]
    subprocess.run(drain, check=True, timeout=10, capture_output=True)
    try:
        n = backend.observe().node(node)
        assert not n.available and "DRAIN" in n.flags and n.reason == "cellsched test"
        view = to_cluster_view(backend.observe(), managed_job_ids=set())
        assert view.node(node).gpus_free == 0
    finally:
        subprocess.run(
            ["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=True, timeout=10, capture_output=True
        )
    # RESUME leaves the node "not responding" until slurmd answers a ping
    n = wait_until(
        lambda: (x := backend.observe().node(node)).available and x, timeout=15, what=f"{node} to be available"
    )
    assert n.flags == () and n.state == "idle"


def test_cluster_command_json_matches_sinfo(slurm_cluster):
    out = subprocess.run(
        ["cellsched", "cluster", "--json", "--backend", "cli"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    doc = json.loads(out)
    sinfo = subprocess.run(
        ["sinfo", "-N", "-h", "-o", "%N|%P|%G|%t|%f|%c|%m|%a"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    rows = [line.split("|") for line in sinfo.splitlines()]
    nodes = {n["name"]: n for n in doc["nodes"]}
    parts = {p["name"]: p for p in doc["partitions"]}
    assert {r[0] for r in rows} == set(nodes)
    for name, part, gres, state, features, cpus, mem, avail in rows:
        n = nodes[name]
        assert gres == f"gpu:{n['gpu_type']}:{n['gpus_total']}"
        assert part.rstrip("*") in n["partitions"] and name in parts[part.rstrip("*")]["nodes"]
        assert parts[part.rstrip("*")]["default"] == part.endswith("*")
        assert {"idle": "idle", "mix": "mixed", "alloc": "allocated"}[state] == n["state"]
        assert features == ",".join(n["features"]) and int(cpus) == n["cpus_total"] and int(mem) == n["memory_mb"]
        assert avail == "up" and parts[part.rstrip("*")]["state"] == "UP"
    table = subprocess.run(
        ["cellsched", "cluster", "--backend", "cli"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    assert len(table.splitlines()) == 1 + len(rows)
