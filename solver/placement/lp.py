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
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import chain

import numpy as np
from ortools.linear_solver import linear_solver_pb2, pywraplp

from solver.placement.model import Matrix, Model
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
START_PER_JOB = 1
#: Stop pricing once the LP's optimum is known within this fraction.
LP_GAP = 2e-4
#: Columns of a job added per pricing pass (those of highest reduced cost).
ADD_PER_JOB = 4
#: At most this many pricing passes (the last LP's bound then says how close it is).
MAX_PASSES = 30


#: Column generation pays where the columns outnumber the rows this many
#: times: each restricted LP holds every row, so with many rows it costs
#: nearly the whole LP. On Arena's 1,280 GPUs in the realistic simulation a
#: round of ~300 jobs has 17,500 columns and 5,000 rows (each multi-node
#: option links its class counts); GLOP solves it whole in 0.2 s, where
#: column generation ran its 30 passes (3 s) to the same optimum without
#: proving it (its bound up to 0.6% above). solver_scale's rounds (12,700
#: columns, 700 rows) converge in 3-8 passes, faster than the whole LP.
COLGEN_MIN_RATIO = 8


def solve_lp(m: Model, time_limit_s: float) -> Relaxation:
    """Solve the LP relaxation of `m` (GLOP's dual simplex): by
    `column_generation` where the columns outnumber the rows
    COLGEN_MIN_RATIO times, otherwise whole."""
    if len(m.ub) < COLGEN_MIN_RATIO * len(m.rows):
        return _solve_whole(m, time_limit_s)
    return column_generation(m, time_limit_s)


def column_generation(m: Model, time_limit_s: float) -> Relaxation:
    """Solve the LP relaxation of `m` by column generation. A restricted LP
    holds each job's most valuable option and its most valuable per unit of
    capacity, and every column that is not a lone option's choice (pinned
    options, class counts, slot counts, overflows). Its duals price the others (reduced cost = value - the
    duals of their rows); the best few per job join the next LP, until the
    whole LP's optimum is known within LP_GAP: raising each job's dual by
    its best positive reduced cost gives a feasible dual of the whole LP,
    whose value bounds it (`upper`; `objective` is the restricted optimum,
    its solution a vertex of the whole LP with the others at 0). On a round
    of 10,000 jobs x 25 options the LPs hold a tenth of the columns. Where
    no restricted LP is solved, the whole LP is."""
    t0 = time.perf_counter()
    lp = _Pricing(m)
    build_s, solve_s, best = time.perf_counter() - t0, 0.0, None
    for _ in range(MAX_PASSES):
        t1 = time.perf_counter()
        if not lp.solve(time_limit_s - (t1 - t0)):
            break
        t2 = time.perf_counter()
        gap = lp.gap()
        best = (lp.values(), lp.value, lp.value + gap)
        build_s += time.perf_counter() - t2
        solve_s += t2 - t1
        if gap <= LP_GAP * max(abs(lp.value), 1.0):
            break
        lp.next_columns()
    if best is not None:
        return Relaxation(SolverStatus.OPTIMAL, best[0], best[1], build_s, solve_s, best[2])
    full = _solve_whole(m, time_limit_s - (time.perf_counter() - t0))
    return replace(full, build_s=full.build_s + build_s, solve_s=full.solve_s + solve_s)


