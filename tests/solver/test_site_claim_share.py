"""A plain sbatch job's claim wins over fair share's shortfall: with shares,
a managed job of an account below its entitlement does not take the GPUs a
pending plain job of higher priority claims (found on the dev cluster with
accounting: the shortfall's cost per GPU was priced from the stand-in's own
value, so two GPUs of shortfall outweighed the claim)."""

from __future__ import annotations

from test_policies import job, running, table_for

from solver.policies import get_policy
from solver.site import SitePolicy, UnmanagedDemand, parse_reason
from solver.types import Cell, ClusterView, NodeView, ScheduleRequest

#: two nodes of 2 GPUs: an elastic job of acctB holds all four
FOUR = ClusterView((NodeView("n1", "a40", 2, 2, partitions=("a40",)), NodeView("n2", "a40", 2, 2, partitions=("a40",))))


def test_a_claim_is_not_taken_by_a_job_of_an_account_short_of_its_share(exact_config):
    borrower = running(
        job("e1", account="acctB", elastic=True, min_gpus=2, max_gpus=4), Cell("a40", 2, 2), [("n1", 2), ("n2", 2)], 1.0
    )
    late = job("m3", account="acctA", min_gpus=2, max_gpus=2)
    jobs = [borrower, late]
    est = table_for(jobs, FOUR, {(j.job_id, "a40"): 1.0 for j in jobs})
    site = SitePolicy(
        shares={"acctA": 0.6, "acctB": 0.4},
        unmanaged=(UnmanagedDemand("77", 2, None, ("a40",), priority=1e6, account="acctA", nodes=1),),
    )
    rep = get_policy("cellsched").schedule(ScheduleRequest(FOUR, tuple(jobs), config=exact_config(), site=site), est)
    held = sum(p.cell.num_gpus for p in rep.placements.values())
    assert held == 2 and "m3" not in rep.placements  # two GPUs left for job 77; e1 shrunk to the other two
    kind, fields = parse_reason(rep.reasons["m3"])
    assert kind == "unmanaged" and fields["job"] == "77"
