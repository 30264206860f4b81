"""Cells (Crius): the deterministic resources a job may run in, and the
pruning of dominated cells once they are estimated.

Enumeration, for each GPU type the job allows:

* nodes: the type's nodes, restricted to the job's partitions when it names
  some (a node is in partition p when p is in ``node.partitions`` or the node
  is listed in ``cluster.partitions[p]``);
* GPU counts N: the powers of two in [min_gpus, max_gpus], plus min_gpus and
  the job's requested count when in range; max_gpus defaults to the type's
  capacity (sum of gpus_total of those nodes) and is capped by it;
* layouts n x g with n * g = N that the nodes can hold at all: at least n of
  them have gpus_total >= g (the partition shape, not the GPUs free now);
  fewest nodes first;
* pipeline stages pp: the divisors of N with pp <= min(config.max_pp,
  model.num_layers), and only what the job's runtime carries out
  (solver.contract.runtimes.refusal): pp = 1 for a runtime without pipeline
  parallelism, and only pp dividing the model's layers for one that splits
  layers evenly over stages; a runtime with neither tensor parallelism nor
  uneven batch shares (ddp) gets only cells whose dp = N / pp divides its
  global batch.

Cells the job excludes (``JobRequest.excludes``: by key or size) are skipped, and so, for a job
with V virtual workers, are cells with N > V x pp x g: tp divides g, so
every plan would need dp = N / (pp tp) > V. Order: GPU type
(name), N ascending, nodes ascending, pp ascending; then the mixed-type cells
of solver.mixed that the job needs (GPU counts no single allowed type can
hold). `optional_mixed_cells` lists the mixed cells that may pay for a job
that does not need them (solver.mixed; the policy offers one only when it
beats the best single-type cell the job could get now). Mixed cells are
only for a runtime that runs one job over several GPU types
(``Runtime.mixed_types``; solver.mixed.mixed_cells says so itself).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from operator import itemgetter

from solver.contract.runtimes import refusal
from solver.mixed import mixed_cells, needs_mixed
from solver.types import Cell, ClusterView, Estimate, JobRequest, NodeView, SolverConfig


def in_partitions(node: NodeView, partitions: tuple[str, ...], cluster: ClusterView) -> bool:
    return any(p in node.partitions or node.name in cluster.partitions.get(p, ()) for p in partitions)


def _gpu_counts(job: JobRequest, capacity: int) -> list[int]:
    hi = min(job.max_gpus if job.max_gpus is not None else capacity, capacity)
    counts = {1 << i for i in range(hi.bit_length()) if job.min_gpus <= 1 << i <= hi}
    counts.update(c for c in (job.min_gpus, job.requested_gpus) if c is not None and job.min_gpus <= c <= hi)
    return sorted(counts)


def _layouts(count: int, sizes: list[int]) -> list[tuple[int, int]]:
    """(nodes, gpus per node) of `count` GPUs that nodes of these sizes
    (sorted ascending) can hold, fewest nodes first."""
    out = []
    for nodes in range(1, min(count, len(sizes)) + 1):
        if count % nodes == 0:
            per_node = count // nodes
            if len(sizes) - bisect.bisect_left(sizes, per_node) >= nodes:
                out.append((nodes, per_node))
    return out


def _sizes_of(job: JobRequest, cluster: ClusterView) -> dict[str, list[int]]:
    """GPUs per node of the nodes of each GPU type the job may use."""
    allowed = None if job.gpu_types is None else set(job.gpu_types)
    sizes_of: dict[str, list[int]] = {}
    for node in cluster.nodes:
        if (
            (allowed is None or node.gpu_type in allowed)
            and node.gpus_total > 0
            and (job.partitions is None or in_partitions(node, job.partitions, cluster))
        ):
            sizes_of.setdefault(node.gpu_type, []).append(node.gpus_total)
    return sizes_of


def optional_mixed_cells(job: JobRequest, cluster: ClusterView, config: SolverConfig) -> list[Cell]:
    """The mixed cells that may pay for a job some single type can hold (none
    for a job that needs mixed cells: enumerate_cells has those)."""
    sizes_of = _sizes_of(job, cluster)
    if needs_mixed(job, sizes_of):
        return []
    return mixed_cells(job, sizes_of, config)


def stage_counts(job: JobRequest, config: SolverConfig, count: int) -> list[int]:
    """The pipeline stage counts of a cell of `count` GPUs (the module doc):
    those the job's runtime may run (solver.contract.runtimes.refusal)."""
    shape = (job.runtime, job.model.num_layers, job.global_batch)
    return [
        p
        for p in range(1, min(config.max_pp, job.model.num_layers, count) + 1)
        if count % p == 0 and refusal(*shape, pp=p, gpus=count) is None
    ]