class _Pricing:
    """Column generation over MPModelProto: each pass solves a fresh LP of
    the active columns (those the last LP used, the best priced ones, and
    every column pricing may not leave out); a job's "at most one" (or
    "exactly one") row is only written when it has several active columns,
    otherwise its column's bound stands for it and that bound's dual for the
    row's. Columns the LP leaves at 0 with a negative reduced cost are
    dropped, so the LPs stay small; basic ones are kept (so no pass undoes
    the last) and the objective never falls (the last solution stays
    feasible)."""

    def __init__(self, m: Model) -> None:
        self.m = m
        mat = m.matrix()
        n = len(m.ub)
        self.n = n
        self.obj = np.asarray(m.obj, np.float64)
        self.ub = np.asarray(m.ub, np.float64)
        self.owner = np.asarray(m.owner, np.int64)
        order = np.argsort(mat.col, kind="stable")
        self.e_row, self.e_col, self.e_coef = mat.row[order], mat.col[order], mat.coef[order]
        self.priceable = np.zeros(n, bool)
        self.priceable[np.asarray(m.lone, np.int64)] = True
        self.is_x = np.zeros(n, bool)
        self.is_x[np.asarray([c for xs in m.choices for c in xs], np.int64)] = True
        jobs = len(m.jobs)
        self.stay_row = np.full(jobs, -1, np.int64)
        self.stay_row[list(m.stays)] = list(m.stays.values())
        multi = np.fromiter((len(xs) > 1 for xs in m.choices), bool, jobs)
        self.one_row = multi | (self.stay_row >= 0)  # jobs whose options are bound by a row
        cand = np.flatnonzero(self.priceable)
        mat_size = np.bincount(mat.col, weights=np.maximum(mat.coef, 0.0), minlength=n)
        self.active = ~self.priceable
        for worth in (self.obj[cand], self.obj[cand] / np.maximum(mat_size[cand], 1.0)):
            by = cand[np.lexsort((cand, -worth, self.owner[cand]))]
            self.active[by[_rank_in_group(self.owner[by]) < START_PER_JOB]] = True
        self.mat = mat

    def solve(self, time_limit_s: float) -> bool:
        """Solve the LP of the active columns; False when GLOP finds no optimum."""
        m, mat = self.m, self.mat
        cols = np.flatnonzero(self.active)
        pos = np.full(self.n, -1, np.int64)
        pos[cols] = np.arange(len(cols))
        xa = self.active & self.is_x
        count = np.bincount(self.owner[xa], minlength=len(m.jobs))
        lone_stay = (self.stay_row >= 0) & (count == 1)  # its one column is held at 1 instead of a row
        lb = np.zeros(self.n)
        lb[xa & lone_stay[np.maximum(self.owner, 0)] & (self.owner >= 0)] = 1.0
        model = linear_solver_pb2.MPModelProto(maximize=True)
        for lo, hi, a in zip(lb[cols].tolist(), self.ub[cols].tolist(), self.obj[cols].tolist(), strict=True):
            model.variable.add(lower_bound=lo, upper_bound=hi, objective_coefficient=a)
        skip = np.zeros(len(m.rows), bool)
        skip[self.stay_row[lone_stay]] = True
        self.kept = np.flatnonzero(~skip)
        live = self.active[mat.col] & ~skip[mat.row]
        vars_, coefs = pos[mat.col[live]].tolist(), mat.coef[live].tolist()
        starts = np.searchsorted(mat.row[live], np.arange(len(m.rows) + 1)).tolist()
        inf = float("inf")
        for r, lo, hi in zip(self.kept.tolist(), mat.lo[self.kept].tolist(), mat.hi[self.kept].tolist(), strict=True):
            a, b = starts[r], starts[r + 1]
            model.constraint.add(lower_bound=lo, upper_bound=hi, var_index=vars_[a:b], coefficient=coefs[a:b])
        self.gub = np.flatnonzero((count > 1) & (self.stay_row < 0))
        by_owner = np.flatnonzero(xa)
        by_owner = by_owner[np.argsort(self.owner[by_owner], kind="stable")]
        starts = np.searchsorted(self.owner[by_owner], np.arange(len(m.jobs) + 1)).tolist()
        idx = pos[by_owner].tolist()
        for j in self.gub.tolist():
            k = starts[j + 1] - starts[j]
            model.constraint.add(
                lower_bound=-inf, upper_bound=1.0, var_index=idx[starts[j] : starts[j + 1]], coefficient=[1.0] * k
            )
        res = _glop(model, time_limit_s)
        if res.status != linear_solver_pb2.MPSOLVER_OPTIMAL:
            return False
        self.cols, self.lone_stay = cols, lone_stay
        self.x = np.zeros(self.n)
        self.x[cols] = np.asarray(res.variable_value)
        self.value = res.objective_value
        dual = np.asarray(res.dual_value)
        self.y = np.zeros(len(m.rows))
        self.y[self.kept] = dual[: len(self.kept)]
        self.u = np.zeros(len(m.jobs))
        self.u[self.gub] = dual[len(self.kept) :]
        return True

    def gap(self) -> float:
        """Price every column with this LP's duals; how far the whole LP's
        optimum may lie above this one: per job its best positive reduced cost
        (a job without a row: each column's reduced cost times its bound)."""
        rc0 = self.obj - np.bincount(self.e_col, weights=self.y[self.e_row] * self.e_coef, minlength=self.n)
        xa = self.active & self.is_x & (self.owner >= 0)
        lone = xa & (np.bincount(self.owner[xa], minlength=len(self.u))[np.maximum(self.owner, 0)] == 1)
        lone_cols = np.flatnonzero(lone)
        lone_cols = lone_cols[self.one_row[self.owner[lone_cols]] & ~np.isin(self.owner[lone_cols], self.gub)]
        stay = self.lone_stay[self.owner[lone_cols]]
        self.u[self.owner[lone_cols]] = np.where(stay, rc0[lone_cols], np.maximum(rc0[lone_cols], 0.0))
        rc = rc0 - np.where(self.owner >= 0, self.u[np.maximum(self.owner, 0)], 0.0)
        self.rc = rc
        self.cand = np.flatnonzero(~self.active & self.priceable & (rc > _TOL * np.maximum(1.0, np.abs(self.obj))))
        if not len(self.cand):
            return 0.0
        gain = rc[self.cand] * self.ub[self.cand]
        bound = self.one_row[self.owner[self.cand]]
        best = np.zeros(len(self.u))
        np.maximum.at(best, self.owner[self.cand][bound], gain[bound])
        return float(best.sum() + gain[~bound].sum())

    def next_columns(self) -> None:
        """Keep the columns in use or of zero reduced cost (basic ones, so
        that no pass undoes the last), add the best priced ones."""
        cand, rc = self.cand, self.rc
        by = cand[np.lexsort((cand, -rc[cand], self.owner[cand]))]
        near = self.active & (rc > -1e-6 * np.maximum(1.0, np.abs(self.obj)))  # basic (or degenerate) columns
        self.active = ~self.priceable | (self.x > _TOL) | near
        self.active[by[_rank_in_group(self.owner[by]) < ADD_PER_JOB]] = True

    def values(self) -> tuple[float, ...]:
        return tuple(self.x.tolist())


