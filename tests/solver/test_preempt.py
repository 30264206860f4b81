"""Preemption to zero GPUs (solver.placement.preempt), the restart governor
(SolverConfig.min_run_s) and the notes on why a running job stays
(solver.placement.explain), through the cellsched policy itself."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_policies import MOVE, TWO_TYPES, job, move_case, running, table_for

from solver.placement.preempt import rank
from solver.policies import get_policy
from solver.site import (
    REASON_KINDS,
    GpuLimit,
    LimitKind,
    LimitScope,
    SitePolicy,
    UnmanagedDemand,
    parse_reason,
    reason_governor,
    reason_preempted,
    reason_preempting,
    reason_stays,
)
from solver.types import Cell, ClusterView, JobRequest, NodeView, ScheduleRequest, SolverConfig

EIGHT = ClusterView(tuple(NodeView(f"n{i}", "a100", 4, 4) for i in range(2)))
FULL = Cell("a100", 1, 4)
NOW = 10_000.0
URGENT = SitePolicy(qos_priority={"urgent": 100.0})


def holders(**kw) -> list[JobRequest]:
    """a0 and a1 (QOS normal, elastic: they may move, never below 4 GPUs) each
    run on one whole node, an hour old."""
    return [
        running(
            job(f"a{i}", qos="normal", elastic=True, min_gpus=4, max_gpus=4, **kw),
            FULL,
            [(f"n{i}", 4)],
            10 / 4**0.9,
            running_since=NOW - 3600,
        )
        for i in range(2)
    ]


def urgent(**kw) -> JobRequest:
    return job("u", **{"qos": "urgent", "elastic": True, "min_gpus": 4, "max_gpus": 4, "submit_time": NOW - 10, **kw})


def schedule(jobs, site=URGENT, cluster=EIGHT, **cfg):
    """cellsched's round at NOW with preemption on and min_run_s 600 (exact: the deterministic budget decides)."""
    est = table_for(jobs, cluster, {(j.job_id, "a100"): 1.0 for j in jobs})
    config = SolverConfig(**{"preemption": "priority", "min_run_s": 600.0, **cfg}, time_limit_s=600.0)
    return get_policy("cellsched").schedule(
        ScheduleRequest(cluster, tuple(jobs), config=config, now=NOW, site=site), est
    )


def test_the_rank_is_the_tier_then_the_qos_priority_then_the_fair_share_standing():
    site = SitePolicy(shares={"A": 0.5, "B": 0.5}, usage={"A": 0.2, "B": 0.8}, qos_priority={"hi": 10.0})
    assert rank(job("x", account="A"), site) == (1, 0.0, 1)  # below its share
    assert rank(job("x", account="B"), site) == (1, 0.0, 0)
    assert rank(job("x", account="B", qos="hi"), site) == (1, 10.0, 0)
    assert rank(job("x", account="B", qos="hi"), site) > rank(job("x", account="A"), site)  # QOS first
    assert rank(job("x", account="C"), site) == (1, 0.0, 0)  # no share: not below it
    assert rank(job("x", account="B"), site, 2) > rank(job("x", account="A", qos="hi"), site)  # the tier first


#: n0 and n1 in partition "lo" (PriorityTier 1); n1 also in "hi" (PriorityTier 5)
TIERED = ClusterView(
    (NodeView("n0", "a100", 4, 4, partitions=("lo",)), NodeView("n1", "a100", 4, 4, partitions=("lo", "hi")))
)
TIERS = SitePolicy(priority_tiers={"hi": 5}, qos_priority={"urgent": 100.0})


def lo_holders(**kw) -> list[JobRequest]:
    return [replace(j, partitions=("lo",), **kw) for j in holders()]


