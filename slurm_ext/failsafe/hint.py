"""A job's static cell, from its spec alone (pure functions).

The fail-safe places no job the way the solver would: it releases each on
what its user asked for, with pure data parallelism (pp = tp = 1), and lets
Slurm pick the nodes.

* GPU type: the spec's requested type; else, of the types it allows (any
  when it names none), the one with the most GPUs on nodes that are up in
  its partitions (where it is most likely to find room).
* GPU count: the spec's requested count, else its min_gpus; at most its
  virtual workers when it has them (dp <= V).
* Layout: one node when one node has that many GPUs, else the fewest nodes
  of equal share (powers of two per node, as FCFS does).
* Partition: one of its partitions holding enough such nodes; a partition of
  that GPU type only first, then the smallest.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_ext.backends.base import JobUpdate
from slurm_ext.controller.inputs import ManagedJob, fixed_virtual_workers
from slurm_ext.controller.progress import default_checkpoint_dir
from slurm_ext.errors import CellschedError
from slurm_ext.records import ClusterSnapshot, SlurmNode, SlurmPartition
from solver import contract
from solver.contract.jobspec import JobSpec
from solver.contract.plan import JobPlan
from solver.types import Cell


class HintError(ValueError, CellschedError):
    """The job has no static cell on this cluster (the message says why)."""


@dataclass(frozen=True)
class StaticCell:
    """Where the fail-safe releases a job: GPU type, layout and partition."""

    gpu_type: str
    num_nodes: int
    gpus_per_node: int
    partition: str

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def key(self) -> str:
        return Cell(self.gpu_type, self.num_nodes, self.gpus_per_node, 1).key()


def usable_nodes(spec: JobSpec, snapshot: ClusterSnapshot) -> list[SlurmNode]:
    """Nodes that are up, have GPUs and lie in one of the job's partitions."""
    return [
        n
        for n in snapshot.nodes
        if n.available
        and n.gpu_type
        and n.gpus_total > 0
        and (spec.partitions is None or set(spec.partitions) & set(n.partitions))
    ]


def gpu_type_of(spec: JobSpec, nodes: Sequence[SlurmNode]) -> str:
    """The requested GPU type, else the allowed type with the most GPUs."""
    totals: dict[str, int] = {}
    for n in nodes:
        totals[n.gpu_type or ""] = totals.get(n.gpu_type or "", 0) + n.gpus_total
    if spec.requested_gpu_type is not None:
        if spec.requested_gpu_type not in totals:
            raise HintError(f"no node of its requested GPU type {spec.requested_gpu_type} is up in its partitions")
        return spec.requested_gpu_type
    allowed = {t: g for t, g in totals.items() if spec.gpu_types is None or t in spec.gpu_types}
    if not allowed:
        raise HintError("no node of a GPU type it allows is up in its partitions")
    return min(allowed, key=lambda t: (-allowed[t], t))


def gpu_count(spec: JobSpec, virtual_workers: int | None) -> int:
    """The requested GPU count, else min_gpus; at most the virtual workers."""
    gpus = spec.requested_gpus or spec.min_gpus
    if virtual_workers is not None and gpus > virtual_workers:
        if virtual_workers < spec.min_gpus:
            raise HintError(f"its {virtual_workers} virtual workers are fewer than its min_gpus ({spec.min_gpus})")
        gpus = virtual_workers
    return gpus


def per_node_options(gpus: int, largest: int) -> list[int]:
    """GPUs per node to try, best locality first: all on one node, then the
    largest power of two that divides `gpus`, halving down to 1."""
    out = [gpus] if gpus <= largest else []
    per = 1
    while per * 2 <= min(gpus, largest) and gpus % (per * 2) == 0:
        per *= 2
    while per >= 1:
        if gpus % per == 0 and per not in out:
            out.append(per)
        per //= 2
    return out


