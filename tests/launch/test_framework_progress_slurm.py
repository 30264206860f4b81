"""torchtitan and Megatron jobs on the dev cluster report progress from their
own step lines, and so become elastic: submitted with ``cellsched sbatch
--runtime megatron|torchtitan --elastic``, run by ``srun cellsched-launch``,
whose task that prints the framework's steps reads them into progress.json.
The controller sees the job's iterations and its speed (``cellsched
status``), calibrates on it, and grows it from 2 to 4 GPUs when a blocker
leaves (signal, the framework's save, exit 75, requeue, resume).

The frameworks cannot train on CPU (docs/runtime-torchtitan.md,
docs/runtime-megatron.md): the job runs the stand-in of
tests/launch/framework_logs.py, which prints the framework's step lines (their
recorded formats, from the ranks that print them) at a fixed pace and keeps
the framework's checkpoint contract."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm_ext" / "controller"))  # controller_support

from controller_support import (
    end_blocker,
    fast_job_controller,
    job_logs,
    job_progress,
    status_row,
    submit_training,
    wait_job_state,
    wait_until,
)

from slurm_ext.controller.progress import read_progress_file

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STAND_IN = Path(__file__).resolve().parent / "framework_logs.py"
#: the steps the stand-in runs: 60 s at its pace, so that it still runs when the blocker has left on a loaded
#: machine (at 70 steps it had finished, or nearly, by the round that should grow it)
STEPS = 240
#: seconds per iteration the stand-in keeps
PACE = 0.25
#: the iterations the spec names (a long job: growing it pays)
ITERATIONS = 200000


@pytest.mark.parametrize(("framework", "log_every"), [("megatron", 2), ("torchtitan", 1)])
def test_framework_job_reports_progress_is_calibrated_and_grown(slurm_cluster, tmp_path, framework, log_every):
    started = time.monotonic()
    # scheduled as a gpt-350m, the stand-in runs many times faster than estimated: more than the default
    # 10 times, beyond which the controller stops believing its progress file
    config, ctl, backend, blocker = fast_job_controller(tmp_path)
    train = [str(STAND_IN), framework, "--steps", str(STEPS), "--pace", str(PACE)]
    train += ["--log-interval", str(log_every), "--runs", str(tmp_path / "runs.jsonl")]
    sbatch = ["--runtime", framework, "--model", "gpt-350m", "--global-batch", "64", "--iterations", str(ITERATIONS)]
    job = submit_training(tmp_path, train, [*sbatch, "--elastic", "--gpu-types", "a40", "--min-gpus", "2"])

    first = ctl.round()
    assert first.placements[job]["cell"].startswith("a40:1x2"), first.placements
    wait_job_state(backend, job, ("RUNNING",), 60, tmp_path)
    # Megatron's own time is believed from its third line of a run on (iteration 4 at two a line)
    seen = wait_until(
        lambda: (p := job_progress(backend, job)) is not None and p.iterations_done >= 8 and p.iter_time_s and p,
        60,
        f"{framework}'s step lines read into progress.json",
    )
    assert seen.first_step_at is not None

    ctl.round()  # the running job's report: its progress, and its speed into the calibration
    row = status_row(config, job)
    assert row["progress_source"] == "file" and row["iterations_done"] >= 8, row
    assert row["progress"] == f"{int(row['iterations_done'])}/{ITERATIONS}", row  # its own count, not "~"
    assert row["iter_s_observed"] == pytest.approx(PACE, rel=0.15), row
    assert row["iter_s_estimated"] and row["iter_s_profile"], row

    end_blocker(backend, blocker)
    grown_at = time.time()
    grow = ctl.round()
    moves = [a for a in grow.actions if a["job"] == job]
    assert moves and moves[0]["kind"] == "move" and moves[0]["ok"], (grow.actions, grow.jobs)
    assert grow.placements[job]["cell"].startswith("a40:2x2"), grow.placements
    plan = json.loads(ctl.state.plans_of(job)[-1].plan)
    assert plan["runtime"] == framework and plan["dp"] * plan.get("tp", 1) * plan.get("pp", 1) == 4, plan

    # the grown run: its launcher reads the steps afresh (a new first step), resuming from the checkpoint
    wait_until(
        lambda: (p := job_progress(backend, job)) is not None and (p.first_step_at or 0) > grown_at,
        120,
        "the grown run's first step",
    )
    done = wait_job_state(backend, job, ("COMPLETED", "FAILED"), 120, tmp_path)
    assert done.state == "COMPLETED", job_logs(tmp_path)
    end = ctl.round()
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    # only the grown run reaches the end (the first stopped on the signal): it resumed from its checkpoint
    assert len(runs) == 1 and runs[0]["world_size"] == 4 and seen.iterations_done <= runs[0]["start"] < STEPS, runs
    assert runs[0]["end"] == STEPS
    final = read_progress_file(plan["checkpoint_dir"])
    assert final is not None and final.iterations_done == STEPS  # the last line, written as the child ended
    events = [e["event"] for e in ctl.state.history(job) if e["event"] != "trained"]
    assert events[:2] == ["placed", "signalled"] and events[-1] == "finished", events
    assert not end.error, end.error
    took = time.monotonic() - started
    print(f"{framework}: {took:.0f} s; {row['iter_s_observed']} s/it observed, {row['iter_s_profile']} estimated")
