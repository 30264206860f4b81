"""Contention as the simulator's truth (`cellsched simulate --contention`).

A multi-node job's iteration is compute plus communication. Its network
seconds come from the bytes its plan puts on each of its NICs (gradient
rings across nodes, activations across stage boundaries:
``slurm_ext.sim.link_truth.wire_bytes``) at the GPU type's datasheet network
(what the truth tables' times stand on), carried to the NICs its nodes
really have (the slowest of them). Jobs that share a NIC or a rack uplink
slow each other as ``slurm_ext.sim.link_truth`` says: a model of its own,
fitted to jobs measured on rate-limited links (benchmarks/contention_real.py,
benchmarks/link_truth_fit.py), not the model the scheduler prices with
(solver.network). The world asks again whenever a multi-node job starts,
ends, leaves its restart stall or begins a checkpoint, and moves the
completions of the jobs whose speed changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slurm_ext.sim.clusterspec import node_names
from slurm_ext.sim.link_truth import LinkRates, Links, Talk, alone_comm, loaded_times, wire_bytes
from slurm_ext.sim.types import ClusterSpec
from solver.contract.jobspec import JobSpec
from solver.contract.plan import JobPlan


def cluster_network(spec: ClusterSpec) -> Links:
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
    return Links(nics, racks, dict(spec.uplink_gbps))


@dataclass(frozen=True)
class Comm:
    """A running job's network use alone on its nodes: its iteration (s) and
    the seconds of it on the network."""

    alone_s: float
    net_s: float


class NetworkTruth:
    """How fast multi-node jobs really run on `network` (NIC per node, rack
    per node, uplink per rack), alone and together."""

    def __init__(self, network: LinkRates) -> None:
        self.network = network

    def slowest_nic(self, nodes: tuple[str, ...]) -> float | None:
        known = [self.network.nic_gbps[n] for n in nodes if n in self.network.nic_gbps]
        return min(known) if known else None

    def alone(
        self, spec: JobSpec, gpu_type: str, nodes: tuple[str, ...], gpus_per_node: int, plan: JobPlan | None, t: float
    ) -> Comm:
        """The job's use of the network when its iteration takes `t` seconds
        at the datasheet network (the truth tables' network)."""
        if len(set(nodes)) < 2:
            return Comm(t, 0.0)
        model = spec.model_spec()
        gpus = len(nodes) * gpus_per_node
        pp = plan.pp if plan is not None and plan.pp >= 1 and gpus % plan.pp == 0 else 1
        tp = plan.tp if plan is not None and plan.tp >= 1 else 1
        size = wire_bytes(
            model.params,
            model.dtype_bytes,
            model.boundary_bytes_per_sample(),
            spec.global_batch,
            len(set(nodes)),
            gpus_per_node,
            pp,
            tp,
        )
        alone, net = alone_comm(t, size, gpu_type, self.slowest_nic(nodes))
        return Comm(alone, min(alone, net))

    def times(self, jobs: Mapping[str, tuple[tuple[str, ...], Comm]]) -> dict[str, float]:
        """job id -> iteration time (s) of each communicating job (its nodes,
        its Comm) with all of them running together."""
        talks = {j: Talk(nodes, c.alone_s, c.net_s) for j, (nodes, c) in jobs.items() if c.net_s > 0}
        return loaded_times(talks, self.network)
