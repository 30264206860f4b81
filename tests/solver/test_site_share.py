"""Fair share, pending plain sbatch jobs, reason forms, and an empty (or
never binding) site policy that changes nothing."""

from __future__ import annotations

import pytest
from test_policies import job, random_cluster_and_jobs, running, table_for
from test_site_limits import PATHS

from solver.placement.siterules import FAIR_FLOOR, SiteRules, fair_factors
from solver.policies import get_policy
from solver.site import (
    GpuLimit,
    LimitKind,
    LimitScope,
    SitePolicy,
    UnmanagedDemand,
    parse_reason,
    reason_fairshare,
    reason_limit,
    reason_no_cell,
    reason_outbid,
    reason_partition,
    reason_reservation,
    reason_unmanaged,
)
from solver.types import Cell, ClusterView, NodeView, ScheduleRequest

EIGHT = ClusterView(tuple(NodeView(f"n{i}", "a100", 4, 4) for i in range(2)))
FULL = Cell("a100", 1, 4)


def borrowers():
    """acctA's two elastic jobs hold all 8 GPUs; acctB's job arrives."""
    a = [
        running(job(f"a{i}", account="acctA", elastic=True, max_gpus=8), FULL, [(f"n{i}", 4)], 10 / 4**0.9)
        for i in range(2)
    ]
    b = job("b0", account="acctB", elastic=True, max_gpus=8)
    jobs = [*a, b]
    return jobs, table_for(jobs, EIGHT, {(j.job_id, "a100"): 1.0 for j in jobs})


def acct_gpus(rep, account_of, account):
    return sum(p.cell.num_gpus for jid, p in rep.placements.items() if account_of.get(jid) == account)


def test_fair_weights_are_the_sites_factors_as_given_over_the_largest():
    # sshare's FairShare of each association (Fair Tree's, say): used as given, not recomputed from
    # shares and usage (which say otherwise here), divided by the largest, at least FAIR_FLOOR
    site = SitePolicy(
        shares={"A": 0.5, "B": 0.5},
        usage={"A": 0.0, "B": 1.0},
        fairshare={"A/ann": 0.4, "A/bob": 0.1, "B/cy": 0.8, "B/dee": 0.005},
    )
    assert fair_factors(site) == pytest.approx({"A/ann": 0.5, "A/bob": 0.125, "B/cy": 1.0, "B/dee": FAIR_FLOOR})
    rules = SiteRules(site, EIGHT, [], {}, 0.0)
    assert rules.fair_weight(job("j", account="A", user="bob")) == 0.125
    assert rules.fair_weight(job("j", account="A", user="zed")) == 1.0  # no factor given: 1
    # the simulator's classic factors are per account: a job takes its account's
    classic = SiteRules(SitePolicy(shares={"A": 0.5, "B": 0.5}, fairshare={"A": 0.25, "B": 0.5}), EIGHT, [], {}, 0.0)
    assert classic.fair_weight(job("j", account="A", user="ann")) == 0.5
    assert fair_factors(SitePolicy(fairshare={"A": 0.0, "B": 0.0})) == {"A": 1.0, "B": 1.0}  # all 0: all alike


def test_past_usage_lowers_an_accounts_jobs_value(exact_config):
    """Two 4-GPU jobs on 4 GPUs, alike but for their accounts: the account
    whose fair-share factor is lower (it used more of its share in the past) goes last."""
    one = ClusterView((NodeView("n0", "a100", 4, 4),))
    jobs = [job("x", account="acctA", min_gpus=4, max_gpus=4), job("y", account="acctB", min_gpus=4, max_gpus=4)]
    est = table_for(jobs, one, {(j.job_id, "a100"): 1.0 for j in jobs})
    for heavy, first in (("acctA", "y"), ("acctB", "x")):
        light = ({"acctA", "acctB"} - {heavy}).pop()
        site = SitePolicy(
            shares={"acctA": 0.5, "acctB": 0.5}, usage={heavy: 0.6}, fairshare={heavy: 2**-1.2, light: 1.0}
        )
        rep = get_policy("cellsched").schedule(ScheduleRequest(one, tuple(jobs), config=exact_config(), site=site), est)
        assert list(rep.placements) == [first]
        (late,) = {"x", "y"} - {first}
        assert rep.reasons[late] == f"fairshare {heavy} usage 0.60 > share 0.50"


