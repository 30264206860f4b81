"""The ``exact`` runtime: EasyScale training, bitwise the same for any dp <= V (on one kind of device).

Work is done in units: one per virtual worker this rank runs (a
contiguous, possibly uneven block: ``ctx.batch.virtual_workers``), or on the
legacy ``plan.batch_shares``-without-virtual-workers path this rank's slice
of the global batch. Each unit's gradient is computed on its own
(micro-batches through the 1F1B pipeline schedule) and the units of all dp
ranks are summed in global unit order (``launch.elastic.ordered_sum``), as
are the per-unit losses, so any dp <= V trains bitwise the same.

shard_state ("none", "even", "memory"; default: the plan's
``state_sharding``): with sharding each dp rank keeps the optimizer state of
its slice of the stage's parameters only (``launch.sharding``); the update
is the same as without.

Checkpoints are layout independent (``launch.checkpoint``): rank 0 writes
``step-<N>.pt`` holding full tensors by parameter name, so a job resumes
under any pp/dp/tp.

Each unit runs inside its virtual worker's random stream for the step
(``launch.elastic.unit_stream``), from which the workload's dropout draws
(``launch.elastic.dropout``). `make_deterministic` (called before the
process group and the engine are made) asks torch for the same kernels and
reduction order every run: deterministic algorithms, cuBLAS's fixed
workspace (``CUBLAS_WORKSPACE_CONFIG``, before CUDA starts), cuDNN without
autotuning, no TF32 and no reduced-precision reductions in half-precision
matmuls. What that guarantees and what it does not: docs/runtime-exact.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from launch import checkpoint
from launch.elastic import VirtualWorker, ordered_sum, unit_stream
from launch.parallel import ParallelContext, pipeline_schedule
from launch.sharding import ShardedOptimizer, ShardLayout, sharding_mode, state_weights
from launch.workload import StageSpec, Workload

#: cuBLAS's workspace for a fixed reduction order (PyTorch's reproducibility notes; ":16:8" also does)
CUBLAS_WORKSPACE = ":4096:8"
_FIXED_WORKSPACES = (":4096:8", ":16:8")


def make_deterministic() -> None:
    """Make torch pick the same kernels and reduction order every run (module
    doc); process-wide. ValueError when CUDA already started without
    CUBLAS_WORKSPACE_CONFIG (too late to set it: set it in the job's environment)."""
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in _FIXED_WORKSPACES:
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            raise ValueError(
                f"CUDA started before the exact runtime could set CUBLAS_WORKSPACE_CONFIG={CUBLAS_WORKSPACE}: "
                "set it in the job's environment, or build the trainer before using CUDA"
            )
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    torch.use_deterministic_algorithms(True)
    # torch then fills every new tensor's memory (NaN) unless told not to: a write sweep of each
    # allocation, which determinism does not need where nothing reads memory before writing it (the
    # runtime never does): on CPU, 27 ms of a 0.29 s step of the reference trainer at dp 2
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    # no TF32 in matmuls or convolutions (some GPU types have none); a property of torch.backends' module class
    torch.backends.fp32_precision = "ieee"  # type: ignore[attr-defined]
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False


def virtual_workers(count: int, dataset_size: int, seed: int) -> list[VirtualWorker]:
    """COUNT virtual workers over a dataset of DATASET_SIZE items, each with its own shard."""
    return [VirtualWorker(i, count, dataset_size, seed) for i in range(count)]


def slice_full(tensor: torch.Tensor, dim: int | None, tp_rank: int, tp: int) -> torch.Tensor:
    """This tp rank's part of a full tensor."""
    if dim is None or tp == 1:
        return tensor
    return tensor.chunk(tp, dim=dim)[tp_rank]


class ExactEngine:
    """Data-, tensor- and pipeline-parallel training of one stage per rank, units summed in order."""

    runtime = "exact"

    def __init__(self, ctx: ParallelContext, work: Workload, global_batch: int, shard_state: str | None = None):
        if ctx.stage_layers is None or ctx.batch is None:
            raise ValueError("init_parallel needs num_layers and global_batch for the trainer")
        if work.draw is None:
            raise ValueError("the exact runtime needs Workload.draw (a virtual worker's next samples)")
        make_deterministic()
        self.ctx, self.work, self.global_batch = ctx, work, global_batch
        tp_group = ctx.group("tp") if ctx.tp > 1 else None
        spec = StageSpec(ctx.stage_layers, ctx.is_first_stage, ctx.is_last_stage, ctx.tp, ctx.tp_rank, tp_group)
        self.stage = work.build_stage(spec).to(ctx.device)
        self.dtype = next(self.stage.parameters()).dtype
        self.dims: dict[str, int | None] = dict(work.tp_dims(self.stage)) if work.tp_dims else {}
        self.params = list(self.stage.parameters())
        self.names = [n for n, _ in self.stage.named_parameters()]
        self.sharding = sharding_mode(ctx.plan, shard_state)
        self.sharded: ShardedOptimizer | None = None
        if self.sharding == "none":
            self.optimizer = work.optimizer(self.params)
        else:
            dp_group = ctx.group("dp")
            weights = state_weights(ctx.plan, self.sharding, dp_group, ctx.dp, ctx.device)
            layout = ShardLayout.proportional(sum(p.numel() for p in self.params), weights)
            self.sharded = ShardedOptimizer(self.params, work.optimizer, layout, dp_group, ctx.dp_rank)  # type: ignore[arg-type]
            self.optimizer = self.sharded.optimizer  # over this rank's slice only
        self.vws = virtual_workers(ctx.virtual_workers, work.dataset_size, work.seed)
        self.unit_counts = ctx.unit_counts  #: units of each dp rank, in dp order
        self.first_unit = sum(self.unit_counts[: ctx.dp_rank])  #: this rank's first unit's global index
        self.step = 0
        self.losses: list[float] = []
        m = ctx.plan.micro_batches
        self.schedule = pipeline_schedule(self.stage, ctx, m, self._loss_fn) if ctx.pp > 1 else None
        #: forwards of the stage before its first micro-batch: torch's pipeline stage infers its shapes with one
        self._inference_forwards = 1 if self.schedule is not None else 0

    # -- one step

    def _loss_fn(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.work.loss(output, targets) / self.global_batch

    def _batch(self) -> torch.Tensor:
        """One step's global batch: every virtual worker's part, in worker order."""
        draw = self.work.draw
        assert draw is not None
        return torch.cat([draw(vw, self.global_batch // len(self.vws)) for vw in self.vws])

    def _units(self, batch: torch.Tensor) -> Iterator[torch.Tensor]:
        """This rank's units of BATCH: one per virtual worker it runs (else its slice)."""
        b = self.ctx.batch
        assert b is not None
        mine = batch[b.offset : b.offset + b.size]
        if len(b.virtual_workers) == 0:
            yield mine
        else:
            yield from mine.chunk(len(b.virtual_workers))

    def _unit_grad(self, samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(flat gradient of this rank's parameters, loss) of one unit of work."""
        # contiguous: a pipeline stage checks its input's strides (torch 2.11 refuses a slice's)
        x, y = (t.contiguous().to(self.ctx.device) for t in self.work.split(samples))
        loss = torch.zeros((), dtype=self.dtype, device=self.ctx.device)
        m = self.ctx.plan.micro_batches
        if self.schedule is None:
            for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True):
                part = self._loss_fn(self.stage(xm), ym)
                part.backward()  # type: ignore[no-untyped-call]
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
        batch = self._batch()
        done = []
        for i, unit in enumerate(self._units(batch)):
            with unit_stream(self.work.seed, self.first_unit + i, self.step, skip=self._inference_forwards):
                done.append(self._unit_grad(unit))
            self._inference_forwards = 0
        grads, losses = zip(*done, strict=True)
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
        dim = self.dims.get(name)
        if dim is None or self.ctx.tp == 1:
            return t.detach().cpu().clone()
        parts = [torch.empty_like(t) for _ in range(self.ctx.tp)]
        dist.all_gather(parts, t.detach().contiguous(), group=self.ctx.group("tp"))
        return torch.cat(parts, dim=dim).cpu()

    def full_state(self) -> dict[str, Any] | None:
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
        gathered: list[Any] | None = [None] * ctx.world_size if ctx.rank == 0 else None
        if ctx.world_size > 1:
            dist.gather_object(mine, gathered, dst=0)
        else:
            gathered = [mine]
        if ctx.rank != 0:
            return None
        assert gathered is not None
        state: dict[str, dict[str, Any]] = {"model": {}, "optim": {}}
        for part in gathered:
            if part is not None:
                state["model"].update(part[0])
                state["optim"].update(part[1])
        return {
            **state,
            "step": self.step,
            "losses": list(self.losses),
            "virtual_workers": [vw.state_dict() for vw in self.vws],
            **{k: dict(v) for k, v in {**self.work.meta, **self.work.config}.items()},
        }

    def load_full_state(self, state: dict[str, Any]) -> None:
        """Resume from ``full_state()`` output, whatever layout wrote it."""
        for key, want in self.work.config.items():
            if state.get(key) != dict(want):
                raise ValueError(f"checkpoint has {key} {state.get(key)}, this run has {dict(want)}")
        if len(state["virtual_workers"]) != len(self.vws):
            raise ValueError(
                f"checkpoint has {len(state['virtual_workers'])} virtual workers, the plan has {len(self.vws)}"
            )
        ctx = self.ctx
        per_param = []
        with torch.no_grad():
            for name, p in zip(self.names, self.params, strict=True):
                dim = self.dims.get(name)
                p.copy_(slice_full(state["model"][name], dim, ctx.tp_rank, ctx.tp))
                per_param.append(
                    {
                        k: slice_full(v, dim, ctx.tp_rank, ctx.tp).to(p.device).clone()
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

    def save(self, directory: str) -> None:
        """Save ``full_state()`` to DIRECTORY (rank 0 writes; collective)."""
        state = self.full_state()
        if self.ctx.rank == 0:
            assert state is not None
            checkpoint.save(directory, self.step, state)
        if self.ctx.world_size > 1:
            dist.barrier()

    save_checkpoint = save  #: the reference trainer's older name

    def load(self, directory: str) -> bool:
        """Resume from DIRECTORY's newest checkpoint; False when there is none."""
        state = checkpoint.load_latest(directory)
        if state is None:
            return False
        self.load_full_state(state)
        return True
