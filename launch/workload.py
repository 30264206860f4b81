"""What a user's training code plugs into ``launch.Trainer``: model, data, loss, optimizer.

The trainer owns everything about the layout (process groups, pipeline
stages, micro-batches, batch shares, gradient sync, checkpoints); the user
describes the work in a ``Workload``:

- ``build_stage(StageSpec)``: the module of one pipeline stage. Its weights
  must not depend on the layout (build from a seed, then cut), so that every
  plan starts from the same model. In ``sharded`` mode the spec has ``tp=1``
  (whole layers; the trainer applies ``tp_plan`` with DTensor); in ``exact``
  mode it carries this rank's tp rank and group (Megatron-style layers).
- ``sample(positions)`` (sharded): the batch of the given global sample
  positions (``step * global_batch + i``); keyed by position, so every plan
  sees the same samples in the same order.
- ``draw(worker, n)`` (exact): the next N samples of a virtual worker
  (``launch.elastic.VirtualWorker``), from its own shard and random stream.
- ``split(batch)``: (inputs, targets) of a batch.
- ``loss(output, targets)``: the loss SUMMED over the batch's samples; the
  trainer divides it by the global batch, so the summed gradient is that of
  the global mean whatever the batch shares.
- ``optimizer(params)``: a torch optimizer over PARAMS (elementwise ones in
  exact mode with state sharding: SGD, Adam, AdamW).
- ``tp_plan(stage, tp)`` (sharded, tp > 1): ``parallelize_module``'s plan,
  submodule name -> ``ParallelStyle``.
- ``shard_units(stage)`` (sharded): submodules each wrapped in their own
  ``fully_shard`` (transformer blocks), before the stage itself.
- ``tp_dims(stage)`` (exact, tp > 1): parameter name -> the dim it is split
  along over tp ranks (None: replicated), to write layout-independent
  checkpoints.
- ``config``: JSON-able description of the model and data; recorded in a
  checkpoint and checked on resume (``meta``: recorded only).
- ``model_shape``: the model's shape (``solver.contract.models.ModelShape``:
  hidden size, heads, sequence length, vocabulary; its ``layers`` are
  ``num_layers``), reported in ``progress.json`` so that the scheduler
  prices the model the job trains (None: its layers only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from launch.elastic import VirtualWorker
from solver.contract.models import ModelShape


@dataclass(frozen=True)
class StageSpec:
    """The pipeline stage a rank builds."""

    layers: range  #: global indices of its layers
    first: bool  #: holds the input (embeddings)
    last: bool  #: holds the output (head; the loss is computed on it)
    tp: int = 1  #: tensor-parallel degree the module is built for (1 in sharded mode)
    tp_rank: int = 0
    tp_group: Any = None  #: exact mode's tp process group (None in sharded mode)


@dataclass(frozen=True)
class Workload:
    """A user's model, data, loss and optimizer (see the module docstring)."""

    num_layers: int
    build_stage: Callable[[StageSpec], nn.Module]
    split: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer]
    sample: Callable[[Sequence[int]], torch.Tensor] | None = None
    draw: Callable[[VirtualWorker, int], torch.Tensor] | None = None
    dataset_size: int = 0  #: exact mode: items the virtual workers share out
    seed: int = 0  #: exact mode: the virtual workers' random streams
    tp_plan: Callable[[nn.Module, int], Mapping[str, Any]] | None = None
    shard_units: Callable[[nn.Module], Iterable[nn.Module]] | None = None
    tp_dims: Callable[[nn.Module], Mapping[str, int | None]] | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)  #: recorded in a checkpoint, not checked
    model_shape: ModelShape | None = None

    def shape(self) -> ModelShape:
        """The shape the trainer reports (`model_shape`, else the layers alone); ValueError when they disagree."""
        shape = self.model_shape or ModelShape(self.num_layers)
        if shape.layers != self.num_layers:
            raise ValueError(f"model_shape has {shape.layers} layers, the workload {self.num_layers}")
        return shape
