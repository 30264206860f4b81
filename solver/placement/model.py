"""The joint placement model as plain data: integer columns, linear rows.

Columns: x[j,k] = 1 when job j runs with option k (sum_k x[j,k] <= 1;
= 1 for a running job that may stay where it is: the controller never
preempts a job to zero GPUs, so a plan must keep it somewhere);
maximise sum value[j,k] * x[j,k] (see objective.py). The same rows are
handed to CP-SAT (cpsat.py) and, as a relaxation, to an LP solver (lp.py).

Exact model (small clusters, <= exact_node_model_max_nodes nodes): for a free
option, y[j,k,i] = 1 when node i holds one of the cell's node shares,
sum_i y[j,k,i] = num_nodes * x[j,k] (so the nodes are distinct), and per node
sum gpus_per_node * y + pinned GPUs * x <= free GPUs. Any solution is
placeable as it is.

Aggregated model (large clusters, no per-node variables): nodes are grouped
into classes (GPU type, free GPUs, partitions) of N_c nodes with f_c free GPUs;
z[j,k,c] = how many of the cell's node shares come from class c
(sum_c z = num_nodes * x, z <= N_c). For each class and each share size L
used in it, the shares of at least L GPUs fit into the whole L-GPU slots
the class has left:

    sum_{shares g >= L} g * z  <=  L * sum_{nodes i of c} floor((f_c - P_i) / L)

where P_i = the GPUs of the pinned (stay) options chosen on node i; on a
node with one pinned share this is linear in its x, with several an integer
k_i (L * k_i + P_i <= f_c) stands for it. (When some share >= L is not a
multiple of L, plain volume is used instead: sum g * z <= sum_i f_c - P_i.)
Every physically placeable plan (the warm start included) satisfies these.
When share sizes divide each other (powers of two) and one job's shares
need not be on distinct nodes they are also sufficient (pack the shares
largest first); otherwise the node post-pass repairs what it cannot place.

Network cards (when some option prices sharing one, Option.nic_cost > 0):
each node's card carries one multi-node job for free (kappa = 1); every
further one is an overflow o >= 0 that costs the objective. Exact model, per
node i: sum of the multi-node shares on i (y, and pinned x) - o_i <= 1 -
(fixed multi-node jobs on i). Aggregated, per class c: sum of its multi-node
shares (z) - o_c <= the class's nodes with no fixed multi-node job. One unit
of overflow is one node where two such jobs share a card; both slow down
(each by its most shared card), so it costs 2 x the mean nic_cost per node
share of the multi-node options that may use that node or class. Sharing then
happens only where placing the job is worth more than what the sharing costs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, cast

import numpy as np

from solver.placement.candidates import Option
from solver.placement.greedy import Chosen
from solver.placement.nodes import ClassKey
from solver.placement.space import Space
from solver.types import Cell, JobRequest

if TYPE_CHECKING:
    from solver.placement.siterules import SiteRules

#: A node (exact model) or a class of nodes (aggregated).
ShareKey = str | ClassKey
#: An option's node shares by class (aggregated) or node (exact): key -> (column, multiplier).
Shares = dict[ShareKey, tuple[int, int]]
#: (nodes, classes) per GPU type of a cell (see _route)
Route = list[tuple[int, list[ClassKey]]]


@dataclass
class Row:
    """lo <= sum coef * column <= hi (lo None: no lower side)."""

    cols: list[int]
    coefs: list[int]
    hi: int
    lo: int | None = None


@dataclass(frozen=True)
class Matrix:
    """A model's rows in coordinate form (entries in row order), as numpy arrays."""

    row: np.ndarray  # entry -> row index
    col: np.ndarray  # entry -> column
    coef: np.ndarray  # entry -> coefficient
    start: np.ndarray  # row -> its first entry (len rows + 1)
    hi: np.ndarray
    lo: np.ndarray  # -inf where a row has no lower side

    @classmethod
    def of(cls, m: Model) -> Matrix:
        sizes = np.fromiter(map(len, (r.cols for r in m.rows)), np.int64, len(m.rows))
        start = np.zeros(len(m.rows) + 1, np.int64)
        np.cumsum(sizes, out=start[1:])
        total = int(start[-1])
        col = np.fromiter(chain.from_iterable(r.cols for r in m.rows), np.int64, total)
        coef = np.fromiter(chain.from_iterable(r.coefs for r in m.rows), np.float64, total)
        hi = np.fromiter((r.hi for r in m.rows), np.float64, len(m.rows))
        lo = np.fromiter((-np.inf if r.lo is None else r.lo for r in m.rows), np.float64, len(m.rows))
        return cls(np.repeat(np.arange(len(m.rows)), sizes), col, coef, start, hi, lo)


