"""Controller rounds place, move and re-place a managed job on the real dev
cluster, whichever Slurm release runs it (the suite runs this file on 22.05
and, through `devcluster.sh exec`, on 24.11), with no training framework.

A scripted policy says where the job goes (the controller does the rest:
update, release; for the move the signal, then, as the script does not stop on
it, the requeue after checkpoint_timeout_s, update, release): on
2 GPUs of one a100 node, then grown to 4 GPUs over both a100 nodes; then the
node it runs on fails (set DOWN and kept drained), Slurm requeues the job,
and the next round places it on the v100 node, where it completes. The job
is a shell script that writes each run's node list and Slurm restart count,
then waits for the test to let it finish, so each run is seen where it ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from controller_support import round_placing, wait_until, write_config

from slurm_ext.backends import get_backend
from slurm_ext.config import load
from slurm_ext.controller.inputs import admin_comment_plan
from slurm_ext.controller.round import Controller
from solver.types import Cell, ParallelPlan, Placement, ScheduleReply, SolverStatus

pytestmark = pytest.mark.slurm

#: where each round puts the job: (cell, nodes with their GPUs, plan, partition)
PLACES = (
    (Cell("a100", 1, 2), (("n1", 2),), ParallelPlan(pp=1, dp=2, tp=1), "a100"),
    (Cell("a100", 2, 2), (("n1", 2), ("n2", 2)), ParallelPlan(pp=1, dp=4, tp=1), "a100"),
    (Cell("v100", 1, 4), (("n3", 4),), ParallelPlan(pp=1, dp=4, tp=1), "v100"),
)


class Scripted:
    """A policy that puts every job where the test says (``self.at``)."""

    name = "scripted"

    def __init__(self) -> None:
        self.at = 0

    def schedule(self, request, estimator):
        cell, nodes, plan, partition = PLACES[self.at]
        placements = {
            j.job_id: Placement(j.job_id, cell, nodes, plan, iter_time_s=5.0, partition=partition) for j in request.jobs
        }
        return ScheduleReply(placements, SolverStatus.FEASIBLE)


def _submit(tmp_path: Path) -> str:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f'echo "${{SLURM_RESTART_COUNT:-0}} $SLURM_JOB_NODELIST $SLURM_JOB_NUM_NODES" >>{tmp_path}/runs.txt\n'
        f"while [ ! -e {tmp_path}/finish ]; do sleep 0.2; done\n"
    )
    script.chmod(0o755)
    argv = [sys.executable, "-m", "slurm_ext", "sbatch", "--parsable", "--runtime", "exact", "--elastic"]
    argv += ["--model", "gpt-350m", "--global-batch", "16", "--iterations", "10", "--gpu-types", "a100,v100"]
    argv += ["-o", str(tmp_path / "job-%j.out"), "--", str(script)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_JOB", "SLURM_STEP", "CELLSCHED_"))}
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def _runs(tmp_path: Path) -> list[tuple[int, str, int]]:
    """(restart count, node list, node count) of each run so far."""
    path = tmp_path / "runs.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(r), nodes, int(n)) for r, nodes, n in (line.split() for line in lines)]


def _slurm_version() -> str:
    return subprocess.run(["sinfo", "--version"], capture_output=True, text=True, timeout=10, check=True).stdout


def test_a_round_places_moves_and_replaces_a_managed_job_that_completes(slurm_cluster, tmp_path):
    release = os.environ.get("DEVCLUSTER_SLURM")
    if release:  # the stage that asked for a release runs on it
        assert release in _slurm_version()
    policy = Scripted()
    config = write_config(
        tmp_path / "cellsched.toml", tmp_path / "state.sqlite", checkpoint_wait_s=0.5, checkpoint_timeout_s=2.0
    )
    ctl = Controller(load(config), policy=policy)
    backend = get_backend("cli")
    job = _submit(tmp_path)

    def job_now():
        return backend.job(job)

    def runs_of(count: int, rounds: bool = False) -> list[tuple[int, str, int]]:
        def seen() -> list[tuple[int, str, int]]:
            if rounds:  # the rounds that finish the move (its requeue comes after checkpoint_timeout_s)
                ctl.round()
            return _runs(tmp_path)[count:]

        try:
            return wait_until(seen, 60, f"run {count + 1} of job {job}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: runs {_runs(tmp_path)}, job now {job_now()}") from None

    placed = ctl.round()
    assert [a["kind"] for a in placed.actions if a["job"] == job] == ["place"], placed.actions
    assert runs_of(0)[0] == (0, "n1", 1)
    assert admin_comment_plan(job_now().admin_comment).dp == 2

    policy.at = 1  # grow: 4 GPUs over both a100 nodes
    moved = ctl.round()
    assert [a["kind"] for a in moved.actions if a["job"] == job] == ["move"], moved.actions
    assert runs_of(1, rounds=True)[0] == (1, "n[1-2]", 2)
    running = wait_until(lambda: (j := job_now()).state == "RUNNING" and j, 30, "the moved job to run")
    assert (running.nodes, running.gpus_per_node, admin_comment_plan(running.admin_comment).dp) == (("n1", "n2"), 2, 4)

    policy.at = 2
    env = {**os.environ}
    try:  # n2 fails: down, and kept out of service (its fake slurmd would bring it back at once)
        for state in ("DOWN", "DRAIN"):
            subprocess.run(
                ["scontrol", "update", "NodeName=n2", f"State={state}", "Reason=cellsched-test"],
                env=env,
                check=True,
                timeout=30,
            )
        wait_until(lambda: job_now().state != "RUNNING", 30, "Slurm to take the job off the failed node")
        again = round_placing(ctl, job)
        assert again.placements[job]["cell"] == "v100:1x4:pp1", again.placements
        assert runs_of(2)[0][1:] == ("n3", 1)
        (tmp_path / "finish").touch()
        done = wait_until(lambda: (j := job_now()).finished and j, 60, "the job to complete")
    finally:
        subprocess.run(["scontrol", "update", "NodeName=n2", "State=RESUME"], env=env, timeout=30, check=False)
    assert (done.state, done.exit_code, done.nodes, done.partition) == ("COMPLETED", 0, ("n3",), "v100")
    assert [r[1] for r in _runs(tmp_path)] == ["n1", "n[1-2]", "n3"]
    ctl.round()
    cells = [p.cell for p in ctl.state.plans_of(job)]
    assert [c for k, c in enumerate(cells) if not k or cells[k - 1] != c] == [c.key() for c, *_ in PLACES], cells
