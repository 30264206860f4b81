"""One GPU limit and one job-count limit, every path that counts under
them: the CP-SAT model (exact, aggregated, LP first), the greedy plan and
the repair's `Tally`, `enforce_site` over a plan made without the site,
slurm-multifactor, the controller's check at a release, the simulated
Slurm's check at a start, and what Slurm's running records hold under them.
They all ask solver.limits, so they agree.

The cases, worked out by hand, on a cluster of 8 A100s where three jobs
ask for 2 GPUs each (6 GPUs: all would fit):

* `gpus`: account acctA has GrpTRES=gres/gpu=4, the jobs are acctA's. 2 + 2
  = 4 fits, a third 2 would make 6 > 4: whatever plans it, two run (4 GPUs)
  and the third waits, "used 4/4".
* `jobs`: account lab has GrpJobs=2, the jobs are its sub-account lab-x's
  (which has no limit of its own). Two run (4 GPUs; a count of GPUs would
  hold one job), and the third waits, "used 2/2"."""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest

from slurm_ext.controller.inputs import ManagedJob, Phase
from slurm_ext.controller.limits import within_limits
from slurm_ext.controller.reconcile import Action, ActionKind
from slurm_ext.records import ClusterSnapshot, SlurmJob, SlurmNode
from slurm_ext.sim.site import SiteUsage
from slurm_ext.sim.types import AccountSpec, SiteSpec, TraceJob
from slurm_ext.site import holder, outside_limits
from solver.contract.models import get_model
from solver.estimator import EstimatorBase
from solver.limits import binds
from solver.placement import joint
from solver.placement.siterules import SiteRules, Tally, enforce_site
from solver.policies import get_policy
from solver.site import GpuLimit, LimitKind, LimitScope, SitePolicy
from solver.types import (
    Cell,
    ClusterView,
    Estimate,
    JobRequest,
    NodeView,
    ParallelPlan,
    Placement,
    ScheduleReply,
    ScheduleRequest,
    SolverConfig,
)

EIGHT = ClusterView(tuple(NodeView(f"n{i}", "a100", 4, 4) for i in range(2)))
LIMIT = GpuLimit(LimitScope.ACCOUNT, "acctA", LimitKind.GRP, 4)
JOB_LIMIT = GpuLimit(LimitScope.ACCOUNT, "lab", LimitKind.GRP_JOBS, 2, below=frozenset({"lab-x"}))
PATHS = {
    "exact": {},
    "aggregated": {"exact_node_model_max_nodes": 0},
    "lp-first": {"exact_node_model_max_nodes": 0, "lp_first_min_jobs": 0},
}


def jobs_of(account: str) -> tuple[JobRequest, ...]:
    return tuple(
        JobRequest(
            f"j{i}",
            get_model("gpt-350m"),
            32,
            1000,
            user="u",
            min_gpus=2,
            max_gpus=2,
            requested_gpus=2,
            requested_gpu_type="a100",
            submit_time=float(i),
            account=account,
            runtime="adaptive",
        )
        for i in (1, 2, 3)
    )


@dataclass(frozen=True)
class Case:
    """A limit, the account of the three jobs, what the third waits with (and
    with 3 planned), what a release held back waits for, and the simulated
    site with the same limit and Slurm's reason there."""

    limit: GpuLimit
    account: str
    waits: str
    over: str
    freed: str
    sim: SiteSpec
    slurm_reason: str

    @property
    def jobs(self) -> tuple[JobRequest, ...]:
        return jobs_of(self.account)


CASES = {
    "gpus": Case(
        LIMIT,
        "acctA",
        "limit account:acctA GrpTRES gres/gpu used 4/4",
        "limit account:acctA GrpTRES gres/gpu used 6/4",
        "GPUs being freed",
        SiteSpec((AccountSpec("acctA", gpus=4),)),
        "AssocGrpGRES",
    ),
    "jobs": Case(
        JOB_LIMIT,
        "lab-x",
        "limit account:lab GrpJobs jobs used 2/2",
        "limit account:lab GrpJobs jobs used 3/2",
        "running jobs to end",
        SiteSpec((AccountSpec("lab", jobs=2), AccountSpec("lab-x", parent="lab"))),
        "AssocGrpJobsLimit",
    ),
}
#: the GPU case's jobs, as the tests of Slurm's records use them
JOBS = CASES["gpus"].jobs


