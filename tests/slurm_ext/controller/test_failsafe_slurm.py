"""The fail-safe on the real dev cluster: with no controller round for
`--after` seconds, `cellsched failsafe` releases the held managed jobs on their
static request and they complete; the job held again by its user after the
controller released it, and the job whose spec cannot be parsed, stay held.
Once a controller completes rounds again, the fail-safe stands down, and a
`--once` check does nothing and says so. Every wait is for an event (a job's
state, a completion, a log line)."""

from __future__ import annotations

import json
import subprocess

import pytest
from controller_support import DEMO_JOB, log_lines, stop, submit_managed, write_config
from support import console_script, wait_for

from slurm_ext.backends import SubmitRequest, get_backend

pytestmark = pytest.mark.slurm


def cs(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([console_script(), *args], capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"cellsched {' '.join(args)}: {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc


def test_failsafe_releases_held_jobs_without_a_controller_and_stands_down_when_one_is_back(slurm_cluster, tmp_path):
    backend = get_backend("cli")
    state = tmp_path / "state.sqlite"
    config = str(write_config(tmp_path / "c.toml", state))
    done = tmp_path / "done"
    done.touch()

    # a job the controller released, then held again by its user: never the fail-safe's to release
    mine = submit_managed("gpt-350m", tmp_path, done_file=tmp_path / "mine-done", sleep=600)
    cs("controller", "run", "--once", "--config", config)
    wait_for(lambda: backend.job(mine).state == "RUNNING", timeout=60, what=f"job {mine} to run")
    subprocess.run(["scontrol", "requeuehold", mine], check=True, capture_output=True, timeout=30)
    wait_for(lambda: backend.job(mine).held and backend.job(mine).pending, timeout=60, what=f"job {mine} held")

    # the controller is gone from here on; two jobs wait for it, and one whose spec cannot be parsed
    jobs = [submit_managed("gpt-350m", tmp_path, done_file=done, sleep=1) for _ in range(2)]
    bad = backend.submit(
        SubmitRequest(script=str(DEMO_JOB), hold=True, comment="cellsched/v1 {oops", output=str(tmp_path / "%j.out"))
    )
    log = tmp_path / "failsafe.log"
    with open(log, "w") as err:
        fs = subprocess.Popen(
            [console_script(), "failsafe", "--config", config, "--after", "3", "--interval", "0.5"],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    ctl = None
    try:
        wait_for(lambda: sorted(done.read_text().split()) == sorted(jobs), timeout=180, what=f"jobs {jobs} to complete")
        lines = log_lines(log)
        released = [ln for ln in lines if ln["msg"] == "released on its static request"]
        assert sorted(ln["job"] for ln in released) == sorted(jobs), lines
        assert all(ln["why"].startswith("no controller round has completed for ") for ln in released), released
        assert all(ln["cell"] == "a100:1x1:pp1" and ln["partition"] == "a100" for ln in released), released
        left = {ln["job"]: ln["why"] for ln in lines if ln["msg"] == "left held"}
        assert left[mine].startswith("held again after cellsched released it"), left
        assert left[bad].startswith("its spec cannot be used (bad spec: "), left
        for job_id in jobs:
            assert backend.job(job_id).state == "COMPLETED"
        assert backend.job(mine).held and backend.job(bad).held

        # a controller is back: the running fail-safe stands down, and a check says so
        with open(tmp_path / "controller.log", "w") as err:
            ctl = subprocess.Popen(
                [console_script(), "controller", "run", "--config", config, "--interval", "0.5"],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        wait_for(
            lambda: (
                [ln["msg"] for ln in log_lines(log) if ln["msg"] in ("acting", "standing down")][-1:]
                == ["standing down"]
            ),
            timeout=120,
            what="the running fail-safe to stand down",
        )
        once = json.loads(cs("failsafe", "--once", "--config", config, "--after", "10").stdout)
        assert not once["acted"] and once["why"].endswith("standing down") and once["released"] == [], once
        assert backend.job(mine).held and backend.job(bad).held
    finally:
        stop(fs)
        if ctl is not None:
            stop(ctl)
    assert "Traceback" not in log.read_text()
