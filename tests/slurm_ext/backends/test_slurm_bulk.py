"""Many jobs per call through the CLI backend on the real dev cluster:
updates fed to one scontrol (and the ones that go alone), one read-back,
list-taking hold / release / requeue, and each job's failure kept to itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_ext.backends.base import JobUpdate, SlurmCommandError, SubmitRequest, UpdateNotApplied
from slurm_ext.backends.cli import _stdin_line, _update_args

pytestmark = pytest.mark.slurm

#: AdminComments a user's spec could make: each must come back byte for byte
HOSTILE = (
    '{"name":"it\'s\\"quoted\\"\\\\#!$(id)`x`;"}',
    '{"name":"unbalanced \\" JobId=1 Partition=x"}',  # blanks: cannot be fed, goes alone
    '"odd',
)


@pytest.fixture
def backend(contract_backend):
    return contract_backend


@pytest.fixture
def held(backend, tmp_path: Path):
    """submit(n, later=False) -> n held jobs (`later`: that may not start for an
    hour, so they stay pending once released); all cancelled after the test."""
    ids: list[str] = []
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsleep 30\n")

    def submit(n: int, later: bool = False) -> list[str]:
        req = SubmitRequest(
            script=str(script),
            gres_per_node=1,
            nodes=1,
            hold=True,
            output="/dev/null",
            extra_args=("--begin=now+3600",) if later else (),
        )
        new = [backend.submit(req) for _ in range(n)]
        ids.extend(new)
        return new

    yield submit
    for job_id in ids:
        backend.cancel(job_id)


def test_updates_of_many_jobs_are_applied_read_back_and_fail_alone(backend, held):
    a, b, c, d, gone = held(5)
    backend.cancel(gone)
    changes = {
        a: JobUpdate(partition="a100", features="a100", num_nodes=1, req_nodes=("n1",), gres_per_node=2,
                     num_tasks=2, tasks_per_node=2, min_cpus_per_node=2, admin_comment=HOSTILE[0]),
        b: JobUpdate(partition="v100", features="v100", admin_comment=HOSTILE[1]),
        c: JobUpdate(partition="nope", admin_comment=HOSTILE[2]),
        d: JobUpdate(partition="a40", req_nodes=("n1",)),  # n1 is not in a40: Slurm takes it, it could never start
        gone: JobUpdate(admin_comment="{}"),
    }  # fmt: skip
    assert _stdin_line(_update_args(a, changes[a])) and _stdin_line(_update_args(b, changes[b])) is None
    out = backend.update_many(changes)
    assert not isinstance(out[a], Exception) and not isinstance(out[b], Exception), out
    assert (out[a].partition, out[a].required_nodes, out[a].gpus_per_node, out[a].admin_comment) == (
        "a100", ("n1",), 2, HOSTILE[0],
    )  # fmt: skip
    assert (out[b].partition, out[b].admin_comment) == ("v100", HOSTILE[1])
    assert isinstance(out[c], UpdateNotApplied) and "Invalid partition name specified" in str(out[c])  # its own
    assert isinstance(out[d], UpdateNotApplied) and "req_nodes" in str(out[d])
    assert isinstance(out[gone], SlurmCommandError | UpdateNotApplied)


def test_hold_release_and_requeue_take_lists_and_name_the_job_that_failed(backend, held, wait_until, wait_job_state):
    a, b, gone = held(3, later=True)
    backend.cancel(gone)
    assert backend.release_many([a, b, gone]).keys() == {gone}
    snap = backend.observe()
    assert [(snap.job(j).state, snap.job(j).held) for j in (a, b)] == [("PENDING", False)] * 2
    assert backend.hold_many([a, gone, b]).keys() == {gone}
    snap = backend.observe()
    assert [(snap.job(j).state, snap.job(j).held) for j in (a, b)] == [("PENDING", True)] * 2
    (c,) = held(1)
    backend.release_many([c])
    wait_job_state(backend, c, "RUNNING", timeout=60)
    failed = backend.requeue_many([c, "999999"], hold=True)  # Slurm no longer knows job 999999
    assert failed.keys() == {"999999"} and isinstance(failed["999999"], SlurmCommandError)
    wait_until(lambda: backend.job(c).held and backend.job(c).pending, timeout=60, what="the job requeued held")
    assert backend.release_many([]) == {} and backend.update_many({}) == {}