def enumerate_cells(job: JobRequest, cluster: ClusterView, config: SolverConfig) -> list[Cell]:
    """Every cell the job may run in on this cluster (see the module doc)."""
    sizes_of = _sizes_of(job, cluster)
    cells: list[Cell] = []
    for gpu_type in sorted(sizes_of):
        sizes = sorted(sizes_of[gpu_type])
        for count in _gpu_counts(job, sum(sizes)):
            stages = stage_counts(job, config, count)
            for num_nodes, per_node in _layouts(count, sizes):
                for pp in stages:
                    if job.virtual_workers is not None and count > job.virtual_workers * pp * per_node:
                        continue  # every plan would need dp > V
                    cell = Cell(gpu_type, num_nodes, per_node, pp)
                    if not job.excludes(cell):
                        cells.append(cell)
    return cells + (mixed_cells(job, sizes_of, config) if needs_mixed(job, sizes_of) else [])


def _easier_or_equal(a: Cell, b: Cell) -> bool:
    """`a` needs no more GPUs in total and no more on any one node than `b`."""
    return a.num_gpus <= b.num_gpus and a.gpus_per_node <= b.gpus_per_node


def _order(e: Estimate) -> tuple[str, int, int, int]:
    c = e.cell
    return (c.gpu_type, c.num_gpus, c.num_nodes, c.pp)


def prune_dominated(estimates: Iterable[Estimate], config: SolverConfig) -> list[Estimate]:
    """Keep the estimates worth offering to the placement model.

    1. Drop infeasible estimates.
    2. Per (GPU type, layout) keep the fastest pp (ties: fewer stages); pp
       does not change the resources a cell takes.
    3. Within a GPU type drop cell B when another cell A is at least as fast
       and at least as easy to place: A needs no more GPUs in total and no
       more GPUs per node (so "same GPUs, slower" goes only when the faster
       layout is at least as spread, and "more GPUs, no faster" only when the
       smaller cell is at least as spread per node). Ties in time and
       resources cannot occur after step 2 (A != B in layout).
    4. Keep at most ``config.max_cells_per_job``: always the fastest cell and
       the smallest cell (fewest GPUs, then fastest) of each type, then the
       rest by throughput per GPU (highest first, then cell order). The
       mandatory cells are kept even when they alone exceed the cap.

    Returned in cell order: GPU type, GPU count, nodes, pp. Steps 1-3 are
    `frontier`, step 4 `cap`.
    """
    return cap(frontier(estimates), config)


def frontier(estimates: Iterable[Estimate]) -> list[list[Estimate]]:
    """Steps 1-3 of `prune_dominated`: per GPU type, the feasible estimates
    no other of the type dominates, fastest first. Only times within a type
    are compared, so scaling each type's times by one factor (calibration)
    keeps the frontier: a caller may scale it instead of its input."""
    best: dict[tuple[str, int, int], Estimate] = {}
    for e in estimates:
        if not e.feasible:
            continue
        key = (e.cell.gpu_type, e.cell.num_nodes, e.cell.gpus_per_node)
        cur = best.get(key)
        if cur is None or (e.iter_time_s, e.cell.pp) < (cur.iter_time_s, cur.cell.pp):
            best[key] = e
    by_type: dict[str, list[Estimate]] = {}
    for e in best.values():
        by_type.setdefault(e.cell.gpu_type, []).append(e)
    groups = []
    for group in by_type.values():
        # A dominator sorts before what it dominates; comparing with survivors suffices (transitivity).
        group.sort(key=lambda e: (e.iter_time_s, e.cell.num_gpus, e.cell.gpus_per_node))
        alive: list[Estimate] = []
        for b in group:
            if not any(_easier_or_equal(a.cell, b.cell) for a in alive):
                alive.append(b)
        groups.append(alive)
    return groups


def cap(groups: Iterable[list[Estimate]], config: SolverConfig) -> list[Estimate]:
    """Step 4 of `prune_dominated` over `frontier`'s groups, in cell order."""
    kept: list[tuple[tuple[str, int, int, int], Estimate]] = []  # (_order, estimate): each order computed once
    mandatory: set[Cell] = set()
    for alive in groups:
        items = [(_order(e), e) for e in alive]
        kept.extend(items)
        mandatory.add(min(items, key=lambda oe: (oe[1].iter_time_s, oe[0]))[1].cell)
        mandatory.add(min(items, key=lambda oe: (oe[1].cell.num_gpus, oe[1].iter_time_s, oe[0]))[1].cell)
    if len(kept) > config.max_cells_per_job:
        rest = sorted(
            (oe for oe in kept if oe[1].cell not in mandatory),
            key=lambda oe: (oe[1].iter_time_s * oe[1].cell.num_gpus, oe[0]),
        )
        room = max(0, config.max_cells_per_job - len(mandatory))
        kept = [oe for oe in kept if oe[1].cell in mandatory] + rest[:room]
    kept.sort(key=itemgetter(0))
    return [e for _, e in kept]
