"""`cellsched profiles`: list, show, import, export, and its errors."""

from __future__ import annotations

import json
import subprocess

import pytest
from click.testing import CliRunner
from support import console_script

from slurm_ext.cli import main
from solver.contract.profiles.arena import shipped_path
from solver.contract.profiles.records import CommRecord, LayerRecord
from solver.contract.profiles.seed import open_store
from solver.contract.profiles.store import ProfileStore


def run(*args: str):
    return CliRunner().invoke(main, ["profiles", *args], catch_exceptions=False)


def test_list_seeds_and_counts(tmp_path):
    db = tmp_path / "p.sqlite"
    res = run("--db", str(db), "list", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["totals"]["cells"] == 329 + 1944 and out["totals"]["gpus"] == 7
    source = json.loads(shipped_path("profiles_optimal.json").read_text())["records"]
    want = [r for r in source if (r["trace_model_name"], r["gpu_type"]) == ("moe__2.4B", "a40")]
    key = ("moe__2.4B", "a40", "arena-optimal")
    row = next(r for r in out["cells"] if (r["model"], r["gpu_type"], r["source"]) == key)
    assert (row["records"], row["oom"]) == (len(want), sum(r["status"] == "oom" for r in want))
    res = run("--db", str(db), "list", "--model", "bert-2.6b")
    assert res.exit_code == 0
    models = {line.split()[0] for line in res.output.splitlines()[2:-1]}
    assert models == {"bert__2.6B"}


def test_show_table_and_json(tmp_path, monkeypatch):
    monkeypatch.setenv("CELLSCHED_PROFILES", str(tmp_path / "env.sqlite"))
    res = run("show", "moe-2.4b", "--batch", "256", "--gpu-type", "a40")
    assert res.exit_code == 0
    line = next(ln for ln in res.output.splitlines() if " 4x2 " in ln and "arena-optimal" in ln)
    assert "6.482" in line and "39.49" in line
    recs = json.loads(run("show", "moe__2.4B", "--batch", "256", "--gpu-type", "a40", "--json").output)
    assert {r["global_batch"] for r in recs} == {256} and {r["gpu_type"] for r in recs} == {"a40"}
    assert (tmp_path / "env.sqlite").exists()
    assert "no cell records" in run("show", "gpt-tiny").output


def test_export_import_round_trip(tmp_path):
    src, dst, out = tmp_path / "src.sqlite", tmp_path / "dst.sqlite", tmp_path / "all.jsonl"
    with open_store(src) as store:
        store.put_layers([LayerRecord("sig", "a100", 1, 2, i, "block", 0.1, 0.2, 10, 20, 30) for i in range(3)])
        store.put_comm([CommRecord("net", "allreduce", 8, 1 << 20, 0.002)])
        before = store.counts()
        cells = store.cells()
    assert run("--db", str(src), "export", str(out)).exit_code == 0
    assert len(out.read_text().splitlines()) == 1 + sum(before.values())
    ProfileStore(dst).close()
    res = run("--db", str(dst), "import", str(out))
    assert res.exit_code == 0 and f"imported {sum(before.values())}" in res.output
    with open_store(dst) as store:
        assert store.counts() == before
        assert store.cells() == cells
        assert store.layers("sig", "a100", 1, 2)[2].layer == 2
    res = run("--db", str(dst), "import", str(out))  # again: same result
    with open_store(dst) as store:
        assert store.counts() == before


def test_import_arena_files_by_shape(tmp_path):
    db = tmp_path / "p.sqlite"
    ProfileStore(db).close()
    res = run(
        "--db",
        str(db),
        "import",
        str(shipped_path("profiles_optimal.json")),
        str(shipped_path("profiles_plans_estimated.json")),
    )
    assert res.exit_code == 0
    assert "arena-optimal: imported 329" in res.output and "arena-estimated: imported 1944" in res.output


@pytest.mark.parametrize(
    "content, message",
    [
        ("{\n  oops", "line 2"),
        (
            '{"format": "cellsched-profiles", "version": 1}\n{"record": "cell", "model": "m"}\n',
            "x.json:2: cell record lacks field",
        ),
        (
            '{"format": "cellsched-profiles", "version": 1}\n{"record": "cell", "model": "m", "global_batch": 0, '
            '"gpu_type": "a100", "num_nodes": 1, "gpus_per_node": 1, "iter_time_s": 1.0}\n',
            "global_batch",
        ),
        ('{"format": "cellsched-profiles", "version": 7}\n', "'version'"),
        ('{"records": [{"foo": 1}]}', "not an Arena profile file"),
    ],
)
def test_bad_files_exit_2_and_import_nothing(tmp_path, content, message):
    db, bad = tmp_path / "p.sqlite", tmp_path / "x.json"
    ProfileStore(db).close()
    good = tmp_path / "good.jsonl"
    good.write_text(
        '{"format": "cellsched-profiles", "version": 1}\n'
        '{"record": "gpu", "name": "g", "mem_gb": 1, "peak_tflops": 1, "mem_bw_gbps": 1}\n'
    )
    bad.write_text(content)
    res = CliRunner().invoke(main, ["profiles", "--db", str(db), "import", str(good), str(bad)])
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output
    with open_store(db) as store:
        assert store.counts() == {"cells": 0, "layers": 0, "comm": 0, "gpus": 0}


def test_missing_file_and_bad_db(tmp_path):
    db = str(tmp_path / "p.sqlite")
    res = CliRunner().invoke(main, ["profiles", "--db", db, "import", str(tmp_path / "no.json")])
    assert res.exit_code == 2 and "does not exist" in res.output
    res = CliRunner().invoke(main, ["profiles", "--db", str(tmp_path / "nodir" / "p.sqlite"), "list"])
    assert res.exit_code == 2 and "nodir" in res.output and "Traceback" not in res.output


def test_help_explains():
    res = run("--help")
    assert res.exit_code == 0 and "CELLSCHED_PROFILES" in res.output
    assert "JSON-lines" in run("import", "--help").output


def test_installed_console_script(tmp_path):
    exe = console_script()
    db = tmp_path / "p.sqlite"
    proc = subprocess.run([exe, "profiles", "list", "--db", str(db)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "totals: cells 2273" in proc.stdout and db.exists()
