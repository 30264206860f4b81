"""Contention as the simulator's truth (`cellsched simulate --contention`).

A multi-node job's iteration is compute plus communication: the share of it
on the network (dp gradient sync, pp point-to-point, tp across nodes) comes
from the estimator's cost breakdown (solver.cost.share.network_share) for the
plan the job runs, priced at the GPU spec's nominal bandwidth and carried to
the NICs its nodes really have (the slowest of them). Jobs that share a NIC or
a rack uplink share its bandwidth (solver.network's time-averaged model; its
error against a phase-by-phase simulation is measured by
benchmarks/contention_model.py and stated in docs/benchmarks.md). The world asks
again whenever a multi-node job starts, ends, leaves its restart stall or
begins a checkpoint, and moves the completions of the jobs whose speed
changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from slurm_ext.jobspec import JobSpec
from slurm_ext.sim.clusterspec import node_names
from slurm_ext.sim.types import ClusterSpec
from solver.contention import nic_factor
from solver.cost.share import network_share
from solver.network import CommLoad, Network, iteration_times
from solver.plan import JobPlan
from solver.types import Cell, ParallelPlan


def cluster_network(spec: ClusterSpec) -> Network:
    """The network a cluster spec gives (NICs of the groups that name one,
    their racks, the racks' uplinks); empty when none does."""
    nics, racks = {}, {}
    names = iter(node_names(spec))
    for g in spec.groups:
        for _ in range(g.count):
            name = next(names)[0]
            if g.nic_gbps:
                nics[name] = float(g.nic_gbps)
            if g.rack:
                racks[name] = g.rack
    return Network(nics, racks, dict(spec.uplink_gbps))


@dataclass(frozen=True)
class Comm:
    """A running job's network use alone on its nodes: its iteration (s) and
    the seconds of it on the network."""

    alone_s: float
    net_s: float


class NetworkTruth:
    """How fast multi-node jobs really run on `network`, alone and together."""

    def __init__(self, network: Network) -> None:
        self.network = network

    def alone(
        self, spec: JobSpec, gpu_type: str, nodes: tuple[str, ...], gpus_per_node: int, plan: JobPlan | None, t: float
    ) -> Comm:
        """The job's use of the network when its iteration takes `t` seconds
        at the nominal bandwidth (the truth tables' network)."""
        if len(set(nodes)) < 2:
            return Comm(t, 0.0)
        first = gpu_type.split("+")[0]
        gpus = len(nodes) * gpus_per_node
        pp = plan.pp if plan is not None and gpus % plan.pp == 0 else 1
        cell = Cell(first, len(nodes), gpus_per_node, pp)
        pplan = None
        if plan is not None and plan.pp * plan.dp * plan.tp == gpus:
            pplan = ParallelPlan(plan.pp, plan.dp, plan.tp, max(1, plan.micro_batches))
        share = network_share(spec.model_spec(), spec.global_batch, cell, pplan)
        f = nic_factor(share, first, self.network.slowest_nic(nodes))
        alone = t * f
        return Comm(alone, min(alone, t * (f - 1.0 + share)))

    def times(self, jobs: Mapping[str, tuple[tuple[str, ...], Comm]]) -> dict[str, float]:
        """job id -> iteration time (s) of each communicating job (its nodes,
        its Comm) with all of them running together."""
        loads: Iterable[CommLoad] = (
            CommLoad(j, nodes, c.alone_s, c.net_s) for j, (nodes, c) in jobs.items() if c.net_s > 0
        )
        return iteration_times(loads, self.network)
