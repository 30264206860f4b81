"""Cephalo state sharding: optimizer state split over dp ranks by memory.

Per pipeline stage and tp rank, the dp group's parameters (same shapes on
every dp rank) are flattened in parameter order into one vector of N
elements. dp rank r owns the contiguous slice ``ShardLayout.bounds[r]``,
sized in proportion to its memory weight (largest remainder: the slices
cover ``[0, N)`` exactly once and do not depend on anything but N and the
weights).

What is split (ZeRO stage 1): the optimizer's state only (AdamW's two
moments, 2 N elements, become 2 x the slice per rank), plus the flat copy of
the rank's parameter slice that the wrapped optimizer steps (one slice).
Parameters and gradients stay whole on every rank: each rank computes the
full gradients of its units; only their sum is formed slice by slice, at
the slices' owners. ``ShardedOptimizer.step`` is that ZeRO-1 step with
uneven slices:

1. reduce: every rank's unit gradients of slice r go to its owner (one
   ``gather`` per owner: an uneven reduce-scatter, which gloo lacks; ranks
   may hold different numbers of units, padded with zeros to the largest
   and unpadded by the owner), who adds them in global unit order, the order
   of ``launch.elastic.ordered_sum``, so the owner's slice equals that slice
   of the replicated path's sum;
2. update: the wrapped optimizer (any elementwise one: SGD, Adam, AdamW)
   steps one flat tensor holding this rank's slice; only it has state;
3. gather: the updated slices are all-gathered (padded to the largest
   slice) and copied into every rank's parameters.

Checkpoints stay layout independent: ``full_optimizer_state`` gathers the
slices' state back into per-parameter tensors (the replicated trainer's
format) and ``load_full_optimizer_state`` cuts this rank's slice out of such
a state, so a job may resume under another dp degree, other weights, or
without sharding.

Weights (``state_weights``): ``plan.state_shares`` when the plan gives them,
else each rank's GPU memory when ``state_sharding`` is "memory" and CUDA is
present, else even.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from launch.errors import LauncherError
from launch.layout import largest_remainder
from solver.contract.plan import JobPlan

#: Values of ``JobPlan.state_sharding`` (None and "none": replicated state).
MODES = ("none", "even", "memory")

OptimizerFactory = Callable[[list[torch.Tensor]], torch.optim.Optimizer]


class ShardingError(ValueError, LauncherError):
    """A shard layout or a state does not fit the parameters."""


@dataclass(frozen=True)
class ShardLayout:
    """Contiguous slices ``[start, stop)`` of a flat vector, one per dp rank."""

    bounds: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not self.bounds:
            raise ShardingError("a shard layout needs at least one rank")
        expect = 0
        for r, (start, stop) in enumerate(self.bounds):
            if start != expect or stop < start:
                raise ShardingError(f"slice {r} is [{start}, {stop}), expected to start at {expect}")
            expect = stop

    @classmethod
    def proportional(cls, numel: int, weights: Sequence[float]) -> ShardLayout:
        """Slices of NUMEL elements sized in proportion to WEIGHTS."""
        sizes = largest_remainder(numel, weights)
        starts = [sum(sizes[:r]) for r in range(len(sizes))]
        return cls(tuple((s, s + n) for s, n in zip(starts, sizes, strict=True)))

    @property
    def numel(self) -> int:
        return self.bounds[-1][1]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(stop - start for start, stop in self.bounds)

    def slice(self, rank: int) -> slice:
        return slice(*self.bounds[rank])


def sharding_mode(plan: JobPlan, override: str | None = None) -> str:
    """The state sharding to use: OVERRIDE, else the plan's ("memory" when it gives shares)."""
    mode = override or plan.state_sharding or ("memory" if plan.state_shares else "none")
    if mode not in MODES:
        raise ShardingError(f"state sharding {mode!r} is not one of {MODES}")
    return mode


def state_weights(
    plan: JobPlan, mode: str, group: dist.ProcessGroup | None, dp: int, device: torch.device
) -> tuple[float, ...]:
    """Per-dp-rank state weights: the plan's shares, GPU memory, or even (collective in "memory" on CUDA)."""
    if mode == "memory" and plan.state_shares is not None:
        return tuple(float(w) for w in plan.state_shares)
    if mode == "memory" and device.type == "cuda":
        mine = torch.cuda.get_device_properties(device).total_memory
        if dp == 1:
            return (float(mine),)
        everyone: list[Any] = [None] * dp
        dist.all_gather_object(everyone, mine, group=group)
        return tuple(float(m) for m in everyone)
    return (1.0,) * dp


def state_numel(optimizer: torch.optim.Optimizer) -> int:
    """Elements of all tensor state of OPTIMIZER (what its state costs in memory)."""
    return sum(v.numel() for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v) and v.dim())


