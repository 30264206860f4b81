"""Never losing a job, without Slurm: the virtual workers an elastic job is
accepted with, the V its plans carry, the begin time of a restart, and the
safety net for runs that end before training (controller.relaunch)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from slurm_ext.backends import JobUpdate
from slurm_ext.backends.cli import CliBackend
from slurm_ext.config import Config
from slurm_ext.controller import inputs as inp
from slurm_ext.controller import relaunch
from slurm_ext.controller.progress import JobProgress
from slurm_ext.controller.reconcile import ActionKind, decide
from slurm_ext.controller.round import excluded_cells
from slurm_ext.records import ClusterSnapshot, SlurmJob, SlurmNode, SlurmPartition
from slurm_ext.state import HistoryEvent, JobStatus, PlanStatus, StateStore
from solver.contract.jobspec import JobSpec
from solver.contract.models import get_model
from solver.contract.plan import JobPlan
from solver.mixed import mixed_cell
from solver.types import Cell, JobRequest, ParallelPlan, Placement

#: the dev cluster's shape: 22 GPUs, 4 of them A40
NODES = (("n1", "a100", 4), ("n2", "a100", 4), ("n3", "v100", 8), ("n4", "a40", 2), ("n5", "a40", 2), ("n6", "a10", 2))


def snapshot(*jobs: SlurmJob) -> ClusterSnapshot:
    nodes = tuple(
        SlurmNode(name=n, gpu_type=t, gpus_total=g, gpus_alloc=0, state="idle", partitions=(t, "all"))
        for n, t, g in NODES
    )
    types = sorted({t for _, t, _ in NODES})
    parts = tuple(SlurmPartition(name=t, nodes=tuple(n for n, tt, _ in NODES if tt == t)) for t in types)
    parts += (SlurmPartition(name="all", nodes=tuple(n for n, _, _ in NODES)),)
    return ClusterSnapshot(nodes=nodes, partitions=parts, jobs=jobs, taken_at=1000.0)


def held(job_id: str, spec: JobSpec, **kw) -> SlurmJob:
    base = dict(
        job_id=job_id,
        user="alice",
        state="PENDING",
        held=True,
        reason="JobHeldUser",
        partition="all",
        comment=spec.to_comment(),
        submit_time=900.0,
        gpus_per_node=1,
    )
    return SlurmJob(**{**base, **kw})


# --- V is fixed when the job is accepted ---------------------------------------


@pytest.mark.parametrize(
    "spec_kw, v",
    [
        (dict(gpu_types=("a40",), min_gpus=2), 4),  # 4 A40s; 4 divides 256
        (dict(gpu_types=("a40",), min_gpus=2, max_gpus=3), 4),  # covers dp 3; 3 does not divide 256, 4 does
        (dict(), 32),  # every type: 22 GPUs; the smallest divisor of 256 from 22 up is 32
        (dict(partitions=("a100", "a10")), 16),  # 8 + 2 = 10 GPUs -> 16
        (dict(max_gpus=2), 2),
    ],
)
def test_an_elastic_job_is_accepted_with_virtual_workers_that_cover_its_largest_dp(spec_kw, v):
    spec = JobSpec(model="gpt-350m", global_batch=256, iterations=100, elastic=True, runtime="exact", **spec_kw)
    (m,) = inp.classify(snapshot(held("5", spec)), {}, {})
    assert m.spec.virtual_workers == v
    assert json.loads(m.spec_json)["virtual_workers"] == v  # what the state DB and the AdminComment keep
    req = inp.build_request(snapshot(held("5", spec)), (m,), {}, Config().solver).request
    assert req.jobs[0].virtual_workers == v


def test_virtual_workers_divide_the_global_batch_and_a_users_choice_is_kept():
    spec = JobSpec(
        model="gpt-350m", global_batch=96, iterations=100, elastic=True, gpu_types=("v100",), runtime="exact"
    )
    (m,) = inp.classify(snapshot(held("5", spec)), {}, {})
    assert m.spec.virtual_workers == 8  # 8 V100s; 8 divides 96
    spec = dataclasses.replace(spec, global_batch=90)
    (m,) = inp.classify(snapshot(held("5", spec)), {}, {})
    assert m.spec.virtual_workers == 9  # 8 does not divide 90, 9 does
    mine = dataclasses.replace(spec, virtual_workers=5)
    (m,) = inp.classify(snapshot(held("5", mine)), {}, {})
    assert m.spec.virtual_workers == 5
    static = JobSpec(model="gpt-350m", global_batch=96, iterations=100, runtime="exact")
    (m,) = inp.classify(snapshot(held("5", static)), {}, {})
    assert m.spec.virtual_workers is None  # a static job picks its dp at its first placement


def test_a_placed_job_keeps_the_virtual_workers_of_its_plan():
    spec = JobSpec(model="gpt-350m", global_batch=64, iterations=100, runtime="exact")  # accepted before V was fixed
    plan = JobPlan(
        dp=2,
        global_batch=64,
        gpu_types=("a40",),
        nodes=("n4",),
        gpus_per_node=2,
        virtual_workers=8,
        cell="a40:1x2:pp1",
        job_id="5",
    )
    ac = json.dumps({"spec": json.loads(spec.to_json()), "plan": json.loads(plan.to_json())})
    job = held("5", spec, state="COMPLETED", held=False, exit_code=75, admin_comment=ac, end_time=990.0)
    (m,) = inp.classify(snapshot(job), {}, {})
    assert m.phase == inp.Phase.CHECKPOINTED and inp.fixed_virtual_workers(m) == 8
    p = Placement("5", Cell("a40", 2, 2, 1), (("n4", 2), ("n5", 2)), ParallelPlan(1, 4, 1, 2), 0.5)
    view = inp.build_request(snapshot(job), (m,), {}, Config().solver).view
    (a,) = decide((m,), {"5": p}, view, "/ck")
    new = JobPlan.from_dict(json.loads(a.update.admin_comment)["plan"])
    assert (new.dp, new.virtual_workers) == (4, 8)
    assert a.update.start_soon and a.requeue_first


def test_a_first_mixed_placement_gets_whole_virtual_workers():
    spec = JobSpec(
        model="gpt-tiny", global_batch=24, iterations=10, gpu_types=("a40", "a10"), min_gpus=6, runtime="exact"
    )
    (m,) = inp.classify(snapshot(held("7", spec)), {}, {})
    view = inp.build_request(snapshot(held("7", spec)), (m,), {}, Config().solver).view
    cell = mixed_cell((("a10", 1), ("a40", 2)), 2)
    p = Placement("7", cell, (("n6", 2), ("n5", 2), ("n4", 2)), ParallelPlan(1, 6, 1, 1, (6, 3)), 0.5)
    (a,) = decide((m,), {"7": p}, view, "/ck")
    plan = JobPlan.from_dict(json.loads(a.update.admin_comment)["plan"])
    # a10 ranks take 6 samples, a40 ranks 3: units of gcd 3 samples, 24 / 3 = 8 virtual workers
    assert plan.virtual_workers == 8 and plan.batch_shares == (3, 3, 3, 3, 6, 6)


# --- a restart never starts in the second its job ended in ---------------------


def test_a_restart_asks_for_the_next_whole_second():
    sent: list[list[str]] = []
    backend = CliBackend()
    backend._run = lambda args, **kw: sent.append(list(args))  # the argument list is the contract
    backend.jobs = lambda ids: {i: SlurmJob(job_id=i, user="alice", state="PENDING", partition="a40") for i in ids}
    backend.update("42", JobUpdate(partition="a40", start_soon=True))
    assert sent == [["scontrol", "update", "JobId=42", "Partition=a40", "StartTime=now+1"]]


# --- runs that end before training ---------------------------------------------


SPEC = JobSpec(model="gpt-350m", global_batch=64, iterations=100, elastic=True, virtual_workers=4, runtime="exact")


def ended(job_id: str, state: str = "FAILED", exit_code: int = 1, start: float = 950.0, end: float = 960.0) -> SlurmJob:
    plan = JobPlan(
        dp=2,
        global_batch=64,
        gpu_types=("a40",),
        nodes=("n4",),
        gpus_per_node=2,
        virtual_workers=4,
        cell="a40:1x2:pp1",
        job_id=job_id,
        checkpoint_dir=f"/ck/{job_id}",
    )
    ac = json.dumps({"spec": json.loads(SPEC.to_json()), "plan": json.loads(plan.to_json())})
    return held(
        job_id, SPEC, state=state, held=False, exit_code=exit_code, admin_comment=ac, start_time=start, end_time=end
    )


def test_a_run_that_failed_before_its_first_step_is_relaunched():
    progress = {
        "1": JobProgress(30, first_step_at=900.0),  # its last step is of an earlier run
        "2": JobProgress(40, first_step_at=955.0),  # this run trained: the program's own failure
        "3": None,
    }  # never wrote progress
    jobs = inp.classify(snapshot(ended("1"), ended("2"), ended("3"), ended("4", state="CANCELLED")), {}, {})
    assert [m.phase for m in jobs] == [inp.Phase.FINISHED] * 4
    read_calls: list[str] = []

    def read(m):
        read_calls.append(m.job_id)
        return progress[m.job_id]

    failures = relaunch.review(jobs, read, {}, max_relaunches=3)
    assert sorted(failures) == ["1", "3"] and read_calls == ["1", "2", "3"]
    f = failures["1"]
    assert (f.cell, f.end_time, f.new, f.relaunch) == ("a40:1x2:pp1", 960.0, True, True)
    assert "failed before training (failed, exit 1 in a40:1x2:pp1, failure 1 of 3" in f.reason
    after = relaunch.apply_review(jobs, failures)
    assert [m.phase for m in after] == [
        inp.Phase.CHECKPOINTED,
        inp.Phase.FINISHED,
        inp.Phase.CHECKPOINTED,
        inp.Phase.FINISHED,
    ]
    view = inp.build_request(snapshot(), after, {}, Config().solver).view
    p = Placement("1", Cell("a40", 1, 2, 1), (("n5", 2),), ParallelPlan(1, 2, 1), 0.5)
    actions = {a.job_id: a for a in decide(after, {"1": p}, view, "/ck")}
    assert actions["1"].kind == ActionKind.PLACE and actions["1"].requeue_first and actions["1"].update.start_soon
    assert actions["3"].kind == ActionKind.REQUEUE  # no placement this round: requeued held, placed later


def test_a_recorded_failure_is_not_read_again_and_a_job_that_keeps_failing_is_given_up():
    jobs = inp.classify(snapshot(ended("1")), {}, {})

    def read(m):
        raise AssertionError("a failure recorded before must not be read again")

    cell = "a40:1x2:pp1"
    again = relaunch.review(jobs, read, {"1": [(700.0, cell), (960.0, cell)]}, max_relaunches=3)
    assert again["1"].relaunch and not again["1"].new
    given_up = relaunch.review(jobs, read, {"1": [(t, cell) for t in (500.0, 600.0, 700.0, 960.0)]}, max_relaunches=3)
    f = given_up["1"]
    assert not f.relaunch and "failed before training 4 times" in f.reason and "not requeued again" in f.reason
    (m,) = relaunch.apply_review(jobs, given_up)
    assert m.phase == inp.Phase.FINISHED and m.reason == f.reason


def test_run_failures_count_against_their_cell(tmp_path):
    with StateStore(tmp_path / "s.sqlite") as st:
        st.add_history("1", HistoryEvent.RUN_FAILED, 100.0, None, "a40:1x2:pp1", value=90.0)
        st.add_history("1", HistoryEvent.RUN_FAILED, 200.0, None, "a40:1x2:pp1", value=190.0)
        st.add_history("2", HistoryEvent.RUN_FAILED, 200.0, None, "a10:1x2:pp1", value=195.0)
        assert st.cell_failures(["1", "2"]) == {"1": {"a40:1x2:pp1": 2}, "2": {"a10:1x2:pp1": 1}}
        assert st.run_failures(["1", "3"]) == {"1": [(90.0, "a40:1x2:pp1"), (190.0, "a40:1x2:pp1")]}


def test_failures_in_new_sizes_are_free_and_a_size_that_failed_twice_is_excluded():
    """A job that fails once in each of four sizes (it does not fit there) is
    relaunched again; twice in one size (any layout) keeps it out of that size."""
    jobs = inp.classify(snapshot(ended("1")), {}, {})
    sizes = [(500.0, "a40:1x1:pp1"), (600.0, "a40:1x2:pp1"), (700.0, "a10:1x2:pp1"), (960.0, "a100:1x4:pp1")]
    assert relaunch.counted(sizes) == 1
    assert relaunch.review(jobs, lambda m: None, {"1": sizes}, max_relaunches=3)["1"].relaunch
    repeats = [(500.0, "a40:1x2:pp1"), (600.0, "a40:2x1:pp1"), (700.0, "a40:1x2:pp1"), (960.0, "a10:1x2:pp1")]
    assert relaunch.counted(repeats) == 3
    assert not relaunch.review(jobs, lambda m: None, {"1": repeats + [(990.0, "a40:2x1:pp1")]}, 3)["1"].relaunch
    out = excluded_cells({"a40:1x2:pp1": 1, "a40:2x1:pp1": 1, "a10:1x2:pp1": 1}, 2)
    assert out == {"a40:2gpus:pp1"}
    job = JobRequest("1", get_model("gpt-350m"), 8, 10, excluded_cells=out, runtime="adaptive")
    assert job.excludes(Cell("a40", 2, 1, 1)) and job.excludes(Cell("a40", 1, 2, 1))
    assert not job.excludes(Cell("a40", 1, 2, 2)) and not job.excludes(Cell("a10", 1, 2, 1))


def test_a_running_job_is_moved_only_once_its_current_run_reported_a_step():
    spec = JobSpec(model="gpt-350m", global_batch=64, iterations=100, elastic=True, virtual_workers=4, runtime="exact")
    plan = JobPlan(
        dp=2,
        global_batch=64,
        gpu_types=("a40",),
        nodes=("n4",),
        gpus_per_node=2,
        virtual_workers=4,
        cell="a40:1x2:pp1",
        job_id="5",
    )
    ac = json.dumps({"spec": json.loads(spec.to_json()), "plan": json.loads(plan.to_json())})
    job = held(
        "5", spec, state="RUNNING", held=False, admin_comment=ac, nodes=("n4",), start_time=950.0, gpus_per_node=2
    )
    (m,) = inp.classify(snapshot(job), {}, {})
    assert m.phase == inp.Phase.RUNNING

    def elastic(first_step_at):
        return (
            inp.build_request(snapshot(job), (m,), {}, Config().solver, first_step_at=first_step_at)
            .request.jobs[0]
            .elastic
        )

    assert elastic({"5": 951.5})  # this run trained: its launcher handles the checkpoint signal
    assert not elastic({"5": 900.0})  # the step is of an earlier run: this one is still starting up
    assert not elastic({})  # no step yet
    assert elastic(None)  # not checked (callers without progress)


def test_a_requeued_held_job_is_released_to_start_in_the_next_second():
    """Requeued held in an earlier round (no placement then): its BeginTime
    is cred_expire away, so its placement asks to start soon."""
    job = dataclasses.replace(ended("1"), state="PENDING", held=True, reason="JobHeldAdmin", exit_code=None)
    (m,) = inp.classify(snapshot(job), {}, {})
    assert m.phase == inp.Phase.HELD and m.plan is not None
    view = inp.build_request(snapshot(job), (m,), {}, Config().solver).view
    p = Placement("1", Cell("a40", 1, 2, 1), (("n5", 2),), ParallelPlan(1, 2, 1), 0.5)
    (a,) = decide((m,), {"1": p}, view, "/ck")
    assert a.kind == ActionKind.PLACE and a.update.start_soon and not a.requeue_first
    fresh = held("2", SPEC)
    (m,) = inp.classify(snapshot(fresh), {}, {})
    (a,) = decide((m,), {"2": dataclasses.replace(p, job_id="2")}, view, "/ck")
    assert not a.update.start_soon  # a new job has no BeginTime to lift


def test_a_job_released_to_start_soon_is_not_placed_again_while_it_waits_that_second():
    """The round after a restart was released (StartTime=now+1) sees it
    pending with Reason=BeginTime for up to a second: it keeps its plan. A
    job Slurm requeued itself (cred_expire away: Phase.SLURM_REQUEUED) is
    held at once (placed again from the next round on, to start soon)."""
    job = dataclasses.replace(
        ended("1"),
        state="PENDING",
        held=False,
        reason="BeginTime",
        exit_code=None,
        nodes=(),
        required_nodes=("n4",),
        partition="a40",
        features="a40",
        num_nodes=1,
        gpus_per_node=2,
    )
    p = Placement("1", Cell("a40", 1, 2, 1), (("n4", 2),), ParallelPlan(1, 2, 1), 0.5)
    for eligible, requeued in ((1000.8, False), (1001.0, False), (1010.0, True), (None, True)):
        j = dataclasses.replace(job, eligible_time=eligible)
        (m,) = inp.classify(snapshot(j), {}, {})
        if requeued:
            assert m.phase == inp.Phase.SLURM_REQUEUED and m.current is None
        else:
            assert m.phase == inp.Phase.RELEASED and m.current is not None and p.same_resources(m.current)
        view = inp.build_request(snapshot(j), (m,), {}, Config().solver).view
        actions = decide((m,), {"1": p}, view, "/ck", now=1000.0)
        assert [(a.kind, a.pending) for a in actions] == ([(ActionKind.REQUEUE, True)] if requeued else []), eligible


def test_a_job_the_controller_requeued_held_is_its_own_and_an_operators_hold_is_not(tmp_path):
    """Released at 100; job 1 is then requeued held by the controller (a
    checkpointed or failed run waiting for a placement), job 2 is held by
    someone else: only job 1 is the controller's to place again."""
    with StateStore(tmp_path / "s.sqlite") as st:
        st.add_history("2", HistoryEvent.REQUEUED, 50.0, None)  # before its last release
        for job_id in ("1", "2", "4"):
            st.accept_spec(job_id, "alice", SPEC.to_json(), "comment", 90.0)
            plan = st.begin_plan(job_id, None, "a40:1x2:pp1", [("n4", 2)], "a40", "{}", "{}", 90.0)
            for status in (PlanStatus.UPDATED, PlanStatus.RELEASED):
                st.set_plan_status(plan, status, 100.0)
        st.add_history("1", HistoryEvent.REQUEUED, 150.0, None)
        # a run that failed as it started, requeued in the release's second (or simulated instant)
        st.add_history("4", HistoryEvent.REQUEUED, 100.0, None)
        released = st.released(["1", "2", "3", "4"])
        assert released == {"2"}
        jobs = inp.classify(snapshot(held("1", SPEC), held("2", SPEC), held("4", SPEC)), st.jobs(), {}, released)
    phases = {m.job_id: m.phase for m in jobs}
    assert phases == {"1": inp.Phase.HELD, "2": inp.Phase.OPERATOR_HOLD, "4": inp.Phase.HELD}


