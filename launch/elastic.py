"""Elastic, consistent data parallelism with virtual workers.

A job has a fixed number V of virtual data-parallel workers, whatever the
number of dp ranks running them now. Each virtual worker owns its shard of
the dataset, its sampler position and its own random stream, and its
gradient is computed on its own; gradients are then summed in virtual-worker
order. So the arithmetic of a step does not depend on how many physical ranks
share the V workers, and the loss curve is bitwise the same after a resize.

Dropout draws from the unit's own stream too (`unit_stream`, `dropout`): the
mask of a dropout site is keyed by the run's seed, the virtual worker, the
step, the site (a layout-independent name, e.g. the global layer index) and
the how-manieth call of the site in that unit (its micro-batch), and drawn
on the CPU, so no rank, device or placement of the worker changes it.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class VirtualWorker:
    """One virtual worker's sampler over its shard ``index, index+V, ...``."""

    index: int
    count: int
    dataset_size: int
    seed: int
    epoch: int = 0
    position: int = 0
    generator: torch.Generator = field(default_factory=torch.Generator)
    _order: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count or self.dataset_size < self.count:
            raise ValueError(
                f"virtual worker {self.index} of {self.count} needs a dataset of at least {self.count} samples"
            )
        self.generator.manual_seed(self.seed * 1_000_003 + self.index)

    @property
    def shard_size(self) -> int:
        return len(range(self.index, self.dataset_size, self.count))

    def next_indices(self, n: int) -> list[int]:
        """The next N dataset indices of this worker (reshuffled every epoch)."""
        out: list[int] = []
        while len(out) < n:
            if self._order is None or self.position >= self.shard_size:
                if self._order is not None:
                    self.epoch += 1
                self.position = 0
                self._order = torch.randperm(self.shard_size, generator=self.generator)
            take = min(n - len(out), self.shard_size - self.position)
            local = self._order[self.position : self.position + take]
            out.extend(self.index + self.count * int(i) for i in local)
            self.position += take
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "count": self.count,
            "epoch": self.epoch,
            "position": self.position,
            "order": None if self._order is None else self._order.clone(),
            "rng": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["index"], state["count"]) != (self.index, self.count):
            raise ValueError(
                f"state of virtual worker {state['index']}/{state['count']} loaded into {self.index}/{self.count}"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = None if state["order"] is None else state["order"].clone()
        self.generator.set_state(state["rng"])


def ordered_sum(
    local: Sequence[torch.Tensor], group: dist.ProcessGroup | None, counts: Sequence[int] | None = None
) -> torch.Tensor:
    """Sum same-shaped per-unit tensors of all ranks of GROUP in global unit order.

    LOCAL holds this rank's units' tensors (at least one). COUNTS: how many
    units each rank of GROUP holds, in group-rank order (uneven is fine);
    rank i's units are ``sum(counts[:i]) ..``. None (or one count): this
    process alone, no communication. The sum always runs left to right over
    all units, so it does not depend on how the units are spread over ranks.
    """
    if not local:
        raise ValueError("ordered_sum needs at least one local tensor")
    counts = tuple(counts) if counts is not None else (len(local),)
    if len(counts) == 1:
        if counts[0] != len(local):
            raise ValueError(f"{len(local)} local units, counts say {list(counts)}")
        return _sum_in_order([local])
    me = dist.get_rank(group)
    if len(counts) != dist.get_world_size(group) or counts[me] != len(local):
        raise ValueError(
            f"rank {me} of a group of {dist.get_world_size(group)} holds {len(local)} units, counts say {list(counts)}"
        )
    width = max(counts)  # all_gather needs equal shapes: short ranks send zero rows, dropped below
    send = local[0].new_empty((width, *local[0].shape))
    for row, t in zip(send, local, strict=False):  # send has max(counts) rows, those past local zeroed next
        row.copy_(t)
    send[len(local) :].zero_()
    parts = [torch.empty_like(send) for _ in counts]
    dist.all_gather(parts, send, group=group)
    # summed where they landed: no concatenated copy of every rank's tensors (fresh memory each step)
    return _sum_in_order(part[:n] for part, n in zip(parts, counts, strict=True))


def _sum_in_order(blocks: Iterable[Iterable[torch.Tensor]]) -> torch.Tensor:
    """The left-to-right sum of the tensors of BLOCKS, one after another."""
    total: torch.Tensor | None = None
    for block in blocks:
        for t in block:
            if total is None:
                total = t.clone()
            else:
                total += t
    if total is None:
        raise ValueError("nothing to sum")
    return total


@dataclass
class UnitStream:
    """The random stream of one unit of work: a virtual worker's part of one step (module doc)."""

    seed: int
    worker: int  #: the virtual worker's global index
    step: int
    #: calls of each site to pass over first (a pipeline stage's one shape-inference forward in a run's first step)
    skip: int = 0
    calls: dict[Hashable, int] = field(default_factory=dict)

    def generator(self, site: Hashable) -> torch.Generator | None:
        """A CPU generator for SITE's next call in this unit; None for a call passed over."""
        n = self.calls.get(site, -self.skip)
        self.calls[site] = n + 1
        if n < 0:
            return None
        key = repr((self.seed, self.worker, self.step, site, n)).encode()
        return torch.Generator().manual_seed(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little"))


_STREAM: list[UnitStream] = []  #: the unit being computed (innermost last)


@contextlib.contextmanager
def unit_stream(seed: int, worker: int, step: int, skip: int = 0) -> Iterator[UnitStream]:
    """Draw dropout masks from virtual worker WORKER's stream of STEP while in the block."""
    stream = UnitStream(seed, worker, step, skip)
    _STREAM.append(stream)
    try:
        yield stream
    finally:
        _STREAM.pop()


def dropout(x: torch.Tensor, p: float, site: Hashable, training: bool = True) -> torch.Tensor:
    """Inverted dropout of X at rate P with the current unit's mask for SITE
    (module doc): the same on every layout. X must be whole at the site (the
    same on every tp rank, e.g. after a row-parallel layer's all-reduce).
    Identity when not training or P is 0; ValueError outside a unit
    (`unit_stream`, which the exact runtime opens for each virtual worker)."""
    if not training or p <= 0.0:
        return x
    if not _STREAM:
        raise ValueError("dropout needs a unit's random stream: the exact runtime opens one per virtual worker")
    g = _STREAM[-1].generator(site)
    if g is None:
        return x
    keep = (torch.rand(x.shape, generator=g, dtype=torch.float64) >= p).to(device=x.device, dtype=x.dtype)
    return x * keep / (1.0 - p)