@dataclass
class Model:
    """Columns 0..n-1 with bounds [0, ub], objective coefficients and owner
    (index into `jobs`, -1 for an auxiliary slot count), the rows, and what
    the columns mean."""

    jobs: list[str] = field(default_factory=list)
    ub: list[int] = field(default_factory=list)
    obj: list[int] = field(default_factory=list)
    owner: list[int] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    choices: list[list[int]] = field(default_factory=list)  # per job: its x columns (at most one is 1)
    x: dict[tuple[str, int], int] = field(default_factory=dict)
    shares: dict[tuple[str, int], Shares] = field(default_factory=dict)
    slots: list[tuple[int, int, int, list[tuple[int, int]]]] = field(default_factory=list)  # k, f, L, pinned
    #: network-card overflow columns: (o, {column: coefficient}, free cards); and the
    #: slack of a GPU limit's row (_limit_rows): (s, {column: GPUs}, cap)
    overflow: list[tuple[int, dict[int, int], int]] = field(default_factory=list)
    #: fair share's shortfall columns (_share_rows): (d, {x column: GPUs}, need); d >= need - GPUs
    shortfall: list[tuple[int, dict[int, int], int]] = field(default_factory=list)
    exact: bool = False
    #: x columns of free options that are their class's count too (one class, no other columns)
    lone: list[int] = field(default_factory=list)
    #: x columns of pinned options (stay where it runs)
    pinned: list[int] = field(default_factory=list)
    #: jobs (indices) that must keep some option -> their row (sum x = 1) in `rows`
    stays: dict[int, int] = field(default_factory=dict)
    #: link rows (sum of an option's share columns = n_nodes * x): (row, x column, n_nodes)
    links: list[tuple[int, int, int]] = field(default_factory=list)
    _matrix: Matrix | None = field(default=None, repr=False)

    def matrix(self) -> Matrix:
        """The rows as one sparse matrix (computed once: build the model first)."""
        if self._matrix is None:
            self._matrix = Matrix.of(self)
        return self._matrix

    def column(self, ub: int, obj: int = 0, owner: int = -1) -> int:
        self.ub.append(ub)
        self.obj.append(obj)
        self.owner.append(owner)
        return len(self.ub) - 1

    def add_le(self, terms: Mapping[int, int], hi: int, lo: int | None = None) -> None:
        """Add lo <= sum coef * col <= hi unless no column can break it."""
        top = sum(a * self.ub[c] for c, a in terms.items() if a > 0)
        low = sum(a * self.ub[c] for c, a in terms.items() if a < 0)
        if top > hi or (lo is not None and low < lo):
            self.rows.append(Row(list(terms), list(terms.values()), hi, lo))


def _acc(terms: dict[int, int], col: int, coef: int) -> None:
    terms[col] = terms.get(col, 0) + coef