def partitions_by_preference(
    spec: JobSpec, snapshot: ClusterSnapshot, gpu_type: str
) -> list[tuple[SlurmPartition, list[SlurmNode]]]:
    """The job's partitions that are up, with their usable nodes of `gpu_type`:
    partitions of that type only first, then the smallest, then by name."""
    nodes = {n.name: n for n in usable_nodes(spec, snapshot)}
    types = {n.name: n.gpu_type for n in snapshot.nodes}
    out = []
    for p in snapshot.partitions:
        if p.state != "UP" or (spec.partitions is not None and p.name not in spec.partitions):
            continue
        of_type = [nodes[n] for n in p.nodes if n in nodes and nodes[n].gpu_type == gpu_type]
        if of_type:
            only = all(types.get(n) == gpu_type for n in p.nodes)
            out.append((not only, len(p.nodes), p.name, p, of_type))
    return [(p, of_type) for *_, p, of_type in sorted(out, key=lambda r: r[:3])]


def static_cell(m: ManagedJob, snapshot: ClusterSnapshot) -> StaticCell:
    """The job's static cell on this cluster; HintError when it has none."""
    spec = m.spec
    if spec is None:
        raise HintError("it has no usable spec")
    gpu_type = gpu_type_of(spec, usable_nodes(spec, snapshot))
    gpus = gpu_count(spec, fixed_virtual_workers(m))
    choices = partitions_by_preference(spec, snapshot, gpu_type)
    largest = max((n.gpus_total for _, nodes in choices for n in nodes), default=0)
    for per in per_node_options(gpus, largest):
        for p, nodes in choices:
            if sum(n.gpus_total >= per for n in nodes) >= gpus // per:
                return StaticCell(gpu_type, gpus // per, per, p.name)
    raise HintError(f"no partition of it holds {gpus} {gpu_type} GPUs on nodes that are up")


def static_plan(m: ManagedJob, cell: StaticCell, checkpoint_root: str) -> JobPlan:
    """The plan the job is released with: pure data parallelism on the
    cell, its nodes left to Slurm; the checkpoint directory, virtual workers
    and micro-batches of an earlier plan are kept (as the controller does).
    Any runtime carries a plan like that out (solver.contract.runtimes); the plan
    names the job's."""
    assert m.spec is not None
    old = m.plan
    vw = fixed_virtual_workers(m) or cell.num_gpus
    keep_m = old is not None and old.virtual_workers == vw and (m.spec.global_batch // vw) % old.micro_batches == 0
    return JobPlan(
        pp=1,
        dp=cell.num_gpus,
        tp=1,
        micro_batches=old.micro_batches if keep_m and old is not None else 1,
        global_batch=m.spec.global_batch,
        gpu_types=(cell.gpu_type,),
        gpus_per_node=cell.gpus_per_node,
        virtual_workers=vw,
        checkpoint_dir=(old.checkpoint_dir if old and old.checkpoint_dir else None)
        or default_checkpoint_dir(m.job_id, m.job.user, m.job.work_dir or None, checkpoint_root),
        runtime=m.spec.runtime,
        cell=cell.key(),
        job_id=m.job_id,
    )


def release_update(m: ManagedJob, cell: StaticCell, checkpoint_root: str) -> JobUpdate:
    """The update that puts the job on its static cell before its release.
    Required nodes of an earlier placement are cleared; a job that ran
    before (requeued) may start at once (JobUpdate.start_soon)."""
    assert m.spec_json is not None
    plan = static_plan(m, cell, checkpoint_root)
    return JobUpdate(
        partition=cell.partition,
        features=cell.gpu_type,
        num_nodes=cell.num_nodes,
        req_nodes=(),
        gres_per_node=cell.gpus_per_node,
        num_tasks=cell.num_gpus,
        tasks_per_node=cell.gpus_per_node,
        min_cpus_per_node=cell.gpus_per_node,
        admin_comment=contract.encode_admin_comment(json.loads(m.spec_json), plan),
        start_soon=m.plan is not None,
    )
