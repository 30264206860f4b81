"""Data-, tensor- and pipeline-parallel training, and the single-process reference run."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from launch import checkpoint
from launch.elastic import ordered_sum
from launch.parallel import ParallelContext
from launch.sharding import ShardedOptimizer, ShardLayout, sharding_mode, state_weights
from minigpt.data import global_batch, make_virtual_workers
from minigpt.model import GPTConfig, build_full_model, build_stage, shard_dims, slice_full

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def loss_sum(logits: torch.Tensor, targets: torch.Tensor, batch: int) -> torch.Tensor:
    """Sum of per-sample mean token losses, divided by the global batch size."""
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")
    return ce / (targets.shape[-1] * batch)


def make_optimizer(params, lr: float) -> torch.optim.Optimizer:
    """The trainer's optimizer (AdamW) over PARAMS."""
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.01, foreach=False)


@dataclass(frozen=True)
class TrainConfig:
    """What a run trains on and how: seed, samples per step, learning rate, dataset size, dtype (a DTYPES key)."""

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
        # contiguous: a pipeline stage checks its input's strides (torch 2.11 refuses a slice's)
        x, y = (t.contiguous().to(self.ctx.device) for t in (tokens[:, :-1], tokens[:, 1:]))
        loss = torch.zeros((), dtype=self.dtype, device=self.ctx.device)
        m = self.ctx.plan.micro_batches
        if self.schedule is None:
            for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True):
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
        grads, losses = zip(*(self._unit_grad(u) for u in self._units(batch)), strict=True)
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
        for name, p, st in zip(self.names, self.params, per_param, strict=True):
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
            for name, p in zip(self.names, self.params, strict=True):
                p.copy_(slice_full(state["model"][name], self.dims[name], ctx.tp_rank, ctx.tp))
                per_param.append(
                    {
                        k: slice_full(v, self.dims[name], ctx.tp_rank, ctx.tp).to(p.device).clone()
                        if torch.is_tensor(v) and v.shape == state["model"][name].shape
                        else v
                        for k, v in state["optim"][name].items()
                    }
                )
        if self.sharded is not None:
            self.sharded.load_full_optimizer_state(per_param)  # this rank's slice of it
        else:
            for p, st in zip(self.params, per_param, strict=True):
                self.optimizer.state[p] = st
        for vw, s in zip(self.vws, state["virtual_workers"], strict=True):
            vw.load_state_dict(s)
        self.step, self.losses = int(state["step"]), list(state["losses"])

    def save_checkpoint(self, directory: str) -> None:
        """Save ``full_state()`` to DIRECTORY (rank 0 writes; collective)."""
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
