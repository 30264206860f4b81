"""The capacity one round may hand out: free GPUs per node after the fixed
jobs, grouped into node classes, and which classes a job may use."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from solver.placement.nodes import ClassKey, Ledger, common_partition, eligible, node_classes
from solver.types import Cell, ClusterView, JobRequest, Placement


@dataclass(frozen=True)
class Space:
    cluster: ClusterView
    free: Mapping[str, int]
    classes: Mapping[ClassKey, tuple[str, ...]]
    parts: Mapping[str, tuple[str, ...]]
    types: Mapping[str, str] = field(default_factory=dict)
    #: node -> the multi-node jobs among the fixed ones on its network card
    links: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(
        cls, cluster: ClusterView, fixed: Mapping[str, Placement] = {}, marks: Mapping[str, tuple[str, ...]] = {}
    ) -> Space:
        """`marks`: node -> the reservations it is in (siterules.RESERVED +
        name), kept apart in their own node classes (the third field of the
        class key, after the node's partitions)."""
        free = {n.name: n.gpus_free for n in cluster.nodes}
        links: dict[str, int] = {}
        for p in fixed.values():
            for name, g in p.nodes:
                free[name] -= g
                if p.cell.num_nodes > 1:
                    links[name] = links.get(name, 0) + 1
        classes = {k: tuple(v) for k, v in node_classes(cluster, free, marks).items()}
        types = {n.name: n.gpu_type for n in cluster.nodes}
        return cls(cluster, free, classes, cluster.node_partitions, types, links)

    @property
    def num_nodes(self) -> int:
        return sum(len(v) for v in self.classes.values())

    def classes_for(
        self, job: JobRequest, cell: Cell, gpu_type: str | None = None, blocked: frozenset[str] = frozenset()
    ) -> list[ClassKey]:
        """Classes whose nodes can each take one of the cell's node shares
        (of `gpu_type`, default the cell's own), none marked `blocked`."""
        want = cell.gpu_type if gpu_type is None else gpu_type
        return [
            k
            for k in self.classes
            if k[0] == want
            and k[1] >= cell.gpus_per_node
            and eligible(job, k[2])
            and not (blocked and blocked & set(k[2]))
        ]

    def part_classes(
        self, job: JobRequest, cell: Cell, blocked: frozenset[str] = frozenset()
    ) -> list[tuple[int, list[ClassKey]]]:
        """(nodes, classes) of each GPU type of the cell (one entry unless mixed)."""
        return [(n, self.classes_for(job, cell, t, blocked)) for t, n in cell.by_type()]

    def blocks(self, names: tuple[str, ...], blocked: frozenset[str]) -> bool:
        """Is one of these nodes marked `blocked` (see Space.of)?"""
        if not blocked:
            return False
        group_of = {n: k for k, ns in self.classes.items() for n in ns}
        return any(blocked & set(group_of[n][2]) for n in names if n in group_of)

    def ledger(self) -> Ledger[ClassKey]:
        return Ledger(self.classes, self.free, self.links)

    def partition_of(self, job: JobRequest, names: tuple[str, ...]) -> tuple[bool, str | None]:
        return common_partition(job, [self.parts[n] for n in names])