#: GLOP's settings: the dual simplex (3-4x faster than the primal one on
#: 4,000 jobs x 24 options), from the all-slack basis. GLOP's default
#: triangular crash basis took 21 of the 29 ms of a month round's LP (58
#: jobs, 3,000 columns, 700 rows) and saved nothing on the 4x run's busy
#: rounds (25,000 columns).
GLOP_PARAMETERS = "use_dual_simplex: true initial_basis: NONE"


def _glop(model: linear_solver_pb2.MPModelProto, time_limit_s: float) -> linear_solver_pb2.MPSolutionResponse:
    """GLOP's answer for `model` (GLOP_PARAMETERS)."""
    request = linear_solver_pb2.MPModelRequest(
        model=model,
        solver_type=linear_solver_pb2.MPModelRequest.GLOP_LINEAR_PROGRAMMING,
        solver_time_limit_seconds=max(time_limit_s, 0.0),
        solver_specific_parameters=GLOP_PARAMETERS,
    )
    res = linear_solver_pb2.MPSolutionResponse()
    pywraplp.Solver.SolveWithProto(request, res)
    return res


def _loads(mat: Matrix, fixed: dict[int, int], staying: dict[int, int], top: dict[int, int]) -> np.ndarray:
    """Each row's left side with the fixed columns, the staying ones at 1 and
    the slot counts at `top` (every other column at 0)."""
    value = np.zeros(int(mat.col.max()) + 1 if len(mat.col) else 0)
    for table in (fixed, staying, top):
        if table:
            value[np.fromiter(table.keys(), np.int64, len(table))] = np.fromiter(table.values(), np.float64, len(table))
    return np.bincount(mat.row, weights=mat.coef * value[mat.col], minlength=len(mat.hi))