class ShardedOptimizer:
    """An optimizer over this dp rank's slice of PARAMS (see the module docstring).

    Per rank it keeps the optimizer state of its slice and a flat copy of
    that slice (``shard``); PARAMS and their gradients stay whole (ZeRO-1).

    All dp ranks of GROUP construct it with the same LAYOUT over the same
    parameter shapes; ``step``, ``full_optimizer_state`` and
    ``load_full_optimizer_state`` are collectives over GROUP.
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        make_optimizer: OptimizerFactory,
        layout: ShardLayout,
        group: dist.ProcessGroup | None,
        dp_rank: int,
    ):
        self.params = list(params)
        numel = sum(p.numel() for p in self.params)
        if layout.numel != numel:
            raise ShardingError(f"the shard layout covers {layout.numel} elements, the parameters have {numel}")
        self.layout, self.group, self.dp_rank = layout, group, dp_rank
        self.dp = len(layout.bounds)
        self.mine = layout.slice(dp_rank)
        with torch.no_grad():
            self.shard = self._flat(self.params)[self.mine].clone()
        self.optimizer = make_optimizer([self.shard])

    # -- helpers

    @staticmethod
    def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1) for t in tensors])

    def _split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """FLAT (N elements) cut into tensors shaped like the parameters."""
        out, offset = [], 0
        for p in self.params:
            out.append(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        return out

    def _all_gather_flat(self, part: torch.Tensor) -> torch.Tensor:
        """Every rank's slice PART (uneven sizes) joined into the full flat vector."""
        if self.dp == 1:
            return part.clone()
        width = max(self.layout.sizes)
        padded = torch.zeros(width, dtype=part.dtype, device=part.device)
        padded[: part.numel()] = part
        bufs = [torch.empty_like(padded) for _ in range(self.dp)]
        dist.all_gather(bufs, padded, group=self.group)
        return torch.cat([b[:n] for b, n in zip(bufs, self.layout.sizes, strict=True)])

    def _counts(self, local: Sequence[torch.Tensor], counts: Sequence[int] | None) -> tuple[int, ...]:
        counts = tuple(counts) if counts is not None else (len(local),) * self.dp
        if len(counts) != self.dp or counts[self.dp_rank] != len(local) or not local:
            raise ShardingError(
                f"dp rank {self.dp_rank} of {self.dp} holds {len(local)} units, counts say {list(counts)}"
            )
        return counts

    def reduce(self, local: Sequence[torch.Tensor], counts: Sequence[int] | None = None) -> torch.Tensor:
        """This rank's slice of the sum of all ranks' flat unit gradients, in unit order.

        LOCAL: this rank's flat unit gradients (at least one). COUNTS: units
        of each dp rank in dp order (uneven is fine; None: every rank holds
        ``len(LOCAL)``); rank i's units come after rank i-1's in the sum.
        """
        counts = self._counts(local, counts)
        stacked = torch.stack(list(local))
        parts: torch.Tensor | None
        if self.dp == 1:
            parts = stacked[:, self.mine]
        else:
            width = max(counts)
            if len(local) < width:  # gather needs equal shapes: pad with zeros, dropped by the owner
                stacked = torch.cat([stacked, stacked.new_zeros((width - len(local), stacked.shape[1]))])
            parts = None
            for owner, (start, stop) in enumerate(self.layout.bounds):
                if stop == start:
                    continue
                send = stacked[:, start:stop].contiguous()
                recv = [torch.empty_like(send) for _ in range(self.dp)] if owner == self.dp_rank else None
                dist.gather(send, recv, group=self.group, group_dst=owner)
                if recv is not None:
                    parts = torch.cat([r[:n] for r, n in zip(recv, counts, strict=True)])
            if parts is None:  # this rank owns nothing
                return stacked.new_zeros(0)
        total = parts[0].clone()
        for t in parts[1:]:
            total += t
        return total

    # -- the step

    @torch.no_grad()
    def step(self, local_grads: Sequence[torch.Tensor], counts: Sequence[int] | None = None) -> None:
        """Reduce LOCAL_GRADS (this rank's flat unit gradients; COUNTS as in
        ``reduce``), update the slice, share it."""
        self.shard.grad = self.reduce(local_grads, counts).to(self.shard.dtype)
        self.optimizer.step()
        self.shard.grad = None
        full = self._all_gather_flat(self.shard.detach())
        for p, new in zip(self.params, self._split(full), strict=True):
            p.copy_(new)

    # -- layout-independent state

    def full_optimizer_state(self) -> list[dict[str, Any]]:
        """Per parameter, its whole optimizer state (as an unsharded optimizer keeps it)."""
        st = self.optimizer.state.get(self.shard, {})
        out: list[dict[str, Any]] = [{} for _ in self.params]
        for key in sorted(st):
            v = st[key]
            if torch.is_tensor(v) and v.dim() == 1:
                for d, part in zip(out, self._split(self._all_gather_flat(v.detach())), strict=True):
                    d[key] = part.clone()
            else:
                for d in out:
                    d[key] = v.clone() if torch.is_tensor(v) else v
        return out

    def load_full_optimizer_state(self, states: Sequence[dict[str, Any]]) -> None:
        """Take this rank's slice of per-parameter optimizer STATES (``full_optimizer_state`` format).

        Call after the parameters are loaded: the slice's values are re-read from them.
        """
        if len(states) != len(self.params):
            raise ShardingError(f"{len(states)} parameter states for {len(self.params)} parameters")
        keys = [sorted(s) for s in states]
        if any(k != keys[0] for k in keys):
            raise ShardingError("the parameters' optimizer states have different keys")
        shard_state: dict[str, Any] = {}
        for key in keys[0]:
            values = [s[key] for s in states]
            if all(
                torch.is_tensor(v) and v.shape == p.shape and v.dim() for v, p in zip(values, self.params, strict=True)
            ):
                flat = self._flat(values)[self.mine]
                shard_state[key] = flat.to(device=self.shard.device, dtype=self.shard.dtype).clone()
            else:
                v = values[0]
                shard_state[key] = v.clone() if torch.is_tensor(v) else v
        self.optimizer.state.pop(self.shard, None)
        if shard_state:
            self.optimizer.state[self.shard] = shard_state
        with torch.no_grad():
            self.shard.copy_(self._flat(self.params)[self.mine])
