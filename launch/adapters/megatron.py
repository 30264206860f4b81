"""Megatron-LM (``pretrain_gpt.py`` and other ``megatron.training`` scripts).

Options (names and meaning read from Megatron-LM's ``megatron/training``
arguments, ``TrainingConfig``, at the ``core_v0.16.1`` tag; the PyPI
``megatron-core`` package does not ship the training scripts):

- ``--tensor-model-parallel-size TP --pipeline-model-parallel-size PP``;
  Megatron takes dp = world size / (tp x pp), the plan's dp.
- ``--micro-batch-size`` (samples per micro-batch on one dp rank) and
  ``--global-batch-size``, when the plan names its global batch: Megatron
  runs global / (micro x dp) micro-batches per iteration, the plan's
  ``micro_batches`` (per pipeline; gradient accumulation when pp = 1).
- ``--use-distributed-optimizer``, always: the runtime table prices every
  Megatron plan of dp > 1 with its optimizer state sharded evenly over dp
  (``State.ZERO1``; at dp = 1 it is the plain optimizer's state). Always,
  not per plan: a run reads the checkpoint of the run before it only with
  the same kind of optimizer, and the plan of a moved job may change dp.
- ``--save DIR --load DIR`` (DIR = the plan's checkpoint_dir: resume from
  the newest checkpoint there) and ``--save-interval N`` from
  ``checkpoint_every``; ``--exit-signal-handler``: on SIGTERM (Megatron's
  default ``--exit-signal``) Megatron saves a checkpoint at the end of the
  iteration on every rank and leaves the loop.
- With a checkpoint_dir, ``--ckpt-format torch_dist`` (Megatron's own
  distributed checkpoint, also its default: set so that the command cannot
  choose the legacy per-rank ``torch`` files, which resume only under the
  same tp and pp) and ``--dist-ckpt-optim-fully-reshardable``: the
  distributed optimizer's state saved as whole tensors per parameter, so the
  next run may have another dp, tp or pp (without it Megatron saves the
  state as ``dp_reshardable``, which a run of another tp or pp cannot read).

Signal bridge: the launcher stays Megatron's parent (``supervise``). It turns
the controller's SIGUSR1 into the SIGTERM Megatron listens to (SIGUSR1 stays
blocked in Megatron, so it never kills it) and, since Megatron then exits 0,
exits ``EXIT_CHECKPOINTED`` (75) when a checkpoint signal came and Megatron's
tracker file ``latest_checkpointed_iteration.txt`` was rewritten after it.
"""

from __future__ import annotations

from launch import steplog
from launch.adapters.base import Adapter, AdapterError, batch_sizes, check_plan
from solver.contract.plan import JobPlan
from solver.contract.runtimes import State, get_runtime

RUNTIME = "megatron"
#: Megatron's file naming its newest checkpoint, in the --save folder
TRACKER_FILE = "latest_checkpointed_iteration.txt"
OWNED = (
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--micro-batch-size",
    "--global-batch-size",
    "--save",
    "--load",
    "--save-interval",
    "--exit-signal-handler",
    "--exit-signal",
    "--use-distributed-optimizer",
    "--ckpt-format",
    "--dist-ckpt-optim-fully-reshardable",
)


def options(plan: JobPlan) -> list[str]:
    """The Megatron options that carry PLAN out."""
    check_plan(plan, RUNTIME)
    if plan.state_shares is not None and len(set(plan.state_shares)) > 1:
        raise AdapterError(
            f"Megatron's distributed optimizer shards its state evenly over dp, not by {list(plan.state_shares)}"
        )
    out = ["--tensor-model-parallel-size", str(plan.tp), "--pipeline-model-parallel-size", str(plan.pp)]
    sizes = batch_sizes(plan)
    if sizes is not None:
        out += ["--micro-batch-size", str(sizes.micro_batch_size), "--global-batch-size", str(sizes.global_batch)]
    if get_runtime(RUNTIME).state == State.ZERO1:
        out.append("--use-distributed-optimizer")
    if plan.checkpoint_dir:
        out += ["--save", plan.checkpoint_dir, "--load", plan.checkpoint_dir, "--exit-signal-handler"]
        out += ["--ckpt-format", "torch_dist", "--dist-ckpt-optim-fully-reshardable"]
        if plan.checkpoint_every:
            out += ["--save-interval", str(plan.checkpoint_every)]
    return out


ADAPTER = Adapter(RUNTIME, options, OWNED, supervise=True, progress=steplog.MEGATRON)