def build(
    space: Space,
    jobs: Sequence[JobRequest],
    options: Mapping[str, Sequence[Option]],
    exact: bool,
    rules: SiteRules | None = None,
) -> Model:
    """The model of choosing options for `jobs` within `space` (see the module
    doc), with the GPU limits of the site's `rules` (siterules) as rows."""
    m = Model(exact=exact)
    node_terms: dict[str, dict[int, int]] = defaultdict(dict)
    class_terms: dict[ShareKey, list[tuple[int, int, int]]] = defaultdict(list)  # class -> [(g, column, multiplier)]
    pins: dict[str, list[tuple[int, int]]] = defaultdict(list)  # node -> [(GPUs, x column)]
    groups_of: _GroupsOf = {}  # (partitions, type, GPUs per node, blocked) -> (classes, their nodes)
    priced = any(o.nic_cost > 0 for opts in options.values() for o in opts)
    class_of = {n: c for c, names in space.classes.items() for n in names} if priced else {}
    # node (exact) or class -> ({column: shares}, [cost per share])
    cards: dict[ShareKey, tuple[dict[int, int], list[float]]] = defaultdict(lambda: ({}, []))
    routes: dict[_RouteKey, tuple[Route, _Layout | None]] = {}
    ub, obj, owner, rows = m.ub, m.obj, m.owner, m.rows
    for job in jobs:
        ji = len(m.jobs)
        m.jobs.append(job.job_id)
        xs: list[int] = []
        running = False
        for k, o in enumerate(options.get(job.job_id, ())):
            if o.pinned is not None:
                if any(space.free.get(n, 0) < g for n, g in o.pinned):
                    continue
                v = m.column(1, o.value, ji)
                m.pinned.append(v)
                running = job.current is not None
                for n, g in o.pinned:
                    pins[n].append((g, v))
                    if priced and o.multi_node:
                        _card(cards[n if exact else class_of.get(n, n)], v, 1, o)
            else:
                cell = o.cell
                g = cell.gpus_per_node
                key = (job.partitions, cell.parts or cell.gpu_type, cell.num_nodes, g, o.blocked)
                found = routes.get(key)
                if found is None:
                    route = _route(space, job, cell, groups_of, o.blocked)
                    found = routes[key] = (route, None if exact or not route else _layout(space, route))
                route, layout = found
                if not route:
                    continue
                v = len(ub)
                ub.append(1)
                obj.append(o.value)
                owner.append(ji)
                shares: Shares = {}
                if layout is not None:  # aggregated: class counts (the x column itself for a lone class)
                    for n_nodes, classes, tops in layout.parts:
                        if not tops:
                            shares[classes[0]] = (v, n_nodes)
                            class_terms[classes[0]].append((g, v, n_nodes))
                            continue
                        first = len(ub)
                        ub.extend(tops)
                        obj.extend([0] * len(tops))
                        owner.extend([ji] * len(tops))
                        cols = list(range(first, len(ub)))
                        for c, col in zip(classes, cols, strict=True):
                            shares[c] = (col, 1)
                            class_terms[c].append((g, col, 1))
                        m.links.append((len(rows), v, n_nodes))
                        rows.append(Row([*cols, v], [1] * len(cols) + [-n_nodes], 0, 0))
                    if layout.lone:
                        m.lone.append(v)
                else:  # exact: a column per node that may hold a share
                    for n_nodes, groups in route:
                        part: Shares = {}
                        for c in groups:
                            for name in space.classes[c]:
                                y = part[name] = (m.column(1, 0, ji), 1)
                                node_terms[name][y[0]] = g
                        link = {c: 1 for c, _ in part.values()}
                        link[v] = -n_nodes
                        m.links.append((len(rows), v, n_nodes))
                        rows.append(Row(list(link), list(link.values()), 0, 0))
                        shares.update(part)
                if priced and o.multi_node:
                    for sk, (col, mult) in shares.items():
                        _card(cards[sk], col, mult, o)
                m.shares[(job.job_id, k)] = shares
            m.x[(job.job_id, k)] = v
            xs.append(v)
        m.choices.append(xs)
        if running:
            m.stays[ji] = len(m.rows)
            m.rows.append(Row(xs, [1] * len(xs), 1, 1))
    if exact:
        for name, terms in node_terms.items():
            for g, v in pins.get(name, ()):
                _acc(terms, v, g)
            m.add_le(terms, space.free[name])
    else:
        for sk, per_class in class_terms.items():
            _class_rows(m, space, cast(ClassKey, sk), per_class, pins)  # aggregated: shares by class
    for name, pinned in pins.items():
        if len(pinned) > 1 or not exact:
            row: dict[int, int] = {}
            for g, v in pinned:
                _acc(row, v, g)
            m.add_le(row, space.free[name])
    for sk, (card_terms, costs) in cards.items():
        _card_row(m, space, sk, card_terms, costs)
    if rules is not None:
        _limit_rows(m, jobs, options, rules)
        _share_rows(m, jobs, options, rules)
    return m