def test_a_job_that_has_trained_is_never_given_up_for_failures_in_cells():
    """Failures of a job that has iterations done say that those cells do not
    hold it (they are excluded), not that the job is broken: it is never
    given up (a failure reviewed before keeps its verdict, relaunched); a job
    that never trained is."""
    jobs = inp.classify(snapshot(ended("1")), {}, {})
    failed = [(500.0, "a40:1x2:pp1"), (600.0, "a40:2x1:pp1"), (700.0, "a10:1x2:pp1")]
    failed += [(800.0, "a10:2x1:pp1"), (900.0, "a100:1x4:pp1"), (960.0, "a100:2x2:pp1")]
    assert relaunch.counted(failed) > 3
    assert not relaunch.review(jobs, lambda m: None, {"1": failed}, 3)["1"].relaunch
    f = relaunch.review(jobs, lambda m: None, {"1": failed}, 3, trained_before={"1"})["1"]
    assert f.relaunch and "requeued from its checkpoint" in f.reason
    assert excluded_cells({c: 1 for _, c in failed}, 2) == {"a40:2gpus:pp1", "a10:2gpus:pp1", "a100:4gpus:pp1"}


def test_a_job_is_never_kept_out_of_a_cell_it_has_trained_in():
    """Failures in other layouts of a size the job has trained in do not
    exclude that size (it fits), only the failing layout; nor do the proven
    cell's own failures: the job always keeps somewhere to run."""
    failures = {"a100:2x2:pp1": 2, "a100:1x4:pp1": 2, "a40:1x2:pp1": 1, "a40:2x1:pp1": 1}
    assert excluded_cells(failures, 2) == {"a100:2x2:pp1", "a100:1x4:pp1", "a100:4gpus:pp1", "a40:2gpus:pp1"}
    out = excluded_cells(failures, 2, trained_in={"a100:1x4:pp1"})
    assert out == {"a100:2x2:pp1", "a40:2gpus:pp1"}
    job = JobRequest("1", get_model("gpt-350m"), 8, 10, excluded_cells=out, runtime="adaptive")
    assert not job.excludes(Cell("a100", 1, 4, 1)) and job.excludes(Cell("a100", 2, 2, 1))


