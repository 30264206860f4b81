"""A release that would put an account over its GPU limit while a moved job
still holds its GPUs waits for a later round (slurm_ext.controller.limits):
cellsched never leans on Slurm keeping such a job pending (AssocGrpGRES).

Oracle: GPU counts worked out by hand."""

from __future__ import annotations

from slurm_ext.controller.inputs import ManagedJob, Phase
from slurm_ext.controller.limits import within_limits
from slurm_ext.controller.reconcile import Action, ActionKind
from slurm_ext.records import SlurmJob
from solver.contract.models import get_model
from solver.site import GpuLimit, LimitKind, LimitScope, SitePolicy, parse_reason
from solver.types import Cell, ClusterView, JobRequest, NodeView, ParallelPlan, Placement, ScheduleRequest

CLUSTER = ClusterView(tuple(NodeView(f"n{i}", "a100", 4, 4) for i in range(1, 4)))
A4 = GpuLimit(LimitScope.ACCOUNT, "acct-a", LimitKind.GRP, 4)


def _placement(job_id: str, node: str, gpus: int) -> Placement:
    return Placement(job_id, Cell("a100", 1, gpus), ((node, gpus),), ParallelPlan(1, gpus, 1), 1.0)


def _managed(job_id: str, phase: Phase, current: Placement | None = None) -> ManagedJob:
    return ManagedJob(SlurmJob(job_id, account="acct-a"), phase, current=current)


def _request(*job_ids: str, priority: dict[str, float] | None = None, limit: GpuLimit = A4) -> ScheduleRequest:
    pr = priority or {}
    jobs = tuple(
        JobRequest(j, get_model("gpt-350m"), 8, 100, account="acct-a", priority=pr.get(j, 0.0), runtime="adaptive")
        for j in job_ids
    )
    return ScheduleRequest(CLUSTER, jobs, site=SitePolicy(limits=(limit,)))


def _place(job_id: str, node: str, gpus: int) -> Action:
    return Action(ActionKind.PLACE, job_id, "new", _placement(job_id, node, gpus))


def test_a_release_onto_gpus_a_checkpointing_job_still_holds_waits():
    # x ran on 4 GPUs, is checkpointing to shrink to 2; y is placed on the other 2: 4 + 2 > 4 now
    jobs = [_managed("x", Phase.CHECKPOINTING, _placement("x", "n1", 4)), _managed("y", Phase.HELD)]
    kept, waits = within_limits([_place("y", "n2", 2)], jobs, _request("x", "y"))
    assert kept == () and set(waits) == {"y"}
    kind, fields = parse_reason(waits["y"].split(": waits")[0])
    assert kind == "limit" and "4/4" in waits["y"]
    # once x has ended (checkpointed), both releases fit: 2 + 2 <= 4
    jobs = [_managed("x", Phase.CHECKPOINTED), _managed("y", Phase.HELD)]
    both = [_place("x", "n1", 2), _place("y", "n2", 2)]
    kept, waits = within_limits(both, jobs, _request("x", "y"))
    assert kept == tuple(both) and waits == {}


def test_the_higher_priority_release_goes_first_and_other_actions_pass():
    jobs = [_managed("run", Phase.RUNNING, _placement("run", "n1", 2)), _managed("lo", Phase.HELD)]
    jobs.append(_managed("hi", Phase.HELD))
    acts = [_place("lo", "n2", 2), _place("hi", "n3", 2), Action(ActionKind.HOLD, "other", "pending")]
    kept, waits = within_limits(acts, jobs, _request("run", "lo", "hi", priority={"hi": 10.0, "lo": 1.0}))
    assert [a.job_id for a in kept] == ["hi", "other"] and set(waits) == {"lo"}  # 2 + 2 = 4; a third 2 is over


def test_a_released_job_placed_again_counts_once_and_outside_use_counts():
    # r was released on 2 GPUs (Slurm will start it) and is moved to 4: its old 2 are not counted twice
    jobs = [_managed("r", Phase.RELEASED, _placement("r", "n1", 2))]
    kept, waits = within_limits([_place("r", "n2", 4)], jobs, _request("r"))
    assert waits == {} and len(kept) == 1
    # 1 GPU of the account held by a plain sbatch job: 4 more do not fit under 4
    used = GpuLimit(LimitScope.ACCOUNT, "acct-a", LimitKind.GRP, 4, used_outside=1)
    kept, waits = within_limits([_place("r", "n2", 4)], jobs, _request("r", limit=used))
    assert kept == () and "used 1/4" in waits["r"]  # 1 used now; the job's 4 would make 5


def test_without_limits_nothing_is_held_back():
    jobs = [_managed("x", Phase.CHECKPOINTING, _placement("x", "n1", 4)), _managed("y", Phase.HELD)]
    req = ScheduleRequest(CLUSTER, _request("x", "y").jobs)
    acts = (_place("y", "n2", 4),)
    assert within_limits(acts, jobs, req) == (acts, {})


def test_a_parents_job_count_holds_back_a_sub_accounts_release_while_a_moved_job_checkpoints():
    # lab GrpJobs=2 over acct-a: x checkpoints to move, run runs; y's release would make 3 running jobs now
    lab = GpuLimit(LimitScope.ACCOUNT, "lab", LimitKind.GRP_JOBS, 2, below=frozenset({"acct-a"}))
    jobs = [
        _managed("x", Phase.CHECKPOINTING, _placement("x", "n1", 1)),
        _managed("run", Phase.RUNNING, _placement("run", "n2", 1)),
        _managed("y", Phase.HELD),
    ]
    kept, waits = within_limits([_place("y", "n3", 1)], jobs, _request("x", "run", "y", limit=lab))
    assert kept == () and waits["y"] == "limit account:lab GrpJobs jobs used 2/2: waits for running jobs to end"
    # once x has ended, y fits (1 + 1 <= 2); x placed again with it would make 3: the higher priority goes first
    jobs[0] = _managed("x", Phase.CHECKPOINTED)
    acts = [_place("x", "n1", 1), _place("y", "n3", 1)]
    kept, waits = within_limits(acts, jobs, _request("x", "run", "y", priority={"x": 5.0}, limit=lab))
    assert [a.job_id for a in kept] == ["x"] and set(waits) == {"y"}
