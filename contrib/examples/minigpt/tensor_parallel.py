"""Tensor-parallel linear layers (Megatron style) over a torch.distributed group."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce the gradient backward (enters a TP region)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce forward; identity backward (leaves a TP region)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def enter_tp(x: torch.Tensor, group) -> torch.Tensor:
    """X entering a TP region: identity forward, its gradient all-reduced over GROUP backward."""
    return _CopyToTP.apply(x, group)


class ColumnParallelLinear(nn.Linear):
    """``y = x A^T + b`` with the rows of A (output features) split over TP ranks.

    An ``nn.Linear`` (built with tp=1, torch's ``ColwiseParallel`` can shard it).

    `enter`: the input enters the TP region here (its gradient is all-reduced
    backward); False when the caller entered it already, as for linears that
    share one input (Megatron's fused QKV: one all-reduce, not one each)."""

    shard_dims = {"weight": 0, "bias": 0}

    def __init__(self, d_in: int, d_out: int, tp: int = 1, group=None, bias: bool = True, enter: bool = True):
        if d_out % tp:
            raise ValueError(f"{d_out} output features do not split over tp={tp}")
        nn.Module.__init__(self)  # parameters made here, initialised by the model's builder
        self.in_features, self.out_features = d_in, d_out // tp
        self.tp, self.group, self.enter = tp, group, enter
        self.weight = nn.Parameter(torch.empty(d_out // tp, d_in))
        self.bias = nn.Parameter(torch.empty(d_out // tp)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp > 1 and self.enter:
            x = enter_tp(x, self.group)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Linear):
    """``y = x A^T + b`` with the columns of A (input features) split over TP ranks.

    An ``nn.Linear`` (built with tp=1, torch's ``RowwiseParallel`` can shard it).
    """

    shard_dims = {"weight": 1}

    def __init__(self, d_in: int, d_out: int, tp: int = 1, group=None):
        if d_in % tp:
            raise ValueError(f"{d_in} input features do not split over tp={tp}")
        nn.Module.__init__(self)
        self.in_features, self.out_features = d_in // tp, d_out
        self.tp, self.group = tp, group
        self.weight = nn.Parameter(torch.empty(d_out, d_in // tp))
        self.bias = nn.Parameter(torch.empty(d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.tp > 1:
            y = _ReduceFromTP.apply(y, self.group)
        return y + self.bias
