"""cellsched's policy as a scheduler of the Sia artifact's simulator (issue 56):
the cellsched half of the adapter, run in this project's environment.

The artifact's half (benchmarks/sia_bridge.py, in the artifact's own
environment) describes each round as one JSON line on our stdin; we answer
one JSON line on stdout. The description (all that the artifact's policies
are told, plus the job sizes cellsched is given):

    {"now": s, "aware": bool,
     "nodes": [{"name": "rtx-0", "type": "rtx", "index": 0, "gpus": 8}, ...],
     "jobs": [{"id": "cifar10-3", "submit": s, "restarts": n, "restart_cost_s": s,
               "rates": [[type, nodes, gpus, progress per s], ...],
               "min_gpus": n, "max_gpus": n,
               "work": declared total progress (null: unaware), "done": progress so far,
               "current": {"type": t, "nodes": {"rtx-0": 4}} or null,
               "running_since": s or null}, ...]}

`request_of` turns it into cellsched's ScheduleRequest: one GPU type per
cell (no mixed cells: the artifact runs none), a job's cells those of its
rates (the goodput the simulator's fitted model gives for that many nodes
and GPUs of that type; its one-GPU throughput where nothing is fitted yet:
sia_bridge says which), a job's progress counted in iterations of `UNIT`
progress units (the artifact's measure of work, its "progress", which
grows by its goodput), its restart cost the artifact's checkpoint-restore
delay of the type it runs on. Size-aware, a job declares its total work
(the bridge's multiplicative error); size-unaware, every job declares the
same huge work and the objective's size terms are off (hesrpt, w_short_jobs).
`allocations_of` turns the reply into the artifact's allocations, {job:
(type, [node index per GPU])}, and checks that no node is given more GPUs
than it has (`NodeOverflow`).

    python benchmarks/sia_policy.py --serve    (started by sia_bridge; one JSON line per round)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from solver.contract.models import ModelSpec
from solver.estimator.protocol import EstimatorBase
from solver.policies import Policy, get_policy
from solver.types import (
    Cell,
    ClusterView,
    Estimate,
    EstimateSource,
    JobRequest,
    NodeView,
    ParallelPlan,
    Placement,
    ScheduleReply,
    ScheduleRequest,
    SolverConfig,
)

#: progress units (the artifact's measure of a job's work) per iteration
UNIT = 1024
#: the work every job declares when cellsched is not told sizes (iterations)
UNAWARE_ITERATIONS = 10**12
#: the project's policies that may answer the artifact's rounds (--scheduler)
SCHEDULERS = ("cellsched", "sia")
#: the runtime of every job: the artifact's jobs run any layout after a checkpoint-restore
RUNTIME = "adaptive"


class NodeOverflow(ValueError):
    """A reply gives a node more GPUs than it has (the message names it)."""


class RateEstimator(EstimatorBase):
    """Iteration times from each job's rates: (type, nodes, GPUs) -> progress/s.
    A cell without a rate (more GPUs than the job may explore, pipeline
    stages, a layout it has none for) is infeasible."""

    def __init__(self, rates: Mapping[str, Mapping[tuple[str, int, int], float]]) -> None:
        self.rates = rates

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        rate = self.rates.get(job.job_id, {}).get((cell.gpu_type, cell.num_nodes, cell.num_gpus), 0.0)
        if cell.pp != 1 or cell.mixed or not rate > 0:
            return Estimate(cell, None, math.inf, 0.0, EstimateSource.NONE, "no rate")
        plan = ParallelPlan(1, cell.num_gpus, 1)
        return Estimate(cell, plan, UNIT / rate, 1.0, EstimateSource.MEASURED, "sia artifact goodput")


def model_of(job_id: str) -> ModelSpec:
    """A model spec of its own per job (cellsched memoises estimates by the
    model's shape; every job of the artifact has a goodput of its own)."""
    return ModelSpec(job_id, "custom", 1, 64, 1, 64, 64, 1e6)


def cluster_of(nodes: Iterable[Mapping[str, Any]]) -> ClusterView:
    return ClusterView(tuple(NodeView(str(n["name"]), str(n["type"]), int(n["gpus"]), int(n["gpus"])) for n in nodes))


def current_of(desc: Mapping[str, Any], rates: Mapping[tuple[str, int, int], float]) -> Placement | None:
    """The job's placement now, as cellsched's Placement (None: not running)."""
    cur = desc.get("current")
    if not cur:
        return None
    per = sorted((str(n), int(g)) for n, g in cur["nodes"].items() if int(g) > 0)
    counts = {g for _, g in per}
    if len(counts) != 1:
        raise ValueError(f"job {desc['id']}: placement {per} is not one count per node (not a cell)")
    cell = Cell(str(cur["type"]), len(per), counts.pop())
    rate = rates.get((cell.gpu_type, cell.num_nodes, cell.num_gpus), 0.0)
    return Placement(
        str(desc["id"]), cell, tuple(per), ParallelPlan(1, cell.num_gpus, 1), UNIT / rate if rate > 0 else math.inf
    )


def job_of(desc: Mapping[str, Any], aware: bool) -> tuple[JobRequest, dict[tuple[str, int, int], float]]:
    rates = {(str(t), int(n), int(g)): float(r) for t, n, g, r in desc["rates"]}
    if aware:
        iterations = max(1, math.ceil(float(desc["work"]) / UNIT))
        done = min(float(desc["done"]) / UNIT, iterations - 1e-3)
    else:
        iterations, done = UNAWARE_ITERATIONS, 0.0
    job = JobRequest(
        job_id=str(desc["id"]),
        model=model_of(str(desc["id"])),
        global_batch=UNIT,
        iterations=iterations,
        iterations_done=max(0.0, done),
        min_gpus=int(desc.get("min_gpus", 1)),
        max_gpus=int(desc["max_gpus"]),
        elastic=True,
        submit_time=float(desc["submit"]),
        current=current_of(desc, rates),
        restart_cost_s=float(desc["restart_cost_s"]),
        running_since=None if desc.get("running_since") is None else float(desc["running_since"]),
        restarts=int(desc.get("restarts") or 0),
        runtime=RUNTIME,
    )
    return job, rates


def config_of(aware: bool, base: SolverConfig | None = None) -> SolverConfig:
    """The round's config: cellsched's defaults, no mixed cells (the artifact
    runs none); size-unaware, the objective's size terms off."""
    cfg = dataclasses.replace(base or SolverConfig(), mixed_cells=False)
    if not aware:
        cfg = dataclasses.replace(cfg, hesrpt=False, w_short_jobs=0.0)
    return cfg


def request_of(desc: Mapping[str, Any], base: SolverConfig | None = None) -> tuple[ScheduleRequest, RateEstimator]:
    """The round's ScheduleRequest and the estimator of its jobs' rates."""
    aware = bool(desc["aware"])
    jobs, rates = [], {}
    for d in desc["jobs"]:
        job, rates[job.job_id] = job_of(d, aware)
        jobs.append(job)
    request = ScheduleRequest(
        cluster_of(desc["nodes"]),
        tuple(jobs),
        previous={j.job_id: j.current for j in jobs if j.current is not None},
        config=config_of(aware, base),
        now=float(desc["now"]),
    )
    return request, RateEstimator(rates)


def allocations_of(reply: ScheduleReply, nodes: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, list[int]]]:
    """The artifact's allocations: job -> (GPU type, the node index of each of
    its GPUs); NodeOverflow when a node would hold more GPUs than it has, or
    a job is put on nodes of another type than its cell's."""
    by_name = {str(n["name"]): n for n in nodes}
    used: dict[str, int] = {}
    out: dict[str, tuple[str, list[int]]] = {}
    for job_id, p in sorted(reply.placements.items()):
        ids: list[int] = []
        for name, gpus in sorted(p.nodes):
            node = by_name.get(name)
            if node is None or node["type"] != p.cell.gpu_type:
                raise NodeOverflow(f"job {job_id}: node {name} is not a {p.cell.gpu_type} node of the cluster")
            used[name] = used.get(name, 0) + gpus
            if used[name] > int(node["gpus"]):
                raise NodeOverflow(f"node {name}: {used[name]} GPUs given, it has {node['gpus']} (job {job_id})")
            ids += [int(node["index"])] * gpus
        out[job_id] = (p.cell.gpu_type, ids)
    return out


