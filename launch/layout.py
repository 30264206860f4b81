"""Pure arithmetic of a (pp, dp, tp) layout: no torch, no processes.

Ranks follow Megatron order: tensor-parallel ranks adjacent, then data
parallel, pipeline outermost, ``rank = (pp_rank * dp + dp_rank) * tp + tp_rank``
(row-major over the mesh shape ``(pp, dp, tp)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from launch.errors import LauncherError
from solver.contract.plan import PlanError, virtual_worker_counts
from solver.contract.plan import largest_remainder as largest_remainder  # re-exported: launch code splits with it

DIMS = ("pp", "dp", "tp")
T = TypeVar("T")


class LayoutError(ValueError, LauncherError):
    """Degrees, ranks or sizes that do not fit together."""


@dataclass(frozen=True)
class Coords:
    pp: int
    dp: int
    tp: int


@dataclass(frozen=True)
class Layout:
    """Parallel degrees of a job."""

    pp: int
    dp: int
    tp: int

    def __post_init__(self) -> None:
        for d in DIMS:
            v = getattr(self, d)
            if not isinstance(v, int) or v < 1:
                raise LayoutError(f"degree {d} must be an integer >= 1, got {v!r}")

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.pp, self.dp, self.tp)

    def coords(self, rank: int) -> Coords:
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} is outside a world of {self.world_size}")
        return Coords(pp=rank // (self.dp * self.tp), dp=rank // self.tp % self.dp, tp=rank % self.tp)

    def rank(self, c: Coords) -> int:
        return (c.pp * self.dp + c.dp) * self.tp + c.tp

    def group(self, dim: str, rank: int) -> tuple[int, ...]:
        """Ranks that share every coordinate of RANK except DIM, in DIM order."""
        if dim not in DIMS:
            raise LayoutError(f"unknown dimension {dim!r} (one of {', '.join(DIMS)})")
        c = self.coords(rank)
        return tuple(self.rank(Coords(**{**c.__dict__, dim: i})) for i in range(getattr(self, dim)))


def split_layers(num_layers: int, pp: int, stage_layers: Sequence[int] | None = None) -> tuple[range, ...]:
    """Layer indices of each pipeline stage: as given, else as even as possible."""
    if stage_layers is not None:
        if len(stage_layers) != pp or sum(stage_layers) != num_layers:
            raise LayoutError(
                f"stage_layers {list(stage_layers)} must give {pp} stages adding up to {num_layers} layers"
            )
        sizes = list(stage_layers)
    else:
        if num_layers < pp:
            raise LayoutError(f"cannot split {num_layers} layers into {pp} pipeline stages")
        sizes = list(largest_remainder(num_layers, [1] * pp))
    starts = [sum(sizes[:i]) for i in range(pp)]
    return tuple(range(s, s + n) for s, n in zip(starts, sizes, strict=True))


def virtual_worker_blocks(virtual_workers: int, dp: int, shares: Sequence[float] | None = None) -> tuple[range, ...]:
    """Contiguous blocks of virtual data-parallel workers, one per dp rank.

    Rank d runs ``virtual_worker_counts(V, dp, shares)[d]`` consecutive
    workers: as even as possible (the first ranks take the leftovers, V=4,
    dp=3: 0-1, 2, 3), or in proportion to SHARES (one weight per rank).
    """
    if dp < 1 or virtual_workers < dp:
        raise LayoutError(
            f"{virtual_workers} virtual workers cannot be spread over dp={dp} ranks: "
            "every dp rank needs at least one (dp <= virtual workers)"
        )
    try:
        counts = virtual_worker_counts(virtual_workers, dp, shares)
    except PlanError as e:
        raise LayoutError(str(e)) from None
    starts = [sum(counts[:d]) for d in range(dp)]
    return tuple(range(s, s + n) for s, n in zip(starts, counts, strict=True))


def plan_ranks(
    plan_nodes: Sequence[str], step_nodes: Sequence[str], tasks_per_node: Sequence[int]
) -> tuple[int, ...] | None:
    """For each rank of a step, the rank its task held in the plan.

    Slurm lays a step's tasks out node by node in the order of STEP_NODES
    (TASKS_PER_NODE tasks each); the plan assumed the order of PLAN_NODES.
    A task keeps the role its node had in the plan: the i-th task on node n
    held plan rank ``start_n + i``, ``start_n`` being the tasks of the nodes
    before n in plan order (each node holding as many as the step gives it).
    None when the two lists are not the same set of distinct nodes.
    """
    if not plan_nodes or len(set(plan_nodes)) != len(plan_nodes) or sorted(plan_nodes) != sorted(step_nodes):
        return None
    if len(tasks_per_node) != len(step_nodes):
        raise LayoutError(f"{len(tasks_per_node)} task counts for the {len(step_nodes)} nodes of the step")
    count = dict(zip(step_nodes, tasks_per_node, strict=True))
    start, offset = {}, 0
    for n in plan_nodes:
        start[n] = offset
        offset += count[n]
    return tuple(start[n] + i for n in step_nodes for i in range(count[n]))


_NAMES = {"pp": "stage", "dp": "dp rank", "tp": "tp rank"}


def in_step_order(values: Sequence[T], layout: Layout, ranks: Sequence[int], dim: str, field: str) -> tuple[T, ...]:
    """VALUES, one per index along DIM in plan order, re-listed in step order.

    Step rank r held plan rank ``ranks[r]`` (``plan_ranks``); step index i
    along DIM takes the value of the plan indices its ranks held. LayoutError,
    naming FIELD, when those values differ (the plan cannot follow the step).
    """
    size = getattr(layout, dim)
    if len(values) != size:
        raise LayoutError(f"plan field '{field}' has {len(values)} entries for {dim}={size}")
    if sorted(ranks) != list(range(layout.world_size)):
        raise LayoutError(f"the step's ranks {list(ranks)} are not a permutation of the plan's {layout.world_size}")
    held: list[dict[int, T]] = [{} for _ in range(size)]  # step index -> {plan index: value}
    for r, was in enumerate(ranks):
        j = getattr(layout.coords(was), dim)
        held[getattr(layout.coords(r), dim)][j] = values[j]
    for i, by_plan in enumerate(held):
        if len(set(by_plan.values())) != 1:
            what = _NAMES[dim]
            had = " and ".join(f"{what} {j} ({v})" for j, v in sorted(by_plan.items()))
            raise LayoutError(
                f"plan field '{field}' cannot follow the step's node order: step {what} {i} "
                f"runs tasks the plan gave to {had}"
            )
    return tuple(next(iter(by_plan.values())) for by_plan in held)


def shares_in_step_order(
    shares: Sequence[float], plan_nodes: Sequence[str], step_nodes: Sequence[str]
) -> tuple[float, ...] | None:
    """Per-dp-rank shares listed node by node in `plan_nodes` order,
    re-listed in the step's node order, for a layout whose nodes hold equal
    blocks of consecutive dp ranks (pp 1; ``in_step_order`` is the general
    form); None when the node lists or the blocks do not match."""
    if not plan_nodes or len(shares) % len(plan_nodes):
        return None
    ranks = plan_ranks(plan_nodes, step_nodes, [len(shares) // len(plan_nodes)] * len(step_nodes))
    if ranks is None:
        return None
    return in_step_order(tuple(shares), Layout(1, len(shares), 1), ranks, "dp", "batch_shares")
