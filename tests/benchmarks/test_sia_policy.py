"""The cellsched half of the Sia-artifact adapter (benchmarks/sia_policy.py):
a round's description into cellsched's request, its reply into the
artifact's allocations with the node-capacity check. Needs no artifact
(the runs themselves are benchmarks/sia_artifact.py's, given --artifact)."""

from __future__ import annotations

import math

import pytest
import sia_bridge
import sia_policy
from sia_policy import UNIT, NodeOverflow, allocations_of, decide, request_of

from solver.policies.cellsched import CellschedPolicy
from solver.types import Cell, ParallelPlan, Placement, ScheduleReply, SolverStatus

NODES = [
    {"name": "rtx-0", "type": "rtx", "index": 0, "gpus": 8},
    {"name": "rtx-1", "type": "rtx", "index": 1, "gpus": 8},
    {"name": "aws-0", "type": "aws", "index": 0, "gpus": 4},
]


def job(jid: str = "cifar10-0", **kw: object) -> dict[str, object]:
    d: dict[str, object] = {
        "id": jid,
        "submit": 10.0,
        "restarts": 0,
        "restart_cost_s": 30.0,
        "rates": [["rtx", 1, 1, 100.0], ["rtx", 1, 2, 180.0], ["aws", 1, 1, 50.0]],
        "min_gpus": 1,
        "max_gpus": 2,
        "work": UNIT * 100.0,
        "done": UNIT * 10.0,
        "current": None,
        "running_since": None,
    }
    d.update(kw)
    return d


def desc(*jobs: dict[str, object], aware: bool = True) -> dict[str, object]:
    return {"now": 600.0, "aware": aware, "nodes": NODES, "jobs": list(jobs)}


def test_request_carries_sizes_rates_and_restart_cost() -> None:
    request, est = request_of(desc(job()))
    (j,) = request.jobs
    assert (j.iterations, j.iterations_done, j.global_batch) == (100, 10.0, UNIT)
    assert (j.max_gpus, j.restart_cost_s, j.submit_time, j.current) == (2, 30.0, 10.0, None)
    assert {n.name: (n.gpu_type, n.gpus_total, n.gpus_free) for n in request.cluster.nodes} == {
        "rtx-0": ("rtx", 8, 8),
        "rtx-1": ("rtx", 8, 8),
        "aws-0": ("aws", 4, 4),
    }
    assert not request.config.mixed_cells and request.config.hesrpt
    assert est.estimate(j, Cell("rtx", 1, 2)).iter_time_s == pytest.approx(UNIT / 180.0)
    assert est.estimate(j, Cell("aws", 1, 1)).iter_time_s == pytest.approx(UNIT / 50.0)
    # no rate for the layout, pipeline stages: infeasible
    assert not est.estimate(j, Cell("rtx", 2, 1)).feasible
    assert not est.estimate(j, Cell("rtx", 1, 2, pp=2)).feasible


def test_unaware_request_hides_sizes_and_size_terms() -> None:
    request, _ = request_of(desc(job(work=None), aware=False))
    (j,) = request.jobs
    assert (j.iterations, j.iterations_done) == (sia_policy.UNAWARE_ITERATIONS, 0.0)
    assert not request.config.hesrpt and request.config.w_short_jobs == 0.0


def test_current_placement_becomes_a_cell_and_bad_ones_are_refused() -> None:
    request, _ = request_of(desc(job(current={"type": "rtx", "nodes": {"rtx-1": 2}}, running_since=120.0)))
    (j,) = request.jobs
    assert j.current is not None
    assert (j.current.cell, j.current.nodes, j.running_since) == (Cell("rtx", 1, 2), (("rtx-1", 2),), 120.0)
    assert j.current.iter_time_s == pytest.approx(UNIT / 180.0)
    assert request.previous == {"cifar10-0": j.current}
    with pytest.raises(ValueError, match="not one count per node"):
        request_of(desc(job(current={"type": "rtx", "nodes": {"rtx-0": 2, "rtx-1": 1}})))


def placed(jid: str, cell: Cell, nodes: tuple[tuple[str, int], ...]) -> Placement:
    return Placement(jid, cell, nodes, ParallelPlan(1, cell.num_gpus, 1), 1.0)


def reply(*ps: Placement) -> ScheduleReply:
    return ScheduleReply({p.job_id: p for p in ps}, SolverStatus.OPTIMAL)


