"""The LP relaxation of the placement model (GLOP) and the jobs it already
places integrally.

The model is a multiple-choice knapsack: one "at most one option" row per job
and a few capacity rows. A vertex of its LP has at most as many fractional
jobs as it has other rows, so on a large round nearly every job is integral.
Fixing those and leaving CP-SAT the rest turns a model of ~100k columns into
one of a few hundred; the LP optimum stays a valid upper bound for the whole
round (it relaxes the aggregated model, which every placeable plan satisfies).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from ortools.linear_solver import pywraplp

from solver.placement.model import Model
from solver.types import SolverStatus

_TOL = 1e-6


@dataclass(frozen=True)
class Relaxation:
    status: SolverStatus
    values: tuple[float, ...] = ()
    objective: float = 0.0
    build_s: float = 0.0
    solve_s: float = 0.0
    #: an upper bound on the LP's optimum when `objective` may fall short of it (column generation)
    upper: float | None = None

    @property
    def bound(self) -> int:
        """The best integer objective the LP allows."""
        top = self.objective if self.upper is None else max(self.upper, self.objective)
        return int(math.floor(top * (1 + _TOL) + _TOL))


#: Columns of each job in the first restricted LP: its most valuable ones, and
#: as many of those most valuable per unit of capacity.
START_PER_JOB = 2
#: Stop pricing once the LP's optimum is known within this fraction.
LP_GAP = 1e-3
#: Columns of a job added per pricing pass (those of highest reduced cost).
ADD_PER_JOB = 4
#: Pricing passes before the whole LP is solved instead.
MAX_PASSES = 30


def solve_lp(m: Model, time_limit_s: float) -> Relaxation:
    """Solve the LP relaxation of `m` to a vertex (GLOP's simplex), by column
    generation: a restricted LP holds every job's most valuable options
    (and every column that is not a lone option's choice: pinned options,
    class counts, slot counts, overflows); the others are priced with its
    duals (reduced cost = value - duals of their rows) and the best ones
    added until none has a positive reduced cost (the restricted optimum is
    then an optimal vertex of the whole LP, the others staying at 0), or
    until the whole LP's optimum is known within LP_GAP: raising each job's
    dual by its best positive reduced cost gives a feasible dual of the
    whole LP, whose value bounds it (`upper`). Where the restricted LP
    fails, the whole LP is solved."""
    t0 = time.perf_counter()
    lp = _Restricted(m)
    lp.start()
    build_s = time.perf_counter() - t0
    solve_s = 0.0
    for _ in range(MAX_PASSES):
        left = time_limit_s - (time.perf_counter() - t0)
        t1 = time.perf_counter()
        code = lp.solve(left)
        solve_s += time.perf_counter() - t1
        if code != pywraplp.Solver.OPTIMAL:
            break
        t1 = time.perf_counter()
        obj = lp.objective()
        upper = obj + lp.lagrangian_gap()
        if upper - obj <= LP_GAP * max(abs(obj), 1.0):
            values = lp.values()
            build_s += time.perf_counter() - t1
            return Relaxation(SolverStatus.OPTIMAL, values, obj, build_s, solve_s, upper)
        lp.add_best()
        build_s += time.perf_counter() - t1
    full = _solve_whole(m, time_limit_s - (time.perf_counter() - t0))
    return replace(full, build_s=full.build_s + build_s, solve_s=full.solve_s + solve_s)


def _solver(time_limit_s: float) -> pywraplp.Solver:
    lp = pywraplp.Solver.CreateSolver("GLOP")
    lp.SetTimeLimit(max(0, int(time_limit_s * 1000)))
    # Dual simplex: 3-4x faster than the primal one on 4,000 jobs x 24 options.
    lp.SetSolverSpecificParametersAsString("use_dual_simplex: true")
    return lp


class _Restricted:
    """The LP of `m` over a growing set of its columns (rows: m.rows, then
    each job's "at most one option" row)."""

    def __init__(self, m: Model) -> None:
        self.m = m
        mat = m.matrix()
        n = len(m.ub)
        owner = np.asarray(m.owner, np.int64)
        self.obj = np.asarray(m.obj, np.float64)
        # the job rows: after m.rows, one per job with several columns (unless it has sum x = 1 there)
        stays = set(m.stays)
        multi = [ji for ji, xs in enumerate(m.choices) if len(xs) > 1 and ji not in stays]
        job_row = np.full(len(m.jobs) + 1, -1, np.int64)
        job_row[multi] = len(m.rows) + np.arange(len(multi))
        self.has_row = job_row >= 0
        self.has_row[m.stays] = True
        self.num_rows = len(m.rows) + len(multi)
        choice_cols = np.fromiter((c for ji in multi for c in m.choices[ji]), np.int64)
        choice_rows = np.repeat(job_row[multi], [len(m.choices[ji]) for ji in multi])
        rows = np.concatenate([mat.row, choice_rows])
        cols = np.concatenate([mat.col, choice_cols])
        coefs = np.concatenate([mat.coef, np.ones(len(choice_cols))])
        order = np.argsort(cols, kind="stable")  # by column: each column's entries
        self.e_row, self.e_col, self.e_coef = rows[order], cols[order], coefs[order]
        self.cstart = np.searchsorted(self.e_col, np.arange(n + 1))
        self.lo = np.concatenate([mat.lo, np.full(len(multi), -np.inf)])
        self.hi = np.concatenate([mat.hi, np.ones(len(multi))])
        self.priceable = np.zeros(n, bool)
        self.priceable[np.asarray(m.lone, np.int64)] = True
        self.owner = owner
        self.active = np.zeros(n, bool)
        self.solver: pywraplp.Solver | None = None

    def start(self) -> None:
        """The restricted LP's rows and first columns."""
        first = ~self.priceable
        cand = np.flatnonzero(self.priceable)
        mat = self.m.matrix()
        size = np.bincount(mat.col, weights=np.maximum(mat.coef, 0.0), minlength=len(self.obj))
        for worth in (self.obj[cand], self.obj[cand] / np.maximum(size[cand], 1.0)):
            order = cand[np.lexsort((cand, -worth, self.owner[cand]))]
            first[order[_rank_in_group(self.owner[order]) < START_PER_JOB]] = True
        lp = self.solver = _solver(0.0)
        inf = lp.infinity()
        self.rows = [
            lp.Constraint(-inf if lo == -np.inf else float(lo), float(hi))
            for lo, hi in zip(self.lo.tolist(), self.hi.tolist())
        ]
        self.cols: dict[int, pywraplp.Variable] = {}
        self.objective_ = lp.Objective()
        self.objective_.SetMaximization()
        self._add(np.flatnonzero(first))

    def _add(self, cols: np.ndarray) -> None:
        lp, obj, ub = self.solver, self.objective_, self.m.ub
        for c in cols.tolist():
            v = self.cols[c] = lp.NumVar(0.0, float(ub[c]), "")
            if self.obj[c]:
                obj.SetCoefficient(v, float(self.obj[c]))
            a, b = self.cstart[c], self.cstart[c + 1]
            for r, coef in zip(self.e_row[a:b].tolist(), self.e_coef[a:b].tolist()):
                self.rows[r].SetCoefficient(v, coef)
        self.active[cols] = True

    def solve(self, time_limit_s: float) -> int:
        self.solver.SetTimeLimit(max(0, int(time_limit_s * 1000)))
        return self.solver.Solve()

    def lagrangian_gap(self) -> float:
        """Price the left-out columns with the current duals; returns how far
        the whole LP's optimum may lie above the restricted one: per job its
        best positive reduced cost (a column of a job without a choice row:
        its reduced cost times its bound)."""
        dual = np.fromiter((r.dual_value() for r in self.rows), np.float64, len(self.rows))
        used = np.bincount(self.e_col, weights=dual[self.e_row] * self.e_coef, minlength=len(self.obj))
        rc = self.obj - used
        self.cand = np.flatnonzero(~self.active & self.priceable & (rc > _TOL * np.maximum(1.0, np.abs(self.obj))))
        self.rc = rc
        if not len(self.cand):
            return 0.0
        gain = rc[self.cand] * np.asarray(self.m.ub, np.float64)[self.cand]
        chosen = self.has_row[self.owner[self.cand]]
        best = np.zeros(len(self.m.jobs))
        np.maximum.at(best, self.owner[self.cand][chosen], gain[chosen])
        return float(best.sum() + gain[~chosen].sum())

    def add_best(self) -> None:
        """Add the priced columns of positive reduced cost, the best few per job."""
        cand, rc = self.cand, self.rc
        order = cand[np.lexsort((cand, -rc[cand], self.owner[cand]))]
        self._add(order[_rank_in_group(self.owner[order]) < ADD_PER_JOB])

    def values(self) -> tuple[float, ...]:
        out = np.zeros(len(self.obj))
        out[list(self.cols)] = [v.solution_value() for v in self.cols.values()]
        return tuple(out.tolist())

    def objective(self) -> float:
        return self.objective_.Value()


def _rank_in_group(groups: np.ndarray) -> np.ndarray:
    """Position of each entry within its run of equal values (groups sorted)."""
    if not len(groups):
        return groups
    idx = np.arange(len(groups))
    first = np.r_[True, groups[1:] != groups[:-1]]
    return idx - np.maximum.accumulate(np.where(first, idx, 0))


def _solve_whole(m: Model, time_limit_s: float) -> Relaxation:
    """The LP relaxation of all of `m` at once."""
    t0 = time.perf_counter()
    lp = _solver(time_limit_s)
    inf = lp.infinity()
    cols = [lp.NumVar(0.0, float(ub), "") for ub in m.ub]
    for r in m.rows:
        row = lp.Constraint(-inf if r.lo is None else float(r.lo), float(r.hi))
        for c, a in zip(r.cols, r.coefs):
            row.SetCoefficient(cols[c], float(a))
    stays = set(m.stays)
    for ji, xs in enumerate(m.choices):
        if len(xs) > 1 and ji not in stays:
            row = lp.Constraint(-inf, 1.0)
            for c in xs:
                row.SetCoefficient(cols[c], 1.0)
    obj = lp.Objective()
    for c, a in enumerate(m.obj):
        if a:
            obj.SetCoefficient(cols[c], float(a))
    obj.SetMaximization()
    t1 = time.perf_counter()
    code = lp.Solve()
    t2 = time.perf_counter()
    if code != pywraplp.Solver.OPTIMAL:
        status = {
            pywraplp.Solver.INFEASIBLE: SolverStatus.INFEASIBLE,
            pywraplp.Solver.UNBOUNDED: SolverStatus.UNBOUNDED,
        }
        return Relaxation(status.get(code, SolverStatus.NOT_SOLVED), build_s=t1 - t0, solve_s=t2 - t1)
    return Relaxation(SolverStatus.OPTIMAL, tuple(v.solution_value() for v in cols), obj.Value(), t1 - t0, t2 - t1)


def integral_jobs(m: Model, values: tuple[float, ...]) -> dict[int, int]:
    """Column values of the jobs whose columns are all integral in `values`,
    less those that would leave CP-SAT no solution.

    Only a slot count (model.py's k) can do that: the LP may give it a
    fraction of a slot. Where a row does not hold with every k at the whole
    slots its node keeps next to the fixed pinned jobs, the fixed jobs using
    the row or pinned on its nodes are left to CP-SAT too, least worth first,
    until it holds. (Leaving a job open only lowers every row's load, so one
    pass suffices; with the open jobs at 0 every other row holds.)
    """
    vals, owner = np.asarray(values, np.float64), np.asarray(m.owner, np.int64)
    whole_vals = np.rint(vals)
    open_jobs = np.unique(owner[(np.abs(vals - whole_vals) > _TOL) & (owner >= 0)])
    keep = np.flatnonzero((owner >= 0) & ~np.isin(owner, open_jobs))
    fixed = dict(zip(keep.tolist(), whole_vals[keep].astype(np.int64).tolist()))
    slots = {k: (f, level, pinned) for k, f, level, pinned in m.slots}
    if not slots:
        return fixed

    def whole(k: int) -> int:
        f, level, pinned = slots[k]
        return (f - sum(u * fixed.get(v, 0) for u, v in pinned)) // level

    top = {k: whole(k) for k in slots}
    under = defaultdict(list)  # pinned x column -> the slot counts it lowers
    for k, (_, _, pinned) in slots.items():
        for _, v in pinned:
            under[v].append(k)
    cols_of = defaultdict(list)
    for c in fixed:
        cols_of[m.owner[c]].append(c)
    mat, is_slot = m.matrix(), np.zeros(len(m.ub), bool)
    is_slot[list(slots)] = True
    for ri in np.unique(mat.row[is_slot[mat.col] & (mat.coef < 0)]).tolist():  # rows a slot count lowers
        r = m.rows[ri]
        coef = dict(zip(r.cols, r.coefs))
        load = sum(a * (top[c] if c in slots else fixed.get(c, 0)) for c, a in coef.items())
        if load <= r.hi:
            continue
        using = [c for c, a in coef.items() if a > 0] + [v for c in coef if c in slots for _, v in slots[c][2]]
        owners = {m.owner[c] for c in using if fixed.get(c)}
        for j in sorted(owners, key=lambda j: (sum(m.obj[c] * fixed[c] for c in cols_of[j]), j)):
            if load <= r.hi:
                break
            cols = cols_of.pop(j)
            for c in cols:
                load -= coef.get(c, 0) * fixed.pop(c)
            for k in {k for c in cols for k in under.get(c, ())}:
                new = whole(k)
                load += coef.get(k, 0) * (new - top[k])
                top[k] = new
    return fixed
