"""``init_parallel()``: from the launcher's environment to process groups.

The launcher sets RANK/WORLD_SIZE/MASTER_* and CELLSCHED_PLAN; this builds a
``DeviceMesh`` with dims ``("pp", "dp", "tp")`` in Megatron order (see
``launch.layout``) and works out what this rank owns: its pipeline stage's
layers and its slice of the global batch.

Batch semantics. With ``plan.virtual_workers`` (V; None = dp) the global
batch of a step is the concatenation, in virtual-worker order, of V equal
parts of ``global_batch / V`` samples, one per virtual data-parallel worker,
each split into ``plan.micro_batches`` micro-batches (so micro-batches are
per virtual worker, which is per pipeline when V == dp). dp rank d runs the
contiguous block of ``virtual_worker_counts(V, dp, plan.batch_shares)[d]``
virtual workers (``launch.layout.virtual_worker_blocks``): any dp <= V
works, uneven when dp does not divide V, and batch shares move whole
virtual workers, so every layout computes the same units of work. Legacy
path (``batch_shares`` without ``virtual_workers``): the global batch is cut
into uneven contiguous slices of samples (largest remainder), one unit per
dp rank, each split into ``plan.micro_batches`` micro-batches.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from launch.errors import LauncherError
from launch.layout import DIMS, Coords, Layout, LayoutError, largest_remainder, split_layers, virtual_worker_blocks
from solver import contract
from solver.contract.plan import JobPlan, PlanError

if TYPE_CHECKING:
    from torch.distributed.pipelining import Schedule1F1B


class ParallelError(RuntimeError, LauncherError):
    """The plan and the running processes disagree."""


@dataclass(frozen=True)
class BatchSlice:
    """This dp rank's part of one step's global batch."""

    offset: int  #: first sample index in the global batch
    size: int  #: samples (this rank's batch share)
    micro_batch_size: int
    num_micro_batches: int
    virtual_workers: range  #: virtual workers this rank runs (empty on the legacy batch_shares path)


@dataclass(frozen=True)
class ParallelContext:
    """This rank's place in the job's parallel layout."""

    plan: JobPlan
    layout: Layout
    rank: int
    local_rank: int
    coords: Coords
    device: torch.device
    backend: str
    mesh: DeviceMesh
    virtual_workers: int
    stage_layers: range | None = None  #: set when num_layers was given
    batch: BatchSlice | None = None  #: set when the global batch is known

    pp = property(lambda self: self.layout.pp)
    dp = property(lambda self: self.layout.dp)
    tp = property(lambda self: self.layout.tp)
    pp_rank = property(lambda self: self.coords.pp)
    dp_rank = property(lambda self: self.coords.dp)
    tp_rank = property(lambda self: self.coords.tp)
    world_size = property(lambda self: self.layout.world_size)
    is_first_stage = property(lambda self: self.coords.pp == 0)
    is_last_stage = property(lambda self: self.coords.pp == self.layout.pp - 1)
    #: units of work of each dp rank, in dp order (see ``unit_counts``)
    unit_counts = property(lambda self: unit_counts(self.plan))

    def group(self, dim: str) -> dist.ProcessGroup:
        """The process group along DIM ("pp", "dp" or "tp")."""
        return self.mesh[dim].get_group()

    def group_ranks(self, dim: str) -> list[int]:
        """Global ranks of this rank's group along DIM, in DIM order."""
        return dist.get_process_group_ranks(self.group(dim))


def plan_from_env(env: Mapping[str, str] | None = None) -> JobPlan:
    """The plan the launcher put into CELLSCHED_PLAN (inline JSON or a path)."""
    try:
        plan = contract.plan_from_env(env)
    except PlanError as e:
        raise ParallelError(f"{contract.ENV_PLAN}: {e}") from None
    if plan is None:
        raise ParallelError(f"{contract.ENV_PLAN} is not set: start the job with cellsched-launch or pass plan=")
    return plan


def unit_counts(plan: JobPlan) -> tuple[int, ...]:
    """Units of work (gradients summed in order) of each dp rank: its virtual
    workers, or one slice of samples each on the legacy batch_shares path."""
    if plan.virtual_workers is None and plan.batch_shares is not None:
        return (1,) * plan.dp
    return tuple(len(b) for b in _blocks(plan))