def decide(policy: Policy, desc: Mapping[str, Any], base: SolverConfig | None = None) -> dict[str, Any]:
    """One round: the description in, the artifact's allocations out."""
    t0 = time.perf_counter()
    request, estimator = request_of(desc, base)
    reply = policy.schedule(request, estimator)
    allocs = allocations_of(reply, desc["nodes"])
    return {"allocations": allocs, "solve_s": round(time.perf_counter() - t0, 4), "status": str(reply.status)}


def config_with(sets: Iterable[str]) -> SolverConfig:
    """SolverConfig with KEY=VALUE changes (a value parsed as JSON, else text)."""
    fields = {f.name: f for f in dataclasses.fields(SolverConfig)}
    changes: dict[str, Any] = {}
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or key not in fields:
            raise SystemExit(f"--set {item!r}: not KEY=VALUE of a SolverConfig field")
        try:
            changes[key] = json.loads(raw)
        except json.JSONDecodeError:
            changes[key] = raw
    return SolverConfig(**changes)


def serve(inp: TextIO, out: TextIO, base: SolverConfig | None = None, scheduler: str = "cellsched") -> None:
    """Answer one JSON line per round until the input ends, by the project's
    policy `scheduler` (cellsched's, or a re-implementation: "sia")."""
    policy = get_policy(scheduler)
    for line in inp:
        if line.strip():
            out.write(json.dumps(decide(policy, json.loads(line), base)) + "\n")
            out.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", action="store_true", help="answer the bridge's rounds on stdin/stdout")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE of cellsched's SolverConfig (repeatable)")
    ap.add_argument(
        "--scheduler",
        choices=SCHEDULERS,
        default="cellsched",
        help="the project's policy that answers: cellsched's, or our re-implementation of Sia",
    )
    args = ap.parse_args()
    if args.serve:
        serve(sys.stdin, sys.stdout, config_with(args.set), args.scheduler)
    else:
        ap.print_help()


if __name__ == "__main__":
    main()
