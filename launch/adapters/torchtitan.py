"""torchtitan (``python -m torchtitan.train --module M --config C ...``).

Options (names read from the installed torchtitan's config dataclasses,
parsed by its ``ConfigManager``; tests/launch/test_frameworks.py parses them):

- ``--parallelism.data_parallel_shard_degree DP`` (FSDP2 over the plan's dp
  ranks; ``--parallelism.data_parallel_replicate_degree 1``),
  ``--parallelism.tensor_parallel_degree TP``,
  ``--parallelism.pipeline_parallel_degree PP``; with pp > 1 also
  ``--training.disable_cuda_graphs`` (torchtitan refuses pipeline parallelism
  with CUDA graphs, which its configs turn on).
- Batches, when the plan names its global batch:
  ``--training.global_batch_size``; pp = 1: ``--training.local_batch_size``
  = one micro-batch and torchtitan accumulates gradients over the plan's
  ``micro_batches``; pp > 1: ``--training.local_batch_size`` = the dp rank's
  share, cut into micro-batches of
  ``--parallelism.pipeline_parallel_microbatch_size``.
- ``--checkpoint.enable --checkpoint.folder DIR`` (DIR = the plan's
  checkpoint_dir, absolute, so not under torchtitan's dump folder; torchtitan
  resumes from the newest step there on its own) and
  ``--checkpoint.interval N`` from ``checkpoint_every``.
- Signal bridge: ``--override.imports launch.adapters.titan_bridge.signal_checkpoint``,
  torchtitan's own override mechanism, swaps its checkpoint manager for one
  that, on SIGUSR1/SIGTERM, saves the step just finished on every rank and
  exits 75 (``launch.adapters.titan_bridge``).
"""

from __future__ import annotations

from launch import steplog
from launch.adapters.base import Adapter, batch_sizes, check_plan
from solver.contract.plan import JobPlan

RUNTIME = "torchtitan"
BRIDGE = "launch.adapters.titan_bridge.signal_checkpoint"
OWNED = (
    "--parallelism.data_parallel_shard_degree",
    "--parallelism.data_parallel_replicate_degree",
    "--parallelism.tensor_parallel_degree",
    "--parallelism.pipeline_parallel_degree",
    "--parallelism.pipeline_parallel_microbatch_size",
    "--training.local_batch_size",
    "--training.global_batch_size",
    "--checkpoint.folder",
    "--checkpoint.interval",
    "--override.imports",
)


def options(plan: JobPlan) -> list[str]:
    """The torchtitan options that carry PLAN out."""
    check_plan(plan, RUNTIME)
    out = [
        "--parallelism.data_parallel_replicate_degree",
        "1",
        "--parallelism.data_parallel_shard_degree",
        str(plan.dp),
        "--parallelism.tensor_parallel_degree",
        str(plan.tp),
        "--parallelism.pipeline_parallel_degree",
        str(plan.pp),
    ]
    if plan.pp > 1:
        out.append("--training.disable_cuda_graphs")
    sizes = batch_sizes(plan)
    if sizes is not None:
        if plan.pp > 1:
            out += [
                "--training.local_batch_size",
                str(sizes.local_batch),
                "--parallelism.pipeline_parallel_microbatch_size",
                str(sizes.micro_batch_size),
            ]
        else:
            out += ["--training.local_batch_size", str(sizes.micro_batch_size)]
        out += ["--training.global_batch_size", str(sizes.global_batch)]
    if plan.checkpoint_dir:
        out += ["--checkpoint.enable", "--checkpoint.folder", plan.checkpoint_dir]
        if plan.checkpoint_every:
            out += ["--checkpoint.interval", str(plan.checkpoint_every)]
        out += ["--override.imports", BRIDGE]
    return out


ADAPTER = Adapter(RUNTIME, options, OWNED, progress=steplog.TORCHTITAN)