def _limit_rows(
    m: Model, jobs: Sequence[JobRequest], options: Mapping[str, Sequence[Option]], rules: SiteRules
) -> None:
    """One row per limit bucket (siterules): what it counts of its jobs
    (GPUs, or 1 per job for a job-count limit) <= its cap. Where the jobs
    that must stay already hold more with the options they have now, a
    slack column lets the row hold, at a cost per GPU (job) above what every
    option together is worth: the plan then holds as little over the cap as
    it can (it shrinks elastic jobs, starts none)."""
    terms: dict[str, dict[int, int]] = defaultdict(dict)
    now: dict[str, int] = defaultdict(int)  # GPUs the jobs that must stay hold where they run
    most: dict[str, int] = defaultdict(int)  # the most its jobs can hold (one option each)
    stays = {m.jobs[ji] for ji in m.stays}
    for job in jobs:
        keys = rules.of_job.get(job.job_id, ())
        if not keys:
            continue
        top: dict[str, int] = defaultdict(int)
        for k, o in enumerate(options.get(job.job_id, ())):
            col = m.x.get((job.job_id, k))
            if col is None:
                continue
            for key in keys:
                g = rules.buckets[key].gpus(o.cell)
                if g:
                    _acc(terms[key], col, g)
                    top[key] = max(top[key], g)
                    if o.pinned is not None and job.job_id in stays:
                        now[key] += g
        for key, g in top.items():
            most[key] += g
    unit = None
    for key, row in sorted(terms.items()):
        cap = rules.cap(key)
        if most[key] <= cap:
            continue  # no plan can break it
        if now[key] > cap:
            if unit is None:
                unit = rules.penalty_unit(options)
            s = m.column(now[key] - cap, -unit)
            m.overflow.append((s, row, cap))  # the same role as a card's overflow: max(0, load - cap)
            row = {**row, s: -1}
        m.add_le(row, cap)


def _share_rows(
    m: Model, jobs: Sequence[JobRequest], options: Mapping[str, Sequence[Option]], rules: SiteRules
) -> None:
    """Fair share's shortfall (siterules.share_targets): per account with a
    target above what its fixed jobs hold, a column d >= target - the GPUs
    its jobs hold (fixed, and the chosen options), d >= 0, costing the
    bonus per GPU. (A cost of what is missing rather than a bonus for what
    is held: the same optimum, and the objective stays the plan's value
    where every target is met, so the solver's relative gap keeps its meaning.)"""
    bonus = rules.share_bonus(options)
    if not bonus:
        return
    targets = rules.share_targets(options)
    terms: dict[str, dict[int, int]] = defaultdict(dict)
    for job in jobs:
        a = rules.account_of.get(job.job_id)
        if a is None:
            continue
        for k, o in enumerate(options.get(job.job_id, ())):
            col = m.x.get((job.job_id, k))
            if col is not None:
                _acc(terms[a], col, o.cell.num_gpus)
    for a, target in sorted(targets.items()):
        need = target - rules.fixed_by_account.get(a, 0)
        row = terms.get(a, {})
        if need <= 0:
            continue
        d = m.column(need, -bonus)
        m.shortfall.append((d, row, need))
        m.rows.append(Row([d, *row], [-1, *(-g for g in row.values())], -need))


#: what a free option's route depends on: (partitions, GPU type or the mixed parts, nodes, GPUs per node, blocked)
_RouteKey = tuple[tuple[str, ...] | None, str | tuple[tuple[str, int], ...], int, int, frozenset[str]]
#: (partitions, GPU type, GPUs per node, blocked marks) -> (classes, their nodes)
_GroupsOf = dict[tuple[tuple[str, ...] | None, str, int, frozenset[str]], tuple[list[ClassKey], int]]


def _route(space: Space, job: JobRequest, cell: Cell, groups_of: _GroupsOf, blocked: frozenset[str]) -> Route:
    """(nodes, classes) per GPU type of a free option's cell, none marked
    `blocked`; empty when some type has too few nodes for it."""
    out: Route = []
    for gpu_type, n_nodes in cell.by_type():
        key = (job.partitions, gpu_type, cell.gpus_per_node, blocked)
        found = groups_of.get(key)
        if found is None:
            groups = space.classes_for(job, cell, gpu_type, blocked)
            found = groups_of[key] = (groups, sum(len(space.classes[c]) for c in groups))
        if found[1] < n_nodes:
            return []
        out.append((n_nodes, found[0]))
    return out


