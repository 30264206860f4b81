"""Reservations and time limits in cellsched's plans: nodes reserved from T
go only to jobs estimated to end before T (or that the reservation admits),
and no move makes a job that would finish within its time limit miss it.
Oracles worked out by hand from table_for's times (4 GPUs on one node:
10 / 4 ** 0.9 = 2.872 s an iteration)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_policies import job, running, table_for
from test_site_limits import PATHS

from solver.placement import validate_plan
from solver.policies import get_policy
from solver.site import Reservation, SitePolicy, iso, parse_reason
from solver.types import Cell, ClusterView, NodeView, ScheduleRequest

T4 = 10 / 4**0.9  # s per iteration on 4 GPUs of one node
NOW = 1_000_000.0
#: node r0 is in the reservation, n1 is not
TWO = ClusterView((NodeView("r0", "a100", 4, 4), NodeView("n1", "a100", 4, 4)))
MAINT = Reservation("maint", ("r0",), start=NOW + 600, maintenance=True)  # opens in 10 minutes


def four(jid: str, minutes: float, **kw):
    """A job of exactly 4 GPUs estimated to run `minutes` on them."""
    return job(jid, min_gpus=4, max_gpus=4, iterations=round(minutes * 60 / T4), **kw)


def plan(jobs, site, cluster=TWO, **cfg):
    est = table_for(jobs, cluster, {(j.job_id, "a100"): 1.0 for j in jobs})
    from conftest import exact

    req = ScheduleRequest(cluster, tuple(jobs), now=NOW, config=exact(**cfg), site=site)
    rep = get_policy("cellsched").schedule(req, est)
    validate_plan(cluster, rep.placements, {j.job_id: j for j in jobs}, site, NOW)
    return rep


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_20_minute_job_stays_off_nodes_reserved_in_10_minutes_and_a_5_minute_job_may_use_them(path):
    rep = plan([four("long", 20), four("short", 5)], SitePolicy(reservations=(MAINT,)), **PATHS[path])
    assert rep.placements["long"].node_names == ("n1",)
    assert rep.placements["short"].node_names == ("r0",)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_job_that_would_end_after_the_window_opens_waits_and_says_which_window(path):
    rep = plan([four("long1", 20), four("long2", 20)], SitePolicy(reservations=(MAINT,)), **PATHS[path])
    assert len(rep.placements) == 1 and all(p.node_names == ("n1",) for p in rep.placements.values())
    (waiting,) = {"long1", "long2"} - set(rep.placements)
    kind, fields = parse_reason(rep.reasons[waiting])
    assert kind == "reservation" and fields["name"] == "maint"
    assert fields["start"] == iso(NOW + 600) == "1970-01-12T13:56:40Z"
    assert fields["end"] == iso(NOW + round(20 * 60 / T4) * T4)


def test_a_reservation_admits_its_own_jobs_and_a_maintenance_one_nobody():
    mine = Reservation("team", ("r0",), start=NOW - 60, accounts=("acctA",))
    rep = plan([four("a", 20, account="acctA"), four("b", 20, account="acctB")], SitePolicy(reservations=(mine,)))
    assert rep.placements["a"].node_names == ("r0",) and rep.placements["b"].node_names == ("n1",)
    asked = four("c", 1, reservation="team")
    rep = plan([asked], SitePolicy(reservations=(mine,)), cluster=ClusterView(TWO.nodes[:1]))
    assert rep.placements["c"].node_names == ("r0",)
    now_maint = replace(MAINT, start=NOW - 1, end=NOW + 3600)
    rep = plan(
        [four("d", 1, reservation="maint")], SitePolicy(reservations=(now_maint,)), cluster=ClusterView(TWO.nodes[:1])
    )
    assert not rep.placements and parse_reason(rep.reasons["d"])[0] == "reservation"


def test_a_time_limit_ends_the_estimate_before_the_window():
    # estimated 20 minutes, but Slurm ends it at its 8-minute limit: before the window opens
    rep = plan([four("long", 20), four("capped", 20, time_limit_s=480)], SitePolicy(reservations=(MAINT,)))
    assert rep.placements["capped"].node_names == ("r0",)


def test_a_move_that_would_miss_the_time_limit_is_refused():
    """An elastic job on 4 GPUs with 1000 s left, time limit 1100 s from now:
    shrinking it to 2 GPUs (1.87 x slower, plus a 60 s restart) would end it
    after its limit, so it keeps its 4 GPUs and the new job waits."""
    one = ClusterView((NodeView("n0", "a100", 4, 4),))
    iters = round(1000 / T4)
    a = job("a", elastic=True, max_gpus=4, iterations=iters, restart_cost_s=60)
    a = running(a, Cell("a100", 1, 4), [("n0", 4)], T4, running_since=NOW - 100, time_limit_s=1200)
    b = job("b", elastic=True, max_gpus=4, iterations=20, submit_time=NOW - 3600)
    jobs = [a, b]
    loose = plan([replace(a, time_limit_s=None), b], SitePolicy(reservations=(MAINT,)), cluster=one)
    assert loose.placements["a"].cell.num_gpus < 4  # without the limit it shrinks for b (the test's subject)
    rep = plan(jobs, SitePolicy(reservations=(MAINT,)), cluster=one)
    assert rep.placements["a"].cell.num_gpus == 4 and "b" not in rep.placements
    # a job that misses its limit anyway may still be moved
    late = replace(a, time_limit_s=600)
    rep = plan([late, b], SitePolicy(reservations=(MAINT,)), cluster=one)
    assert rep.placements["a"].cell.num_gpus < 4