def test_fair_share_reclaims_an_accounts_share_from_elastic_borrowers(exact_config):
    jobs, est = borrowers()
    account_of = {j.job_id: j.account for j in jobs}
    req = ScheduleRequest(EIGHT, tuple(jobs), config=exact_config())
    before = get_policy("cellsched").schedule(req, est)
    assert acct_gpus(before, account_of, "acctB") < 4  # without shares B gets less than half (the subject)
    site = SitePolicy(shares={"acctA": 0.5, "acctB": 0.5})
    after = get_policy("cellsched").schedule(ScheduleRequest(EIGHT, tuple(jobs), config=exact_config(), site=site), est)
    assert acct_gpus(after, account_of, "acctB") >= 4  # its share of 8 GPUs
    assert {"a0", "a1"} <= set(after.placements)  # borrowers shrink, none is preempted


@pytest.mark.parametrize("share_b", [0.5, 0.25])
def test_an_account_with_one_job_gets_its_share_against_one_with_ten(share_b, exact_config):
    """10 acctA jobs and one acctB job (each up to 8 GPUs) on 8 GPUs: without
    shares acctB gets nothing (ten 1-GPU starts are worth more); with them
    it gets its entitlement, share x 8 GPUs, and acctA the rest."""
    jobs = [job(f"a{i}", account="acctA", elastic=True, max_gpus=8) for i in range(10)]
    jobs.append(job("b0", account="acctB", elastic=True, max_gpus=8))
    est = table_for(jobs, EIGHT, {(j.job_id, "a100"): 1.0 for j in jobs})
    account_of = {j.job_id: j.account for j in jobs}
    free = get_policy("cellsched").schedule(ScheduleRequest(EIGHT, tuple(jobs), config=exact_config()), est)
    assert acct_gpus(free, account_of, "acctB") == 0
    site = SitePolicy(shares={"acctA": 1 - share_b, "acctB": share_b})
    rep = get_policy("cellsched").schedule(ScheduleRequest(EIGHT, tuple(jobs), config=exact_config(), site=site), est)
    assert acct_gpus(rep, account_of, "acctB") == 8 * share_b
    assert acct_gpus(rep, account_of, "acctA") == 8 * (1 - share_b)
    waiting = [j for j in account_of if j not in rep.placements]
    assert {rep.reasons[j] for j in waiting} == {f"fairshare acctA usage {1 - share_b:.2f} >= share {1 - share_b:.2f}"}


def test_idle_share_is_lent_out(exact_config):
    jobs, est = borrowers()
    jobs = jobs[:2]  # acctB has no demand
    site = SitePolicy(shares={"acctA": 0.5, "acctB": 0.5})
    rep = get_policy("cellsched").schedule(ScheduleRequest(EIGHT, tuple(jobs), config=exact_config(), site=site), est)
    assert sum(p.cell.num_gpus for p in rep.placements.values()) == 8


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_pending_plain_sbatch_job_of_higher_priority_gets_a_whole_node(path, exact_config):
    jobs, est = borrowers()
    jobs = jobs[:2]
    claim = UnmanagedDemand("77", 4, "a100", (), priority=1000.0, nodes=1)
    site = SitePolicy(unmanaged=(claim,))
    cfg = exact_config(**PATHS[path])
    rep = get_policy("cellsched").schedule(ScheduleRequest(EIGHT, tuple(jobs), config=cfg, site=site), est)
    held = {n: sum(g for p in rep.placements.values() for m, g in p.nodes if m == n) for n in ("n0", "n1")}
    assert sorted(held.values()) == [0, 4]  # one node left whole for job 77, the borrowers squeezed onto the other
    assert set(rep.placements) == {"a0", "a1"}
    assert not any(j.startswith("@") for j in rep.placements)
    # one of lower priority than every managed job claims nothing
    low = SitePolicy(unmanaged=(UnmanagedDemand("78", 4, "a100", (), priority=-1.0),))
    rep = get_policy("cellsched").schedule(ScheduleRequest(EIGHT, tuple(jobs), config=exact_config(), site=low), est)
    assert sum(p.cell.num_gpus for p in rep.placements.values()) == 8


