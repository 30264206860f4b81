"""One joint placement round: options in, placeable plan out.

greedy warm start -> CP-SAT (exact node model on small clusters, node classes
on large ones) -> concrete nodes (nodes.py) -> repair -> the better of that and
the greedy plan. If CP-SAT returns nothing usable (UNKNOWN, MODEL_INVALID, an
exception) the greedy plan is returned with status "GREEDY".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from solver.placement.candidates import Option
from solver.placement.cpsat import Solved, solve_cpsat
from solver.placement.greedy import Chosen, greedy, try_place, value_of
from solver.placement.objective import SCALE
from solver.placement.space import Space
from solver.types import JobRequest, Placement, SolverConfig


@dataclass(frozen=True)
class Result:
    placements: dict[str, Placement]
    status: str
    objective: float
    bound: float
    build_s: float = 0.0
    solve_s: float = 0.0
    place_s: float = 0.0
    reasons: dict[str, str] = field(default_factory=dict)
    repaired: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()


def assign_nodes(space: Space, jobs: Sequence[JobRequest], options: Mapping[str, Sequence[Option]],
                 solved: Solved) -> tuple[Chosen, list[str], list[str]]:
    """Concrete nodes for CP-SAT's choice: pinned options first, then shares
    largest first (multi-node jobs first among equal shares) within the
    planned classes, least-loaded node first.

    Repair: a job whose chosen cell cannot be put on concrete nodes (the
    aggregated model does not see that one job's shares need distinct nodes)
    takes its best other option that still fits, else stays unplaced.
    Returns the placed choices, the repaired jobs and the unplaced ones."""
    ledger = space.ledger()
    by_id = {j.job_id: j for j in jobs}
    chosen: Chosen = {}
    failed: list[str] = []
    picks = [(jid, options[jid][k]) for jid, k in solved.choice.items()]
    picks.sort(key=lambda p: (p[1].pinned is None, -p[1].cell.gpus_per_node, -p[1].cell.num_nodes, -p[1].value))
    for jid, o in picks:
        job, cell = by_id[jid], o.cell
        if o.pinned is not None:
            got = try_place(space, ledger, job, o)
            if got is None:
                failed.append(jid)
            else:
                chosen[jid] = (o, *got)
            continue
        counts = solved.counts.get(jid)
        if counts is None:  # exact model: classes of the nodes CP-SAT picked
            counts = {}
            for n in solved.nodes.get(jid, ()):
                c = ledger.group_of[n]
                counts[c] = counts.get(c, 0) + 1
        names: list[str] = []
        for c, cnt in counts.items():
            got = ledger.pick([c], cnt, cell.gpus_per_node, cell.num_nodes > 1, True, exclude=names)
            if got is None:
                break
            names += got
        ok, part = space.partition_of(job, tuple(names))
        if len(names) != cell.num_nodes or not ok:
            failed.append(jid)
            continue
        chosen[jid] = (o, ledger.place(cell, names), part)
    repaired, unplaced = [], []
    for jid in failed:
        for o in sorted(options[jid], key=lambda o: -o.value):
            got = try_place(space, ledger, by_id[jid], o, spread=True)
            if got is not None:
                chosen[jid] = (o, *got)
                repaired.append(jid)
                break
        else:
            unplaced.append(jid)
    return chosen, repaired, unplaced


def _exact_nodes(space: Space, jobs: Sequence[JobRequest], options: Mapping[str, Sequence[Option]],
                 solved: Solved) -> Chosen:
    """The exact model's own node choice (always placeable)."""
    by_id = {j.job_id: j for j in jobs}
    out: Chosen = {}
    for jid, k in solved.choice.items():
        o = options[jid][k]
        nodes = o.pinned if o.pinned is not None else tuple((n, o.cell.gpus_per_node) for n in solved.nodes[jid])
        out[jid] = (o, nodes, space.partition_of(by_id[jid], tuple(n for n, _ in nodes))[1])
    return out


def place_jobs(space: Space, jobs: Sequence[JobRequest], options: Mapping[str, Sequence[Option]],
               config: SolverConfig, preferred: Mapping[str, Placement] = {}, use_cpsat: bool = True) -> Result:
    """Choose at most one option per job and concrete nodes for each."""
    t0 = time.perf_counter()
    warm = greedy(space, jobs, options, preferred)
    exact = space.num_nodes <= config.exact_node_model_max_nodes
    solved = Solved("NOT_RUN")
    if use_cpsat and any(options.values()):
        try:
            solved = solve_cpsat(space, jobs, options, config, warm, exact)
        except Exception as e:  # solver trouble must not leave the cluster without a plan
            solved = Solved(f"ERROR: {type(e).__name__}: {e}")
    elif not any(options.values()):
        solved = Solved("OPTIMAL")
    t1 = time.perf_counter()
    repaired: list[str] = []
    dropped: list[str] = []
    if solved.status in ("OPTIMAL", "FEASIBLE"):
        chosen, repaired, dropped = assign_nodes(space, jobs, options, solved)
        if (repaired or dropped) and exact:
            chosen, repaired, dropped = _exact_nodes(space, jobs, options, solved), [], []
        status = solved.status if not (repaired or dropped) else "FEASIBLE"
        if value_of(warm) > value_of(chosen):
            chosen, status = warm, "GREEDY"
        objective, bound = value_of(chosen), max(solved.bound, value_of(chosen))
    else:
        chosen, status = warm, "GREEDY"
        objective = bound = value_of(warm)
    reasons = {j: "its cell could not be put on concrete nodes, and no other option fit" for j in dropped
               if j not in chosen}
    if status == "GREEDY" and solved.status not in ("OPTIMAL", "FEASIBLE"):
        reasons.update({j.job_id: f"greedy plan (CP-SAT: {solved.status})" for j in jobs if j.job_id not in chosen})
    placements = {jid: o.placement(nodes, part) for jid, (o, nodes, part) in chosen.items()}
    place_s = time.perf_counter() - t1
    return Result(placements, status, objective / SCALE, bound / SCALE,
                  build_s=solved.build_s + (t1 - t0 - solved.build_s - solved.solve_s),
                  solve_s=solved.solve_s, place_s=place_s, reasons=reasons, repaired=tuple(repaired), dropped=tuple(dropped))
