"""Solve the placement model (model.py) with CP-SAT, whole or with some
columns fixed (the jobs the LP relaxation already placed, lp.py)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import numpy as np
from ortools.sat.python import cp_model

from solver.placement.model import Model
from solver.placement.nodes import ClassKey
from solver.types import SolverConfig, SolverStatus

if TYPE_CHECKING:
    from ortools.sat.python.cp_model_helper import CpModelProto


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


def decode(
    m: Model, values: Sequence[int]
) -> tuple[dict[str, int], dict[str, dict[ClassKey, int]], dict[str, tuple[str, ...]]]:
    """(choice, class counts, node names) of a solution's column values."""
    choice: dict[str, int] = {}
    counts: dict[str, dict[ClassKey, int]] = {}
    nodes: dict[str, tuple[str, ...]] = {}
    for (jid, k), v in m.x.items():
        if not values[v]:
            continue
        choice[jid] = k
        shares = m.shares.get((jid, k))
        if shares is None:
            continue
        if m.exact:  # shares by node name
            nodes[jid] = tuple(cast(str, n) for n, (c, _) in shares.items() if values[c])
        else:  # shares by class
            counts[jid] = {cast(ClassKey, key): mult * values[c] for key, (c, mult) in shares.items() if values[c]}
    return choice, counts, nodes


def _add_rows(
    proto: CpModelProto,
    m: Model,
    value: np.ndarray[tuple[int], np.dtype[np.int64]],
    is_fixed: np.ndarray[tuple[int], np.dtype[np.bool_]],
    ub: np.ndarray[tuple[int], np.dtype[np.int64]],
    index: np.ndarray[tuple[int], np.dtype[np.int64]],
) -> bool:
    """The rows some free column can break, with the fixed columns' part
    moved to the bounds; False when a row fails on fixed columns alone."""
    mat = m.matrix()
    rows = len(m.rows)
    coef = mat.coef
    free_e = ~is_fixed[mat.col]
    const = np.bincount(mat.row, weights=np.where(free_e, 0.0, coef * value[mat.col]), minlength=rows)
    reach = np.where(free_e, coef * ub[mat.col], 0.0)
    top = np.bincount(mat.row, weights=np.maximum(reach, 0.0), minlength=rows)
    low = np.bincount(mat.row, weights=np.minimum(reach, 0.0), minlength=rows)
    hi, lo = mat.hi - const, mat.lo - const
    some = np.bincount(mat.row, weights=free_e, minlength=rows) > 0
    broken = (top > hi) | (low < lo)  # otherwise no free column can break the row
    if np.any(broken & ~some):
        return False
    starts = mat.start.tolist()
    for r in np.flatnonzero(broken).tolist():
        a, b = starts[r], starts[r + 1]
        keep = free_e[a:b]
        linear = proto.constraints.add().linear
        linear.vars.extend(index[mat.col[a:b][keep]].tolist())
        linear.coeffs.extend(coef[a:b][keep].astype(np.int64).tolist())
        linear.domain.extend((int(low[r]) if lo[r] == -np.inf else int(lo[r]), int(hi[r])))
    return True


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
    n = len(m.ub)
    ub = np.asarray(m.ub, np.int64)
    value = np.zeros(n, np.int64)  # the fixed columns' values
    is_fixed = np.zeros(n, bool)
    if fixed:
        cols = np.fromiter(fixed.keys(), np.int64, len(fixed))
        value[cols] = np.fromiter(fixed.values(), np.int64, len(fixed))
        is_fixed[cols] = True
    free_cols = np.flatnonzero(~is_fixed)  # CP-SAT variable i is column free_cols[i]
    index = np.full(n, -1, np.int64)  # column -> CP-SAT variable (-1: fixed)
    index[free_cols] = np.arange(len(free_cols))
    for c in free_cols.tolist():
        proto.variables.add().domain.extend((0, int(ub[c])))
    if not _add_rows(proto, m, value, is_fixed, ub, index):
        return Solved(SolverStatus.INFEASIBLE, build_s=time.perf_counter() - t0)
    for xs in m.choices:
        free = [int(index[c]) for c in xs if index[c] >= 0]
        if len(free) > 1:
            proto.constraints.add().at_most_one.literals.extend(free)
    obj = np.asarray(m.obj, np.int64)
    offset = int(obj[is_fixed] @ value[is_fixed])
    terms = np.flatnonzero((obj != 0) & ~is_fixed)
    objective = proto.objective  # CP-SAT minimises: maximise sum a x as -(sum -a x)
    objective.vars.extend(index[terms].tolist())
    objective.coeffs.extend((-obj[terms]).tolist())
    objective.scaling_factor = -1.0
    if hint is not None:
        proto.solution_hint.vars.extend(range(len(free_cols)))
        proto.solution_hint.values.extend(np.asarray(hint, np.int64)[free_cols].tolist())
    solver = cp_model.CpSolver()
    parameters(solver, config, time_limit_s)
    t1 = time.perf_counter()
    code = solver.solve(cp)
    t2 = time.perf_counter()
    status = SolverStatus(solver.status_name(code))
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Solved(status, build_s=t1 - t0, solve_s=t2 - t1)
    solution = value.copy()
    solution[free_cols] = np.asarray(solver.response_proto.solution, np.int64)
    values: list[int] = solution.tolist()
    objective_value = offset + int(round(solver.objective_value))
    bound = offset + int(round(solver.best_objective_bound))
    if status == SolverStatus.OPTIMAL and bound > objective_value:  # stopped by relative_gap_limit
        status = SolverStatus.FEASIBLE
    return Solved(status, "", *decode(m, values), objective_value, bound, t1 - t0, t2 - t1, len(proto.variables))