class Flat(EstimatorBase):
    """1 s per iteration in every one-stage cell."""

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        if cell.pp != 1:
            return Estimate(cell, None, float("inf"), 0.0, "none")
        return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), 1.0, 1.0, "measured")


def request(case: Case, site: SitePolicy | None = None, **config: int) -> ScheduleRequest:
    site = SitePolicy(limits=(case.limit,)) if site is None else site
    return ScheduleRequest(EIGHT, case.jobs, config=SolverConfig(deterministic=True, **config), site=site)


def held(reply: ScheduleReply) -> int:
    return sum(p.cell.num_gpus for p in reply.placements.values())


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_cpsat_model_runs_two(path, case):
    c = CASES[case]
    reply = get_policy("cellsched").schedule(request(c, **PATHS[path]), Flat())
    assert held(reply) == 4 and len(reply.placements) == 2
    (waiting,) = {j.job_id for j in c.jobs} - set(reply.placements)
    assert reply.reasons[waiting] == c.waits
    assert held(get_policy("cellsched").schedule(request(c, SitePolicy()), Flat())) == 6  # the limit is what stops it


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_greedy_plan_runs_two(case, monkeypatch):
    def broken(*a, **kw):
        raise RuntimeError("no CP-SAT today")

    monkeypatch.setattr(joint, "solve_cpsat", broken)
    reply = get_policy("cellsched").schedule(request(CASES[case]), Flat())
    assert reply.status == "GREEDY" and held(reply) == 4 and len(reply.placements) == 2


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_tally_of_the_greedy_plan_and_the_repair_takes_two(case):
    c = CASES[case]
    tally = Tally(SiteRules(SitePolicy(limits=(c.limit,)), EIGHT, c.jobs, {}, 0.0))
    fits = []
    for j in c.jobs:
        fits.append(tally.fits(j.job_id, Cell("a100", 1, 2)))
        if fits[-1]:
            tally.add(j.job_id, Cell("a100", 1, 2))
    assert fits == [True, True, False] and tally.over() == 0


@pytest.mark.parametrize("case", sorted(CASES))
def test_enforce_site_cuts_a_plan_made_without_the_site_to_two(case):
    c = CASES[case]
    own = get_policy("fcfs").schedule(request(c, SitePolicy()), Flat())
    assert held(own) == 6
    fixed = enforce_site(request(c), own)
    # the last submitted waits; its reason counts the plan it was cut from
    assert held(fixed) == 4 and fixed.reasons == {"j3": c.over}