def _rank_in_group(groups: np.ndarray) -> np.ndarray:
    """Position of each entry within its run of equal values (groups sorted)."""
    if not len(groups):
        return groups
    idx = np.arange(len(groups))
    first = np.r_[True, groups[1:] != groups[:-1]]
    return idx - np.maximum.accumulate(np.where(first, idx, 0))


def _solve_whole(m: Model, time_limit_s: float) -> Relaxation:
    """The LP relaxation of all of `m` at once (`_WholeLP`), written straight
    into an MPModelProto from the model's arrays (the same LP as through
    pywraplp's per-coefficient calls, faster to build)."""
    t0 = time.perf_counter()
    lp = _WholeLP(m)
    model = linear_solver_pb2.MPModelProto(maximize=True)
    for hi, a in zip(lp.ub.tolist(), lp.obj.tolist(), strict=True):
        model.variable.add(lower_bound=0.0, upper_bound=hi, objective_coefficient=a)
    cols, coefs = lp.col.tolist(), lp.coef.tolist()
    starts = np.searchsorted(lp.row, np.arange(len(lp.lo) + 1)).tolist()
    for r, (lo, hi) in enumerate(zip(lp.lo.tolist(), lp.hi.tolist(), strict=True)):
        a, b = starts[r], starts[r + 1]
        model.constraint.add(lower_bound=lo, upper_bound=hi, var_index=cols[a:b], coefficient=coefs[a:b])
    t1 = time.perf_counter()
    res = _glop(model, time_limit_s)
    t2 = time.perf_counter()
    if res.status != linear_solver_pb2.MPSOLVER_OPTIMAL:
        status = {
            linear_solver_pb2.MPSOLVER_INFEASIBLE: SolverStatus.INFEASIBLE,
            linear_solver_pb2.MPSOLVER_UNBOUNDED: SolverStatus.UNBOUNDED,
        }
        return Relaxation(status.get(res.status, SolverStatus.NOT_SOLVED), build_s=t1 - t0, solve_s=t2 - t1)
    values = lp.values(res.variable_value)
    return Relaxation(SolverStatus.OPTIMAL, values, res.objective_value, t1 - t0, t2 - t1)


