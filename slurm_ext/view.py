"""The one place where Slurm's records become the solver's capacity view."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection

from slurm_ext.config import NetworkConfig
from slurm_ext.records import ClusterSnapshot
from solver.types import ClusterView, NodeView


def to_cluster_view(
    snapshot: ClusterSnapshot,
    managed_job_ids: Collection[str],
    network: NetworkConfig | None = None,
    ending_job_ids: Collection[str] = (),
) -> ClusterView:
    """Nodes with GPUs, and partitions, as the solver sees them, with the
    network of `network` (None: the [network] defaults, NICs by GPU type).

    A node's ``gpus_free`` is its GPUs minus those held by running (or
    completing) jobs the solver does not manage; 0 when the node cannot take
    work (down, drained, not responding). The GPUs held by unmanaged jobs are
    counted conservatively: the larger of what those jobs requested on the
    node and what Slurm reports allocated there minus the managed jobs'
    share (the two can disagree when a job asked for GPUs per job, not per
    node, or when jobs and nodes were read a moment apart).

    `ending_job_ids`: managed jobs that ended and are placed again (they
    checkpointed). Slurm may still count their GPUs on the nodes they ran on
    (the nodes were read before the jobs, or Slurm had not freed them yet):
    the GPUs a node shows allocated beyond what the jobs holding resources
    there explain, up to the ending jobs' GPUs on it, are theirs and count
    as free, not as another's. Without this, a job moved away from a node
    would find its own GPUs taken and be placed on a smaller cell, then
    moved again (an avoidable restart).
    """
    managed, ending = set(managed_job_ids), set(ending_job_ids)
    unmanaged_req: dict[str, int] = defaultdict(int)
    managed_req: dict[str, int] = defaultdict(int)
    ending_req: dict[str, int] = defaultdict(int)
    for job in snapshot.jobs:
        if not job.gpus_per_node:
            continue
        if job.holds_resources:
            target = managed_req if job.job_id in managed else unmanaged_req
        elif job.job_id in ending and job.finished:
            target = ending_req
        else:
            continue
        for name in job.nodes:
            target[name] += job.gpus_per_node
    net = network or NetworkConfig()
    nodes = []
    for n in snapshot.nodes:
        if not n.gpu_type or n.gpus_total <= 0:
            continue  # the solver only places GPU work
        unexplained = n.gpus_alloc - managed_req[n.name] - unmanaged_req[n.name]
        own = min(ending_req[n.name], max(0, unexplained))  # still counted for a job that ended
        held = max(unmanaged_req[n.name], n.gpus_alloc - managed_req[n.name] - own)
        free = min(n.gpus_total, max(0, n.gpus_total - held)) if n.available else 0
        nodes.append(
            NodeView(
                name=n.name,
                gpu_type=n.gpu_type,
                gpus_total=n.gpus_total,
                gpus_free=free,
                partitions=n.partitions,
                nic_gbps=net.nic_of(n.name, n.gpu_type),
                rack=net.rack_of(n.name),
            )
        )
    partitions = {p.name: p.nodes for p in snapshot.partitions}
    return ClusterView(nodes=tuple(nodes), partitions=partitions, uplink_gbps=dict(net.uplink_gbps))
