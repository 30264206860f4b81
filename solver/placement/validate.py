"""Check that a plan can be carried out on the cluster as it is."""

from __future__ import annotations

from collections.abc import Mapping

from solver.errors import SolverError
from solver.mixed import task_stage_types
from solver.placement.nodes import in_partition
from solver.types import ClusterView, Placement


class PlacementError(ValueError, SolverError):
    """Placements that cannot be carried out on the cluster as it is (not to
    be confused with ``solver.plan.PlanError``, a malformed job plan)."""


def validate_plan(cluster: ClusterView, placements: Mapping[str, Placement]) -> None:
    """Raise PlacementError unless every placement is on existing nodes of its cell's
    GPU type, matches its cell's layout (num_nodes distinct nodes with
    gpus_per_node GPUs each), uses only nodes of its partition (when set), its
    plan fits the cell, every stage of a pipeline across types lies on nodes of
    one type in the cluster's node order (Slurm's task order), and no node
    gives out more than its free GPUs."""
    by_name = {n.name: n for n in cluster.nodes}
    order = {n.name: i for i, n in enumerate(cluster.nodes)}
    used: dict[str, int] = {}
    for job_id, p in placements.items():
        if p.job_id != job_id:
            raise PlacementError(f"placement under key {job_id} is for job {p.job_id}")
        cell = p.cell
        names = p.node_names
        if len(names) != cell.num_nodes or len(set(names)) != len(names):
            raise PlacementError(
                f"job {job_id}: {len(names)} nodes {names} for layout {cell.layout} (need distinct nodes)"
            )
        if p.plan.num_gpus != cell.num_gpus:
            raise PlacementError(
                f"job {job_id}: plan uses {p.plan.num_gpus} GPUs, cell {cell.key()} has {cell.num_gpus}"
            )
        for name, g in p.nodes:
            node = by_name.get(name)
            if node is None:
                raise PlacementError(f"job {job_id}: unknown node {name}")
            if node.gpu_type not in dict(cell.by_type()):
                raise PlacementError(f"job {job_id}: node {name} has {node.gpu_type}, cell wants {cell.gpu_type}")
            if g != cell.gpus_per_node:
                raise PlacementError(
                    f"job {job_id}: {g} GPUs on {name}, layout {cell.layout} wants {cell.gpus_per_node}"
                )
            if p.partition is not None and not in_partition(cluster, node, p.partition):
                raise PlacementError(f"job {job_id}: node {name} is not in partition {p.partition}")
            used[name] = used.get(name, 0) + g
        if not cell.holds_types([by_name[n].gpu_type for n in names]):
            raise PlacementError(f"job {job_id}: nodes {names} are not the GPU types of cell {cell.key()}")
        if cell.mixed and cell.pp > 1:
            tasks = [by_name[n].gpu_type for n in sorted(names, key=lambda n: order[n])]
            if task_stage_types(cell, p.plan, tasks) is None:
                raise PlacementError(
                    f"job {job_id}: a pipeline stage would span GPU types on nodes {names} in task order"
                )
    for name, g in sorted(used.items()):
        if g > by_name[name].gpus_free:
            raise PlacementError(f"node {name}: {g} GPUs planned, {by_name[name].gpus_free} free")