def test_a_managed_job_waiting_behind_a_plain_sbatch_claim_says_so(exact_config):
    one = ClusterView((NodeView("n0", "a100", 4, 4),))
    jobs = [job("m", min_gpus=4, max_gpus=4)]
    est = table_for(jobs, one, {("m", "a100"): 1.0})
    site = SitePolicy(unmanaged=(UnmanagedDemand("77", 4, "a100", (), priority=10.0),))
    rep = get_policy("cellsched").schedule(ScheduleRequest(one, tuple(jobs), config=exact_config(), site=site), est)
    assert not rep.placements
    assert rep.reasons["m"] == "unmanaged 77 (priority 10) claims 4 a100 GPUs"


def test_outbid_names_the_jobs_that_hold_the_gpus(exact_config):
    one = ClusterView((NodeView("n0", "a100", 4, 4),))
    jobs = [
        job("big", min_gpus=4, max_gpus=4, account="A"),
        job("late", min_gpus=4, max_gpus=4, account="A", submit_time=1),
    ]
    est = table_for(jobs, one, {(j.job_id, "a100"): 1.0 for j in jobs})
    site = SitePolicy(limits=(GpuLimit(LimitScope.ACCOUNT, "A", LimitKind.GRP, 100),))
    rep = get_policy("cellsched").schedule(ScheduleRequest(one, tuple(jobs), config=exact_config(), site=site), est)
    (waiting,) = {"big", "late"} - set(rep.placements)
    (holder,) = rep.placements
    kind, fields = parse_reason(rep.reasons[waiting])
    assert kind == "outbid" and fields["jobs"] == holder


def test_reason_forms_read_back():
    lim = GpuLimit(LimitScope.QOS_PER_USER, "normal", LimitKind.PER_USER, 4, gpu_type="a100")
    cases = {
        reason_limit(lim, 4, "alice"): ("limit", {"scope": "qos-per-user", "name": "normal/alice", "used": "4"}),
        reason_fairshare("acctA", 0.62, 0.5): ("fairshare", {"account": "acctA", "usage": "0.62", "op": ">"}),
        reason_fairshare("acctA", 0.5, 0.5): ("fairshare", {"usage": "0.50", "op": ">=", "share": "0.50"}),
        reason_reservation("maint", 0.0, 600.0): (
            "reservation",
            {"name": "maint", "start": "1970-01-01T00:00:00Z", "end": "1970-01-01T00:10:00Z"},
        ),
        reason_partition("acctA", "normal", ("prio", "gpu")): ("partition", {"partitions": "prio,gpu"}),
        reason_unmanaged("77", 1000.0, 4, None): ("unmanaged", {"job": "77", "gpus": "4", "gpu_type": "any"}),
        reason_no_cell("every cell out of memory"): ("no cell fits", {"why": "every cell out of memory"}),
        reason_outbid((("12", 1.5), ("14", 0.25))): ("outbid", {"jobs": "12,14"}),
    }
    assert reason_limit(lim, 4, "alice") == "limit qos-per-user:normal/alice MaxTRESPerUser gres/gpu:a100 used 4/4"
    assert reason_outbid((("12", 1.5), ("14", 0.25))) == "outbid by job 12 (value 1.50), job 14 (value 0.25)"
    for text, (kind, some) in cases.items():
        got_kind, fields = parse_reason(text)
        assert got_kind == kind and some.items() <= fields.items(), text
    assert parse_reason("waiting: the GPUs are worth more to other jobs this round")[0] == "other"


@pytest.mark.parametrize("seed", [3, 7])
def test_a_site_policy_that_never_binds_plans_as_none(seed, exact_config):
    cluster, jobs, est = random_cluster_and_jobs(seed)
    base = get_policy("cellsched").schedule(ScheduleRequest(cluster, tuple(jobs), config=exact_config()), est)
    roomy = SitePolicy(limits=(GpuLimit(LimitScope.ACCOUNT, "", LimitKind.GRP, 10_000),))  # binds nobody's account ""
    big = SitePolicy(limits=tuple(GpuLimit(LimitScope.USER, f"/{j.user}", LimitKind.GRP, 10_000) for j in jobs))
    for site in (roomy, big):
        rep = get_policy("cellsched").schedule(
            ScheduleRequest(cluster, tuple(jobs), config=exact_config(), site=site), est
        )
        assert rep.placements == base.placements
