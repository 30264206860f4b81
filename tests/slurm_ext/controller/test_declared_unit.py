"""What declared iterations are worth (slurm_ext.controller.declared): the
accuracies of completed jobs, and the expected total of a job given how far
it is, against hand-computed conditional means."""

from __future__ import annotations

from slurm_ext.controller import inputs as inp
from slurm_ext.controller.declared import DeclaredWork
from slurm_ext.controller.progress import EachCall, JobProgress, Unreadable
from slurm_ext.records import SlurmJob
from solver.contract.jobspec import JobSpec


def managed(job_id: str, declared: int, state: str = "COMPLETED", phase=inp.Phase.FINISHED) -> inp.ManagedJob:
    spec = JobSpec(model="gpt-1.3b", global_batch=64, iterations=declared)
    return inp.ManagedJob(SlurmJob(job_id, state=state), phase, spec)


def learner(done: dict[str, float]) -> DeclaredWork:
    def read(m):
        if m.job_id == "bad":
            raise Unreadable("not JSON")
        return JobProgress(done[m.job_id]) if m.job_id in done else None

    return DeclaredWork(EachCall(read))


def test_without_completed_jobs_the_declaration_is_believed():
    w = learner({})
    assert (w.expected(1000, 0), w.expected(1000, 999)) == (1000, 1000)


def test_only_completed_jobs_count_once_each():
    w = learner({"a": 250, "b": 1000, "c": 100, "d": 10, "e": 600})
    jobs = [
        managed("a", 1000),  # 0.25
        managed("b", 2000),  # 0.5
        managed("c", 1000, state="FAILED"),  # not completed: not a measure of its declaration
        managed("d", 1000, state="RUNNING", phase=inp.Phase.RUNNING),
        managed("e", 600),  # 1.0
        managed("bad", 1000),  # its report cannot be read
        managed("gone", 1000),  # none
    ]
    w.observe(jobs)
    w.observe(jobs)  # seen already
    assert list(w.accuracies) == [0.25, 0.5, 1.0]


def test_the_expected_total_is_the_mean_of_those_that_ran_longer():
    w = learner({})
    w.accuracies.extend([0.25, 0.5, 1.0])
    assert w.expected(1000, 0) == (250 + 500 + 1000) / 3
    assert w.expected(1000, 250) == (500 + 1000) / 2  # 250 is not longer than 250 done
    assert w.expected(1000, 700) == 1000
    assert w.expected(1000, 1000) == 1000  # none ran longer: the declaration


def test_the_round_request_carries_the_expected_totals():
    from solver.contract.models import get_model
    from solver.types import ClusterView, JobRequest, ScheduleRequest

    w = learner({})
    w.accuracies.extend([0.2, 0.6])
    jobs = (
        JobRequest("x", get_model("gpt-1.3b"), 64, 1000, iterations_done=100.0, runtime="ddp"),
        JobRequest("y", get_model("gpt-1.3b"), 64, 1000, iterations_done=300.0, runtime="ddp"),
    )
    built = inp.Inputs(ClusterView(()), ScheduleRequest(ClusterView(()), jobs), (), {})
    out = w.applied(built)
    assert [(j.job_id, j.iterations, j.remaining_iterations) for j in out.request.jobs] == [
        ("x", 400, 300.0),  # (200 + 600) / 2
        ("y", 600, 300.0),
    ]
    assert learner({}).applied(built) is built