@pytest.mark.parametrize(
    ("partitions", "qos", "victim", "why"),
    [
        # a job of the high-tier partition takes the job on the node that partition holds, by tier alone
        (("hi",), "normal", "a1", "partition PriorityTier 5 > 1"),
        # may use both: on n0 only "lo" holds it (the same rank), on n1 "hi" does
        (("lo", "hi"), "normal", "a1", "partition PriorityTier 5 > 1"),
        # "lo" only: the same rank as both holders, nothing to take
        (("lo",), "normal", None, ""),
        # the QOS ranks below the tier: an urgent job of "lo" never takes a job of "hi"
        (("lo",), "urgent", "a0", "qos urgent priority 100 > qos normal priority 0"),
    ],
)
def test_a_partitions_priority_tier_ranks_first_on_the_nodes_it_holds(partitions, qos, victim, why):
    jobs = [*lo_holders(), urgent(qos=qos, partitions=partitions)]
    rep = schedule(jobs, site=TIERS, cluster=TIERED)
    assert dict(rep.preempted) == ({victim: "u"} if victim else {})
    if victim:
        assert rep.reasons[victim] == f"preempted by job u ({why})"
    # a1 runs on n1 in "hi": an urgent job of "lo" (rank tier 1) never takes it
    hi_holder = [lo_holders()[0], replace(holders()[1], partitions=("hi",))]
    rep = schedule([*hi_holder, urgent(qos="urgent", partitions=("lo",))], site=TIERS, cluster=TIERED)
    assert dict(rep.preempted) == {"a0": "u"}


def test_an_urgent_job_preempts_one_running_job_of_lower_rank():
    jobs = [*holders(), urgent()]
    off = schedule(jobs, preemption="off")
    assert "u" not in off.placements and not off.preempted  # the subject: without it, u waits
    rep = schedule(jobs)
    assert rep.placements["u"].cell == FULL
    [(victim, by)] = rep.preempted.items()
    assert by == "u" and victim not in rep.placements
    other = ({"a0", "a1"} - {victim}).pop()
    assert rep.placements[other].same_resources(next(j for j in jobs if j.job_id == other).current)
    assert rep.placements["u"].node_names == next(j for j in jobs if j.job_id == victim).current.node_names
    assert rep.reasons[victim] == "preempted by job u (qos urgent priority 100 > qos normal priority 0)"
    assert rep.notes["u"] == f"preempting job {victim}"
    assert parse_reason(rep.reasons[victim]) == (
        "preempted",
        {"job": "u", "why": "qos urgent priority 100 > qos normal priority 0"},
    )
    assert parse_reason(rep.notes["u"]) == ("preempting", {"jobs": victim})


@pytest.mark.parametrize(
    ("change", "victim"),
    [
        ({"a0": {"running_since": NOW - 100}}, "a1"),  # a0 younger than min_run_s
        ({"a0": {"movable": False}}, "a1"),  # a0 may not be signalled
        ({"a0": {"elastic": False}}, "a1"),  # a0 may not be moved now
        ({"a0": {"preempted_at": NOW - 100}}, "a1"),  # a0 preempted within the back-off
        ({"a0": {"qos": "urgent"}}, "a1"),  # a0 of the same rank
        ({"a0": {"running_since": NOW - 100}, "a1": {"running_since": NOW - 599}}, None),  # both too young
        ({"a0": {"preempted_at": NOW - 100}, "a1": {"movable": False}}, None),
    ],
)
def test_who_may_be_a_victim(change, victim):
    jobs = [replace(j, **change.get(j.job_id, {})) for j in holders()] + [urgent()]
    rep = schedule(jobs)
    assert dict(rep.preempted) == ({victim: "u"} if victim else {})
    assert ("u" in rep.placements) == (victim is not None)
    assert {"a0", "a1"} - {victim} <= set(rep.placements)


def test_a_job_never_preempts_the_job_that_preempted_it():
    """u was preempted for a0 before (A preempts B, then B never preempts A): only a1 may give way."""
    jobs = [*holders(), urgent(preempted_by=frozenset({"a0"}))]
    assert dict(schedule(jobs).preempted) == {"a1": "u"}
    jobs = [*holders(), urgent(preempted_by=frozenset({"a0", "a1"}))]
    rep = schedule(jobs)
    assert not rep.preempted and "u" not in rep.placements


