"""Elastic, consistent data parallelism with virtual workers.

A job has a fixed number V of virtual data-parallel workers, whatever the
number of dp ranks running them now. Each virtual worker owns its shard of
the dataset, its sampler position and its own random stream, and its
gradient is computed on its own; gradients are then summed in virtual-worker
order. So the arithmetic of a step does not depend on how many physical ranks
share the V workers, and the loss curve is bitwise the same after a resize.
"""

from __future__ import annotations

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


def ordered_sum(local: list[torch.Tensor], group: dist.ProcessGroup | None, group_size: int) -> torch.Tensor:
    """Sum same-shaped per-worker tensors of all ranks in global worker order.

    LOCAL holds this rank's workers' tensors (every rank the same number);
    rank i of GROUP holds workers ``i*k .. i*k+k-1``. The sum always runs
    left to right over all workers, so it is independent of the group size.
    """
    stacked = torch.stack(local)
    if group_size > 1:
        parts = [torch.empty_like(stacked) for _ in range(group_size)]
        dist.all_gather(parts, stacked, group=group)
        stacked = torch.cat(parts)
    total = stacked[0].clone()
    for t in stacked[1:]:
        total += t
    return total