class _WholeLP:
    """The LP relaxation of `m`: its rows, and an "at most one" row per job of
    several options that need not stay, with every option's x that a link
    row defines (sum of its share columns = n_nodes * x; model.py) written
    as its shares, x = sum z / n_nodes, in the objective and every other row,
    and that link row left out. It is the same polytope, so the same
    optimum and vertices: x is a linear function of its shares, and x <= 1
    follows from its job's "at most one" or "stays" row (a job of one
    option and no such row keeps its x). On the 4x run's busy rounds the
    link rows were 5,000 of 5,600 rows. Columns are the model's less the
    substituted x (`keep`); `values` gives x back from its shares."""

    def __init__(self, m: Model) -> None:
        mat = m.matrix()
        n = len(m.ub)
        stays = set(m.stays)
        multi = [xs for ji, xs in enumerate(m.choices) if len(xs) > 1 and ji not in stays]
        bounded = np.zeros(len(m.jobs), bool)  # x <= 1 follows from a row of its job
        bounded[[ji for ji, xs in enumerate(m.choices) if len(xs) > 1 or ji in stays]] = True
        sizes = np.fromiter(map(len, multi), np.int64, len(multi))
        row = np.concatenate([mat.row, len(mat.hi) + np.repeat(np.arange(len(multi)), sizes)])
        col = np.concatenate([mat.col, np.fromiter(chain.from_iterable(multi), np.int64, int(sizes.sum()))])
        coef = np.concatenate([mat.coef, np.ones(int(sizes.sum()))])
        lo = np.concatenate([mat.lo, np.full(len(multi), -np.inf)])
        hi = np.concatenate([mat.hi, np.ones(len(multi))])
        owner = np.asarray(m.owner, np.int64)
        define = np.full(n, -1, np.int64)  # x -> the link row that defines it
        share = np.ones(n)  # x -> its n_nodes
        for r, x, k in m.links:
            if define[x] < 0 and bounded[owner[x]]:
                define[x], share[x] = r, k
        drop = np.zeros(len(hi), bool)
        drop[define[define >= 0]] = True
        self.subst = np.flatnonzero(define >= 0)
        # the substitution: x -> (z, 1 / n_nodes) over its defining row's other columns
        d = np.zeros(len(hi), np.int64)
        d[define[self.subst]] = self.subst
        zent = drop[row] & (coef > 0)
        self.tx, self.tz = d[row[zent]], col[zent]
        self.tw = 1.0 / share[self.tx]
        order = np.argsort(self.tx, kind="stable")
        self.tx, self.tz, self.tw = self.tx[order], self.tz[order], self.tw[order]
        self.keep = np.flatnonzero(define < 0)
        new = np.full(n, -1, np.int64)
        new[self.keep] = np.arange(len(self.keep))
        obj = np.asarray(m.obj, np.float64)
        self.obj = obj[self.keep].copy()
        np.add.at(self.obj, new[self.tz], obj[self.tx] * self.tw)
        self.ub = np.asarray(m.ub, np.float64)[self.keep]
        live = ~drop[row]
        row, col, coef = row[live], col[live], coef[live]
        sub = define[col] >= 0
        first = np.searchsorted(self.tx, col[sub])
        count = np.searchsorted(self.tx, col[sub], side="right") - first
        at = np.repeat(first - np.cumsum(count) + count, count) + np.arange(int(count.sum()))
        row = np.concatenate([row[~sub], np.repeat(row[sub], count)])
        col = np.concatenate([new[col[~sub]], new[self.tz[at]]])
        coef = np.concatenate([coef[~sub], np.repeat(coef[sub], count) * self.tw[at]])
        rows_kept = np.flatnonzero(~drop)
        renum = np.full(len(hi), -1, np.int64)
        renum[rows_kept] = np.arange(len(rows_kept))
        width = max(len(self.keep), 1)
        uniq, inv = np.unique(renum[row] * width + col, return_inverse=True)  # duplicates summed
        self.row, self.col, self.coef = uniq // width, uniq % width, np.bincount(inv, weights=coef)
        self.lo, self.hi = lo[rows_kept], hi[rows_kept]
        self.n = n

    def values(self, solved: Sequence[float]) -> tuple[float, ...]:
        """The model's column values from the LP's."""
        v = np.zeros(self.n)
        v[self.keep] = np.asarray(solved, np.float64)
        v[self.subst] = np.bincount(self.tx, weights=v[self.tz] * self.tw, minlength=self.n)[self.subst]
        return tuple(v.tolist())


