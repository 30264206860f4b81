"""The time-averaged contention model (solver.network, the simulator's truth
under --contention) against a phase-by-phase simulation of the same jobs.

The reference is Wang et al.'s model: a job alternates a compute phase and a
communication phase; while k jobs communicate over one link they share its
bandwidth equally (each sends at min(its rate, capacity / k)), a job's
transfer moves at the pace of its most shared link, and phases are not
synchronised between jobs (each starts at a random point of its cycle). It
is simulated event by event until every job has run `--iters` iterations;
a job's iteration time is then its mean cycle.

Scenarios: `--scenarios` random sets of 2 to 6 multi-node jobs on 8 nodes
(each on 2 to 4 of them, network duty alone 0.05 to 0.8), all NICs equal,
and (one in three) two racks with an uplink of half a NIC. Prints one JSON
line per scenario (the largest error in it) and a summary line: mean and
max relative error of the iteration time over all jobs, and of the
slowdown (loaded / alone - 1) where it is at least 5%.

    python benchmarks/contention_model.py [--scenarios 200] [--iters 300] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

from solver.network import CommLoad, Network, iteration_times

NODES = [f"n{i}" for i in range(8)]
NIC = 10.0


def phase_level(loads: list[CommLoad], network: Network, iters: int, rng: random.Random) -> dict[str, float]:
    """Mean iteration time of each job under the phase-by-phase model."""
    links = {c.job_id: network.links(c.nodes) for c in loads}
    comp = {c.job_id: c.iter_s - c.net_s for c in loads}
    state: dict[str, list] = {}  # job -> [phase, left]; compute left in s, comm left in s at full rate
    for c in loads:
        off = rng.uniform(0, c.iter_s)
        if off < comp[c.job_id]:
            state[c.job_id] = ["comp", comp[c.job_id] - off]
        else:
            state[c.job_id] = ["comm", c.iter_s - off]
    done = dict.fromkeys(state, 0)
    first_end: dict[str, float] = {}
    last_end: dict[str, float] = {}
    t = 0.0
    while min(done.values()) < iters:
        active: dict[str, int] = {}
        for j, (phase, _) in state.items():
            if phase == "comm":
                for link, _ in links[j]:
                    active[link] = active.get(link, 0) + 1
        rate = {}
        for j, (phase, _) in state.items():
            if phase == "comp":
                rate[j] = 1.0
            else:
                rate[j] = min([1.0] + [min(1.0, network.capacity(ln) / (active[ln] * r)) for ln, r in links[j]])
        dt = min(left / rate[j] for j, (_, left) in state.items())
        t += dt
        for j, st in state.items():
            st[1] -= dt * rate[j]
            if st[1] <= 1e-12:
                if st[0] == "comp":
                    st[0], st[1] = "comm", next(c.net_s for c in loads if c.job_id == j)
                else:
                    st[0], st[1] = "comp", comp[j]
                    done[j] += 1
                    first_end.setdefault(j, t)
                    last_end[j] = t
                    if comp[j] <= 0:
                        st[0], st[1] = "comm", next(c.net_s for c in loads if c.job_id == j)
    return {j: (last_end[j] - first_end[j]) / (done[j] - 1) for j in state}


def scenario(rng: random.Random) -> tuple[list[CommLoad], Network]:
    racks = rng.random() < 1 / 3
    rack_of = {n: ("r0" if i < 4 else "r1") for i, n in enumerate(NODES)} if racks else {}
    uplink = {"r0": NIC / 2, "r1": NIC / 2} if racks else {}
    net = Network(dict.fromkeys(NODES, NIC), rack_of, uplink)
    loads = []
    for k in range(rng.randint(2, 6)):
        nodes = tuple(rng.sample(NODES, rng.randint(2, 4)))
        it = rng.uniform(0.2, 2.0)
        loads.append(CommLoad(f"j{k}", nodes, it, it * rng.uniform(0.05, 0.8)))
    return loads, net


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", type=int, default=200)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    errs, slow_errs = [], []
    for s in range(a.scenarios):
        loads, net = scenario(rng)
        ref = phase_level(loads, net, a.iters, rng)
        avg = iteration_times(loads, net)
        worst = 0.0
        for c in loads:
            e = abs(avg[c.job_id] - ref[c.job_id]) / ref[c.job_id]
            errs.append(e)
            worst = max(worst, e)
            if ref[c.job_id] / c.iter_s - 1 >= 0.05:
                slow_errs.append(
                    abs(avg[c.job_id] / c.iter_s - ref[c.job_id] / c.iter_s) / (ref[c.job_id] / c.iter_s - 1)
                )
        print(
            json.dumps({"scenario": s, "jobs": len(loads), "racks": bool(net.uplink_gbps), "max_err": round(worst, 4)})
        )
    print(
        json.dumps(
            {
                "summary": True,
                "jobs": len(errs),
                "iter_time_mean_err": round(statistics.mean(errs), 4),
                "iter_time_p95_err": round(sorted(errs)[int(0.95 * (len(errs) - 1))], 4),
                "iter_time_max_err": round(max(errs), 4),
                "slowdown_mean_err": round(statistics.mean(slow_errs), 4) if slow_errs else None,
                "slowed_jobs": len(slow_errs),
            }
        )
    )


if __name__ == "__main__":
    main()
