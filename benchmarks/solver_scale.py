"""How long a full cellsched round takes as the cluster grows.

A round = enumerate cells + estimate (real Estimator on a seeded in-memory
ProfileStore) + CP-SAT + node placement, timed around the policy's
schedule() call. Jobs are drawn from the Arena Philly trace's model / batch /
request mix (default: the copy shipped in solver/data/arena). Per size: one
cold round (empty caches), then warm rounds: between rounds 300 s pass,
running jobs make progress, about 5% of them finish and as many new jobs
arrive; each round is warm-started from the previous plan and the jobs'
current placements. Every node has a 100 Gb/s network card, in racks of 32
behind a 4:1 oversubscribed uplink, so cellsched checks each round for
links shared at a cost ("contention included"; since sharing is priced only
where it costs a job 1% or more, these cards never are; --no-network
leaves the NICs unknown).

Run it from the checkout with PYTHONPATH=. to time that checkout's solver
(without it, `solver` is whatever the environment installed). Prints one
JSON line per round (round_s: wall clock; cpu_s: this process's
CPU time, which a loaded machine disturbs less) and a summary line per size:

    PYTHONPATH=. python benchmarks/solver_scale.py   # 64 / 1,280 / 10,240 / 32,768 GPUs
    python benchmarks/solver_scale.py --quick    # smoke run
    python benchmarks/solver_scale.py --no-network   # nodes without known NICs (no contention pricing)
    python benchmarks/solver_scale.py --sizes 1280 --compare   # LP first vs CP-SAT only
"""

from __future__ import annotations

import argparse
import csv
import json
import pathlib
import random
import statistics
import time
from dataclasses import replace

from solver.contract.models import get_model
from solver.contract.profiles.arena import TRACE_FILE, shipped_path
from solver.contract.profiles.seed import open_store
from solver.estimator import Estimator
from solver.placement import validate_plan
from solver.policies import get_policy
from solver.types import ClusterView, JobRequest, NodeView, ScheduleRequest, SolverConfig

ARENA = {"a100": (80, 4), "v100": (20, 16), "a40": (160, 2), "a10": (160, 2)}  # nodes, GPUs per node
SMALL = {"a100": (4, 4), "v100": (1, 16), "a40": (8, 2), "a10": (8, 2)}  # 64 GPUs
#: every node's network card, nodes per rack and each rack's uplink (4:1 oversubscribed), Gb/s
NIC_GBPS, RACK_NODES, UPLINK_GBPS = 100.0, 32, 800.0


def cluster_of(spec: dict[str, tuple[int, int]], scale: float = 1, network: bool = True) -> ClusterView:
    """`spec`'s nodes times `scale`, each with a 100 Gb/s NIC in racks of
    RACK_NODES behind an oversubscribed uplink (network=False: none known)."""
    names = [(f"{t}-{i:05d}", t, g) for t, (n, g) in spec.items() for i in range(int(n * scale))]
    if not network:
        return ClusterView(tuple(NodeView(name, t, g, g) for name, t, g in names))
    nodes = tuple(
        NodeView(name, t, g, g, nic_gbps=NIC_GBPS, rack=f"r{k // RACK_NODES:04d}")
        for k, (name, t, g) in enumerate(names)
    )
    return ClusterView(nodes, uplink_gbps={n.rack: UPLINK_GBPS for n in nodes})


