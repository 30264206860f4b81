"""Reference trainer: a small GPT with pipeline, data and tensor parallelism.

Run one process per GPU through the launcher::

    srun cellsched-launch -- python contrib/examples/train_gpt.py --steps 20 --out losses.json

The layout comes from the job's plan (pp, dp, tp, micro-batches, batch
shares, virtual workers, checkpoints). The model is built whole from the
seed and then sliced (stage layers, tensor-parallel shards), so every layout
starts from the same weights; the data is synthetic and seeded. Rank 0 prints
one JSON line per step and writes ``{"steps": [...], "losses": [...]}`` to
--out.

As a library: ``GPTConfig``, ``build_full_model``, ``build_stage``,
``Trainer`` (``Trainer.train_step``) and ``reference_losses`` (the same
training on one process without torch.distributed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from launch import checkpoint
from launch.elastic import VirtualWorker, ordered_sum
from launch.parallel import ParallelContext, init_parallel, plan_from_env
from launch.progress import write_progress
from launch.sharding import ShardedOptimizer, ShardLayout, sharding_mode, state_numel, state_weights

DTYPES = {"float32": torch.float32, "float64": torch.float64}


# ---------------------------------------------------------------- model shape


@dataclass(frozen=True)
class GPTConfig:
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
    def from_preset(cls, name: str) -> "GPTConfig":
        """A model preset from solver.models (layers, hidden, heads, seq, vocab)."""
        try:
            from solver.models import get_model
        except ImportError:
            raise ValueError(f"model presets are not available; give --layers/--hidden/... instead of {name!r}") from None
        spec = get_model(name)
        return cls(spec.num_layers, spec.hidden, spec.heads, spec.seq_len, spec.vocab)


# ------------------------------------------------------------ tensor parallel


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


class ColumnParallelLinear(nn.Module):
    """``y = x A^T + b`` with the rows of A (output features) split over TP ranks."""

    shard_dims = {"weight": 0, "bias": 0}

    def __init__(self, d_in: int, d_out: int, tp: int = 1, group=None, bias: bool = True):
        super().__init__()
        if d_out % tp:
            raise ValueError(f"{d_out} output features do not split over tp={tp}")
        self.tp, self.group = tp, group
        self.weight = nn.Parameter(torch.empty(d_out // tp, d_in))
        self.bias = nn.Parameter(torch.empty(d_out // tp)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp > 1:
            x = _CopyToTP.apply(x, self.group)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``y = x A^T + b`` with the columns of A (input features) split over TP ranks."""

    shard_dims = {"weight": 1}

    def __init__(self, d_in: int, d_out: int, tp: int = 1, group=None):
        super().__init__()
        if d_in % tp:
            raise ValueError(f"{d_in} input features do not split over tp={tp}")
        self.tp, self.group = tp, group
        self.weight = nn.Parameter(torch.empty(d_out, d_in // tp))
        self.bias = nn.Parameter(torch.empty(d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.tp > 1:
            y = _ReduceFromTP.apply(y, self.group)
        return y + self.bias


# ---------------------------------------------------------------------- model


class Block(nn.Module):
    """Pre-norm transformer block; attention heads and MLP columns split over TP."""

    def __init__(self, cfg: GPTConfig, tp: int = 1, group=None):
        super().__init__()
        if cfg.heads % tp:
            raise ValueError(f"{cfg.heads} heads do not split over tp={tp}")
        h = cfg.hidden
        self.heads = cfg.heads // tp
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        # No key bias: softmax ignores it, so its gradient is only rounding
        # noise, which Adam would turn into steps.
        self.qkv = nn.ModuleList(ColumnParallelLinear(h, h, tp, group, bias=i != 1) for i in range(3))
        self.proj = RowParallelLinear(h, h, tp, group)
        self.fc = ColumnParallelLinear(h, 4 * h, tp, group)
        self.out = RowParallelLinear(4 * h, h, tp, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        a = self.ln1(x)
        q, k, v = (lin(a).view(b, s, self.heads, -1).transpose(1, 2) for lin in self.qkv)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, -1))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPTStage(nn.Module):
    """The layers of one pipeline stage; parameter names use global layer indices."""

    def __init__(self, cfg: GPTConfig, layers: range, first: bool, last: bool, tp: int = 1, group=None):
        super().__init__()
        self.cfg, self.first, self.last = cfg, first, last
        if first:
            self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
            self.pos = nn.Embedding(cfg.seq, cfg.hidden)
        self.blocks = nn.ModuleDict({str(i): Block(cfg, tp, group) for i in layers})
        if last:
            self.ln_f = nn.LayerNorm(cfg.hidden)
            self.head = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
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
) -> GPTStage:
    """One pipeline stage's TP shard, cut from a full (layout-independent) state."""
    stage = GPTStage(cfg, layers, first, last, tp, group)
    dims = shard_dims(stage)
    dtype = next(iter(full_state.values())).dtype
    stage.to(dtype)
    with torch.no_grad():
        for name, p in stage.named_parameters():
            p.copy_(slice_full(full_state[name], dims[name], tp_rank, tp))
    return stage


# ----------------------------------------------------------------------- data


def sample(seed: int, index: int, cfg: GPTConfig) -> torch.Tensor:
    """Dataset item INDEX: ``seq + 1`` tokens of an arithmetic progression mod vocab."""
    g = torch.Generator().manual_seed(seed * 7_919 + index)
    start = torch.randint(cfg.vocab, (1,), generator=g)
    stride = torch.randint(1, 4, (1,), generator=g)
    return (start + stride * torch.arange(cfg.seq + 1)) % cfg.vocab


def draw(vw: VirtualWorker, n: int, cfg: GPTConfig, seed: int, noise: float = 0.1) -> torch.Tensor:
    """N samples of one virtual worker; input tokens are corrupted from its own RNG."""
    tokens = torch.stack([sample(seed, i, cfg) for i in vw.next_indices(n)])
    flip = torch.rand(tokens.shape, generator=vw.generator) < noise
    random = torch.randint(cfg.vocab, tokens.shape, generator=vw.generator)
    tokens[:, :-1] = torch.where(flip[:, :-1], random[:, :-1], tokens[:, :-1])
    return tokens


def global_batch(vws: list[VirtualWorker], batch: int, cfg: GPTConfig, seed: int) -> torch.Tensor:
    """One step's global batch: every virtual worker's part, in worker order."""
    return torch.cat([draw(vw, batch // len(vws), cfg, seed) for vw in vws])


def make_virtual_workers(count: int, dataset_size: int, seed: int) -> list[VirtualWorker]:
    return [VirtualWorker(i, count, dataset_size, seed) for i in range(count)]


def loss_sum(logits: torch.Tensor, targets: torch.Tensor, batch: int) -> torch.Tensor:
    """Sum of per-sample mean token losses, divided by the global batch size."""
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")
    return ce / (targets.shape[-1] * batch)


def make_optimizer(params, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.01, foreach=False)


# -------------------------------------------------------------------- trainer


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    global_batch: int = 8
    lr: float = 3e-3
    dataset_size: int = 512
    dtype: str = "float32"


class Trainer:
    """Data-, tensor- and pipeline-parallel training of a ``GPTStage`` per rank.

    Work is done in units: one per virtual worker this rank runs (a
    contiguous, possibly uneven block: ``ctx.batch.virtual_workers``), or on
    the legacy ``plan.batch_shares``-without-virtual-workers path this rank's
    slice of the global batch. Each unit's gradient is computed on its own
    (micro-batches through the 1F1B pipeline schedule) and the units of all
    dp ranks are summed in global unit order (``ordered_sum``), as are the
    per-unit losses, so any dp <= V trains bitwise the same.

    shard_state ("none", "even", "memory"; default: the plan's
    ``state_sharding``): with sharding each dp rank keeps the optimizer state
    of its slice of the stage's parameters only (``launch.sharding``); the
    update is the same as without.
    """

    def __init__(self, ctx: ParallelContext, cfg: GPTConfig, tc: TrainConfig, shard_state: str | None = None):
        if ctx.stage_layers is None or ctx.batch is None:
            raise ValueError("init_parallel needs num_layers and global_batch for the trainer")
        self.ctx, self.cfg, self.tc = ctx, cfg, tc
        self.dtype = DTYPES[tc.dtype]
        tp_group = ctx.group("tp") if ctx.tp > 1 else None
        full = build_full_model(cfg, tc.seed, self.dtype).state_dict()
        self.stage = build_stage(
            cfg, full, ctx.stage_layers, ctx.is_first_stage, ctx.is_last_stage, ctx.tp_rank, ctx.tp, tp_group
        ).to(ctx.device)
        self.dims = shard_dims(self.stage)
        self.params = list(self.stage.parameters())
        self.names = [n for n, _ in self.stage.named_parameters()]
        self.sharding = sharding_mode(ctx.plan, shard_state)
        self.sharded: ShardedOptimizer | None = None
        if self.sharding == "none":
            self.optimizer = make_optimizer(self.params, tc.lr)
        else:
            dp_group = ctx.group("dp")
            weights = state_weights(ctx.plan, self.sharding, dp_group, ctx.dp, ctx.device)
            layout = ShardLayout.proportional(sum(p.numel() for p in self.params), weights)
            self.sharded = ShardedOptimizer(
                self.params, lambda ps: make_optimizer(ps, tc.lr), layout, dp_group, ctx.dp_rank
            )
            self.optimizer = self.sharded.optimizer  # over this rank's slice only
        self.vws = make_virtual_workers(ctx.virtual_workers, tc.dataset_size, tc.seed)
        self.unit_counts = ctx.unit_counts  #: units of each dp rank, in dp order
        self.first_unit = sum(self.unit_counts[: ctx.dp_rank])  #: this rank's first unit's global index
        self.step = 0
        self.losses: list[float] = []
        self.schedule = self._pipeline_schedule() if ctx.pp > 1 else None

    # -- one step

    def _loss_fn(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return loss_sum(logits, targets, self.tc.global_batch)

    def _pipeline_schedule(self):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        pipe = PipelineStage(self.stage, self.ctx.pp_rank, self.ctx.pp, self.ctx.device, group=self.ctx.group("pp"))
        n = self.ctx.plan.micro_batches
        return Schedule1F1B(pipe, n_microbatches=n, loss_fn=self._loss_fn, scale_grads=False)

    def _units(self, batch: torch.Tensor) -> Iterator[torch.Tensor]:
        """This rank's units of BATCH: one per virtual worker it runs (else its slice)."""
        b = self.ctx.batch
        mine = batch[b.offset : b.offset + b.size]
        if len(b.virtual_workers) == 0:
            yield mine
        else:
            yield from mine.chunk(len(b.virtual_workers))

    def _unit_grad(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(flat gradient of this rank's parameters, loss) of one unit of work."""
        x, y = tokens[:, :-1].to(self.ctx.device), tokens[:, 1:].to(self.ctx.device)
        loss = torch.zeros((), dtype=self.dtype, device=self.ctx.device)
        m = self.ctx.plan.micro_batches
        if self.schedule is None:
            for xm, ym in zip(x.chunk(m), y.chunk(m)):
                part = self._loss_fn(self.stage(xm), ym)
                part.backward()
                loss += part.detach()
        elif self.ctx.is_first_stage:
            self.schedule.step(x)
        elif self.ctx.is_last_stage:
            losses: list[torch.Tensor] = []
            self.schedule.step(target=y, losses=losses)
            for part in losses:
                loss += part.detach()
        else:
            self.schedule.step()
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params])
        for p in self.params:
            p.grad = None
        return flat, loss

    def train_step(self) -> float:
        """One optimizer step; returns the global loss (same value on every rank)."""
        ctx = self.ctx
        batch = global_batch(self.vws, self.tc.global_batch, self.cfg, self.tc.seed)
        grads, losses = zip(*(self._unit_grad(u) for u in self._units(batch)))
        if self.sharded is not None:
            self.sharded.step(grads, self.unit_counts)
        else:
            grad = ordered_sum(list(grads), ctx.group("dp"), self.unit_counts)
            offset = 0
            for p in self.params:
                p.grad = grad[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            self.optimizer.step()
            for p in self.params:
                p.grad = None
        # Every unit's loss sits on the last stage's tp-rank-0; gather them all
        # by global unit index (adding exact zeros elsewhere) and add them in
        # unit order.
        owner = ctx.is_last_stage and ctx.tp_rank == 0
        per_unit = torch.zeros(sum(self.unit_counts), dtype=torch.float64, device=ctx.device)
        if owner:
            per_unit[self.first_unit : self.first_unit + len(losses)] = torch.stack(losses).to(torch.float64)
        if ctx.world_size > 1:
            dist.all_reduce(per_unit)
        total = per_unit[0].clone()
        for v in per_unit[1:]:
            total += v
        self.step += 1
        self.losses.append(total.item())
        return self.losses[-1]

    # -- layout-independent state

    def _full(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """The whole tensor of which T is this rank's TP shard (collective over tp)."""
        dim = self.dims[name]
        if dim is None or self.ctx.tp == 1:
            return t.detach().cpu().clone()
        parts = [torch.empty_like(t) for _ in range(self.ctx.tp)]
        dist.all_gather(parts, t.detach().contiguous(), group=self.ctx.group("tp"))
        return torch.cat(parts, dim=dim).cpu()

    def full_state(self) -> dict | None:
        """Everything needed to resume, keyed by parameter name; on rank 0 only (collective)."""
        ctx = self.ctx
        model, optim = {}, {}
        if self.sharded is not None:
            per_param = self.sharded.full_optimizer_state()  # collective over dp
        else:
            per_param = [self.optimizer.state.get(p, {}) for p in self.params]
        for name, p, st in zip(self.names, self.params, per_param):
            model[name] = self._full(name, p)
            optim[name] = {
                k: self._full(name, v) if torch.is_tensor(v) and v.shape == p.shape else v for k, v in st.items()
            }
        mine = (model, optim) if ctx.dp_rank == 0 and ctx.tp_rank == 0 else None
        gathered = [None] * ctx.world_size if ctx.rank == 0 else None
        if ctx.world_size > 1:
            dist.gather_object(mine, gathered, dst=0)
        else:
            gathered = [mine]
        if ctx.rank != 0:
            return None
        state = {"model": {}, "optim": {}}
        for part in gathered:
            if part is not None:
                state["model"].update(part[0])
                state["optim"].update(part[1])
        return {
            **state,
            "step": self.step,
            "losses": list(self.losses),
            "virtual_workers": [vw.state_dict() for vw in self.vws],
            "model_config": asdict(self.cfg),
            "train_config": asdict(self.tc),
        }

    def load_full_state(self, state: dict) -> None:
        """Resume from ``full_state()`` output, whatever layout wrote it."""
        if state["model_config"] != asdict(self.cfg):
            raise ValueError(f"checkpoint is of model {state['model_config']}, this run builds {asdict(self.cfg)}")
        if len(state["virtual_workers"]) != len(self.vws):
            raise ValueError(
                f"checkpoint has {len(state['virtual_workers'])} virtual workers, the plan has {len(self.vws)}"
            )
        ctx = self.ctx
        per_param = []
        with torch.no_grad():
            for name, p in zip(self.names, self.params):
                p.copy_(slice_full(state["model"][name], self.dims[name], ctx.tp_rank, ctx.tp))
                per_param.append({
                    k: slice_full(v, self.dims[name], ctx.tp_rank, ctx.tp).to(p.device).clone()
                    if torch.is_tensor(v) and v.shape == state["model"][name].shape
                    else v
                    for k, v in state["optim"][name].items()
                })
        if self.sharded is not None:
            self.sharded.load_full_optimizer_state(per_param)  # this rank's slice of it
        else:
            for p, st in zip(self.params, per_param):
                self.optimizer.state[p] = st
        for vw, s in zip(self.vws, state["virtual_workers"]):
            vw.load_state_dict(s)
        self.step, self.losses = int(state["step"]), list(state["losses"])

    def save_checkpoint(self, directory: str) -> None:
        state = self.full_state()
        if self.ctx.rank == 0:
            checkpoint.save(directory, self.step, state)
        if self.ctx.world_size > 1:
            dist.barrier()


def reference_losses(cfg: GPTConfig, tc: TrainConfig, steps: int, virtual_workers: int = 1) -> list[float]:
    """The same training on one process, no torch.distributed, whole batches."""
    return reference_run(cfg, tc, steps, virtual_workers)[0]


def reference_run(
    cfg: GPTConfig, tc: TrainConfig, steps: int, virtual_workers: int = 1
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """``reference_losses`` and the model's parameters after the last step."""
    dtype = DTYPES[tc.dtype]
    model = build_full_model(cfg, tc.seed, dtype)
    opt = make_optimizer(model.parameters(), tc.lr)
    vws = make_virtual_workers(virtual_workers, tc.dataset_size, tc.seed)
    out = []
    for _ in range(steps):
        batch = global_batch(vws, tc.global_batch, cfg, tc.seed)
        loss = loss_sum(model(batch[:, :-1]), batch[:, 1:], tc.global_batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out, {k: v.detach().clone() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------ CLI


def _write_json(path: str, obj: object) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, p)


def _report(ctx: ParallelContext, directory: str) -> None:
    """Where this rank sits: coordinates, group members, stage layers, batch slice."""
    b = ctx.batch
    _write_json(
        os.path.join(directory, f"rank-{ctx.rank}.json"),
        {
            "rank": ctx.rank,
            "coords": [ctx.pp_rank, ctx.dp_rank, ctx.tp_rank],
            "groups": {d: ctx.group_ranks(d) for d in ("pp", "dp", "tp")},
            "stage_layers": list(ctx.stage_layers),
            "batch": [b.offset, b.size, b.micro_batch_size, b.num_micro_batches, list(b.virtual_workers)],
        },
    )


def _report_state(trainer: Trainer, directory: str) -> None:
    """This rank's optimizer state: sharding mode, owned slice, state elements."""
    s = trainer.sharded
    _write_json(
        os.path.join(directory, f"state-{trainer.ctx.rank}.json"),
        {
            "mode": trainer.sharding,
            "param_numel": sum(p.numel() for p in trainer.params),
            "slice": list(s.layout.bounds[s.dp_rank]) if s else None,
            "bounds": [list(b) for b in s.layout.bounds] if s else None,
            "state_numel": state_numel(trainer.optimizer),
        },
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="model preset name (solver.models); overrides the shape flags")
    for k, v in asdict(GPTConfig()).items():
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--steps", type=int, default=20, help="train until this step (counting resumed steps)")
    ap.add_argument("--global-batch", type=int, help="samples per step (default: plan.global_batch, else 8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--dataset-size", type=int, default=512)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--out", help="write the loss sequence here (rank 0)")
    ap.add_argument("--step-delay", type=float, default=0.0,
                    help="sleep this many seconds after each step (to watch a job being moved)")
    ap.add_argument("--report", help="directory for one JSON file per rank describing its layout")
    ap.add_argument(
        "--shard-state",
        choices=("none", "even", "memory"),
        help="optimizer state over the dp ranks (default: the plan's state_sharding, else none)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = checkpoint.StopRequest()  # before anything slow: a signal must not kill us
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = (
        GPTConfig.from_preset(args.model)
        if args.model
        else GPTConfig(args.layers, args.hidden, args.heads, args.seq, args.vocab)
    )
    plan = plan_from_env()
    batch = args.global_batch or plan.global_batch or 8
    ctx = init_parallel(plan, num_layers=cfg.layers, global_batch=batch)
    tc = TrainConfig(args.seed, batch, args.lr, args.dataset_size, args.dtype)
    if args.report:
        _report(ctx, args.report)
    trainer = Trainer(ctx, cfg, tc, shard_state=args.shard_state)
    if plan.checkpoint_dir:
        state = checkpoint.load_latest(plan.checkpoint_dir)
        if state is not None:
            trainer.load_full_state(state)
    status = 0
    while trainer.step < args.steps:
        loss = trainer.train_step()
        if ctx.rank == 0:
            print(json.dumps({"step": trainer.step, "loss": loss}), flush=True)
            if plan.checkpoint_dir:
                write_progress(plan.checkpoint_dir, trainer.step, loss=loss)
        if args.step_delay > 0:
            time.sleep(args.step_delay)
        stopping = stop.agreed(device=ctx.device)
        due = plan.checkpoint_every and trainer.step % plan.checkpoint_every == 0
        if plan.checkpoint_dir and (stopping or due or trainer.step == args.steps):
            trainer.save_checkpoint(plan.checkpoint_dir)
        if stopping:
            status = checkpoint.EXIT_CHECKPOINTED
            break
    if args.report:
        _report_state(trainer, args.report)
    if ctx.rank == 0 and args.out:
        _write_json(args.out, {"steps": list(range(1, trainer.step + 1)), "losses": trainer.losses})
    if ctx.world_size > 1:
        dist.barrier()  # nobody tears down while a peer still talks (gloo aborts otherwise)
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without C++ static destructors: under load gloo's worker threads
    # can still be joinable then, and the runtime aborts a finished run.
    os._exit(code)
