"""The joint CP-SAT model: at most one option per job, within node capacity.

Variables: x[j,k] = 1 when job j runs with option k (sum_k x[j,k] <= 1);
maximise sum value[j,k] * x[j,k] (see objective.py).

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
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ortools.sat.python import cp_model

from solver.placement.candidates import Option
from solver.placement.greedy import Chosen
from solver.placement.nodes import ClassKey
from solver.placement.space import Space
from solver.types import JobRequest, SolverConfig


@dataclass(frozen=True)
class Solved:
    """What CP-SAT chose: option index per job, and per free option either
    class counts (aggregated) or node names (exact)."""

    status: str
    choice: dict[str, int] = field(default_factory=dict)
    counts: dict[str, dict[ClassKey, int]] = field(default_factory=dict)
    nodes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    objective: int = 0
    bound: int = 0
    build_s: float = 0.0
    solve_s: float = 0.0
    num_vars: int = 0


def parameters(solver: cp_model.CpSolver, config: SolverConfig) -> None:
    """Time limits, workers, seed and search settings.

    Deterministic mode (config.deterministic, the default) runs ONE worker
    stopped by the deterministic-time budget: the same input and seed then
    give the same plan whatever the machine's load. (CP-SAT's interleaved
    multi-worker search is also deterministic, but on this model it stalled
    at a 4% gap after 3 s where one worker proved optimality in under 1 s.)
    Otherwise config.workers run the parallel portfolio. The wall-clock
    limit time_limit_s is a safety net; hitting it can change the result.

    The model is a multiple-choice knapsack with few capacity rows, so its
    LP relaxation is tight: full linearization (level 2) lets the LP guide
    the search. Presolve and probing cost more than they save here (measured
    on 500 jobs x 24 options: 2.3 s -> 0.7 s to optimality without them);
    the warm start is complete and feasible, so no search time is spent
    trying to repair it (hint_conflict_limit 0).
    """
    p = solver.parameters
    p.max_time_in_seconds = max(config.time_limit_s, 0.0)
    p.max_deterministic_time = max(config.deterministic_time, 0.0)
    p.num_workers = 1 if config.deterministic else max(1, config.workers)
    p.random_seed = config.seed
    p.relative_gap_limit = max(config.relative_gap_limit, 0.0)
    p.linearization_level = 2
    p.cp_model_presolve = False
    p.cp_model_probing_level = 0
    p.hint_conflict_limit = 0
    p.log_search_progress = False


class _Model:
    def __init__(self, space: Space, jobs: Sequence[JobRequest], options: Mapping[str, Sequence[Option]],
                 exact: bool) -> None:
        self.m = cp_model.CpModel()
        self.space = space
        self.exact = exact
        self.x: dict[tuple[str, int], cp_model.IntVar] = {}
        self.z: dict[tuple[str, int], dict] = {}  # class -> var/expr (aggregated) or node -> var (exact)
        self.class_of = {n: c for c, names in space.classes.items() for n in names}
        self.slot_vars: list = []
        node_terms: dict[str, list] = defaultdict(list)
        class_terms: dict[ClassKey, list] = defaultdict(list)
        pins: dict[str, list] = defaultdict(list)
        objective = []
        for job in jobs:
            xs = []
            for k, o in enumerate(options.get(job.job_id, ())):
                if o.pinned is not None:
                    if any(space.free.get(n, 0) < g for n, g in o.pinned):
                        continue
                    v = self.m.NewBoolVar(f"x_{job.job_id}_{k}")
                    for n, g in o.pinned:
                        pins[n].append((g, v))
                else:
                    groups = space.classes_for(job, o.cell)
                    n_nodes, g = o.cell.num_nodes, o.cell.gpus_per_node
                    if sum(len(space.classes[c]) for c in groups) < n_nodes:
                        continue
                    v = self.m.NewBoolVar(f"x_{job.job_id}_{k}")
                    if exact:
                        ys = {}
                        for c in groups:
                            for name in space.classes[c]:
                                ys[name] = y = self.m.NewBoolVar("")
                                node_terms[name].append((g, y))
                        self.m.Add(sum(ys.values()) == n_nodes * v)
                        self.z[(job.job_id, k)] = ys
                    else:
                        zs = {}
                        if len(groups) == 1:
                            zs[groups[0]] = n_nodes * v
                        else:
                            for c in groups:
                                hi = min(n_nodes, len(space.classes[c]))
                                zs[c] = self.m.NewBoolVar("") if hi == 1 else self.m.NewIntVar(0, hi, "")
                            self.m.Add(sum(zs.values()) == n_nodes * v)
                        for c, z in zs.items():
                            class_terms[c].append((g, z, n_nodes))
                        self.z[(job.job_id, k)] = zs
                self.x[(job.job_id, k)] = v
                xs.append(v)
                objective.append(o.value * v)
            if len(xs) > 1:
                self.m.AddAtMostOne(xs)
        if exact:
            for name, terms in node_terms.items():
                terms = terms + pins.get(name, [])
                if sum(g for g, _ in terms) > space.free[name]:
                    self.m.Add(sum(g * v for g, v in terms) <= space.free[name])
        else:
            for c, terms in class_terms.items():
                _, f, _ = c
                pinned_nodes = [n for n in space.classes[c] if n in pins]
                plain = len(space.classes[c]) - len(pinned_nodes)
                for level in sorted({g for g, _, _ in terms}):
                    shares = [(g, z) for g, z, _ in terms if g >= level]
                    if all(g % level == 0 for g, _ in shares):  # count whole slots of `level` GPUs
                        slots = f // level
                        room = [level * slots * plain]
                        for n in pinned_nodes:
                            room.append(level * self._slots_left(n, f, level, pins[n]))
                    else:  # plain volume
                        room = [f * plain] + [f - sum(u * v for u, v in pins[n]) for n in pinned_nodes]
                    self.m.Add(sum(g * z for g, z in shares) <= sum(room))
        for name, terms in pins.items():
            if len(terms) > 1 or not exact:
                if sum(g for g, _ in terms) > space.free[name]:
                    self.m.Add(sum(g * v for g, v in terms) <= space.free[name])
        self.m.Maximize(sum(objective))

    def _slots_left(self, node: str, f: int, level: int, pinned: list):
        """Whole `level`-GPU slots node keeps free next to its pinned shares:
        floor((f - pinned GPUs) / level), linear in the pinned choices."""
        slots = f // level
        if len(pinned) == 1:
            u, v = pinned[0]
            return slots - (slots - (f - u) // level) * v
        k = self.m.NewIntVar(0, slots, "")
        self.m.Add(level * k + sum(u * v for u, v in pinned) <= f)
        self.slot_vars.append((k, f, level, pinned))
        return k

    def hint(self, options: Mapping[str, Sequence[Option]], hint: Chosen) -> None:
        on_vars = set()
        for (jid, k), v in self.x.items():
            chosen = hint.get(jid)
            on = chosen is not None and options[jid][k] is chosen[0]
            if on:
                on_vars.add(v.Index())
            self.m.AddHint(v, int(on))
            zs = self.z.get((jid, k))
            if zs is None:
                continue
            names = [n for n, _ in chosen[1]] if on else []
            if self.exact:
                used = set(names)
                for name, y in zs.items():
                    self.m.AddHint(y, int(name in used))
            elif len(zs) > 1:
                per = defaultdict(int)
                for n in names:
                    per[self.class_of.get(n)] += 1
                for c, z in zs.items():
                    self.m.AddHint(z, per.get(c, 0))
        for k, f, level, pinned in self.slot_vars:
            used = sum(u for u, v in pinned if v.Index() in on_vars)
            self.m.AddHint(k, max(0, (f - used) // level))


def solve_cpsat(space: Space, jobs: Sequence[JobRequest], options: Mapping[str, Sequence[Option]],
                config: SolverConfig, hint: Chosen, exact: bool) -> Solved:
    """Build, warm-start and solve the model; never raises for solver trouble."""
    t0 = time.perf_counter()
    model = _Model(space, jobs, options, exact)
    model.hint(options, hint)
    solver = cp_model.CpSolver()
    parameters(solver, config)
    t1 = time.perf_counter()
    code = solver.Solve(model.m)
    t2 = time.perf_counter()
    status = solver.StatusName(code)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Solved(status, build_s=t1 - t0, solve_s=t2 - t1)
    choice, counts, nodes = {}, {}, {}
    for (jid, k), v in model.x.items():
        if solver.Value(v):
            choice[jid] = k
            zs = model.z.get((jid, k))
            if zs is None:
                continue
            if exact:
                nodes[jid] = tuple(n for n, y in zs.items() if solver.Value(y))
            else:
                counts[jid] = {c: int(solver.Value(z)) for c, z in zs.items() if solver.Value(z)}
    objective, bound = int(round(solver.ObjectiveValue())), int(round(solver.BestObjectiveBound()))
    if status == "OPTIMAL" and bound > objective:  # stopped by relative_gap_limit
        status = "FEASIBLE"
    return Solved(status, choice, counts, nodes, objective, bound, t1 - t0, t2 - t1, len(model.m.Proto().variables))
