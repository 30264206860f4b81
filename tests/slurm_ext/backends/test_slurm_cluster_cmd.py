"""`cellsched cluster` output: table and JSON from recorded samples, and the
exit status when slurmctld cannot be reached (real Slurm commands against a
config whose controller port is closed)."""

import dataclasses
import json

from click.testing import CliRunner

from slurm_ext.cli import main
from slurm_ext.cli.cluster_cmd import format_table, snapshot_json, table_rows
from slurm_ext.parse import json_output as J
from slurm_ext.parse import scontrol_text as T
from slurm_ext.records import ClusterSnapshot


def snap(sample):
    return ClusterSnapshot(
        nodes=J.parse_nodes(sample("sinfo.json")),
        partitions=T.parse_partitions(sample("scontrol_show_-o_partition.txt")),
        jobs=(),
        taken_at=1795232910.0,
    )


def test_table(sample):
    s = snap(sample)
    rows = table_rows(s)
    assert len(rows) == 8  # one per (partition, node)
    assert rows[0] == ("a100", "n1", "a100", "1/4", "mixed")
    assert ("all*", "n4", "v100", "4/4", "idle") in rows
    lines = format_table(s).splitlines()
    assert lines[0].split() == ["PARTITION", "NODE", "GPU", "FREE/TOTAL", "STATE"]
    assert lines[1].split() == ["a100", "n1", "a100", "1/4", "mixed"]


def test_table_shows_drained_nodes_with_nothing_free(sample):
    s = snap(sample)
    s = dataclasses.replace(
        s, nodes=tuple(dataclasses.replace(n, flags=("DRAIN",)) if n.name == "n4" else n for n in s.nodes)
    )
    assert ("v100", "n4", "v100", "0/4", "idle+drain") in table_rows(s)


def test_json(sample):
    doc = snapshot_json(snap(sample))
    assert sorted(doc) == ["nodes", "partitions", "taken_at"]
    n1 = doc["nodes"][0]
    assert sorted(n1) == sorted(
        [
            "name",
            "address",
            "port",
            "partitions",
            "features",
            "gpu_type",
            "gpus_total",
            "gpus_alloc",
            "gpus_free",
            "cpus_total",
            "cpus_alloc",
            "memory_mb",
            "state",
            "flags",
            "reason",
            "available",
        ]
    )
    assert (n1["name"], n1["gpus_total"], n1["gpus_alloc"], n1["gpus_free"]) == ("n1", 4, 3, 1)
    assert doc["partitions"][2] == {
        "name": "all",
        "nodes": ["n1", "n2", "n3", "n4"],
        "state": "UP",
        "default": True,
        "max_time": None,
    }
    json.dumps(doc)


def test_unreachable_controller_exits_2_with_one_line(tmp_path, monkeypatch):
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=9\nAuthType=auth/none\nCredType=cred/none\n"
        "NodeName=x1 CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=x1\n"
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    result = CliRunner().invoke(main, ["cluster", "--backend", "cli"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(
        "cellsched cluster: Slurm unavailable: slurmctld is not responding"
    )


def test_unknown_backend_exits_1():
    result = CliRunner().invoke(main, ["cluster", "--backend", "nope"])
    assert result.exit_code == 1 and "unknown backend 'nope'" in result.stderr


def test_help():
    result = CliRunner().invoke(main, ["cluster", "--help"])
    assert result.exit_code == 0 and "--json" in result.output and "free/total" in result.output
