"""User-facing `cellsched` paths that need no Slurm: --version, controller
--backend, plan's config errors, simulate (the docs' example, sacct traces,
--limit-jobs, --max-time, --seed) and profile --no-comm. The installed
console script runs as a subprocess; the cheaper simulate options in-process
through CliRunner."""

from __future__ import annotations

import csv
import importlib.metadata
import json
import shlex
import sqlite3
import subprocess
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner
from support import ADMIN, ROOT, console_script

from slurm_ext.cli import main
from solver.contract.profiles.arena import TRACE_FILE, shipped_path
from solver.contract.profiles.seed import open_store

SACCT = ROOT / "tests" / "slurm_ext" / "sim" / "data" / "sacct_sample.txt"


def cellsched(*args: str, timeout: float = 120, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [console_script(), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False
    )


def simulate(tmp_path: Path, *args: str) -> dict:
    """`cellsched simulate ... --json --no-plots` in-process; its results.json."""
    out = tmp_path / f"sim{len(list(tmp_path.glob('sim*')))}"
    res = CliRunner().invoke(main, ["simulate", *args, "--out", str(out), "--json", "--no-plots"])
    assert res.exit_code == 0, res.output[-3000:]
    return json.loads((out / "results.json").read_text())


def outcomes(doc: dict, policy: str = "cellsched") -> dict[str, dict]:
    return {j["job_id"]: j for j in doc["runs"][policy]["jobs"]}


def test_version_is_the_package_version():
    """--version prints the version of pyproject.toml and the installed metadata."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert importlib.metadata.version("cellsched") == version
    proc = cellsched("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"cellsched, version {version}\n"


def test_controller_backend_overrides_the_config(tmp_path):
    """--backend beats the config's backend; unknown or unusable backends are one-line errors (exit 2)."""
    state = tmp_path / "state.sqlite"
    config = tmp_path / "c.toml"
    config.write_text(
        f'[controller]\nbackend = "bogus"\nstate_path = "{state}"\nkick_file = ""\n'
        '[metrics]\nport = 0\n[log]\nformat = "json"\n'
    )
    proc = cellsched("controller", "run", "--once", "--config", str(config))
    assert proc.returncode == 2 and "unknown backend 'bogus'; choose one of: auto, cli, pyslurm, sim" in proc.stderr
    proc = cellsched("controller", "run", "--once", "--config", str(config), "--backend", "sim")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["status"], report["num_jobs"], report["dry_run"], report["round_id"]) == ("ok", 0, False, 1)
    with sqlite3.connect(state) as db:  # the round went through the simulated Slurm into the state
        assert db.execute("SELECT status FROM rounds").fetchall() == [("ok",)]
    proc = cellsched("controller", "run", "--once", "--config", str(config), "--backend", "pyslurm")
    try:
        import pyslurm  # noqa: F401
    except ImportError:
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (
            "cellsched controller: error: needs pyslurm built for this Slurm; "
            "install it with: pip install 'cellsched[pyslurm]'\n"
        )
        assert "Traceback" not in proc.stderr
    proc = cellsched("plan", "--config", str(config))
    assert proc.returncode == 2 and "unknown backend 'bogus'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_simulate_docs_example_verbatim(tmp_path):
    """docs/simulator.md's `cellsched simulate` example, run as written (only --out moved): 150 jobs, both policies."""
    page = (ROOT / "docs" / "simulator.md").read_text().splitlines()
    line = next(ln.strip() for ln in page if ln.strip().startswith("cellsched simulate --arena-compat --limit-jobs"))
    args = shlex.split(line)[1:]
    args[args.index("--out") + 1] = str(tmp_path / "sim")
    proc = cellsched(*args, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout.splitlines()
    assert table[0].startswith("| policy | finished | avg JCT s |")
    assert any(r.startswith("| cellsched | 150/150 |") for r in table) and any(
        r.startswith("| fcfs | 150/150 |") for r in table
    )
    doc = json.loads((tmp_path / "sim" / "results.json").read_text())
    assert (doc["meta"]["jobs"], doc["meta"]["gpus"], doc["meta"]["mode"]) == (150, 1280, "arena-compat")
    for policy in ("cellsched", "fcfs"):
        assert all(j["finished"] and j["jct"] % 300 == 0 for j in doc["runs"][policy]["jobs"])  # 300 s rounds
    assert all((tmp_path / "sim" / png).stat().st_size > 0 for png in ("jct_cdf.png", "throughput.png"))


def test_simulate_sacct_trace(tmp_path):
    """--trace-format sacct replays the GPU jobs of a `sacct -P` export by their JobIDs and submit offsets."""
    res = CliRunner().invoke(main, ["simulate", "--trace-format", "sacct", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "--trace is required with --trace-format sacct" in res.output
    store = tmp_path / "profiles.sqlite"
    open_store(store).close()  # the default model of unmanaged sacct jobs (gpt-1.3b) is priced by the store
    doc = simulate(
        tmp_path,
        "--trace",
        str(SACCT),
        "--trace-format",
        "sacct",
        "--cluster",
        str(ADMIN / "sim-cluster.toml"),
        "--profiles",
        str(store),
        "--policy",
        "cellsched",
    )
    assert doc["meta"]["trace_format"] == "sacct" and doc["meta"]["jobs"] == 3
    jobs = outcomes(doc)
    assert list(jobs) == ["102", "101", "106"]  # steps, CPU-only, unstarted and running jobs left out
    assert [jobs[j]["submit_time"] for j in jobs] == [0.0, 60.0, 3060.0]
    assert all(j["finished"] for j in jobs.values()) and doc["runs"]["cellsched"]["meta"]["not_submitted"] == {}


def test_simulate_limit_jobs_max_time_and_seed(tmp_path):
    """--limit-jobs N simulates the first N arrivals; --seed reaches the solver and repeats exactly;
    --max-time stops the clock so only the jobs done by then finish."""
    with open(shipped_path(TRACE_FILE), newline="") as fh:
        rows = sorted(csv.DictReader(fh), key=lambda r: int(r["submission_time"]))
    first5 = [r["job_id"] for r in rows[:5]]
    full = simulate(tmp_path, "--limit-jobs", "5", "--seed", "7", "--policy", "cellsched")
    run = full["runs"]["cellsched"]
    assert list(outcomes(full)) == first5 and full["meta"]["jobs"] == 5
    assert run["meta"]["options"]["seed"] == run["meta"]["solver"]["seed"] == 7  # the seed the rounds ran with
    assert all(j["finished"] for j in run["jobs"])
    again = simulate(tmp_path, "--limit-jobs", "5", "--seed", "7", "--policy", "cellsched")
    assert again["runs"]["cellsched"]["jobs"] == run["jobs"]

    t0 = min(j["submit_time"] for j in run["jobs"])
    ends = sorted(j["end_time"] - t0 for j in run["jobs"])
    limit = (ends[1] + ends[2]) / 2  # two jobs end before it, three after
    cut = simulate(tmp_path, "--limit-jobs", "5", "--seed", "7", "--policy", "cellsched", "--max-time", str(limit))
    done = {k for k, j in outcomes(cut).items() if j["finished"]}
    assert done == {k for k, j in outcomes(full).items() if j["end_time"] - t0 <= limit} and len(done) == 2
    assert all(outcomes(cut)[k]["end_time"] == outcomes(full)[k]["end_time"] for k in done)
    assert cut["runs"]["cellsched"]["meta"]["simulated_s"] <= limit
    assert cut["summary"]["cellsched"]["jobs_finished"] == 2


def test_profile_no_comm(tmp_path):
    """`cellsched profile --no-comm` (the plugged-in command) stores layer records and no comm curves."""
    db = tmp_path / "p.sqlite"
    # --comm first, then --no-comm (the last one wins): were --no-comm ignored, comm would be profiled
    proc = cellsched(
        "profile",
        "--model",
        "gpt-tiny",
        "--tp",
        "1,2",
        "--micro-batch",
        "1",
        "--comm",
        "--no-comm",
        "--comm-ranks",
        "2",
        "--warmup",
        "0",
        "--repeat",
        "1",
        "--threads",
        "1",
        "--db",
        str(db),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == f"profiled gpt-tiny on cpu (12 layer records) into {db}"
    assert [ln.split()[:2] for ln in lines[1:]] == [["tp=1", "micro_batch=1"], ["tp=2", "micro_batch=1"]]
    assert not any("link=" in ln for ln in lines)
    with open_store(db) as store:
        counts = store.counts()
    assert counts["layers"] == 12 and counts["comm"] == 0
