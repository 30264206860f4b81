"""`cellsched simulate` end to end: a small Arena-format trace on a small
cluster with the shipped Arena profiles, two policies, through the real
command (a subprocess of this interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
#: a small Arena-format trace and a small cluster of three GPU types
TRACE = (DATA / "small_trace.csv").read_text()
CLUSTER = (DATA / "small_cluster.toml").read_text()


def cellsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurm_ext", "simulate", *args], capture_output=True, text=True, timeout=600, check=False
    )


def inputs(tmp_path: Path) -> tuple[Path, Path]:
    trace, cluster = tmp_path / "trace.csv", tmp_path / "cluster.toml"
    trace.write_text(TRACE)
    cluster.write_text(CLUSTER)
    return trace, cluster


def test_two_policies_end_to_end(tmp_path):
    trace, cluster = inputs(tmp_path)
    out = tmp_path / "out"
    proc = cellsched(
        "--trace",
        str(trace),
        "--cluster",
        str(cluster),
        "--policy",
        "fcfs",
        "--policy",
        "cellsched",
        "--out",
        str(out),
        "--json",
        "--workers",
        "2",
        "--interval",
        "30",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout)
    assert set(printed["summary"]) == {"fcfs", "cellsched"}
    assert {"results.json", "results.md", "jct_cdf.png"} <= set(printed["files"])
    for name in printed["files"]:
        assert (out / name).stat().st_size > 0
    doc = json.loads((out / "results.json").read_text())
    for policy in ("fcfs", "cellsched"):
        jobs = doc["runs"][policy]["jobs"]
        assert sorted(j["job_id"] for j in jobs) == ["j1", "j2", "j3", "j4", "j5", "j6"]
        assert all(j["finished"] and j["end_time"] > j["submit_time"] for j in jobs), jobs
        assert doc["runs"][policy]["meta"]["infeasible_starts"] == 0
    # fcfs runs every job on exactly its request
    fcfs = {j["job_id"]: j["cells"] for j in doc["runs"]["fcfs"]["jobs"]}
    assert fcfs["j1"] == ["v100:1x1"] and fcfs["j2"] == ["a40:2x2"]
    assert "jobs finished" in proc.stderr  # the plain-text progress lines (stderr is not a tty)


def test_realistic_mode_and_policy_options(tmp_path):
    """--realistic sets every condition for every run; a --policy string with
    solver keys labels its run and sets that run's configuration only."""
    trace, cluster = inputs(tmp_path)
    out = tmp_path / "out"
    args = ["--trace", str(trace), "--cluster", str(cluster), "--realistic", "--noise", "0.2", "--no-plots"]
    proc = cellsched(
        *args, "--policy", "cellsched", "--policy", "cellsched:calibrate=false,w_age=0.5", "--out", str(out), "--json"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout)
    assert printed["meta"]["mode"] == "realistic" and printed["meta"]["estimates"] == "arena-estimated"
    assert printed["meta"]["noise_sigma"] == 0.2 and "model" in printed["meta"]["restart"]
    doc = json.loads((out / "results.json").read_text())
    assert set(doc["runs"]) == {"cellsched", "cellsched:calibrate=false,w_age=0.5"}
    plain, opts = doc["runs"]["cellsched"]["meta"], doc["runs"]["cellsched:calibrate=false,w_age=0.5"]["meta"]
    assert (plain["solver"]["calibrate"], plain["solver"]["w_age"]) == (True, 0.25)
    assert (opts["solver"]["calibrate"], opts["solver"]["w_age"], opts["policy"]) == (False, 0.5, "cellsched")
    for run in doc["runs"].values():
        assert all(j["finished"] for j in run["jobs"])


