"""minigpt as a ``launch.Workload`` (model, data, loss, optimizer), and the single-process reference runs.

The training itself (process groups, stages, batch split, gradient sync,
checkpoints) is ``launch.Trainer``'s, in the runtime the plan names
(``exact`` or ``sharded``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from launch.exact import ExactEngine, virtual_workers
from launch.parallel import ParallelContext
from launch.sharded import ShardedEngine
from launch.trainer import make_engine
from launch.workload import StageSpec, Workload
from minigpt.data import batch_at, draw
from minigpt.model import GPTConfig, GPTStage, build_full_model, build_stage, shard_dims
from solver.contract.models import ModelShape

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def sample_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum over the samples of each sample's mean token loss (the trainer divides by the global batch)."""
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")
    return ce / targets.shape[-1]


def loss_sum(logits: torch.Tensor, targets: torch.Tensor, batch: int) -> torch.Tensor:
    """Sum of per-sample mean token losses, divided by the global batch size."""
    return sample_loss(logits, targets) / batch


def make_optimizer(params: Any, lr: float) -> torch.optim.Optimizer:
    """The trainer's optimizer (AdamW) over PARAMS."""
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.01, foreach=False)


def split(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets of a batch of ``seq + 1`` tokens."""
    return tokens[:, :-1], tokens[:, 1:]


@dataclass(frozen=True)
class TrainConfig:
    """What a run trains on and how: seed, samples per step, learning rate, dataset size, dtype (a DTYPES
    key), and the dropout rate (0: none; above, the exact runtime only: from each virtual worker's stream)."""

    seed: int = 0
    global_batch: int = 8
    lr: float = 3e-3
    dataset_size: int = 512
    dtype: str = "float32"
    dropout: float = 0.0


def tp_plan(cfg: GPTConfig, stage: nn.Module, tp: int) -> dict[str, Any]:
    """DTensor tensor parallelism of a stage's blocks (Megatron's split: q, k, v and fc by
    columns, proj and out by rows); heads split over the tp ranks."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if cfg.heads % tp:
        raise ValueError(f"{cfg.heads} heads do not split over tp={tp}")
    plan: dict[str, Any] = {}
    for name in stage.blocks:  # type: ignore[union-attr]
        for i in range(3):
            plan[f"blocks.{name}.qkv.{i}"] = ColwiseParallel()
        plan[f"blocks.{name}.fc"] = ColwiseParallel()
        plan[f"blocks.{name}.proj"] = RowwiseParallel()
        plan[f"blocks.{name}.out"] = RowwiseParallel()
    return plan


def workload(cfg: GPTConfig, tc: TrainConfig) -> Workload:
    """minigpt's model, data, loss and optimizer for ``launch.Trainer``."""
    dtype = DTYPES[tc.dtype]

    def build(spec: StageSpec) -> GPTStage:
        full = build_full_model(cfg, tc.seed, dtype).state_dict()
        return build_stage(
            cfg, full, spec.layers, spec.first, spec.last, spec.tp_rank, spec.tp, spec.tp_group, tc.dropout
        )

    return Workload(
        num_layers=cfg.layers,
        build_stage=build,
        split=split,
        loss=sample_loss,
        optimizer=lambda params: make_optimizer(params, tc.lr),
        sample=lambda positions: batch_at(positions, cfg, tc.seed, tc.dataset_size),
        draw=lambda vw, n: draw(vw, n, cfg, tc.seed),
        dataset_size=tc.dataset_size,
        seed=tc.seed,
        tp_plan=lambda stage, tp: tp_plan(cfg, stage, tp),
        shard_units=lambda stage: list(stage.blocks.values()),  # type: ignore[union-attr, operator]
        tp_dims=shard_dims,
        config={"model_config": asdict(cfg)},
        meta={"train_config": asdict(tc)},
        model_shape=ModelShape(cfg.layers, cfg.hidden, cfg.heads, cfg.seq, cfg.vocab),
    )


def Trainer(  # noqa: N802 - the reference trainer's engine, under its older name
    ctx: ParallelContext, cfg: GPTConfig, tc: TrainConfig, shard_state: str | None = None
) -> ExactEngine | ShardedEngine:
    """The engine of CTX's plan's runtime training minigpt (``train_step()``, ``save``, ``load``)."""
    return make_engine(ctx, workload(cfg, tc), tc.global_batch, shard_state)


def reference_losses(cfg: GPTConfig, tc: TrainConfig, steps: int, virtual_workers: int = 1) -> list[float]:
    """The same training on one process, no torch.distributed, whole batches (exact's data)."""
    return reference_run(cfg, tc, steps, virtual_workers)[0]


def reference_run(
    cfg: GPTConfig, tc: TrainConfig, steps: int, virtual_workers: int = 1
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """``reference_losses`` and the model's parameters after the last step."""
    vws = _virtual_workers(virtual_workers, tc.dataset_size, tc.seed)
    per_worker = tc.global_batch // len(vws)
    return _reference(cfg, tc, steps, lambda step: torch.cat([draw(vw, per_worker, cfg, tc.seed) for vw in vws]))


def keyed_reference_losses(cfg: GPTConfig, tc: TrainConfig, steps: int) -> list[float]:
    """The sharded runtime's training (samples by global position) on one process."""
    b = tc.global_batch

    def batch_of(step: int) -> torch.Tensor:
        return batch_at(range(step * b, (step + 1) * b), cfg, tc.seed, tc.dataset_size)

    return _reference(cfg, tc, steps, batch_of)[0]


_virtual_workers = virtual_workers


def _reference(
    cfg: GPTConfig, tc: TrainConfig, steps: int, batch_of: Any
) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = build_full_model(cfg, tc.seed, DTYPES[tc.dtype])
    opt = make_optimizer(model.parameters(), tc.lr)
    out = []
    for step in range(steps):
        x, y = split(batch_of(step))
        loss = loss_sum(model(x), y, tc.global_batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out, {k: v.detach().clone() for k, v in model.state_dict().items()}
