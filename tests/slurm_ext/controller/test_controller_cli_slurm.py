"""`cellsched controller run --dry-run / --interval / --backend` and the
plain-text `cellsched plan` and `cellsched status`, through the installed
console script on the real dev cluster."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from itertools import pairwise

import pytest
from controller_support import DEMO_JOB, write_config
from support import console_script, wait_for

from slurm_ext.backends import get_backend
from slurm_ext.cli.status_cmd import HEADER
from solver.contract import admin_comment_dict

pytestmark = pytest.mark.slurm


def cs(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([console_script(), *args], capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, (
        f"cellsched {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


def test_dry_run_plan_and_status_text(slurm_cluster, tmp_path):
    """--dry-run --once and `plan` decide without touching the held job; a real round places it; `status` shows it."""
    backend = get_backend("cli")
    state = tmp_path / "state.sqlite"
    config = str(write_config(tmp_path / "c.toml", state))
    job = cs(
        "sbatch",
        "--parsable",
        "--model",
        "gpt-350m",
        "--global-batch",
        "64",
        "--iterations",
        "50",
        "-o",
        str(tmp_path / "%j.out"),
        "--export=ALL,DEMO_SLEEP=1",
        "--",
        str(DEMO_JOB),
    ).stdout.strip()
    assert job.isdigit(), job

    dry = json.loads(cs("controller", "run", "--once", "--dry-run", "--backend", "cli", "--config", config).stdout)
    assert dry["status"] == "ok" and dry["dry_run"] and dry["round_id"] is None
    (action,) = dry["actions"]
    assert action["kind"] == "place" and action["job"] == job
    text = cs("plan", "--config", config).stdout
    assert f"place job {job} -> {action['cell']} on {','.join(action['nodes'])} ({action['partition']})" in text, text
    held = backend.job(job)
    assert held.held and held.state == "PENDING" and "plan" not in admin_comment_dict(held.admin_comment)
    assert not state.exists()  # neither dry run wrote a state

    placed = json.loads(cs("controller", "run", "--once", "--config", config).stdout)
    assert [(a["kind"], a["job"]) for a in placed["actions"]] == [("place", job)]
    plan = admin_comment_dict(backend.job(job).admin_comment)["plan"]
    lines = cs("status", "--config", config).stdout.splitlines()
    assert lines[0].split() == list(HEADER)
    row = next(ln.split() for ln in lines[1:] if ln.startswith(job + " "))
    assert (
        row[1] == "root"
        and row[3] == plan["cell"]
        and row[4] == ",".join(f"{n}:{plan['gpus_per_node']}" for n in plan["nodes"])
    )
    # placed this round and not started yet: no progress is known
    assert row[5] == f"{plan['pp']}/{plan['dp']}/{plan['tp']}" and row[7] == row[8] == "-"
    assert any(ln.startswith("last round 1 at ") and ": ok, 1 actions" in ln for ln in lines), lines
    assert "nothing to do" in cs("plan", "--config", config).stdout  # placed: the next round leaves it alone


def test_daemon_runs_every_interval_and_stops_on_sigterm(slurm_cluster, tmp_path):
    """--interval overrides the config's hour-long interval; SIGTERM ends the daemon cleanly and frees its lock."""
    state = tmp_path / "state.sqlite"
    config = str(write_config(tmp_path / "c.toml", state, interval_s=3600.0))
    log = tmp_path / "controller.log"
    with open(log, "w") as err:
        daemon = subprocess.Popen(
            [console_script(), "controller", "run", "--config", config, "--interval", "0.5"],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:

        def ok_rounds() -> list[dict]:
            lines = [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{")]
            return [r for r in lines if r.get("msg") == "round" and r["status"] == "ok" and not r["dry_run"]]

        wait_for(lambda: len(ok_rounds()) >= 2, timeout=60, what="two controller rounds logged")
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert "Traceback" not in log.read_text()
    with sqlite3.connect(state) as db:
        rows = db.execute("SELECT started, status FROM rounds ORDER BY id").fetchall()
    started = [t for t, _ in rows]
    assert sum(st == "ok" for _, st in rows) >= 2 and all(b - a >= 0.45 for a, b in pairwise(started)), rows
    cs("controller", "run", "--once", "--config", config)  # the state lock was released