def test_only_a_jobs_own_reports_make_it_trained():
    """The controller's estimate from run time is no evidence of training (a
    broken job runs too): such a job is still given up after max_relaunches."""

    def status(job_id: str, done: float | None, source: str | None) -> JobStatus:
        return JobStatus(job_id, "alice", "FAILED", "finished", "", 900.0, 950.0, 960.0, 1, done, source, True)

    rows = [status("1", 120.0, "file"), status("2", 120.0, "estimate"), status("3", 0.0, "file")]
    rows.append(status("4", None, None))
    assert relaunch.trained_jobs({s.job_id: s for s in rows}) == {"1"}


# --- a trained job whose runs keep failing is parked ---------------------------

CELL = "a40:1x2:pp1"


def test_a_trained_job_failing_max_relaunches_plus_one_times_in_a_row_is_parked_not_failed():
    """Trained (its last first step at 300), then every run fails before
    training: the first max_relaunches failures are relaunched, the next one
    parks the job: requeued held and not placed, never FINISHED."""
    record = JobProgress(30, first_step_at=300.0)
    recorded: list[tuple[float, str]] = []
    verdicts = []
    for end in (500.0, 600.0, 700.0, 800.0):
        jobs = inp.classify(snapshot(ended("1", start=end - 10, end=end)), {}, {})
        f = relaunch.review(jobs, lambda m: record, {"1": list(recorded)}, 3, trained_before={"1"})["1"]
        assert f.new
        verdicts.append((f.relaunch, f.park))
        recorded.append((end, CELL))
    assert verdicts == [(True, False)] * 3 + [(False, True)]
    third = relaunch.review(jobs, lambda m: record, {"1": recorded[:2]}, 3, trained_before={"1"})["1"]
    assert "failure 3 of 3 allowed since it last trained" in third.reason
    f = relaunch.review(jobs, lambda m: record, {"1": recorded[:3]}, 3, trained_before={"1"})["1"]
    assert "parked" in f.reason and "4 times in a row since it last trained" in f.reason
    assert "scontrol release 1" in f.reason and "max_relaunches = 3" in f.reason
    (m,) = relaunch.apply_review(jobs, {"1": f})
    assert m.phase == inp.Phase.PARKED and m.reason == f.reason
    view = inp.build_request(snapshot(), (m,), {}, Config().solver).view
    assert inp.build_request(snapshot(), (m,), {}, Config().solver).request.jobs == ()  # not placed
    p = Placement("1", Cell("a40", 1, 2, 1), (("n5", 2),), ParallelPlan(1, 2, 1), 0.5)
    (a,) = decide((m,), {"1": p}, view, "/ck")
    assert a.kind == ActionKind.REQUEUE  # requeued held (scontrol requeuehold: a user hold), never cancelled
    # the same failure reviewed again (its requeue failed) stays parked; a relaunched one stays relaunched
    again = relaunch.review(jobs, lambda m: record, {"1": recorded}, 3, trained_before={"1"}, parked={"1"})["1"]
    assert again.park and not again.new
    assert relaunch.review(jobs, lambda m: record, {"1": recorded}, 3, trained_before={"1"})["1"].relaunch


