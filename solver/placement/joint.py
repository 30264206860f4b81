"""One joint placement round: options in, placeable plan out.

model (model.py: exact node model on small clusters, node classes on large
ones) -> CP-SAT, warm-started by the greedy plan -> concrete nodes (nodes.py)
-> repair -> the greedy plan instead where that is better (see place_jobs).
On the aggregated model (from config.lp_first_min_jobs jobs: by default
always) the LP relaxation is solved first and CP-SAT only decides the jobs it
leaves fractional (lp.py); the LP optimum is the reported bound. Should that
sub-model fail, CP-SAT gets the whole model.
If CP-SAT returns nothing usable (UNKNOWN, MODEL_INVALID, an exception) the
greedy plan is returned with status "GREEDY".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from solver.placement.candidates import Option
from solver.placement.cpsat import Solved, solve_cpsat
from solver.placement.greedy import Chosen, greedy, try_place, value_of
from solver.placement.lp import integral_jobs, solve_lp
from solver.placement.model import build, hint_values
from solver.placement.objective import SCALE
from solver.placement.siterules import SiteRules, Tally
from solver.placement.space import Space
from solver.types import JobRequest, Placement, SolverConfig, SolverStatus


@dataclass(frozen=True)
class Result:
    placements: dict[str, Placement]
    status: SolverStatus
    objective: float
    bound: float
    build_s: float = 0.0
    solve_s: float = 0.0
    place_s: float = 0.0
    reasons: dict[str, str] = field(default_factory=dict)
    repaired: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()


def assign_nodes(
    space: Space,
    jobs: Sequence[JobRequest],
    options: Mapping[str, Sequence[Option]],
    solved: Solved,
    rules: SiteRules | None = None,
) -> tuple[Chosen, list[str], list[str]]:
    """Concrete nodes for CP-SAT's choice: pinned options first, then shares
    largest first (multi-node jobs first among equal shares) within the
    planned classes, least-loaded node first.

    Repair: a job whose chosen cell cannot be put on concrete nodes (the
    aggregated model does not see that one job's shares need distinct nodes)
    takes its best other option that still fits (within the site's GPU
    limits: `rules`), else stays unplaced. A running job that may stay where
    it runs is never left unplaced: the controller would keep it there
    anyway, under the jobs given its nodes. Should that happen, the pass is
    made again with it on its pinned option (placed first, so on its own
    nodes), until no such job is left out.
    Returns the placed choices, the repaired jobs and the unplaced ones."""
    by_id = {j.job_id: j for j in jobs}
    stay: dict[str, int] = {}
    while True:
        chosen, repaired, unplaced = _nodes_for(space, by_id, options, {**solved.choice, **stay}, solved, rules)
        left = {j: k for j in unplaced if by_id[j].current is not None and (k := _pinned(options[j])) is not None}
        if not left.keys() - stay.keys():
            return chosen, [*repaired, *stay], unplaced
        stay.update(left)


def _pinned(options: Sequence[Option]) -> int | None:
    """The index of the most valuable pinned (stay where it runs) option."""
    pinned = [k for k, o in enumerate(options) if o.pinned is not None]
    return max(pinned, key=lambda k: options[k].value) if pinned else None


def _nodes_for(
    space: Space,
    by_id: Mapping[str, JobRequest],
    options: Mapping[str, Sequence[Option]],
    choice: Mapping[str, int],
    solved: Solved,
    rules: SiteRules | None,
) -> tuple[Chosen, list[str], list[str]]:
    """One pass of assign_nodes with the options of `choice`."""
    ledger = space.ledger()
    chosen: Chosen = {}
    failed: list[str] = []
    picks = [(jid, options[jid][k]) for jid, k in choice.items()]
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
            picked = ledger.pick([c], cnt, cell.gpus_per_node, cell.num_nodes > 1, True, exclude=names)
            if picked is None:
                break
            names += picked
        ok, part = space.partition_of(job, tuple(names))
        if len(names) != cell.num_nodes or not ok:
            failed.append(jid)
            continue
        chosen[jid] = (o, ledger.place(cell, names), part)
    repaired, unplaced = [], []
    tally = None
    if rules is not None and failed:
        tally = Tally(rules)
        for jid, (o, _, _) in chosen.items():
            tally.add(jid, o.cell)
    for jid in failed:
        for o in sorted(options[jid], key=lambda o: -o.value):
            if tally is not None and not tally.fits(jid, o.cell):
                continue
            got = try_place(space, ledger, by_id[jid], o, spread=True)
            if got is not None:
                chosen[jid] = (o, *got)
                repaired.append(jid)
                if tally is not None:
                    tally.add(jid, o.cell)
                break
        else:
            unplaced.append(jid)
    return chosen, repaired, unplaced


def _exact_nodes(
    space: Space, jobs: Sequence[JobRequest], options: Mapping[str, Sequence[Option]], solved: Solved
) -> Chosen:
    """The exact model's own node choice (always placeable)."""
    by_id = {j.job_id: j for j in jobs}
    out: Chosen = {}
    for jid, k in solved.choice.items():
        o = options[jid][k]
        nodes = o.pinned if o.pinned is not None else tuple((n, o.cell.gpus_per_node) for n in solved.nodes[jid])
        out[jid] = (o, nodes, space.partition_of(by_id[jid], tuple(n for n, _ in nodes))[1])
    return out


def _solve(
    space: Space,
    jobs: Sequence[JobRequest],
    options: Mapping[str, Sequence[Option]],
    config: SolverConfig,
    warm: Callable[[], Chosen],
    exact: bool,
    rules: SiteRules | None = None,
) -> Solved:
    """CP-SAT on what the LP relaxation leaves open, or on the whole model
    (warm-started from `warm()`)."""
    t0 = time.perf_counter()
    m = build(space, jobs, options, exact, rules)
    built = time.perf_counter() - t0
    if not exact and sum(1 for xs in m.choices if xs) >= config.lp_first_min_jobs:
        lp = solve_lp(m, config.time_limit_s)
        if lp.status == SolverStatus.OPTIMAL:
            left = config.time_limit_s - (time.perf_counter() - t0)
            sub = solve_cpsat(m, config, fixed=integral_jobs(m, lp.values), time_limit_s=left)
            if sub.status.solved:
                status = SolverStatus.OPTIMAL if sub.objective >= lp.bound else SolverStatus.FEASIBLE
                return replace(
                    sub,
                    status=status,
                    bound=max(lp.bound, sub.objective),
                    build_s=built + lp.build_s + sub.build_s,
                    solve_s=lp.solve_s + sub.solve_s,
                )
        built += lp.build_s + lp.solve_s
    t1 = time.perf_counter()
    hint = hint_values(m, options, warm(), {n: c for c, names in space.classes.items() for n in names})
    built += time.perf_counter() - t1
    solved = solve_cpsat(m, config, hint, time_limit_s=config.time_limit_s - (time.perf_counter() - t0))
    return replace(solved, build_s=built + solved.build_s)


def place_jobs(
    space: Space,
    jobs: Sequence[JobRequest],
    options: Mapping[str, Sequence[Option]],
    config: SolverConfig,
    preferred: Mapping[str, Placement] = {},
    use_cpsat: bool = True,
    rules: SiteRules | None = None,
) -> Result:
    """Choose at most one option per job and concrete nodes for each.

    The greedy plan is computed when needed: as CP-SAT's warm start, as the
    fallback, and to compare with a plan further than
    config.relative_gap_limit from the bound (it cannot gain more than that).

    `rules` (siterules): the site's GPU limits bind every path (the model's
    rows, the greedy plan, the repair); a plan is worth its value less
    the cost of the GPUs it holds over a limit (only where the jobs that
    must stay hold more than it allows already).
    """
    t0 = time.perf_counter()
    warm_plan: list[Chosen] = []
    unit = rules.penalty_unit(options) if rules is not None and rules.buckets else 0
    bonus = rules.share_bonus(options) if rules is not None else 0
    targets = cast(SiteRules, rules).share_targets(options) if bonus else {}

    def warm() -> Chosen:
        if not warm_plan:
            warm_plan.append(greedy(space, jobs, options, preferred, Tally(rules) if rules is not None else None))
        return warm_plan[0]

    def worth(chosen: Chosen) -> int:
        total = value_of(chosen, space.links)
        if unit:
            tally = Tally(cast(SiteRules, rules))
            for jid, (o, _, _) in chosen.items():
                tally.add(jid, o.cell)
            total -= unit * tally.over()
        if bonus:
            total -= bonus * cast(SiteRules, rules).shortfall(
                targets, ((jid, o.cell) for jid, (o, _, _) in chosen.items())
            )
        return total

    exact = space.num_nodes <= config.exact_node_model_max_nodes
    solved = Solved(SolverStatus.NOT_RUN)
    if use_cpsat and any(options.values()):
        try:
            solved = _solve(space, jobs, options, config, warm, exact, rules)
        except Exception as e:  # solver trouble must not leave the cluster without a plan
            solved = Solved(SolverStatus.ERROR, f"{type(e).__name__}: {e}")
    elif not any(options.values()):
        solved = Solved(SolverStatus.OPTIMAL)
    t1 = time.perf_counter()
    repaired: list[str] = []
    dropped: list[str] = []
    if solved.status.solved:
        chosen, repaired, dropped = assign_nodes(space, jobs, options, solved, rules)
        if (repaired or dropped) and exact:
            chosen, repaired, dropped = _exact_nodes(space, jobs, options, solved), [], []
        status = solved.status if not (repaired or dropped) else SolverStatus.FEASIBLE
        place_s = time.perf_counter() - t1
        value = worth(chosen)
        if (warm_plan or max(solved.bound, value) - value > config.relative_gap_limit * value) and worth(
            warm()
        ) > value:
            chosen, status = warm(), SolverStatus.GREEDY
        objective = worth(chosen)
        bound = max(solved.bound, objective)
    else:
        chosen, status = warm(), SolverStatus.GREEDY
        objective = bound = worth(chosen)
        place_s = 0.0
    reasons = {
        j: "its cell could not be put on concrete nodes, and no other option fit" for j in dropped if j not in chosen
    }
    if status == SolverStatus.GREEDY and not solved.status.solved:
        why = f"{solved.status}: {solved.error}" if solved.error else solved.status
        reasons.update({j.job_id: f"greedy plan (CP-SAT: {why})" for j in jobs if j.job_id not in chosen})
    placements = {jid: o.placement(nodes, part) for jid, (o, nodes, part) in chosen.items()}
    t2 = time.perf_counter()
    return Result(
        placements,
        status,
        objective / SCALE,
        bound / SCALE,
        build_s=t2 - t0 - solved.solve_s - place_s,
        solve_s=solved.solve_s,
        place_s=place_s,
        reasons=reasons,
        repaired=tuple(repaired),
        dropped=tuple(dropped),
    )
