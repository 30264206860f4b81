"""The ``sharded`` runtime: torch's own parallelism over the plan's (pp, dp, tp) mesh.

Per rank (docs/runtime-sharded.md has the memory layout):

- pp: the rank builds only its stage's layers (``plan.stage_layers`` or an
  even split) and runs ``torch.distributed.pipelining``'s ``Schedule1F1B``
  over ``plan.micro_batches`` micro-batches (at least pp);
- tp: ``parallelize_module`` over the mesh's tp dim with the workload's
  ``tp_plan`` (DTensor; column-wise then row-wise linears);
- dp: FSDP2 (``fully_shard`` over the mesh's dp dim): parameters, gradients
  and optimizer state sharded evenly over the dp ranks; parameters
  all-gathered per unit (transformer block) for forward and backward,
  gradients reduce-scattered (summed: the loss is already divided by the
  global batch, so uneven batch shares give the gradient of the global mean).

Batch: step s's global batch is the samples at global positions
``s*B .. s*B+B-1`` (``Workload.sample`` is keyed by position), cut into
contiguous per-dp-rank blocks by ``plan.batch_shares`` (largest remainder;
even without shares). Every plan trains on the same samples in the same
order; only the floating-point reduction order differs between plans.

Checkpoints: ``torch.distributed.checkpoint`` (DCP) into
``<checkpoint_dir>/step-<N>/``: every rank writes its own shard
(``__<rank>_0.distcp``; replicated tensors are written once), rank 0 the
metadata and ``trainer.json`` (step, losses, config), then ``LATEST``. A job
resumes under any other pp/dp/tp/GPU count: DCP reads each rank's new shards
from the old ones (no gather to one rank).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from launch import checkpoint
from launch.layout import largest_remainder
from launch.parallel import ParallelContext, ParallelError, pipeline_schedule
from launch.workload import StageSpec, Workload

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

TRAINER_STATE = "trainer.json"
# A stage's output goes straight to the loss or the next stage, never changed in place.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")


def shard_unit(module: nn.Module, mesh: Any) -> FSDPModule:
    """``fully_shard`` MODULE over the dp MESH as this runtime does: its
    gradients reduced as a plain sum (the loss carries 1/global_batch): SUM,
    not PREMUL_SUM, which gloo lacks. Returns the FSDP module (MODULE itself)."""
    from torch.distributed.fsdp import fully_shard

    unit = fully_shard(module, mesh=mesh)
    unit.set_gradient_divide_factor(1.0)
    unit.set_force_sum_reduction_for_comms(True)
    return unit


def step_dir(directory: str | os.PathLike[str], step: int) -> Path:
    """The DCP directory of checkpoint STEP."""
    return Path(directory) / f"step-{step:08d}"


def batch_sizes(global_batch: int, dp: int, shares: tuple[float, ...] | None, micro_batches: int) -> tuple[int, ...]:
    """Samples of each dp rank per step: in proportion to SHARES (else even), largest remainder."""
    if shares is not None and len(shares) != dp:
        raise ParallelError(f"batch_shares has {len(shares)} entries for dp={dp}")
    sizes = largest_remainder(global_batch, list(shares) if shares is not None else [1.0] * dp)
    for d, n in enumerate(sizes):
        if n < micro_batches:
            raise ParallelError(
                f"dp rank {d}'s batch of {n} (of {global_batch}, shares {shares}) is smaller than "
                f"{micro_batches} micro-batches: every dp rank runs every micro-batch (FSDP all-gathers for each)"
            )
    return tuple(sizes)


class ShardedEngine:
    """FSDP2 x DTensor TP x pipelining training of one stage per rank."""

    runtime = "sharded"

    def __init__(self, ctx: ParallelContext, work: Workload, global_batch: int):
        if ctx.stage_layers is None:
            raise ValueError("init_parallel needs num_layers for the trainer")
        if work.sample is None:
            raise ValueError("the sharded runtime needs Workload.sample (samples by global position)")
        self.ctx, self.work, self.global_batch = ctx, work, global_batch
        plan = ctx.plan
        self.micro_batches = plan.micro_batches
        if ctx.pp > 1 and self.micro_batches < ctx.pp:
            raise ParallelError(
                f"{self.micro_batches} micro-batches for pp={ctx.pp}: Schedule1F1B needs at least one per stage"
            )
        self.sizes = batch_sizes(global_batch, ctx.dp, plan.batch_shares, self.micro_batches)
        if ctx.pp > 1 and any(n % self.micro_batches for n in self.sizes):
            raise ParallelError(
                f"per-dp-rank batches {list(self.sizes)} do not split into {self.micro_batches} equal "
                "micro-batches (a pipeline needs one micro-batch shape)"
            )
        self.offset = sum(self.sizes[: ctx.dp_rank])  #: this dp rank's first sample within a step's batch
        stage = work.build_stage(StageSpec(ctx.stage_layers, ctx.is_first_stage, ctx.is_last_stage)).to(ctx.device)
        if ctx.tp > 1:
            from torch.distributed.tensor.parallel import parallelize_module

            if work.tp_plan is None:
                raise ValueError(f"tp={ctx.tp} needs Workload.tp_plan (parallelize_module's plan)")
            parallelize_module(stage, ctx.mesh["tp"], dict(work.tp_plan(stage, ctx.tp)))
        dp_mesh = ctx.mesh["dp"]
        for unit in list(work.shard_units(stage)) if work.shard_units else []:
            shard_unit(unit, dp_mesh)
        shard_unit(stage, dp_mesh)
        self.stage: nn.Module = stage
        self.optimizer = work.optimizer(list(stage.parameters()))
        self.dtype = next(stage.parameters()).dtype
        self.step = 0
        self.losses: list[float] = []
        self.schedule = pipeline_schedule(self.stage, ctx, self.micro_batches, self._loss_fn) if ctx.pp > 1 else None

    def _loss_fn(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.work.loss(output, targets) / self.global_batch

    def positions(self, step: int) -> range:
        """Global sample positions this dp rank trains on at STEP (0-based)."""
        start = step * self.global_batch + self.offset
        return range(start, start + self.sizes[self.ctx.dp_rank])

    def train_step(self) -> float:
        """One optimizer step; returns the global loss (same value on every rank)."""
        ctx = self.ctx
        sample = self.work.sample
        assert sample is not None
        x, y = (t.contiguous().to(ctx.device) for t in self.work.split(sample(self.positions(self.step))))
        loss = torch.zeros((), dtype=torch.float64, device=ctx.device)
        if self.schedule is None:
            for xm, ym in zip(x.tensor_split(self.micro_batches), y.tensor_split(self.micro_batches), strict=True):
                part = self._loss_fn(self.stage(xm), ym)
                part.backward()  # type: ignore[no-untyped-call]
                loss += part.detach().double()
        elif ctx.is_first_stage:
            self.schedule.step(x)
        elif ctx.is_last_stage:
            losses: list[torch.Tensor] = []
            self.schedule.step(target=y, losses=losses)
            for part in losses:
                loss += part.detach().double()
        else:
            self.schedule.step()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if not (ctx.is_last_stage and ctx.tp_rank == 0):
            loss.zero_()  # each dp rank's loss counted once
        if ctx.world_size > 1:
            dist.all_reduce(loss)
        self.step += 1
        self.losses.append(loss.item())
        return self.losses[-1]

    # -- DCP checkpoints

    def _state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        options = StateDictOptions(flatten_optimizer_state_dict=True)  # keyed by parameter name: any pp split
        model, optim = get_state_dict(self.stage, self.optimizer, options=options)
        return {"model": model, "optim": optim}

    def save(self, directory: str) -> Path:
        """Every rank writes its shard of the model and optimizer state; rank 0 then marks LATEST."""
        import torch.distributed.checkpoint as dcp

        path = step_dir(directory, self.step)
        dcp.save(self._state(), checkpoint_id=path)
        if self.ctx.rank == 0:
            record = {"step": self.step, "losses": self.losses, "global_batch": self.global_batch}
            record.update({k: dict(v) for k, v in {**self.work.meta, **self.work.config}.items()})
            (path / TRAINER_STATE).write_text(json.dumps(record))
            checkpoint.mark_latest(directory, self.step)
        if self.ctx.world_size > 1:
            dist.barrier()
        return path

    def load(self, directory: str) -> bool:
        """Resume from DIRECTORY's newest checkpoint, written under any plan; False when there is none."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        step = checkpoint.latest_step(directory)
        if step is None:
            return False
        path = step_dir(directory, step)
        if not path.is_dir():
            raise ValueError(f"{directory}: step {step} is not a sharded (DCP) checkpoint; was it written by exact?")
        record = json.loads((path / TRAINER_STATE).read_text())
        for key, want in self.work.config.items():
            if record.get(key) != dict(want):
                raise ValueError(f"checkpoint has {key} {record.get(key)}, this run has {dict(want)}")
        state = self._state()
        dcp.load(state, checkpoint_id=path)
        options = StateDictOptions(flatten_optimizer_state_dict=True)
        model, optim = state["model"], state["optim"]
        set_state_dict(self.stage, self.optimizer, model_state_dict=model, optim_state_dict=optim, options=options)
        self.step, self.losses = int(record["step"]), [float(v) for v in record["losses"]]
        return True
