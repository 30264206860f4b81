"""Slurm preempts a managed job, without Slurm: the recorded outputs of a
preempted job on Slurm 22.05 and 24.11 (tests/slurm_ext/backends/data/
preemption/, its README says how they were made and what they show), read by
both parsers, and the phase and action the controller gives each state once
the job carries a plan of ours (docs/preemption.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from slurm_ext.config import Config
from slurm_ext.controller import inputs as inp
from slurm_ext.controller.reconcile import ActionKind, apply, decide
from slurm_ext.parse import json_output, scontrol_text
from slurm_ext.records import ClusterSnapshot, SlurmJob, SlurmNode, SlurmPartition
from slurm_ext.state import HistoryEvent, StateStore
from solver.contract.jobspec import JobSpec
from solver.contract.plan import JobPlan
from solver.types import Cell, ParallelPlan, Placement

DATA = Path(__file__).resolve().parents[1] / "backends" / "data" / "preemption"
SPEC = JobSpec(model="gpt-350m", global_batch=64, iterations=100, runtime="exact", gpu_types=("a40",))
PLAN = JobPlan(
    dp=4, global_batch=64, gpu_types=("a40",), nodes=("n1", "n2"), gpus_per_node=2, cell="a40:2x2:pp1", job_id=None
)
P = Placement("x", Cell("a40", 2, 2, 1), (("n1", 2), ("n2", 2)), ParallelPlan(1, 4, 1), 0.5)

#: case -> per recorded state: (base state, flags, preempted, finished, pending and not held)
STATES = {
    "22.05/grace-exit75": [
        ("RUNNING", (), False, False, False),
        ("COMPLETING", (), True, False, False),
        ("FAILED", (), True, True, False),
    ],
    "22.05/nograce-exit75": [
        ("RUNNING", (), False, False, False),
        ("COMPLETING", (), True, False, False),
        ("PENDING", (), False, False, True),
        ("PENDING", (), False, False, True),
        ("RUNNING", (), False, False, False),
    ],
    "22.05/cancel-nograce": [
        ("RUNNING", (), False, False, False),
        ("COMPLETING", (), True, False, False),
        ("PREEMPTED", (), True, True, False),
    ],
    "24.11/grace-exit75": [
        ("RUNNING", (), False, False, False),
        ("RUNNING", ("SIGNALING",), True, False, False),
        ("PENDING", (), False, False, True),
        ("PENDING", (), False, False, True),
    ],
    "24.11/grace-ignore": [
        ("RUNNING", (), False, False, False),
        ("RUNNING", (), True, False, False),
        ("PENDING", ("COMPLETING",), True, False, True),
    ],
    "24.11/nograce-exit75": [
        ("RUNNING", (), False, False, False),
        ("PENDING", (), False, False, True),
        ("RUNNING", (), False, False, False),
    ],
    "24.11/cancel-grace-exit75": [
        ("RUNNING", (), False, False, False),
        ("PREEMPTED", ("COMPLETING",), True, True, False),
        ("PREEMPTED", (), True, True, False),
    ],
    "24.11/cancel-nograce": [
        ("RUNNING", (), False, False, False),
        ("PREEMPTED", ("COMPLETING",), True, True, False),
        ("PREEMPTED", (), True, True, False),
    ],
}

#: (case, state) -> what scontrol's text showed where it differs from squeue's JSON (taken a moment later,
#: or without 24.11's flags: `PENDING,COMPLETING` is COMPLETING there)
TEXT = {
    ("22.05/grace-exit75", 1): ("FAILED", (), True, True, False),
    ("24.11/cancel-nograce", 1): ("COMPLETING", (), True, False, False),
    ("24.11/grace-ignore", 2): ("COMPLETING", (), False, False, False),
    ("22.05/nograce-exit75", 1): ("COMPLETING", (), False, False, False),  # PreemptTime=None by then
    ("24.11/grace-exit75", 1): ("RUNNING", (), True, False, False),
    ("24.11/cancel-grace-exit75", 1): ("PREEMPTED", (), True, True, False),
}

#: case -> the phase of the managed job in each recorded state (the round at the time it was taken)
PHASES = {
    "22.05/grace-exit75": ["running", "running", "checkpointed"],
    # completing, Slurm had let n2 go already: no longer on its plan's nodes (left alone, its GPUs taken)
    "22.05/nograce-exit75": ["running", "unplanned", "slurm-requeued", "slurm-requeued", "running"],
    "22.05/cancel-nograce": ["running", "running", "finished"],
    "24.11/grace-exit75": ["running", "running", "slurm-requeued", "slurm-requeued"],
    # PENDING,COMPLETING: Slurm requeues it, its processes still end (it holds its GPUs): left alone until then
    "24.11/grace-ignore": ["running", "running", "running"],
    "24.11/nograce-exit75": ["running", "slurm-requeued", "running"],
    "24.11/cancel-grace-exit75": ["running", "finished", "finished"],
    "24.11/cancel-nograce": ["running", "finished", "finished"],
}


def recorded(case: str) -> list[tuple[float, SlurmJob, SlurmJob]]:
    """(taken at, the job from squeue --json, the job from scontrol -o show job) of each recorded state."""
    d = DATA / case
    times = dict(line.split() for line in (d / "taken_at.txt").read_text().splitlines())
    out = []
    for n in sorted(times):
        (j,) = json_output.parse_jobs((d / f"{n}.squeue.json").read_text())
        (t,) = scontrol_text.parse_jobs((d / f"{n}.scontrol.txt").read_text())
        out.append((float(times[n]), j, t))
    return out


def managed(job: SlurmJob) -> SlurmJob:
    """The recorded job as a managed one placed on n1, n2 (its plan in the AdminComment)."""
    plan = dataclasses.replace(PLAN, job_id=job.job_id)
    ac = json.dumps({"spec": json.loads(SPEC.to_json()), "plan": json.loads(plan.to_json())})
    return dataclasses.replace(job, admin_comment=ac, comment=SPEC.to_comment(), user="alice")


def snapshot(job: SlurmJob, at: float) -> ClusterSnapshot:
    nodes = tuple(
        SlurmNode(name=n, gpu_type="a40", gpus_total=2, state="idle", partitions=("a40", "all")) for n in ("n1", "n2")
    )
    parts = (SlurmPartition("a40", ("n1", "n2")), SlurmPartition("all", ("n1", "n2")))
    return ClusterSnapshot(nodes=nodes, partitions=parts, jobs=(job,), taken_at=at)


@pytest.mark.parametrize("case", sorted(STATES))
def test_both_parsers_read_each_state_of_a_preempted_job(case):
    got = recorded(case)
    assert len(got) == len(STATES[case])
    for n, ((_, j, t), want) in enumerate(zip(got, STATES[case], strict=True)):
        for job, (state, flags, preempted, finished, waiting) in ((j, want), (t, TEXT.get((case, n), want))):
            assert (job.state, job.state_flags, job.preempted, job.finished, job.pending and not job.held) == (
                state,
                flags,
                preempted,
                finished,
                waiting,
            ), (case, n, job)


def test_the_preempt_time_is_slurms_and_a_requeue_resets_it():
    (_, running, _), (_, completing, _), (_, pending, _), *_ = recorded("22.05/nograce-exit75")
    assert running.preempted_at is None and completing.preempted_at == 1795935209.0
    assert pending.preempted_at is None and pending.eligible_time == 1795935220.0  # cred_expire (10 s) after
    assert pending.submit_time == 1795935209.0  # the requeue moved SubmitTime on


@pytest.mark.parametrize("case", sorted(PHASES))
def test_the_controller_sees_each_state_of_a_preempted_managed_job_in_its_phase(case):
    phases = [inp.classify(snapshot(managed(j), at), {}, {})[0].phase for at, j, _ in recorded(case)]
    assert phases == PHASES[case]


def test_a_job_slurm_requeued_is_held_at_once_and_not_placed_in_that_round():
    """Its GPUs are for the job that preempted it, which Slurm starts once
    its processes have ended: placed now, it would race that job for them."""
    at, job, _ = recorded("22.05/nograce-exit75")[3]
    snap = snapshot(managed(job), at)
    (m,) = inp.classify(snap, {}, {})
    assert m.phase == inp.Phase.SLURM_REQUEUED and m.current is None and "requeued by Slurm" in m.reason
    built = inp.build_request(snap, (m,), {}, Config().solver)
    assert built.request.jobs == ()  # not scheduled this round
    p = dataclasses.replace(P, job_id=job.job_id)
    for desired in ({}, {job.job_id: p}):
        (a,) = decide((m,), desired, built.view, "/ck", now=at)
        assert (a.kind, a.pending, a.was) == (ActionKind.REQUEUE, True, m.job.admin_comment)


class Recorder:
    """A backend that records the calls `apply` makes (only those it needs here)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def hold_many(self, ids):
        self.calls.append(("hold", tuple(ids)))
        return {}

    def requeue_many(self, ids, *, hold=False):
        self.calls.append(("requeuehold" if hold else "requeue", tuple(ids)))
        return {}

    def update_many(self, changes):
        self.calls.append(("update", tuple(changes)))
        return dict.fromkeys(changes)