def test_the_governor_bounds_who_may_be_preempted_at_zero_too():
    """min_run_s 0 (the governor off): a job that started a second ago may be preempted."""
    jobs = [replace(j, running_since=NOW - 1) for j in holders()] + [urgent()]
    assert not schedule(jobs).preempted
    assert len(schedule(jobs, min_run_s=0.0).preempted) == 1


def test_a_fair_share_standing_ranks_within_a_qos():
    """Same QOS: a job of an account below its share outranks the jobs of an account above its own."""
    site = SitePolicy(shares={"A": 0.5, "B": 0.5}, usage={"A": 0.9, "B": 0.1})
    jobs = [replace(j, account="A") for j in holders()] + [urgent(qos="normal", account="B")]
    rep = schedule(jobs, site=site)
    [(victim, by)] = rep.preempted.items()
    assert by == "u" and rep.reasons[victim] == "preempted by job u (account B below its fair share, account A not)"
    site = SitePolicy(shares={"A": 0.5, "B": 0.5}, usage={"A": 0.4, "B": 0.1})  # both below: the same rank
    assert not schedule(jobs, site=site).preempted


def test_preemption_keeps_the_sites_gpu_limits():
    """The account's GrpTRES of 8 GPUs binds a0, a1 and u: u fits only with a
    victim's GPUs given back; a limit of 4 on u's QOS alone lets it in, one of 3 never."""
    acct = GpuLimit(LimitScope.ACCOUNT, "A", LimitKind.GRP, 8)
    jobs = [replace(j, account="A") for j in holders()] + [urgent(account="A")]
    site = replace(URGENT, limits=(acct,))
    assert len(schedule(jobs, site=site).preempted) == 1
    for gpus, preempts in ((4, True), (3, False)):
        qos = GpuLimit(LimitScope.QOS, "urgent", LimitKind.GRP, gpus)
        rep = schedule(jobs, site=replace(URGENT, limits=(acct, qos)))
        assert bool(rep.preempted) == preempts and ("u" in rep.placements) == preempts


def test_a_pending_placement_of_lower_rank_gives_way_before_any_running_job():
    """4 GPUs free: the joint model gives them to short job s (worth more:
    little work left), not to urgent u (days of work); the pass gives them to u
    and preempts nobody."""
    four = ClusterView((NodeView("n0", "a100", 4, 4), NodeView("n1", "a100", 4, 4)))
    a = running(job("a0", qos="normal", elastic=True, min_gpus=4, max_gpus=4), FULL, [("n0", 4)], 10 / 4**0.9)
    a = replace(a, running_since=NOW - 3600)
    s = job("s", qos="normal", elastic=True, min_gpus=4, max_gpus=4, iterations=10)
    u = urgent(iterations=10_000_000)
    off = schedule([a, s, u], cluster=four, preemption="off")
    assert "s" in off.placements and "u" not in off.placements  # the subject
    rep = schedule([a, s, u], cluster=four)
    assert "u" in rep.placements and "s" not in rep.placements and not rep.preempted
    assert rep.placements["a0"].same_resources(a.current)
    assert rep.reasons["s"].startswith("preempted by job u (") and "u" not in rep.notes


def test_the_gpus_a_plain_sbatch_job_claims_are_never_taken():
    """n1 is free but claimed by a pending plain sbatch job of higher Slurm
    priority: u preempts a0 on n0 rather than take n1."""
    a = holders()[0]
    claim = UnmanagedDemand("77", 4, "a100", (), 1e6)
    rep = schedule([a, urgent()], site=replace(URGENT, unmanaged=(claim,)))
    assert dict(rep.preempted) == {"a0": "u"} and rep.placements["u"].node_names == ("n0",)
    rep = schedule([a, urgent()])  # the subject: without the claim u takes the free node
    assert not rep.preempted and rep.placements["u"].node_names == ("n1",)