@pytest.mark.parametrize("case", sorted(CASES))
def test_slurm_multifactor_starts_two(case):
    reply = get_policy("slurm-multifactor").schedule(request(CASES[case]), Flat())
    assert held(reply) == 4 and reply.reasons == {"j3": CASES[case].waits}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_controller_releases_two(case):
    c = CASES[case]

    def place(j: JobRequest, node: str) -> Action:
        p = Placement(j.job_id, Cell("a100", 1, 2), ((node, 2),), ParallelPlan(1, 2, 1), 1.0)
        return Action(ActionKind.PLACE, j.job_id, "new", p)

    held_jobs = [ManagedJob(SlurmJob(j.job_id, account=c.account), Phase.HELD) for j in c.jobs]
    actions = [place(c.jobs[0], "n0"), place(c.jobs[1], "n0"), place(c.jobs[2], "n1")]
    kept, waits = within_limits(actions, held_jobs, request(c))
    assert [a.job_id for a in kept] == ["j1", "j2"] and waits == {"j3": f"{c.waits}: waits for {c.freed}"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_simulated_slurm_starts_two(case):
    c = CASES[case]
    usage = SiteUsage(c.sim, 8, lambda: 0.0, 0.0)
    started, why = 0, []
    for j in c.jobs:
        usage.register(j.job_id, TraceJob(j.job_id, 0.0, "gpt-350m", 32, 1000, 2, "a100", user="u", account=c.account))
        sim_job = SimpleNamespace(job_id=j.job_id, gres=2, num_nodes=1, gpus=2, starts=0)
        why.append(usage.gate(sim_job))
        if not why[-1]:
            usage.started(sim_job, "a100:1x2")
            started += 2
    assert started == 4 and why == ["", "", c.slurm_reason]


def test_slurms_running_jobs_count_under_the_same_rule():
    """Three plain acctA jobs of 2 GPUs running in Slurm hold 6 GPUs under the
    limit (none left to managed jobs); the records bind as the requests do."""
    nodes = tuple(SlurmNode(f"n{i}", gpus_total=4, gpu_type="a100") for i in range(2))
    running = tuple(
        SlurmJob(f"{i}", user="u", state="RUNNING", account="acctA", partition="all", nodes=(f"n{i % 2}",),
                 num_nodes=1, gpus_per_node=2)
        for i in (1, 2, 3)
    )  # fmt: skip
    snap = ClusterSnapshot(nodes=nodes, partitions=(), jobs=running, taken_at=0.0)
    (lim,) = outside_limits((LIMIT,), list(running), snap)
    assert (lim.used_outside, lim.headroom) == (6, 0)
    other = replace(running[0], account="acctB")
    assert [binds(LIMIT, holder(j)) for j in (*running, other)] == [True, True, True, False]
    assert [binds(LIMIT, j) for j in JOBS] == [True, True, True]


def test_a_partition_qos_counts_the_jobs_that_run_in_its_partition():
    """Partition `all`'s QOS: GrpTRES 4 and MaxTRESPerUser 2. alice's plain job runs in
    `all` with 2 GPUs, bob's in `a100`: only alice's counts, under both, and her
    per-user share outside becomes a limit of her own, which binds her jobs only."""
    grp = GpuLimit(LimitScope.PARTITION, "all", LimitKind.GRP, 4)
    per_user = GpuLimit(LimitScope.PARTITION, "all", LimitKind.PER_USER, 2)
    nodes = tuple(SlurmNode(f"n{i}", gpus_total=4, gpu_type="a100") for i in range(2))
    running = [
        SlurmJob("1", user="alice", state="RUNNING", partition="all", nodes=("n0",), num_nodes=1, gpus_per_node=2),
        SlurmJob("2", user="bob", state="RUNNING", partition="a100", nodes=("n1",), num_nodes=1, gpus_per_node=2),
    ]
    snap = ClusterSnapshot(nodes=nodes, partitions=(), jobs=tuple(running), taken_at=0.0)
    got = outside_limits((grp, per_user), running, snap)
    alice = GpuLimit(LimitScope.PARTITION, "all/alice", LimitKind.PER_USER, 2, used_outside=2)
    assert got == [replace(grp, used_outside=2), per_user, alice]
    assert [binds(alice, replace(JOBS[0], user=u)) for u in ("alice", "bob")] == [True, False]


def test_slurms_running_jobs_count_under_a_job_count_too():
    """Three plain jobs running in Slurm, one in lab-x with 2 GPUs, one in
    lab with none, one in acct-b: lab's count holds two (none left to
    managed jobs); the records bind as the requests do."""
    nodes = tuple(SlurmNode(f"n{i}", gpus_total=4, gpu_type="a100") for i in range(2))
    run = tuple(
        SlurmJob(f"{i}", user="u", state="RUNNING", account=a, partition="all", nodes=("n0",), num_nodes=1,
                 gpus_per_node=g)
        for i, a, g in ((1, "lab-x", 2), (2, "lab", None), (3, "acct-b", 1))
    )  # fmt: skip
    snap = ClusterSnapshot(nodes=nodes, partitions=(), jobs=run, taken_at=0.0)
    (lim,) = outside_limits((JOB_LIMIT,), list(run), snap)
    assert (lim.used_outside, lim.headroom) == (2, 0)
    assert [binds(JOB_LIMIT, holder(j)) for j in run] == [True, True, False]
    assert [binds(JOB_LIMIT, j) for j in CASES["jobs"].jobs] == [True, True, True]
    assert not binds(JOB_LIMIT, replace(CASES["jobs"].jobs[0], account="lab-y"))
