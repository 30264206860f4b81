"""``launch.Trainer``: a user's ``Workload`` trained the way the job's plan says.

The plan (``CELLSCHED_PLAN``, from ``cellsched-launch``) names the runtime
(``plan.runtime``; None means ``exact``) and the layout; the trainer builds
the process groups (``init_parallel``: a (pp, dp, tp) device mesh), its
pipeline stage, the batch split and the engine:

- ``sharded`` (``launch.sharded``): FSDP2 x DTensor TP x torch pipelining,
  DCP checkpoints that reshard on resume (docs/runtime-sharded.md);
- ``exact`` (``launch.exact``): virtual workers and the ordered all-gather
  sum, bitwise the same for any dp <= V (docs/runtime-exact.md).

``run(steps)`` is the whole loop: resume from the plan's checkpoint
directory, train, write ``progress.json`` (rank 0; with the shape of the
model it trains, ``"model"``: ``Workload.shape``), save every
``plan.checkpoint_every`` steps and at the end, and on the controller's
signal (``launch.checkpoint.StopRequest``) save at the next step boundary
and return ``EXIT_CHECKPOINTED`` (75), which the script passes to exit.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from launch import checkpoint
from launch.exact import ExactEngine, make_deterministic
from launch.parallel import ParallelContext, init_parallel, plan_from_env
from launch.progress import write_progress
from launch.sharded import ShardedEngine
from launch.workload import Workload
from solver.contract import EXIT_CHECKPOINTED
from solver.contract.plan import JobPlan

#: runtimes this trainer carries out (``plan.runtime``; None is exact)
RUNTIMES = ("exact", "sharded")
#: runtimes whose plans another engine carries out: a ddp plan (the submission default) is
#: data parallel only, with even batches, which exact runs as it is
ALIASES = {"ddp": "exact"}

Engine = ExactEngine | ShardedEngine


def runtime_of(plan: JobPlan) -> str:
    """The runtime PLAN asks for (None: exact); ValueError for one this trainer does not carry out."""
    name = plan.runtime or "exact"
    name = ALIASES.get(name, name)
    if name not in RUNTIMES:
        raise ValueError(
            f"plan.runtime is {name!r}; launch.Trainer carries out {' and '.join(RUNTIMES)} (and ddp's plans) "
            "(submit with cellsched sbatch --runtime sharded or exact)"
        )
    return name


def make_engine(
    ctx: ParallelContext, work: Workload, global_batch: int, shard_state: str | None = None
) -> ExactEngine | ShardedEngine:
    """The engine of CTX's plan's runtime over CTX (init_parallel with num_layers)."""
    if runtime_of(ctx.plan) == "sharded":
        if shard_state not in (None, "none", "even"):
            raise ValueError(f"the sharded runtime shards all state evenly over dp; shard_state={shard_state!r}")
        return ShardedEngine(ctx, work, global_batch)
    return ExactEngine(ctx, work, global_batch, shard_state)


class Trainer:
    """Train WORK under the job's plan.

    plan: defaults to CELLSCHED_PLAN. global_batch: samples per step
    (default plan.global_batch). shard_state: exact mode's optimizer-state
    sharding ("none", "even", "memory"; default the plan's). stop: a
    ``StopRequest`` made earlier (make it first thing in a script, before
    slow imports); one is made here otherwise.
    """

    def __init__(
        self,
        work: Workload,
        *,
        plan: JobPlan | None = None,
        global_batch: int | None = None,
        shard_state: str | None = None,
        stop: checkpoint.StopRequest | None = None,
    ):
        self.stop = stop if stop is not None else checkpoint.StopRequest()
        plan = plan if plan is not None else plan_from_env()
        self.runtime = runtime_of(plan)
        if self.runtime == "sharded" and plan.virtual_workers is not None:
            plan = dataclasses.replace(plan, virtual_workers=None)  # no virtual workers: V may be < dp
        batch = global_batch or plan.global_batch
        if not batch:
            raise ValueError("no global batch: give global_batch= or plan.global_batch")
        self.global_batch = batch
        if self.runtime == "exact":
            make_deterministic()  # before init_parallel starts CUDA
        # exact checks the batch against its virtual workers here; sharded splits it itself
        ctx = init_parallel(plan, num_layers=work.num_layers, global_batch=batch, split_batch=self.runtime == "exact")
        self.ctx = ctx
        self.plan = plan
        self.engine: Engine = make_engine(ctx, work, batch, shard_state)
        self.checkpoint_dir = plan.checkpoint_dir
        self.model_shape = work.shape()  #: reported in progress.json: the model the scheduler prices

    @property
    def step(self) -> int:
        return self.engine.step

    @property
    def losses(self) -> list[float]:
        return self.engine.losses

    def resume(self) -> bool:
        """Load the newest checkpoint of the plan's directory (any plan wrote it); False if none."""
        return bool(self.checkpoint_dir) and self.engine.load(str(self.checkpoint_dir))

    def train_step(self) -> float:
        return self.engine.train_step()

    def save(self) -> None:
        """Checkpoint now into the plan's directory (collective)."""
        if not self.checkpoint_dir:
            raise ValueError("the plan has no checkpoint_dir")
        self.engine.save(str(self.checkpoint_dir))

    def run(self, steps: int, on_step: Callable[[int, float], Any] | None = None, step_delay: float = 0.0) -> int:
        """Resume, then train until step STEPS; 0, or EXIT_CHECKPOINTED when stopped by the signal.

        on_step(step, loss) runs on rank 0 after each step.
        """
        self.resume()
        plan, d = self.plan, self.checkpoint_dir
        while self.step < steps:
            loss = self.train_step()
            if self.ctx.rank == 0:
                if on_step is not None:
                    on_step(self.step, loss)
                if d:
                    write_progress(d, self.step, loss=loss, model=self.model_shape.to_dict())
            if step_delay > 0:
                time.sleep(step_delay)
            stopping = self.stop.agreed(device=self.ctx.device)
            due = plan.checkpoint_every and self.step % plan.checkpoint_every == 0
            if d and (stopping or due or self.step == steps):
                self.save()
            if stopping:
                return EXIT_CHECKPOINTED
        return 0

    def close(self) -> None:
        """Wait for every rank, then leave the process group."""
        if self.ctx.world_size > 1:
            dist.barrier()  # nobody tears down while a peer still talks (gloo aborts otherwise)
        dist.destroy_process_group()


def exit_now(code: int) -> None:
    """Leave without C++ static destructors: under load gloo's worker threads can
    still be joinable then, and the runtime aborts a finished run."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
