"""The model: its shape, transformer blocks, pipeline stages, and building a stage's shard.

The model is built whole from the seed and then sliced (stage layers,
tensor-parallel shards), so every layout starts from the same weights.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from launch.elastic import dropout
from minigpt.tensor_parallel import ColumnParallelLinear, RowParallelLinear, enter_tp


@dataclass(frozen=True)
class GPTConfig:
    """The model's shape."""

    layers: int = 4
    hidden: int = 32
    heads: int = 4
    seq: int = 16
    vocab: int = 64

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"GPT {k} must be a positive integer, got {v!r}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden size {self.hidden} is not divisible by {self.heads} heads")

    @classmethod
    def from_preset(cls, name: str) -> GPTConfig:
        """A model preset from solver.contract.models (layers, hidden, heads, seq, vocab)."""
        try:
            from solver.contract.models import get_model
        except ImportError:
            raise ValueError(
                f"model presets are not available; give --layers/--hidden/... instead of {name!r}"
            ) from None
        spec = get_model(name)
        return cls(spec.num_layers, spec.hidden, spec.heads, spec.seq_len, spec.vocab)


class Block(nn.Module):
    """Pre-norm transformer block; attention heads and MLP columns split over TP.

    Under TP a block all-reduces 4 times per micro-batch, as Megatron's: the
    attention and MLP outputs forward, and the gradients of their inputs
    backward (q, k and v enter the TP region together, once).

    With `dropout` > 0, the attention and MLP outputs (whole on every tp
    rank) are dropped out from the virtual worker's stream
    (``launch.elastic.dropout``; the exact runtime), sites named by the
    block's global `index`."""

    def __init__(self, cfg: GPTConfig, tp: int = 1, group=None, index: int = 0, dropout: float = 0.0):
        super().__init__()
        if cfg.heads % tp:
            raise ValueError(f"{cfg.heads} heads do not split over tp={tp}")
        h = cfg.hidden
        self.head_dim, self.tp, self.group = h // cfg.heads, tp, group
        self.index, self.dropout = index, dropout
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        # No key bias: softmax ignores it, so its gradient is only rounding
        # noise, which Adam would turn into steps.
        self.qkv = nn.ModuleList(ColumnParallelLinear(h, h, tp, group, bias=i != 1, enter=False) for i in range(3))
        self.proj = RowParallelLinear(h, h, tp, group)
        self.fc = ColumnParallelLinear(h, 4 * h, tp, group)
        self.out = RowParallelLinear(4 * h, h, tp, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        a = self.ln1(x)
        if self.tp > 1:
            a = enter_tp(a, self.group)
        # heads of this rank: all, a tp shard's (Megatron), or those of a DTensor tp shard
        q, k, v = (lin(a).view(b, s, -1, self.head_dim).transpose(1, 2) for lin in self.qkv)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self._drop(self.proj(att.transpose(1, 2).reshape(b, s, -1)), "attn")
        return x + self._drop(self.out(F.gelu(self.fc(self.ln2(x)))), "mlp")

    def _drop(self, x: torch.Tensor, where: str) -> torch.Tensor:
        return dropout(x, self.dropout, (self.index, where), self.training) if self.dropout else x


class GPTStage(nn.Module):
    """The layers of one pipeline stage; parameter names use global layer indices."""

    def __init__(
        self, cfg: GPTConfig, layers: range, first: bool, last: bool, tp: int = 1, group=None, dropout: float = 0.0
    ):
        super().__init__()
        self.cfg, self.first, self.last, self.dropout = cfg, first, last, dropout
        if first:
            self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
            self.pos = nn.Embedding(cfg.seq, cfg.hidden)
        self.blocks = nn.ModuleDict({str(i): Block(cfg, tp, group, i, dropout) for i in layers})
        if last:
            self.ln_f = nn.LayerNorm(cfg.hidden)
            self.head = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
            if self.dropout:
                x = dropout(x, self.dropout, "embed", self.training)
        for block in self.blocks.values():
            x = block(x)
        if self.last:
            x = self.head(self.ln_f(x))
        return x


def shard_dims(module: nn.Module) -> dict[str, int | None]:
    """Parameter name -> the dim it is split along over TP ranks (None: replicated)."""
    out: dict[str, int | None] = {}
    for mname, m in module.named_modules():
        for pname, _ in m.named_parameters(recurse=False):
            out[f"{mname}.{pname}" if mname else pname] = getattr(m, "shard_dims", {}).get(pname)
    return out


def build_full_model(cfg: GPTConfig, seed: int, dtype: torch.dtype = torch.float32) -> GPTStage:
    """The whole model, initialised from SEED alone (layout independent)."""
    g = torch.Generator().manual_seed(seed)
    model = GPTStage(cfg, range(cfg.layers), first=True, last=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln" in name or name.startswith("ln_"):
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                std = 0.02 / math.sqrt(2 * cfg.layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                p.normal_(0.0, std, generator=g)
    return model.to(dtype)


def slice_full(tensor: torch.Tensor, dim: int | None, tp_rank: int, tp: int) -> torch.Tensor:
    """This TP rank's part of a full tensor."""
    if dim is None or tp == 1:
        return tensor
    return tensor.chunk(tp, dim=dim)[tp_rank]


def build_stage(
    cfg: GPTConfig,
    full_state: dict[str, torch.Tensor],
    layers: range,
    first: bool,
    last: bool,
    tp_rank: int = 0,
    tp: int = 1,
    group=None,
    dropout: float = 0.0,
) -> GPTStage:
    """One pipeline stage's TP shard, cut from a full (layout-independent) state."""
    stage = GPTStage(cfg, layers, first, last, tp, group, dropout)
    dims = shard_dims(stage)
    dtype = next(iter(full_state.values())).dtype
    stage.to(dtype)
    with torch.no_grad():
        for name, p in stage.named_parameters():
            p.copy_(slice_full(full_state[name], dims[name], tp_rank, tp))
    return stage
