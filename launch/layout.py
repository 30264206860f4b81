"""Pure arithmetic of a (pp, dp, tp) layout: no torch, no processes.

Ranks follow Megatron order: tensor-parallel ranks adjacent, then data
parallel, pipeline outermost, ``rank = (pp_rank * dp + dp_rank) * tp + tp_rank``
(row-major over the mesh shape ``(pp, dp, tp)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from solver.plan import (
    PlanError,
    largest_remainder,  # noqa: F401  (re-exported: launch code splits with it)
    virtual_worker_counts,
)

DIMS = ("pp", "dp", "tp")


class LayoutError(ValueError):
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
    return tuple(range(s, s + n) for s, n in zip(starts, sizes))


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
    return tuple(range(s, s + n) for s, n in zip(starts, counts))


def shares_in_step_order(
    shares: Sequence[float], plan_nodes: Sequence[str], step_nodes: Sequence[str]
) -> tuple[float, ...] | None:
    """Per-dp-rank batch shares listed node by node in `plan_nodes` order,
    re-listed in the step's node order (pp 1: each node holds an equal block
    of consecutive dp ranks); None when the node lists do not match."""
    if (
        sorted(plan_nodes) != sorted(step_nodes)
        or len(set(plan_nodes)) != len(plan_nodes)
        or not plan_nodes
        or len(shares) % len(plan_nodes)
    ):
        return None
    k = len(shares) // len(plan_nodes)
    block = {n: tuple(shares[i * k : (i + 1) * k]) for i, n in enumerate(plan_nodes)}
    return tuple(s for n in step_nodes for s in block[n])