@dataclass(frozen=True)
class _Layout:
    """An aggregated model's columns for a free option of one route: per GPU
    type, (nodes, classes, the count columns' upper bounds: none where one
    class takes every share and the x column counts them); `lone` when no
    type needs count columns."""

    parts: tuple[tuple[int, tuple[ClassKey, ...], tuple[int, ...]], ...]
    lone: bool


def _layout(space: Space, route: Route) -> _Layout:
    parts = tuple(
        (n, tuple(groups), () if len(groups) == 1 else tuple(min(n, len(space.classes[c])) for c in groups))
        for n, groups in route
    )
    return _Layout(parts, all(not tops for _, _, tops in parts))


def _card(entry: tuple[dict[int, int], list[float]], col: int, mult: int, o: Option) -> None:
    terms, costs = entry
    _acc(terms, col, mult)
    costs.append(o.nic_cost / o.cell.num_nodes)


def _card_row(m: Model, space: Space, key: ShareKey, terms: dict[int, int], costs: list[float]) -> None:
    """The overflow column and row of one node's (or class's) network cards."""
    if isinstance(key, str):  # a node
        free = int(not space.links.get(key))
    else:  # a class
        free = sum(1 for n in space.classes[key] if not space.links.get(n, 0))
    most = sum(a * m.ub[c] for c, a in terms.items())
    cost = round(2 * sum(costs) / len(costs))
    if most <= free or cost <= 0:
        return
    o = m.column(most - free, -cost)
    row = dict(terms)
    row[o] = -1
    m.rows.append(Row(list(row), list(row.values()), free))
    m.overflow.append((o, terms, free))


def _class_rows(
    m: Model, space: Space, c: ClassKey, terms: list[tuple[int, int, int]], pins: Mapping[str, list[tuple[int, int]]]
) -> None:
    """The slot (or volume) rows of class `c`, one per share size used in it."""
    _, f, _ = c
    pinned_nodes = [n for n in space.classes[c] if n in pins]
    plain = len(space.classes[c]) - len(pinned_nodes)
    for level in sorted({g for g, _, _ in terms}):
        row: dict[int, int] = {}
        get = row.get
        for g, col, mult in terms:
            if g >= level:
                row[col] = get(col, 0) + g * mult
        if all(g % level == 0 for g, _, _ in terms if g >= level):  # count whole slots of `level` GPUs
            slots = f // level
            hi = level * slots * plain
            for n in pinned_nodes:
                if len(pins[n]) == 1:  # slots left = slots - (slots - (f - u) // level) * x
                    u, v = pins[n][0]
                    hi += level * slots
                    if slots - (f - u) // level:
                        _acc(row, v, level * (slots - (f - u) // level))
                else:  # k = slots left, level * k + pinned GPUs <= f
                    k = m.column(slots)
                    _acc(row, k, -level)
                    link: dict[int, int] = {k: level}
                    for u, v in pins[n]:
                        _acc(link, v, u)
                    m.rows.append(Row(list(link), list(link.values()), f))
                    m.slots.append((k, f, level, pins[n]))
        else:  # plain volume
            hi = f * (plain + len(pinned_nodes))
            for n in pinned_nodes:
                for u, v in pins[n]:
                    _acc(row, v, u)
        m.add_le(row, hi)


def hint_values(
    m: Model, options: Mapping[str, Sequence[Option]], chosen: Chosen, class_of: Mapping[str, ClassKey]
) -> list[int]:
    """Column values of a placeable choice (the warm start)."""
    vals = [0] * len(m.ub)
    for (jid, k), v in m.x.items():
        got = chosen.get(jid)
        if got is None or options[jid][k] is not got[0]:
            continue
        vals[v] = 1
        shares = m.shares.get((jid, k))
        if not shares:
            continue
        names = [n for n, _ in got[1]]
        if m.exact:
            for n in names:
                vals[shares[n][0]] = 1
        else:  # a class count column (not the x column itself, which a lone class reuses)
            for n in names:
                c = shares[class_of[n]][0]
                if c != v:
                    vals[c] += 1
    for k, f, level, pinned in m.slots:
        vals[k] = max(0, (f - sum(u for u, v in pinned if vals[v])) // level)
    for o, terms, free in m.overflow:
        vals[o] = max(0, sum(a * vals[c] for c, a in terms.items()) - free)
    for d, terms, need in m.shortfall:
        vals[d] = max(0, need - sum(a * vals[c] for c, a in terms.items()))
    return vals
