"""State rebuilt from Slurm, on the real dev cluster: an elastic job of the
reference trainer grows (a move); the controller "dies" (Killed: nothing
catches it, as with SIGKILL, and it makes no further Slurm call) right
after it signalled the job to checkpoint, or right after it requeued the
checkpointed job held; its state file is deleted. A fresh controller on an
EMPTY state file takes over from the jobs' AdminComments: it finishes the
move (asks a job still running to checkpoint once more, which it does
once; never cancels it, releases it once) and the job completes, each
training step run once.

The simulated version, every step of a move: test_rebuild_unit.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from controller_support import (
    Killed,
    find_job,
    job_env,
    log_lines,
    start_blocker,
    start_daemon,
    stop,
    wait_job_state,
    wait_until,
    write_config,
)
from test_elastic_slurm import STEPS, _controller, _steps_done, _submit_elastic
from test_rebuild_unit import Recorder

from slurm_ext.backends import get_backend
from solver import contract

pytestmark = pytest.mark.slurm


#: the kill point on real Slurm: mid-checkpoint, the hardest (a second request must not checkpoint the job
#: twice, and the fresh controller must not take it for lost); after the requeue, and every other step, on
#: the simulated Slurm (test_rebuild_unit.py), which keeps this suite's time down
@pytest.mark.parametrize("dies_after", ["signal"])
def test_a_fresh_controller_on_an_empty_state_finishes_a_move_cut_short(slurm_cluster, tmp_path, dies_after):
    backend = get_backend("cli")
    blocker = start_blocker("n5", "a40", 2)
    wait_job_state(backend, blocker, ("RUNNING",), 30, tmp_path)
    job = _submit_elastic(tmp_path, "--gpu-types", "a40", "--min-gpus", "2", step_delay=0.2)
    calls: Counter = Counter()
    (tmp_path / "first").mkdir()
    (tmp_path / "fresh").mkdir()
    first = _controller(tmp_path / "first", checkpoint_wait_s=60.0, checkpoint_poll_s=0.3)
    first.backend = Recorder(backend, calls=calls)
    assert first.round().placements[job]["cell"] == "a40:1x2:pp1"
    wait_job_state(backend, job, ("RUNNING",), 60, tmp_path)
    wait_until(lambda: _steps_done(backend, job) >= 3, 60, "three steps on two GPUs")
    first.round()  # sees the job train: it may be moved from now on

    subprocess.run(["scancel", blocker], env=job_env(), check=True, timeout=30)
    wait_until(
        lambda: find_job(backend, blocker) is None or find_job(backend, blocker).finished, 30, "the blocker to end"
    )
    first.backend = Recorder(backend, (dies_after, job), calls)
    with pytest.raises(Killed):
        first.round()  # the move: its Step written, signalled (, checkpointed, requeued held) ... killed
    first.state.close()
    assert calls[("signal", job)] == 1
    shown = find_job(backend, job)
    assert contract.admin_comment_step(shown.admin_comment).step == contract.SIGNALLED
    if dies_after == "requeue_many":
        assert shown.held and shown.state == "PENDING"
    for f in (tmp_path / "first").glob("state.sqlite*"):
        f.unlink()  # the state is lost

    fresh = _controller(tmp_path / "fresh", checkpoint_wait_s=60.0, checkpoint_poll_s=0.3)
    fresh.backend = Recorder(backend, calls=calls)

    acted: list[dict] = []  # the fresh controller's actions on the job, for a failure's message

    def completed() -> bool:  # FAILED with exit 75 is its checkpoint, not its end: the next round requeues it
        acted.extend(a for a in fresh.round().actions if a["job"] == job)
        j = find_job(backend, job)
        checkpointed = j is not None and j.state == "FAILED" and j.exit_code == contract.EXIT_CHECKPOINTED
        return j is not None and j.state in ("COMPLETED", "FAILED", "CANCELLED") and not checkpointed

    wait_until(completed, 300, f"job {job} to end", interval=0.5)
    done = find_job(backend, job)
    assert done.state == "COMPLETED", done
    # asked once more when still running as the fresh controller took over: the job checkpoints once anyway
    assert calls[("signal", job)] in (1, 2)
    assert calls[("requeue_many", job)] == 1, acted  # the move's one restart
    assert calls[("release_many", job)] == 2, acted  # its first placement and the move
    assert not any(name == "cancel" for name, _ in calls)
    assert [e["cell"] for e in fresh.state.history(job) if e["event"] == "placed"] == ["a40:2x2:pp1"]
    assert fresh.state.open_plans() == {}
    out = json.loads((tmp_path / "losses.json").read_text())
    assert out["steps"] == list(range(1, STEPS + 1)), "a step was trained twice (or not at all)"
    fresh.state.close()


def test_the_standby_finishes_a_move_after_the_active_daemon_is_sigkilled_and_its_state_deleted(
    slurm_cluster, tmp_path
):
    """Two `cellsched controller run` daemons share a lease. The active one
    starts a move (a blocker leaves: the job grows from 2 to 4 A40s) and is
    SIGKILLed as soon as the job's AdminComment shows the move's signal; its
    state file is deleted. The standby takes the lease and finishes the move
    on its target, asking a job still running once more (the killed one may
    have died between the Step and the signal: under load the test's SIGKILL
    lands there), and the job completes with each training step run once."""
    backend = get_backend("cli")
    blocker = start_blocker("n5", "a40", 2)
    wait_job_state(backend, blocker, ("RUNNING",), 30, tmp_path)
    job = _submit_elastic(tmp_path, "--gpu-types", "a40", "--min-gpus", "2", step_delay=0.2)
    lease = tmp_path / "shared" / "lease"
    lease.parent.mkdir()
    names = ("a", "b")
    states = {n: tmp_path / n / "state.sqlite" for n in names}
    logs = {n: tmp_path / n / "controller.log" for n in names}
    procs: dict[str, subprocess.Popen] = {}
    for n in names:
        (tmp_path / n).mkdir()
        config = write_config(
            tmp_path / n / "c.toml",
            states[n],
            interval_s=1.5,
            lease_path=str(lease),
            lease_s=1.0,
            lease_settle_s=0.1,
            checkpoint_wait_s=60.0,
            checkpoint_poll_s=0.3,
        )
        with config.open("a") as f:
            f.write("max_pp = 1\n")  # data-parallel plans: a resize changes dp only
    try:
        for n in names:
            procs[n] = start_daemon(tmp_path / n / "c.toml", logs[n], job_env())
        wait_job_state(backend, job, ("RUNNING",), 90, tmp_path)
        wait_until(lambda: _steps_done(backend, job) >= 3, 60, "three steps on two GPUs")
        active = next(n for n in names if _placed(logs[n], job))
        standby = next(n for n in names if n != active)
        assert _placed(logs[active], job) == ["a40:1x2:pp1"]

        subprocess.run(["scancel", blocker], env=job_env(), check=True, timeout=30)

        def signalled() -> bool:
            j = find_job(backend, job)
            step = contract.admin_comment_step(j.admin_comment) if j is not None else None
            return step is not None and step.step == contract.SIGNALLED

        wait_until(signalled, 120, "the move's signal", interval=0.05)
        os.kill(procs[active].pid, signal.SIGKILL)
        procs[active].wait(timeout=30)
        for f in states[active].parent.glob("state.sqlite*"):
            f.unlink()  # the state is lost

        def ended() -> bool:  # (FAILED with exit 75 is its checkpoint: the standby requeues it)
            j = find_job(backend, job)
            return j is not None and j.state in ("COMPLETED", "CANCELLED")

        wait_until(ended, 300, f"job {job} to end", interval=0.5)
        assert find_job(backend, job).state == "COMPLETED", find_job(backend, job)
        # the standby finishes the move once (from the AdminComment's Step while the job checkpoints, or
        # from its checkpoint once it has: whichever it finds); it starts no move of its own
        assert _placed(logs[standby], job) == ["a40:2x2:pp1"]
        standby_msgs = [ln["msg"] for ln in log_lines(logs[standby])]
        assert "asked to checkpoint" not in standby_msgs
        assert standby_msgs.count("asked to checkpoint again") <= 1
        assert _placed(logs[active], job) == ["a40:1x2:pp1"]
        out = json.loads((tmp_path / "losses.json").read_text())
        assert out["steps"] == list(range(1, STEPS + 1)), "a step was trained twice (or not at all)"
    finally:
        for p in procs.values():
            stop(p)
    for n in names:
        assert "Traceback" not in logs[n].read_text(), logs[n].read_text()[-3000:]


def _placed(log: Path, job: str) -> list[str]:
    """The cells the controller logging to `log` placed `job` in, in order."""
    return [ln["cell"] for ln in log_lines(log) if ln["msg"] == "placed" and ln["job"] == job]
