"""Load-aware estimates (Arena): a cell's speed on the cluster's network, and
a placed job's speed next to the other jobs on its links (Wang et al.).

Estimates price the network at the GPU spec's bandwidth
(`solver.cost.share.nominal_nic_gbps`). `NicAwareEstimator` carries a
multi-node cell's network seconds to the NICs its nodes really have (the
slowest NIC of each GPU type in the cluster: a cell may land on any of its
nodes); every policy decides on it. `loads` and `loaded_times` price jobs on
concrete nodes together (solver.network's time-averaged contention): what the
controller compares a job's reported speed with, and what contention-aware
policies weigh.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from solver.cost.share import boundary_bytes, network_share, nominal_nic_gbps
from solver.estimator.protocol import CostModel, EstimatorBase, EstimatorLike
from solver.network import CommLoad, at_nic, iteration_times
from solver.types import Cell, ClusterView, Estimate, JobRequest, ParallelPlan, Placement


def nic_by_type(cluster: ClusterView) -> dict[str, float]:
    """GPU type -> the slowest NIC (Gb/s) among its nodes (types without a known NIC left out)."""
    out: dict[str, float] = {}
    for n in cluster.nodes:
        if n.nic_gbps > 0:
            out[n.gpu_type] = min(out.get(n.gpu_type, n.nic_gbps), n.nic_gbps)
    return out


def nic_factor(share: float, gpu_type: str, nic_gbps: float | None) -> float:
    """The factor on an iteration whose `share` is on the network at the
    nominal bandwidth, run on NICs of `nic_gbps` instead (None: unchanged)."""
    if not share or not nic_gbps:
        return 1.0
    return 1.0 - share + at_nic(share, nominal_nic_gbps(gpu_type), nic_gbps)


class NicAwareEstimator(EstimatorBase):
    """`inner`'s estimates, multi-node cells carried to the cluster's NICs
    (`set_cluster` each round; before it, and for one-node cells, unchanged):
    the network share scaled to the slowest NIC, plus every micro-batch's
    transfer over pipeline stage boundaries between nodes
    (`solver.cost.share.boundary_bytes`) at that NIC beyond the nominal one."""

    def __init__(self, inner: EstimatorLike) -> None:
        self.inner = inner
        self.nics: dict[str, float] = {}

    def set_cluster(self, cluster: ClusterView) -> bool:
        """Take the NICs of `cluster`; True when they changed."""
        nics = nic_by_type(cluster)
        changed, self.nics = nics != self.nics, nics
        return changed

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        est = self.inner.estimate(job, cell)
        if cell.num_nodes < 2 or not self.nics or not est.feasible:
            return est
        known = [self.nics[t] for t, _ in cell.by_type() if t in self.nics]
        if not known:
            return est
        gpu_type, nic = cell.by_type()[0][0], min(known)
        f = nic_factor(network_share(job.model, job.global_batch, cell, est.plan), gpu_type, nic)
        slower = max(0.0, 1 / nic - 1 / nominal_nic_gbps(gpu_type))  # s per Gb
        extra = boundary_bytes(job.model, job.global_batch, cell, est.plan) * 8e-9 * slower
        if f == 1.0 and extra == 0.0:
            return est
        return dataclasses.replace(est, iter_time_s=est.iter_time_s * f + extra)

    def refresh(self) -> bool:
        return self.inner.refresh()

    @property
    def cost_model(self) -> CostModel | None:
        return self.inner.cost_model


def duty(job: JobRequest, cell: Cell, plan: ParallelPlan | None, nic_gbps: float | None) -> float:
    """The fraction of its iteration `job` spends on NICs of `nic_gbps` (None:
    at the nominal bandwidth) alone, in `cell` with `plan`; 0 on one node."""
    if cell.num_nodes < 2:
        return 0.0
    share = network_share(job.model, job.global_batch, cell, plan)
    f = nic_factor(share, cell.by_type()[0][0], nic_gbps)
    return min(1.0, max(0.0, (f - 1.0 + share) / f))


def load_of(job: JobRequest, placement: Placement, iter_s: float, cluster: ClusterView) -> CommLoad:
    """The network use of `job` placed by `placement`, whose iteration takes
    `iter_s` alone on its nodes (NICs included)."""
    nodes = placement.node_names
    if len(set(nodes)) < 2 or not iter_s > 0:
        return CommLoad(job.job_id, nodes, max(iter_s, 1e-9), 0.0)
    d = duty(job, placement.cell, placement.plan, cluster.network.slowest_nic(nodes))
    return CommLoad(job.job_id, nodes, iter_s, iter_s * d)


def loaded_times(placed: Iterable[tuple[JobRequest, Placement, float]], cluster: ClusterView) -> dict[str, float]:
    """job id -> iteration time (s) of each (job, placement, time alone)
    when they all run together on `cluster`'s network."""
    loads = [load_of(j, p, t, cluster) for j, p, t in placed]
    return iteration_times(loads, cluster.network)


def contention_factors(
    placed: Iterable[tuple[JobRequest, Placement, float]], cluster: ClusterView
) -> Mapping[str, float]:
    """job id -> loaded time / time alone (>= 1)."""
    placed = list(placed)
    times = loaded_times(placed, cluster)
    return {j.job_id: times[j.job_id] / t for j, _, t in placed if t > 0}
