"""slurm-multifactor: Slurm's multifactor priority and backfill, against
hand-worked oracles (every job's iteration takes 1 s on any cell, so a job
of N remaining iterations runs N seconds)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from solver.contract.models import ModelSpec
from solver.estimator import EstimatorBase
from solver.placement import validate_plan
from solver.policies import get_policy
from solver.policies.slurm_multifactor import MultifactorWeights, fairshare_factor, multifactor_priority
from solver.site import GpuLimit, LimitKind, LimitScope, SitePolicy
from solver.types import Cell, ClusterView, Estimate, JobRequest, NodeView, ParallelPlan, Placement, ScheduleRequest

MODEL = ModelSpec("tiny", "gpt", 4, 256, 4, 128, 1000, 1e7)
DAY = 86400.0


class OneSecond(EstimatorBase):
    """Every cell feasible at 1 s per iteration."""

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), 1.0, 1.0, "test")


def job(jid: str, gpus: int, iterations: int, **kw) -> JobRequest:
    kw.setdefault("requested_gpu_type", "a100")
    return JobRequest(jid, MODEL, 32, iterations=iterations, requested_gpus=gpus, **{"runtime": "adaptive", **kw})


def running(j: JobRequest, node: str, gpus: int) -> JobRequest:
    cell = Cell("a100", 1, gpus)
    return replace(j, current=Placement(j.job_id, cell, ((node, gpus),), ParallelPlan(1, gpus, 1), 1.0))


ONE_NODE = ClusterView((NodeView("a100-1", "a100", 4, 4),))


def schedule(cluster, jobs, site=None, now=0.0, **opts):
    rep = get_policy("slurm-multifactor", **opts).schedule(
        ScheduleRequest(cluster, tuple(jobs), now=now, site=site or SitePolicy()), OneSecond()
    )
    validate_plan(cluster, rep.placements)
    return rep


# ---- priority ----------------------------------------------------------------------------


def test_the_fairshare_factor_is_the_sites_as_given():
    """sshare's FairShare of the job's association, else its account's
    (the simulator's classic factors are per account); shares and usage
    are not made into a factor of cellsched's own."""
    site = SitePolicy(
        shares={"a": 0.5, "b": 0.25}, usage={"a": 0.25, "b": 0.75}, fairshare={"a/ann": 0.8, "a": 0.3, "b": 0.125}
    )
    assert fairshare_factor(job("j", 1, 1, account="a", user="ann"), site) == 0.8  # its association's
    assert fairshare_factor(job("j", 1, 1, account="a", user="bob"), site) == 0.3  # no association's: its account's
    assert fairshare_factor(job("j", 1, 1, account="b", user="ann"), site) == 0.125
    assert fairshare_factor(job("j", 1, 1, account="nobody"), site) == 0.0  # none given
    assert fairshare_factor(job("j", 1, 1, account="a"), SitePolicy(shares={"a": 0.5})) == 1.0  # no factor at all


def test_multifactor_priority_weights_age_fairshare_and_size():
    site = SitePolicy(shares={"a": 0.5}, usage={"a": 0.5}, fairshare={"a": 0.5})
    j = job("j", 4, 10, account="a", submit_time=0.0)
    w = MultifactorWeights()  # age 1000 (max age 7 days), fair share 10000, job size 1000
    # age 3.5 of 7 days: 500; fair share 2^-1: 5000; 4 of 16 GPUs: 250
    assert multifactor_priority(j, site, 3.5 * DAY, 16, w) == pytest.approx(5750.0)
    # age saturates at PriorityMaxAge
    assert multifactor_priority(j, site, 30 * DAY, 16, w) == pytest.approx(1000 + 5000 + 250)


def test_the_account_under_its_share_goes_first():
    site = SitePolicy(shares={"heavy": 0.5, "light": 0.5}, fairshare={"heavy": 0.2, "light": 0.9})
    older = job("older", 4, 100, account="heavy", submit_time=0.0)
    newer = job("newer", 4, 100, account="light", submit_time=60.0)
    rep = schedule(ONE_NODE, [older, newer], site, now=120.0)
    assert set(rep.placements) == {"newer"}
    # without a site policy the older job is first (equal fair share, older)
    assert set(schedule(ONE_NODE, [older, newer], now=120.0).placements) == {"older"}


def test_equal_priorities_go_by_submit_time_then_job_number():
    # Slurm orders equal priorities by job id as a number: job 9 before job 10 ("10" < "9" as text)
    jobs = [job(jid, 4, 100, submit_time=t) for jid, t in (("10", 5.0), ("9", 5.0), ("11", 4.0))]
    got = get_policy("slurm-multifactor").order(ScheduleRequest(ONE_NODE, tuple(jobs), now=10.0), jobs)
    assert [j.job_id for j in got] == ["11", "9", "10"]
    assert set(schedule(ONE_NODE, jobs[:2], now=10.0).placements) == {"9"}


# ---- backfill ----------------------------------------------------------------------------


def backfill_case(**b_kw):
    """4 A100s; r runs on 2 until t=1000. top (highest priority) wants 4:
    it can start at 1000 and runs to 1300. b (2 GPUs, 500 s) ends before
    1000: backfilled now. c (2 GPUs, 2000 s) would hold 2 GPUs past 1000
    and delay top: it waits, its expected start is 1300 (top's end)."""
    site = SitePolicy(shares={"x": 0.5, "y": 0.3, "z": 0.2})
    r = running(job("r", 2, 1000, account="z"), "a100-1", 2)
    top = job("top", 4, 300, account="x")
    b = job("b", 2, 500, account="y", **b_kw)
    c = job("c", 2, 2000, account="z")
    return site, [r, top, b, c]


def test_backfill_starts_a_lower_job_only_when_it_delays_no_reservation():
    site, jobs = backfill_case()
    rep = schedule(ONE_NODE, jobs, site)
    assert set(rep.placements) == {"r", "b"}
    assert rep.placements["r"] == jobs[0].current  # never moved
    assert "expected start in 1000 s" in rep.reasons["top"]
    assert "expected start in 1300 s" in rep.reasons["c"]


def test_backfill_uses_the_time_limit_over_the_estimate():
    # b's limit, 1200 s, would run past top's start at 1000: not backfilled
    site, jobs = backfill_case(time_limit_s=1200.0)
    rep = schedule(ONE_NODE, jobs, site)
    assert set(rep.placements) == {"r"}
    assert "expected start in 1300 s" in rep.reasons["b"]  # after top, 1000 + 300


def test_without_reservations_it_is_plain_priority_order_first_fit():
    site, jobs = backfill_case()
    rep = schedule(ONE_NODE, jobs, site, max_reservations=0)
    assert set(rep.placements) == {"r", "b"}  # b first by priority; c finds no GPU left


def test_typed_requests_stay_on_their_type():
    cluster = ClusterView((NodeView("a100-1", "a100", 4, 4), NodeView("v100-1", "v100", 8, 8)))
    a = job("a", 8, 10, submit_time=0.0)  # 8 x A100 never fits 4 A100s: no layout
    v = job("v", 8, 10, requested_gpu_type="v100", submit_time=1.0)
    rep = schedule(cluster, [a, v])
    assert set(rep.placements) == {"v"}
    assert rep.placements["v"].cell == Cell("v100", 1, 8)


# ---- limits ------------------------------------------------------------------------------


def test_an_account_limit_is_hard_and_holds_nothing():
    cluster = ClusterView(tuple(NodeView(f"a100-{i}", "a100", 4, 4) for i in (1, 2)))
    lim = GpuLimit(LimitScope.ACCOUNT, "x", LimitKind.GRP, 4)
    site = SitePolicy(limits=(lim,), shares={"x": 0.9, "y": 0.1})
    r = running(job("r", 2, 1000, account="x"), "a100-1", 2)
    big = job("big", 4, 10, account="x")  # 2 + 4 > 4: waits, though 6 GPUs are free
    small = job("small", 2, 10, account="x")  # 2 + 2 <= 4: runs
    other = job("other", 4, 10, account="y")  # lower priority; the blocked job reserves nothing
    rep = schedule(cluster, [r, big, small, other], site)
    assert set(rep.placements) == {"r", "small", "other"}
    assert rep.reasons["big"] == "limit account:x GrpTRES gres/gpu used 2/4"


def test_limit_headroom_counts_gpus_used_outside_and_per_user_qos_limits():
    cluster = ClusterView(tuple(NodeView(f"a100-{i}", "a100", 4, 4) for i in (1, 2)))
    outside = GpuLimit(LimitScope.ACCOUNT, "x", LimitKind.GRP, 4, used_outside=3)
    per_user = GpuLimit(LimitScope.QOS_PER_USER, "normal", LimitKind.PER_USER, 2)
    site = SitePolicy(limits=(outside, per_user))
    a = job("a", 2, 10, account="x", submit_time=0.0)  # 3 + 2 > 4
    u1 = job("u1", 2, 10, account="y", user="ann", qos="normal", submit_time=1.0)
    u2 = job("u2", 1, 10, account="y", user="ann", qos="normal", submit_time=2.0)  # ann: 2 + 1 > 2
    u3 = job("u3", 2, 10, account="y", user="bob", qos="normal", submit_time=3.0)
    rep = schedule(cluster, [a, u1, u2, u3], site)
    assert set(rep.placements) == {"u1", "u3"}
    assert rep.reasons["a"] == "limit account:x GrpTRES gres/gpu used 3/4"  # 3 outside, 2 more do not fit
    assert rep.reasons["u2"] == "limit qos-per-user:normal/ann MaxTRESPerUser gres/gpu used 2/2"


def test_a_per_job_limit():
    site = SitePolicy(limits=(GpuLimit(LimitScope.QOS, "small", LimitKind.PER_JOB, 2),))
    rep = schedule(ONE_NODE, [job("j", 4, 10, qos="small"), job("k", 2, 10, qos="small", submit_time=1.0)], site)
    assert set(rep.placements) == {"k"}
    assert rep.reasons["j"] == "limit qos:small MaxTRESPerJob gres/gpu used 4/2"