def integral_jobs(m: Model, values: tuple[float, ...]) -> dict[int, int]:
    """Column values of the jobs whose columns are all integral in `values`,
    less those that would leave CP-SAT no solution.

    Only a slot count (model.py's k) can do that: the LP may give it a
    fraction of a slot. Where a row does not hold with every k at the whole
    slots its node keeps next to the fixed pinned jobs, the fixed jobs using
    the row or pinned on its nodes are left to CP-SAT too, least worth first,
    until it holds. (Leaving a job open only lowers every row's load, so one
    pass suffices; with the open jobs at 0 every other row holds.) An open
    job that must stay (model.py's sum x = 1) is counted in its pinned
    option, which it can always keep unless the fixed jobs take its room,
    so the rows of that option are walked the same way. A slot count
    whose node holds no open job is fixed too, at its whole slots (the most
    it can be, and what is best for every row it is in).
    """
    vals, owner = np.asarray(values, np.float64), np.asarray(m.owner, np.int64)
    whole_vals = np.rint(vals)
    open_jobs = np.unique(owner[(np.abs(vals - whole_vals) > _TOL) & (owner >= 0)])
    keep = np.flatnonzero((owner >= 0) & ~np.isin(owner, open_jobs))
    fixed = dict(zip(keep.tolist(), whole_vals[keep].astype(np.int64).tolist(), strict=True))
    slots = {k: (f, level, pinned) for k, f, level, pinned in m.slots}
    pinned_of = {int(owner[v]): v for v in m.pinned if int(owner[v]) in m.stays}  # job that must stay -> its pinned x
    staying = {pinned_of[j]: 1 for j in open_jobs.tolist() if j in pinned_of}  # open ones, kept where they are
    if not slots and not staying:
        return fixed

    def at(c: int) -> int:
        return fixed.get(c, 0) or staying.get(c, 0)

    def whole(k: int) -> int:
        f, level, pinned = slots[k]
        return (f - sum(u * at(v) for u, v in pinned)) // level

    top = {k: whole(k) for k in slots}
    under = defaultdict(list)  # pinned x column -> the slot counts it lowers
    for k, (_, _, pinned) in slots.items():
        for _, v in pinned:
            under[v].append(k)
    cols_of = defaultdict(list)
    for c in fixed:
        cols_of[m.owner[c]].append(c)

    def release(j: int) -> None:
        """Leave job j to CP-SAT (a job that must stay counts where it is)."""
        cols = cols_of.pop(j)
        for c in cols:
            fixed.pop(c)
        if j in pinned_of:
            staying[pinned_of[j]] = 1
            cols = cols + [pinned_of[j]]
        ks = {k for c in cols for k in under.get(c, ())}
        for k in ks:
            top[k] = whole(k)

    mat = m.matrix()
    special = np.zeros(len(m.ub), np.int8)  # 1: slot count, 2: pinned x of a job that must stay, 3: overflow
    special[list(slots)] = 1
    special[list(pinned_of.values())] = 2
    special[[o for o, _, _ in m.overflow]] = 3
    walk = np.zeros(len(m.rows), bool)  # rows a slot count lowers, rows of jobs that must stay
    walk[mat.row[((special[mat.col] == 1) & (mat.coef < 0)) | (special[mat.col] == 2)]] = True
    walk[mat.row[special[mat.col] == 3]] = False  # a network card's overflow always makes room
    walk[np.isfinite(mat.lo)] = False  # a link or sum x = 1 row: the open jobs settle it
    rows = np.flatnonzero(walk)
    while len(rows):  # a released job that must stay may load rows walked before
        over = rows[_loads(mat, fixed, staying, top)[rows] > mat.hi[rows]]
        rows = np.zeros(0, np.int64)
        for ri in over.tolist():
            r = m.rows[ri]
            coef = dict(zip(r.cols, r.coefs, strict=True))

            def term(c: int) -> int:
                return top[c] if c in slots else at(c)

            load = sum(a * term(c) for c, a in coef.items())
            if load <= r.hi:
                continue
            using = [c for c, a in coef.items() if a > 0] + [v for c in coef if c in slots for _, v in slots[c][2]]
            owners = {m.owner[c] for c in using if fixed.get(c)}
            for j in sorted(owners, key=lambda j: (sum(m.obj[c] * fixed[c] for c in cols_of[j]), j)):
                if j in pinned_of and fixed.get(pinned_of[j]):
                    continue  # it stays where it is: releasing it frees nothing
                touched = [*cols_of[j], pinned_of.get(j, -1)]
                touched += [k for c in touched for k in under.get(c, ())]
                before = {c: term(c) for c in touched if c in coef}
                release(j)
                load += sum(coef[c] * (term(c) - v) for c, v in before.items())
                rows = np.flatnonzero(walk)
                if load <= r.hi:
                    break
    for k, (_, _, pinned) in slots.items():  # whole slots where no open job is pinned: the most k may be
        if all(v in fixed for _, v in pinned):
            fixed[k] = top[k]
    return fixed