def load_trace(path: pathlib.Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class JobSource:
    """New jobs drawn (with replacement) from the trace's mix."""

    def __init__(self, rows: list[dict], rng: random.Random) -> None:
        self.rows, self.rng, self.count = rows, rng, 0

    def new(self, now: float) -> JobRequest:
        r = self.rng.choice(self.rows)
        self.count += 1
        return JobRequest(
            f"job{self.count:06d}",
            get_model(r["model_name"]),
            int(r["batch_size"]),
            max(1, int(r["num_iteration"]) // 5),
            elastic=True,
            submit_time=now,
            requested_gpus=int(r["num_gpu"]),
            requested_gpu_type=r["gpu_type"],
            runtime="adaptive",
        )


def advance(
    jobs: list[JobRequest],
    placements,
    source: JobSource,
    rng: random.Random,
    now: float,
    dt: float = 300.0,
    churn: float = 0.05,
) -> list[JobRequest]:
    """The jobs of the next round: progress, ~churn of the running finish, as many arrive."""
    out, finished = [], 0
    for j in jobs:
        p = placements.get(j.job_id)
        if p is not None and rng.random() < churn:
            finished += 1
            continue
        done = j.iterations_done + (dt / p.iter_time_s if p is not None else 0.0)
        out.append(replace(j, current=p, iterations_done=min(done, j.iterations - 1.0)))
    return out + [source.new(now) for _ in range(max(finished, 1))]


def _line(
    name: str, variant: str, rnd: int, gpus: int, jobs: list[JobRequest], rep, round_s: float, cpu_s: float
) -> dict:
    moved = sum(1 for j in jobs if j.current is not None and not j.current.same_resources(rep.placements.get(j.job_id)))
    return {
        "size": name,
        "variant": variant,
        "round": rnd,
        "cold": rnd == 0,
        "gpus": gpus,
        "jobs": len(jobs),
        "cells": rep.num_cells,
        "build_s": round(rep.build_s, 3),
        "solve_s": round(rep.solve_s, 3),
        "place_s": round(rep.place_s, 3),
        "round_s": round(round_s, 3),
        "cpu_s": round(cpu_s, 3),
        "objective": round(rep.objective, 3),
        "bound": round(rep.bound, 3),
        "gap": round(rep.gap, 4) if rep.gap != float("inf") else None,
        "status": rep.status,
        "placed": len(rep.placements),
        "gpus_used": sum(p.cell.num_gpus for p in rep.placements.values()),
        "moved_or_resized": moved,
    }


def _summary(
    name: str, variant: str, gpus: int, num_jobs: int, times: list[float], gaps: list[float], cpus: list[float]
) -> dict:
    times = sorted(times)
    return {
        "summary": name,
        "variant": variant,
        "gpus": gpus,
        "jobs": num_jobs,
        "warm_rounds": len(times),
        "median_round_s": round(statistics.median(times), 3) if times else None,
        "p95_round_s": round(times[min(len(times) - 1, int(0.95 * len(times)))], 3) if times else None,
        "max_round_s": round(times[-1], 3) if times else None,
        "median_cpu_s": round(statistics.median(cpus), 3) if cpus else None,
        "max_gap": round(max(gaps), 4) if gaps else None,
    }


def run_size(
    name: str,
    cluster: ClusterView,
    num_jobs: int,
    rounds: int,
    rows: list[dict],
    variants: dict[str, SolverConfig],
    seed: int,
) -> dict[str, dict]:
    """Rounds of one size. With several variants each solves the same request
    every round (in alternating order, each with its own policy and
    Estimator, so no variant gets the other's cache hits); the jobs follow
    the first variant's plan."""
    rng = random.Random(seed)
    source = JobSource(rows, rng)
    estimators = {v: Estimator(open_store(":memory:")) for v in variants}
    policies = {v: get_policy("cellsched") for v in variants}
    jobs = [source.new(0.0) for _ in range(num_jobs)]
    gpus = sum(n.gpus_total for n in cluster.nodes)
    previous: dict = {}
    times: dict[str, list[float]] = {v: [] for v in variants}
    cpus: dict[str, list[float]] = {v: [] for v in variants}
    gaps: dict[str, list[float]] = {v: [] for v in variants}
    first = next(iter(variants))
    for rnd in range(rounds + 1):
        now = 300.0 * rnd
        order = list(variants) if rnd % 2 == 0 else list(reversed(variants))
        replies = {}
        for v in order:
            req = ScheduleRequest(cluster, tuple(jobs), previous=previous, config=variants[v], now=now)
            t0, c0 = time.perf_counter(), time.process_time()
            rep = replies[v] = policies[v].schedule(req, estimators[v])
            round_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
            validate_plan(cluster, rep.placements)
            print(json.dumps(_line(name, v, rnd, gpus, jobs, rep, round_s, cpu_s)), flush=True)
            if rnd > 0:
                times[v].append(round_s)
                cpus[v].append(cpu_s)
                if rep.gap != float("inf"):
                    gaps[v].append(rep.gap)
        previous = dict(replies[first].placements)
        jobs = advance(jobs, replies[first].placements, source, rng, now + 300.0)
    out = {v: _summary(name, v, gpus, num_jobs, times[v], gaps[v], cpus[v]) for v in variants}
    for line in out.values():
        print(json.dumps(line), flush=True)
    if len(variants) > 1:
        base = out[list(variants)[-1]]
        for v in list(variants)[:-1]:
            ratios = sorted(a / b for a, b in zip(times[v], times[list(variants)[-1]], strict=True))
            print(
                json.dumps(
                    {
                        "compare": name,
                        "variant": v,
                        "vs": list(variants)[-1],
                        "median_ratio": round(statistics.median(ratios), 3) if ratios else None,
                        "median_s": [out[v]["median_round_s"], base["median_round_s"]],
                        "p95_s": [out[v]["p95_round_s"], base["p95_round_s"]],
                    }
                ),
                flush=True,
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=pathlib.Path, help="Arena trace CSV (default: the shipped Philly trace)")
    ap.add_argument("--quick", action="store_true", help="small sizes and few rounds (smoke run)")
    ap.add_argument("--rounds", type=int, default=10, help="warm rounds per size (after one cold round)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sizes", default="64,1280,10240,32768", help="comma-separated sizes to run (GPUs)")
    ap.add_argument("--skip-large", action="store_true", help="leave out the 10,240- and 32,768-GPU sizes")
    ap.add_argument("--no-network", action="store_true", help="nodes without known NICs (no contention pricing)")
    ap.add_argument(
        "--compare",
        action="store_true",
        help="also run CP-SAT on the whole model (no LP first) on the same requests and print ratios",
    )
    args = ap.parse_args()
    rows = load_trace(args.trace or shipped_path(TRACE_FILE))
    wanted = set(args.sizes.split(",")) - ({"10240", "32768"} if args.skip_large else set())
    net = not args.no_network
    if args.quick:
        sizes = [
            ("64", lambda: cluster_of(SMALL, 1, net), 20, 2, SolverConfig(seed=args.seed)),
            ("1280", lambda: cluster_of(ARENA, 1, net), 100, 2, SolverConfig(seed=args.seed, time_limit_s=2.0)),
        ]
    else:
        sizes = [
            ("64", lambda: cluster_of(SMALL, 1, net), 20, args.rounds, SolverConfig(seed=args.seed)),
            (
                "1280",
                lambda: cluster_of(ARENA, 1, net),
                500,
                args.rounds,
                SolverConfig(seed=args.seed, time_limit_s=2.0),
            ),
            (
                "10240",
                lambda: cluster_of(ARENA, 8, net),
                4000,
                max(1, args.rounds // 5),
                SolverConfig(seed=args.seed, time_limit_s=10.0, deterministic_time=20.0),
            ),
            (
                "32768",
                lambda: cluster_of(ARENA, 25.6, net),
                12000,
                max(1, args.rounds // 5),
                SolverConfig(seed=args.seed, time_limit_s=30.0, deterministic_time=60.0),
            ),
        ]
    for name, make, n, rounds, cfg in sizes:
        if name not in wanted:
            continue
        cluster = make()
        variants = {"lp-first": cfg}
        if args.compare:
            variants["cpsat-only"] = replace(cfg, lp_first_min_jobs=1 << 30)
        run_size(name, cluster, n, rounds, rows, variants, args.seed)


if __name__ == "__main__":
    main()