def test_arena_compat_markdown(tmp_path):
    trace, cluster = inputs(tmp_path)
    proc = cellsched(
        "--trace",
        str(trace),
        "--cluster",
        str(cluster),
        "--policy",
        "fcfs",
        "--arena-compat",
        "--out",
        str(tmp_path / "o"),
        "--no-plots",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("| policy |") and "| fcfs | 6/6 |" in proc.stdout
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    assert all(j["end_time"] % 300 == 100 % 300 for j in doc["runs"]["fcfs"]["jobs"])  # round grid from t=100
    assert not (tmp_path / "o" / "jct_cdf.png").exists()


@pytest.mark.slow
def test_bad_inputs_exit_2_with_one_line(tmp_path):
    trace, cluster = inputs(tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_text(TRACE.replace("j3,400,2000", "j3,soon,2000"))
    cases = [
        (("--trace", str(bad), "--cluster", str(cluster)), "bad.csv:4: field 'submission_time'"),
        (("--trace", str(trace), "--cluster", str(tmp_path / "none.toml")), "--cluster"),
        (("--trace", str(trace), "--policy", "lottery"), "unknown policy 'lottery'"),
        (("--trace", str(trace), "--profiles", str(trace)), "--profiles"),
        (("--trace", str(trace), "--arena-compat", "--interval", "60"), "300"),
        (("--trace", str(trace), "--policy", "cellsched:calibrat=false"), "unknown solver key 'calibrat'"),
        (("--trace", str(trace), "--policy", "cellsched:calibrate=maybe"), "solver.calibrate must be true or false"),
        (("--trace", str(trace), "--policy", "sia:w_age"), "expected key=value, got 'w_age'"),
        (("--trace", str(trace), "--policy", "sia", "--policy", "sia"), "given twice"),
        (("--trace", str(trace), "--realistic", "--arena-compat"), "--realistic"),
        (("--trace", str(trace), "--contention", "--arena-compat"), "--contention"),
        (("--trace", str(trace), "--restart-cost", "soon"), "--restart-cost"),
        (("--trace", str(trace), "--truth", str(tmp_path / "nope.json")), "--truth"),
    ]
    for args, words in cases:
        proc = cellsched(*args, "--out", str(tmp_path / "x"))
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.startswith("cellsched simulate: error:") and words in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_help_explains_the_defaults():
    proc = cellsched("--help")
    assert (
        proc.returncode == 0
        and "Philly" in proc.stdout
        and "--arena-compat" in proc.stdout
        and "srsf-accept" in "".join(proc.stdout.split())  # click may wrap at the hyphen
    )


def test_string_solver_keys_in_policy_options():
    from slurm_ext.cli.simulate_cmd import SimulateError, parse_policies
    from solver.types import SolverConfig

    ((label, name, cfg),) = parse_policies(["ada-srsf:node_placement=first-fit"], SolverConfig())
    assert (label, name, cfg.node_placement) == ("ada-srsf:node_placement=first-fit", "ada-srsf", "first-fit")
    assert parse_policies(["srsf-avoid"], SolverConfig())[0][2].node_placement == "lwf-kappa"
    for bad in ("srsf-accept:node_placement=best-fit", "srsf-accept:node_placement=2"):
        with pytest.raises(SimulateError, match="node_placement"):
            parse_policies([bad], SolverConfig())


def test_checkpoint_dir_is_left_empty_by_a_finished_run_and_guards_its_runs(tmp_path):
    """--checkpoint-dir: a run that ends leaves no checkpoint; a checkpoint
    there of another run under the same label is refused with its name, and
    kept."""
    trace, cluster = inputs(tmp_path)
    ckpts = tmp_path / "ckpt"
    base = ["--trace", str(trace), "--cluster", str(cluster), "--no-plots", "--json", "--checkpoint-dir", str(ckpts)]
    proc = cellsched(*base, "--policy", "fcfs", "--out", str(tmp_path / "a"), "--checkpoint-every", "0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ckpts.is_dir() and list(ckpts.iterdir()) == []
    from slurm_ext.sim.checkpoint import save

    save(ckpts / "fcfs.ckpt", "fcfs:0123456789abcdef", None)  # another trace's fcfs run
    proc = cellsched(*base, "--policy", "fcfs", "--out", str(tmp_path / "b"))
    assert proc.returncode == 2 and "fcfs.ckpt holds another run" in proc.stderr
    assert (ckpts / "fcfs.ckpt").exists()