def test_a_run_that_trained_in_between_resets_the_count():
    """Three failures, a run that reached its first step (its progress
    record's first step, or the controller's own "trained" event), then a
    failure: the count is one, relaunched."""
    jobs = inp.classify(snapshot(ended("1")), {}, {})
    failed = [(500.0, CELL), (600.0, CELL), (700.0, CELL)]

    def verdict(first_step_at, trained_at=None):
        record = JobProgress(30, first_step_at=first_step_at)
        return relaunch.review(jobs, lambda m: record, {"1": failed}, 3, {"1"}, trained_at)["1"]

    assert verdict(300.0).park  # no success since 300: 4 in a row
    assert verdict(650.0).relaunch and "failure 2 of 3" in verdict(650.0).reason  # 700 and 960
    assert verdict(750.0).relaunch and "failure 1 of 3" in verdict(750.0).reason
    assert verdict(300.0, {"1": 750.0}).relaunch  # seen training by the controller at 750
    assert verdict(None, {"1": 650.0}).relaunch and verdict(None).park  # no progress record: the state's word


def test_a_parked_job_is_left_held_until_released_then_counts_again_from_zero(tmp_path):
    """The state remembers a parked job until an "unparked" event; a held
    parked job is Phase.PARKED (its reason kept, no action); released by its
    user it is managed again, and its failures count from the release."""
    with StateStore(tmp_path / "s.sqlite") as st:
        st.accept_spec("1", "alice", SPEC.to_json(), "comment", 90.0)
        st.add_history("1", HistoryEvent.TRAINED, 100.0, None, CELL)
        for t in (500.0, 600.0):
            st.add_history("1", HistoryEvent.RUN_FAILED, t + 5, None, CELL, value=t)
        assert st.parked(["1"]) == set() and st.trained_or_parked_at(["1", "2"]) == {"1": 100.0}
        st.add_history("1", HistoryEvent.PARKED, 605.0, None, CELL)
        assert st.parked(["1", "2"]) == {"1"} and st.trained_or_parked_at(["1"]) == {"1": 605.0}
        reason = "parked: its run failed before training 2 times in a row since it last trained"
        row = JobStatus("1", "alice", "PENDING", inp.Phase.PARKED, reason, 900.0, None, None, None, 30.0, "file", False)
        st.save_statuses([row], 605.0)
        job = dataclasses.replace(ended("1"), state="PENDING", held=True, reason="JobHeldUser", exit_code=None)
        (m,) = inp.classify(snapshot(job), st.jobs(), {}, st.released(["1"]), st.parked(["1"]))
        assert m.phase == inp.Phase.PARKED and m.reason == reason
        view = inp.build_request(snapshot(job), (m,), {}, Config().solver).view
        p = Placement("1", Cell("a40", 1, 2, 1), (("n5", 2),), ParallelPlan(1, 2, 1), 0.5)
        assert decide((m,), {"1": p}, view, "/ck") == ()  # never released by the controller
        assert relaunch.trained_jobs(st.jobs()) == {"1"}
        # released by its user: no longer held, managed again
        free = dataclasses.replace(job, held=False, reason="BeginTime", eligible_time=2000.0)
        (m,) = inp.classify(snapshot(free), st.jobs(), {}, st.released(["1"]), st.parked(["1"]))
        assert m.phase == inp.Phase.SLURM_REQUEUED  # its requeue's BeginTime: held and placed again
        st.add_history("1", HistoryEvent.UNPARKED, 700.0, None)
        assert st.parked(["1"]) == set() and st.trained_or_parked_at(["1"]) == {"1": 700.0}
        # its next failure is the first since the release: relaunched (max_relaunches = 1)
        jobs = inp.classify(snapshot(ended("1", start=950.0, end=960.0)), {}, {})
        f = relaunch.review(
            jobs, lambda m: None, st.run_failures(["1"]), 1, {"1"}, st.trained_or_parked_at(["1"]), st.parked(["1"])
        )["1"]
        assert f.relaunch and "failure 1 of 1" in f.reason