def test_holding_a_job_slurm_requeued_makes_the_hold_the_controllers(tmp_path):
    """A job Slurm requeued is only held (requeuehold would fail on a pending
    job), with a "requeued" event and Step: the next round places it as its
    own, not as an operator's hold."""
    at, job, _ = recorded("24.11/grace-exit75")[3]
    (m,) = inp.classify(snapshot(managed(job), at), {}, {})
    view = inp.build_request(snapshot(m.job, at), (m,), {}, Config().solver).view
    (a,) = decide((m,), {}, view, "/ck", now=at)
    backend = Recorder()
    with StateStore(tmp_path / "s.sqlite") as st:
        st.add_history(job.job_id, HistoryEvent.PLACED, at - 50, None)
        (o,) = apply((a,), backend, st, None, clock=lambda: at)
        assert o.ok
        assert backend.calls == [("hold", (job.job_id,)), ("update", (job.job_id,))]
        assert [e["event"] for e in st.history(job.job_id)] == ["placed", "requeued"]
        assert st.released([job.job_id]) == set()


def test_a_job_slurm_preempted_is_not_moved_while_it_runs_out_its_grace_time():
    at, job, _ = recorded("22.05/grace-exit75")[1]
    running = dataclasses.replace(managed(job), state="RUNNING", nodes=("n1", "n2"))
    (m,) = inp.classify(snapshot(running, at), {}, {})
    assert m.phase == inp.Phase.RUNNING and "preempted by Slurm" in m.reason
    elastic = dataclasses.replace(m, spec=dataclasses.replace(SPEC, elastic=True))
    assert not inp.elastic_now(elastic, None, ())
    assert inp.elastic_now(dataclasses.replace(elastic, job=dataclasses.replace(running, preempted_at=None)), None, ())