def test_a_round_with_one_rank_preempts_nothing():
    jobs = [*holders(), urgent(qos="normal")]
    rep = schedule(jobs)
    assert not rep.preempted and "u" not in rep.placements


# ---- the governor and the notes ---------------------------------------------------------


@pytest.mark.parametrize(("ran_s", "moves"), [(599.0, False), (600.0, True), (3600.0, True)])
def test_the_governor_keeps_a_young_run_where_it_is(ran_s, moves, exact_config):
    """A job 10x faster on the A100 moves there (the subject), unless its
    current run is younger than min_run_s; its note says which."""
    j, est = move_case(10.0, elastic=True)
    j = replace(j, running_since=NOW - ran_s)
    cfg = exact_config(**MOVE, min_run_s=600.0)
    rep = get_policy("cellsched").schedule(ScheduleRequest(TWO_TYPES, (j,), config=cfg, now=NOW), est)
    assert rep.placements["j"].cell.gpu_type == ("a100" if moves else "a10")
    if not moves:
        assert rep.notes["j"] == reason_governor(599.0, 600.0) == "governor: ran 599 s of min_run_s 600 s"
        assert parse_reason(rep.notes["j"]) == ("governor", {"ran": "599", "min_run": "600"})
    else:
        assert "j" not in rep.notes  # it moved: no note
    cfg = exact_config(**MOVE, min_run_s=0.0)  # off
    rep = get_policy("cellsched").schedule(ScheduleRequest(TWO_TYPES, (j,), config=cfg, now=NOW), est)
    assert rep.placements["j"].cell.gpu_type == "a100"


@pytest.mark.parametrize(
    ("fast", "restart_cost_s", "why"),
    [
        (1.0, 60.0, "no cell is worth more than its own"),  # the A100 is no faster
        (1.1, 60.0, "a100:1x1:pp1 worth 1.10x, 0.88x after its restart cost"),  # 0.8 of 1.1
        (2.0, 250.0, "a100:1x1:pp1 worth 2.00x, 0.33x after its restart cost"),  # 1 - 250/300 of 2
    ],
)
def test_a_running_elastic_job_that_stays_says_why(fast, restart_cost_s, why, exact_config):
    """The user's question: an elastic job beside a better cell, neither grown nor moved."""
    j, est = move_case(fast, elastic=True, restart_cost_s=restart_cost_s)
    rep = get_policy("cellsched").schedule(ScheduleRequest(TWO_TYPES, (j,), config=exact_config(**MOVE)), est)
    assert rep.placements["j"].same_resources(j.current)
    assert rep.notes["j"] == reason_stays("a10:1x1:pp1", why)
    assert parse_reason(rep.notes["j"]) == ("stays", {"cell": "a10:1x1:pp1", "why": why})


def test_a_better_cell_held_by_a_job_worth_more_is_named(exact_config):
    """j (on the A10) would pay its restart on the A100, but k holds it and is worth more there."""
    j, est = move_case(2.0, elastic=True)
    k = running(job("k", max_gpus=1), Cell("a100", 1, 1), [("a100-0", 1)], 1.0)
    est.table[("k", "a100:1x1")] = 1.0
    rep = get_policy("cellsched").schedule(ScheduleRequest(TWO_TYPES, (j, k), config=exact_config(**MOVE)), est)
    assert rep.placements["j"].same_resources(j.current)
    assert rep.notes["j"] == reason_stays(
        "a10:1x1:pp1", "a100:1x1:pp1 worth 1.60x after its restart cost; its GPUs are worth more to other jobs"
    )
    assert rep.notes["k"].startswith("stays in a100:1x1:pp1: not elastic now")


def test_the_reason_forms_read_back():
    assert {"preempted", "preempting", "governor", "stays"} <= set(REASON_KINDS)
    assert parse_reason(reason_preempting(("7", "9"))) == ("preempting", {"jobs": "7,9"})
    assert parse_reason(reason_preempted("12", "account B below its fair share, account A not")) == (
        "preempted",
        {"job": "12", "why": "account B below its fair share, account A not"},
    )
