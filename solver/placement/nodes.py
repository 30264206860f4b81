"""Concrete nodes for chosen cells (LWF-kappa style).

A cell already fixes how consolidated a job is (num_nodes x gpus_per_node).
Among the nodes that can take it, a multi-node job (it talks over the
inter-node links) first takes the nodes whose network card carries the fewest
other multi-node jobs (kappa: those running and staying, and those placed
this round), then prefers the least-loaded nodes (most free GPUs: load balance);
`spread=False` picks best fit instead (fewest GPUs left over), which packs
single-node jobs and keeps whole nodes free for large ones when no solver
has planned the capacity (greedy, FCFS). Ties keep the order of the node
groups, then the order in which nodes reached their current load, so the
choice is deterministic.

Nodes are grouped into classes (GPU type, free GPUs, partitions); the
solver plans how many nodes of each class a job takes, and the Ledger hands
out nodes from buckets (free GPUs, carries a multi-node job) instead of
scanning every node.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Generic, TypeVar

from solver.types import Cell, ClusterView, JobRequest, NodeView

ClassKey = tuple[str, int, tuple[str, ...]]
#: mark of a reserved node in its node class key (after its partitions): "@reservation:<name>"
RESERVED = "@reservation:"
#: a Ledger's node group (the solver's: a ClassKey)
G = TypeVar("G", bound=Hashable)


def in_partition(cluster: ClusterView, node: NodeView, partition: str) -> bool:
    return partition in node.partitions or node.name in cluster.partitions.get(partition, ())


def partitions_of(key_parts: tuple[str, ...]) -> tuple[str, ...]:
    """A class key's partitions without its reservation marks."""
    if key_parts and key_parts[-1].startswith(RESERVED):
        return tuple(p for p in key_parts if not p.startswith(RESERVED))
    return key_parts


def eligible(job: JobRequest, parts: tuple[str, ...]) -> bool:
    """A job may use a node unless both name partitions and none is shared."""
    parts = partitions_of(parts)
    return job.partitions is None or not parts or any(p in parts for p in job.partitions)


def common_partition(job: JobRequest, parts: Sequence[tuple[str, ...]]) -> tuple[bool, str | None]:
    """(ok, partition) for a job on nodes with these partitions: the job's
    first partition holding every node; (True, None) when nothing is named."""
    if job.partitions is None or all(not p for p in parts):
        return True, None
    for p in job.partitions:
        if all(p in ps for ps in parts):
            return True, p
    return False, None


def node_classes(
    cluster: ClusterView, free: Mapping[str, int], marks: Mapping[str, tuple[str, ...]] = {}
) -> dict[ClassKey, list[str]]:
    """Nodes with free GPUs grouped by (GPU type, free GPUs, partitions), in
    cluster order; classes sorted. A node's `marks` (its reservations) join
    its partitions in the key: no partition is named like one, so they only
    keep reserved nodes in classes of their own."""
    parts = cluster.node_partitions
    groups: dict[ClassKey, list[str]] = {}
    for n in cluster.nodes:
        f = free.get(n.name, 0)
        if f > 0:
            groups.setdefault((n.gpu_type, f, parts[n.name] + marks.get(n.name, ())), []).append(n.name)
    return dict(sorted(groups.items()))


class Ledger(Generic[G]):
    """Free GPUs and multi-node jobs per node (on its network card), bucketed per node group."""

    def __init__(
        self, groups: Mapping[G, Sequence[str]], free: Mapping[str, int], links: Mapping[str, int] = {}
    ) -> None:
        """`links`: multi-node jobs already on each node's network card (fixed ones)."""
        self.free = {name: free[name] for names in groups.values() for name in names}
        self.links = {name: links.get(name, 0) for name in self.free}
        self.group_of = {name: g for g, names in groups.items() for name in names}
        self.buckets: dict[G, dict[tuple[int, int], dict[str, None]]] = {g: {} for g in groups}
        for name in self.free:
            self._add(name)

    def _bkey(self, name: str) -> tuple[int, int]:
        return self.free[name], self.links[name]

    def _add(self, name: str) -> None:
        self.buckets[self.group_of[name]].setdefault(self._bkey(name), {})[name] = None

    def _remove(self, name: str) -> None:
        g = self.buckets[self.group_of[name]]
        k = self._bkey(name)
        del g[k][name]
        if not g[k]:
            del g[k]

    def take(self, name: str, gpus: int, multi: bool) -> None:
        """Give `gpus` of node `name` to a job (multi: it spans several nodes)."""
        if name not in self.free or self.free[name] < gpus:
            raise ValueError(f"node {name}: cannot take {gpus} GPUs ({self.free.get(name, 0)} free)")
        self._remove(name)
        self.free[name] -= gpus
        self.links[name] += int(multi)
        self._add(name)

    def give_back(self, name: str, gpus: int, multi: bool) -> None:
        """Undo `take`."""
        self._remove(name)
        self.free[name] += gpus
        self.links[name] -= int(multi)
        self._add(name)

    def pick(
        self, groups: Iterable[G], n: int, g: int, multi: bool, spread: bool, exclude: Iterable[str] = ()
    ) -> list[str] | None:
        """`n` distinct nodes from `groups` with >= `g` free GPUs, best first,
        or None when there are not enough."""
        keys = []
        for grp in groups:
            for f, link in self.buckets.get(grp, {}):
                if f >= g:
                    keys.append(((link if multi else 0, -f if spread else f), grp, (f, link)))
        keys.sort(key=lambda k: k[0])  # stable: ties keep group order
        skip = set(exclude)
        out: list[str] = []
        for _, grp, bk in keys:
            for name in self.buckets[grp][bk]:
                if name not in skip:
                    out.append(name)
                    skip.add(name)
                    if len(out) == n:
                        return out
        return None

    def place(self, cell: Cell, names: Sequence[str]) -> tuple[tuple[str, int], ...]:
        multi = cell.num_nodes > 1
        for name in names:
            self.take(name, cell.gpus_per_node, multi)
        return tuple((name, cell.gpus_per_node) for name in names)