def test_a_job_slurm_ended_as_preempted_is_finished_with_that_reason_even_after_a_checkpoint():
    """CANCEL: 24.11 ends a job that saved and exited 75 in its grace time
    PREEMPTED all the same; it is not requeued (the site ends preempted jobs)."""
    for case in ("24.11/cancel-grace-exit75", "22.05/cancel-nograce"):
        at, job, _ = recorded(case)[-1]
        for exit_code in (job.exit_code, 75):
            ended = dataclasses.replace(managed(job), exit_code=exit_code)
            assert not inp.checkpointed(ended)
            (m,) = inp.classify(snapshot(ended, at), {}, {})
            assert m.phase == inp.Phase.FINISHED and m.reason.startswith("preempted by Slurm (preempted"), m.reason


def test_a_job_that_checkpointed_in_its_grace_time_on_22_05_is_requeued_by_the_controller():
    at, job, _ = recorded("22.05/grace-exit75")[-1]
    (m,) = inp.classify(snapshot(managed(job), at), {}, {})
    assert (m.phase, m.job.exit_code) == (inp.Phase.CHECKPOINTED, 75)
    assert m.reason == "checkpointed on Slurm's preemption (failed, exit 75); to be requeued"


def test_a_requeue_flag_keeps_an_end_state_from_being_final():
    job = SlurmJob("1", state="PREEMPTED", state_flags=("REQUEUED",))
    assert not job.finished and job.preempted
    assert SlurmJob("1", state="PREEMPTED").finished