def _blocks(plan: JobPlan) -> tuple[range, ...]:
    v = plan.virtual_workers or plan.dp
    if plan.dp > v:
        raise ParallelError(
            f"dp={plan.dp} ranks but only {v} virtual workers: every dp rank needs at least one (dp <= V)"
        )
    try:
        return virtual_worker_blocks(v, plan.dp, plan.batch_shares)
    except LayoutError as e:
        raise ParallelError(f"virtual workers over dp ranks (batch shares {plan.batch_shares}): {e}") from None


def batch_slice(plan: JobPlan, dp_rank: int, global_batch: int) -> BatchSlice:
    """This dp rank's samples of the global batch (see the module docstring)."""
    if not 0 <= dp_rank < plan.dp:
        raise ParallelError(f"dp rank {dp_rank} is outside dp={plan.dp}")
    m = plan.micro_batches
    if plan.virtual_workers is None and plan.batch_shares is not None:
        sizes = largest_remainder(global_batch, plan.batch_shares)
        size = sizes[dp_rank]
        if size == 0 or size % m:
            raise ParallelError(
                f"dp rank {dp_rank}'s batch share of {size} (of {global_batch}, shares "
                f"{list(plan.batch_shares)}) does not split into {m} micro-batches"
            )
        return BatchSlice(sum(sizes[:dp_rank]), size, size // m, m, range(0))
    v = plan.virtual_workers or plan.dp
    mine = _blocks(plan)[dp_rank]
    if global_batch % (v * m):
        raise ParallelError(
            f"global batch {global_batch} does not split into {v} virtual workers x {m} micro-batches "
            f"(it must be a multiple of {v * m})"
        )
    per_vw = global_batch // v
    return BatchSlice(mine.start * per_vw, len(mine) * per_vw, per_vw // m, len(mine) * m, mine)


def init_parallel(
    plan: JobPlan | None = None,
    *,
    num_layers: int | None = None,
    global_batch: int | None = None,
    backend: str | None = None,
    timeout_s: float | None = None,
    split_batch: bool = True,
) -> ParallelContext:
    """Join the job's process group and build its (pp, dp, tp) device mesh.

    plan: defaults to CELLSCHED_PLAN. num_layers: split into pipeline stages
    (plan.stage_layers or evenly). global_batch: defaults to plan.global_batch.
    backend: nccl when CUDA is available, gloo otherwise. split_batch: False
    leaves ``batch`` unset (a runtime that splits the batch its own way).
    """
    plan = plan if plan is not None else plan_from_env()
    layout = Layout(plan.pp, plan.dp, plan.tp)
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    except (KeyError, ValueError) as e:
        raise ParallelError(
            f"RANK/WORLD_SIZE missing or malformed ({e}): start the job with cellsched-launch"
        ) from None
    if world != layout.world_size:
        raise ParallelError(f"WORLD_SIZE={world} but the plan needs pp*dp*tp = {layout.world_size}")
    v = plan.virtual_workers or plan.dp
    unit_counts(plan)  # dp <= V, and batch shares leave every dp rank a virtual worker

    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_s) if timeout_s else None  # None: torch's default
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
    mesh = init_device_mesh(device.type, layout.shape, mesh_dim_names=DIMS)
    coords = layout.coords(rank)
    if tuple(mesh.get_coordinate() or ()) != (coords.pp, coords.dp, coords.tp):
        raise ParallelError(f"device mesh puts rank {rank} at {mesh.get_coordinate()}, expected {coords}")

    stages = split_layers(num_layers, plan.pp, plan.stage_layers) if num_layers is not None else None
    global_batch = global_batch if global_batch is not None else plan.global_batch
    if not split_batch:
        global_batch = None
    return ParallelContext(
        plan=plan,
        layout=layout,
        rank=rank,
        local_rank=local_rank,
        coords=coords,
        device=device,
        backend=backend,
        mesh=mesh,
        virtual_workers=v,
        stage_layers=stages[coords.pp] if stages else None,
        batch=batch_slice(plan, coords.dp, global_batch) if global_batch is not None else None,
    )


def pipeline_schedule(
    stage: torch.nn.Module,
    ctx: ParallelContext,
    micro_batches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Schedule1F1B:
    """torch's 1F1B schedule of this rank's pipeline stage over the pp group
    (gradients left unscaled: the loss is already divided by the global batch)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    pipe = PipelineStage(stage, ctx.pp_rank, ctx.pp, ctx.device, group=ctx.group("pp"))
    return Schedule1F1B(pipe, n_microbatches=micro_batches, loss_fn=loss_fn, scale_grads=False)
