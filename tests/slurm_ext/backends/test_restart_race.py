"""A requeued job restarted within the second it ended in: slurmd refuses
the new launch credential ("Job credential revoked") and the job dies. The
controller's restart (requeue held, update with `start_soon`, release) must
never start it inside that second.

Each try makes a job end just after a whole second (exit 75, as a
checkpointed job does), then restarts it at once, well inside that second.
``CELLSCHED_RACE_TRIES`` sets the number of tries (default 5; 20 for the
issue's check). With ``StartTime=now`` instead of ``start_soon`` every try
that lands in the second fails.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_ext.backends import get_backend
from slurm_ext.backends.base import JobUpdate, SlurmCommandError, SlurmUnavailable, SubmitRequest

pytestmark = pytest.mark.slurm

TRIES = int(os.environ.get("CELLSCHED_RACE_TRIES", "5"))
BODY = """#!/bin/bash
echo "run ${SLURM_RESTART_COUNT:-0}" >> "$1"
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
  python3 -c 'import time; time.sleep(1.01 - time.time() % 1)'  # end just after a whole second
  exit 75
fi
exit 0
"""


def test_a_restart_never_starts_in_the_second_its_job_ended_in(slurm_cluster, tmp_path, wait_until):
    backend = get_backend("cli", timeout=10.0)
    script = tmp_path / "job.sh"
    script.write_text(BODY)
    script.chmod(0o755)
    inside = 0
    for attempt in range(TRIES):
        runs = tmp_path / f"runs-{attempt}"
        job_id = backend.submit(
            SubmitRequest(
                script=str(script),
                script_args=(str(runs),),
                partition="a40",
                gres_per_node=1,
                nodes=1,
                output=str(tmp_path / f"{attempt}.out"),
                extra_args=("--requeue",),
            )
        )
        try:
            first = wait_until(
                lambda job_id=job_id: (lambda j: j if j is not None and j.finished else None)(backend.job(job_id)),
                timeout=60,
                what=f"job {job_id}'s first run to end",
                interval=0.01,
            )
            assert first.exit_code == 75, first
            while True:  # requeue, update and release at once, as the controller restarts a job
                try:
                    backend.requeue(job_id, hold=True)
                    break
                except SlurmCommandError:  # still completing
                    time.sleep(0.01)
            answered(lambda job_id=job_id: backend.update(job_id, JobUpdate(start_soon=True)))
            answered(lambda job_id=job_id: backend.release(job_id))
            released_at = time.time()
            ended_at = first.end_time if first.end_time is not None else released_at
            inside += math.floor(released_at) == math.floor(ended_at)
            done = wait_until(
                lambda job_id=job_id: (lambda j: j if j is not None and j.finished and j.exit_code != 75 else None)(
                    backend.job(job_id)
                ),
                timeout=60,
                what=f"job {job_id}'s second run to end",
                interval=0.1,
            )
            assert (done.state, done.exit_code) == ("COMPLETED", 0), (
                f"try {attempt}: the restarted job died ({done.state}, exit {done.exit_code}, {done.reason})"
            )
            assert Path(runs).read_text().split("\n")[:2] == ["run 0", "run 1"]
        finally:
            backend.cancel(job_id)
    print(f"\n{TRIES} restarts, {inside} released inside the second their job ended in; all completed")
    assert inside >= 1, "no try landed in the second its job ended in: the race was not exercised"


def answered(call: Callable[[], object], attempts: int = 5) -> None:
    """`call` made again while a loaded slurmctld does not take it (SlurmUnavailable:
    the client timed out or was killed by SIGPIPE), as the controller's next round would."""
    for attempt in range(1, attempts + 1):
        try:
            call()
            return
        except SlurmUnavailable:
            if attempt == attempts:
                raise
            time.sleep(0.2 * attempt)
