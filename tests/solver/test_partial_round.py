"""Partial rounds (SolverConfig.replan_interval_s): between rounds that re-plan
every running job, a round places the pending jobs and re-plans only the
running jobs on nodes with idle GPUs (solver.placement.candidates.partial_round),
and says why the others stayed (solver.placement.explain)."""

from __future__ import annotations

from dataclasses import replace

from test_policies import MOVE, job, move_case, running, table_for

from solver.placement.candidates import partial_round
from solver.placement.explain import PARTIAL_ROUND
from solver.policies import get_policy
from solver.site import parse_reason, reason_stays
from solver.types import Cell, ClusterView, NodeView, ParallelPlan, Placement, ScheduleRequest

#: n3 has one GPU held by a job cellsched does not manage (3 free)
NODES = ClusterView(
    (
        NodeView("n1", "a100", 4, 4),
        NodeView("n2", "a100", 8, 8),
        NodeView("n3", "a100", 4, 3),
        NodeView("n4", "a100", 4, 4),
    )
)


def placed(jid: str, nodes: list[tuple[str, int]]) -> Placement:
    gpus = {g for _, g in nodes}.pop()
    cell = Cell("a100", len(nodes), gpus)
    return Placement(jid, cell, tuple(nodes), ParallelPlan(1, cell.num_gpus, 1), 1.0)


def test_the_running_jobs_with_no_idle_gpu_on_their_nodes_are_kept():
    fixed = {"f": placed("f", [("n2", 1)])}  # kept by split_fixed (say, not elastic)
    on = {
        "a": [("n1", 4)],  # n1: 4 of 4 held, none idle: kept
        "b": [("n2", 2)],  # n2: f's 1, b's 2 and g's 1 of 8: idle ones, placed again
        "d": [("n3", 3)],  # n3: its 3 free all d's: kept
        "e": [("n9", 2)],  # a node gone: placed again
        "g": [("n2", 1), ("n4", 1)],  # n4 has none idle, n2 has: placed again
        "k": [("n4", 3)],  # n4: g's 1 and k's 3: kept
        "h": [("n3", 3)],  # n3 again (none idle), but d's 3 fill its 3 free: placed again
    }
    jobs = [replace(job(j), current=placed(j, nodes)) for j, nodes in on.items()]
    jobs.insert(2, job("c"))  # pending
    held, rest, kept = partial_round(NODES, fixed, jobs)
    assert kept == ["a", "d", "k"]
    assert [j.job_id for j in rest] == ["b", "c", "e", "g", "h"]
    assert held == {"f": fixed["f"], **{j.job_id: j.current for j in jobs if j.job_id in kept}}


def test_a_partial_round_keeps_a_job_a_whole_one_moves_and_says_why(exact_config):
    """A job 10x faster on the idle A100: a whole round moves it (the
    subject); a partial one keeps it on its full A10 node, with the note."""
    j, est = move_case(10.0, elastic=True)
    cluster = ClusterView((NodeView("a100-0", "a100", 1, 1), NodeView("a10-0", "a10", 1, 1)))
    policy = get_policy("cellsched")
    whole = policy.schedule(ScheduleRequest(cluster, (j,), config=exact_config(**MOVE)), est)
    assert whole.placements["j"].cell.gpu_type == "a100"
    part = policy.schedule(ScheduleRequest(cluster, (j,), config=exact_config(**MOVE), replan_all=False), est)
    assert part.placements["j"].same_resources(j.current)
    assert part.notes["j"] == reason_stays("a10:1x1:pp1", PARTIAL_ROUND)
    assert parse_reason(part.notes["j"]) == ("stays", {"cell": "a10:1x1:pp1", "why": PARTIAL_ROUND})


def test_a_partial_round_replans_a_job_beside_an_idle_gpu_and_places_a_pending_one(exact_config):
    """The A10 node has 2 GPUs and j holds one: j is re-planned (moves to the
    A100), and a pending job p gets the A10 GPUs."""
    cluster = ClusterView((NodeView("a100-0", "a100", 1, 1), NodeView("a10-0", "a10", 2, 2)))
    j, p = job("j", max_gpus=1, elastic=True), job("p", max_gpus=2)
    est = table_for([j, p], cluster, {("j", "a100"): 10.0, ("j", "a10"): 1.0, ("p", "a10"): 1.0})
    cell = Cell("a10", 1, 1)
    j = running(j, cell, [("a10-0", 1)], est.table[("j", cell.key())])
    req = ScheduleRequest(cluster, (j, p), config=exact_config(**MOVE), replan_all=False)
    rep = get_policy("cellsched").schedule(req, est)
    assert rep.placements["j"].cell.gpu_type == "a100"
    assert rep.placements["p"].nodes == (("a10-0", 2),)