def test_allocations_name_node_indexes_per_gpu() -> None:
    out = allocations_of(
        reply(
            placed("a", Cell("rtx", 2, 4), (("rtx-1", 4), ("rtx-0", 4))),
            placed("b", Cell("aws", 1, 3), (("aws-0", 3),)),
        ),
        NODES,
    )
    assert out == {"a": ("rtx", [0, 0, 0, 0, 1, 1, 1, 1]), "b": ("aws", [0, 0, 0])}


def test_allocations_refuse_an_overfull_node_or_a_foreign_type() -> None:
    full = reply(placed("a", Cell("rtx", 1, 6), (("rtx-0", 6),)), placed("b", Cell("rtx", 1, 4), (("rtx-0", 4),)))
    with pytest.raises(NodeOverflow, match="node rtx-0: 10 GPUs given, it has 8"):
        allocations_of(full, NODES)
    with pytest.raises(NodeOverflow, match="aws-0 is not a rtx node"):
        allocations_of(reply(placed("a", Cell("rtx", 1, 2), (("aws-0", 2),))), NODES)


def test_a_round_gives_the_fast_type_and_fits_the_nodes() -> None:
    fast = [["rtx", n, n * g, 100.0 * n * g] for n in (1, 2) for g in range(1, 9)]
    slow = [["aws", 1, g, 10.0 * g] for g in range(1, 5)]
    alone = decide(CellschedPolicy(), desc(job(rates=fast + slow, max_gpus=16)))
    # one job, every GPU free, linear speedup: the whole of the fast type
    assert alone["allocations"] == {"cifar10-0": ("rtx", [0] * 8 + [1] * 8)}
    many = decide(CellschedPolicy(), desc(*(job(f"j{i}", rates=fast + slow, max_gpus=16) for i in range(5))))
    used: dict[tuple[str, int], int] = {}
    for t, ids in many["allocations"].values():
        for i in ids:
            used[(t, i)] = used.get((t, i), 0) + 1
    cap = {(n["type"], n["index"]): n["gpus"] for n in NODES}
    assert used and all(g <= cap[k] for k, g in used.items())
    assert len(many["allocations"]) == 5  # 20 GPUs for 5 jobs: none waits


def test_our_sia_answers_a_round_through_the_same_adapter() -> None:
    """--scheduler sia: the project's re-implemented Sia gets the same request and its reply the same checks."""
    from solver.policies import get_policy

    fast = [["rtx", n, n * g, 100.0 * n * g] for n in (1, 2) for g in range(1, 9)]
    slow = [["aws", 1, g, 10.0 * g] for g in range(1, 5)]
    alone = decide(get_policy("sia"), desc(job(rates=fast + slow, max_gpus=16)))
    assert alone["allocations"] == {"cifar10-0": ("rtx", [0] * 8 + [1] * 8)}
    many = decide(get_policy("sia"), desc(*(job(f"j{i}", rates=fast + slow, max_gpus=16) for i in range(5))))
    assert len(many["allocations"]) == 5  # 20 GPUs for 5 jobs: Sia's p < 1 gives every job some first


def test_bridge_layouts_and_declared_error() -> None:
    assert sia_bridge.layouts(4, 2, 5) == [(1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (2, 4)]

    class App:
        def get_completion_epoch(self, batch: int) -> int:
            return 9

        def get_progress(self, epoch: int) -> float:
            return 1000.0 * epoch

    class Job:
        name, target_batch_size, reference_app = "bert-1", 64, App()

    assert sia_bridge.declared(Job(), 0.0, 0) == 10_000.0
    errs = [sia_bridge.declared(Job(), 0.5, s) / 10_000.0 for s in range(400)]
    logs = [math.log(e) for e in errs]
    assert abs(sum(logs) / len(logs)) < 0.1 and 0.4 < (sum(x * x for x in logs) / len(logs)) ** 0.5 < 0.6
    assert sia_bridge.declared(Job(), 0.5, 3) == sia_bridge.declared(Job(), 0.5, 3)  # per (seed, job)


def test_config_changes_are_fields_of_solver_config() -> None:
    cfg = sia_policy.config_with(["restart_penalty=0.25", "fairness_p=1", "preemption=off"])
    assert (cfg.restart_penalty, cfg.fairness_p, cfg.preemption) == (0.25, 1, "off")
    with pytest.raises(SystemExit, match="not KEY=VALUE"):
        sia_policy.config_with(["no_such_knob=1"])
    request, _ = request_of(desc(job()), cfg)
    assert request.config.restart_penalty == 0.25 and not request.config.mixed_cells
