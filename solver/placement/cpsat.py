"""Solve the placement model (model.py) with CP-SAT, whole or with some
columns fixed (the jobs the LP relaxation already placed, lp.py)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from solver.placement.model import Model
from solver.placement.nodes import ClassKey
from solver.types import SolverConfig, SolverStatus


@dataclass(frozen=True)
class Solved:
    """What the solver chose: option index per job, and per free option either
    class counts (aggregated) or node names (exact)."""

    status: SolverStatus
    error: str = ""  # what the solver raised (status ERROR)
    choice: dict[str, int] = field(default_factory=dict)
    counts: dict[str, dict[ClassKey, int]] = field(default_factory=dict)
    nodes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    objective: int = 0
    bound: int = 0
    build_s: float = 0.0
    solve_s: float = 0.0
    num_vars: int = 0


def parameters(solver: cp_model.CpSolver, config: SolverConfig, time_limit_s: float | None = None) -> None:
    """Time limits, workers, seed and search settings.

    Deterministic mode (config.deterministic, the default) runs ONE worker
    stopped by the deterministic-time budget: the same input and seed then
    give the same plan whatever the machine's load. (CP-SAT's interleaved
    multi-worker search is also deterministic, but on this model it stalled
    at a 4% gap after 3 s where one worker proved optimality in under 1 s.)
    Otherwise config.workers run the parallel portfolio. The wall-clock
    limit (time_limit_s, default config.time_limit_s) is a safety net;
    hitting it can change the result.

    The model is a multiple-choice knapsack with few capacity rows, so its
    LP relaxation is tight: full linearization (level 2) lets the LP guide
    the search. Presolve and probing cost more than they save here (measured
    on 500 jobs x 24 options: 2.3 s -> 0.7 s to optimality without them);
    the warm start is complete and feasible, so no search time is spent
    trying to repair it (hint_conflict_limit 0).
    """
    p = solver.parameters
    p.max_time_in_seconds = max(config.time_limit_s if time_limit_s is None else time_limit_s, 0.0)
    p.max_deterministic_time = max(config.deterministic_time, 0.0)
    p.num_workers = 1 if config.deterministic else max(1, config.workers)
    p.random_seed = config.seed
    p.relative_gap_limit = max(config.relative_gap_limit, 0.0)
    p.linearization_level = 2
    p.cp_model_presolve = False
    p.cp_model_probing_level = 0
    p.hint_conflict_limit = 0
    p.log_search_progress = False


def decode(m: Model, values: Sequence[int]) -> tuple[dict, dict, dict]:
    """(choice, class counts, node names) of a solution's column values."""
    choice, counts, nodes = {}, {}, {}
    for (jid, k), v in m.x.items():
        if not values[v]:
            continue
        choice[jid] = k
        shares = m.shares.get((jid, k))
        if shares is None:
            continue
        if m.exact:
            nodes[jid] = tuple(n for n, (c, _) in shares.items() if values[c])
        else:
            counts[jid] = {key: mult * values[c] for key, (c, mult) in shares.items() if values[c]}
    return choice, counts, nodes


def solve_cpsat(
    m: Model,
    config: SolverConfig,
    hint: Sequence[int] | None = None,
    fixed: Mapping[int, int] | None = None,
    time_limit_s: float | None = None,
) -> Solved:
    """Solve `m` with the `fixed` columns held at their values; never raises
    for solver trouble. The objective and bound include the fixed part.

    The model is written straight into CP-SAT's proto (variables by index,
    rows and hints as whole lists): the same model as through the
    CpModel methods, a few times faster to build for thousands of columns."""
    t0 = time.perf_counter()
    fixed = fixed or {}
    cp = cp_model.CpModel()
    proto = cp.proto
    free_cols = [c for c in range(len(m.ub)) if c not in fixed]  # CP-SAT variable i is column free_cols[i]
    index = [-1] * len(m.ub)  # column -> CP-SAT variable (-1: fixed)
    for i, c in enumerate(free_cols):
        index[c] = i
        proto.variables.add().domain.extend((0, m.ub[c]))
    for r in m.rows:
        vs, cs, const, top, low = [], [], 0, 0, 0
        for c, a in zip(r.cols, r.coefs):
            if index[c] < 0:
                const += a * fixed[c]
            else:
                vs.append(index[c])
                cs.append(a)
                top += max(a, 0) * m.ub[c]
                low += min(a, 0) * m.ub[c]
        hi, lo = r.hi - const, None if r.lo is None else r.lo - const
        if top > hi or (lo is not None and low < lo):  # otherwise no free column can break the row
            if not vs:
                return Solved(SolverStatus.INFEASIBLE, build_s=time.perf_counter() - t0)
            linear = proto.constraints.add().linear
            linear.vars.extend(vs)
            linear.coeffs.extend(cs)
            linear.domain.extend((low if lo is None else lo, hi))
    for xs in m.choices:
        free = [index[c] for c in xs if index[c] >= 0]
        if len(free) > 1:
            proto.constraints.add().at_most_one.literals.extend(free)
    offset = sum(m.obj[c] * v for c, v in fixed.items())
    terms = [(index[c], a) for c, a in enumerate(m.obj) if a and index[c] >= 0]
    objective = proto.objective  # CP-SAT minimises: maximise sum a x as -(sum -a x)
    objective.vars.extend([i for i, _ in terms])
    objective.coeffs.extend([-a for _, a in terms])
    objective.scaling_factor = -1.0
    if hint is not None:
        proto.solution_hint.vars.extend(range(len(free_cols)))
        proto.solution_hint.values.extend([hint[c] for c in free_cols])
    solver = cp_model.CpSolver()
    parameters(solver, config, time_limit_s)
    t1 = time.perf_counter()
    code = solver.solve(cp)
    t2 = time.perf_counter()
    status = SolverStatus(solver.status_name(code))
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Solved(status, build_s=t1 - t0, solve_s=t2 - t1)
    sol = list(solver.response_proto.solution)
    values = [fixed[c] if index[c] < 0 else sol[index[c]] for c in range(len(m.ub))]
    objective_value = offset + int(round(solver.objective_value))
    bound = offset + int(round(solver.best_objective_bound))
    if status == SolverStatus.OPTIMAL and bound > objective_value:  # stopped by relative_gap_limit
        status = SolverStatus.FEASIBLE
    return Solved(status, "", *decode(m, values), objective_value, bound, t1 - t0, t2 - t1, len(proto.variables))
