"""What a job's code can carry out: the runtimes a job names at submission.

A plan is only as good as the code that runs it. A torchrun-style DDP
script ignores a pp=2 or tp=2 plan and trains at the speed of the plan it
really runs; Megatron cannot split a batch unevenly. Each runtime here
declares what it can carry out (the table below). The rule is applied in
one place: `refusal` says why a runtime cannot run a plan being generated
(the cell enumerations and the estimators ask it), and `plan_problem` why it
cannot carry out a whole plan (the controller checks every plan with it
before applying it, the launcher's adapters before starting one). The
estimator prices the runtime's own gradient sync (``grad_sync``) and state
layout (``state``).

A job that has trained resumes from the checkpoint an earlier plan wrote, so
a move is a plan generated for it from that plan: ``resumes`` says which of
dp, tp, pp and the GPU types may differ between the two (the GPU count is
pp x dp x tp), established from each framework's own resume code
(``resume_basis``), and `move_problem` why a job may not go from one to the
other: the policies ask it where a running job's options are made, and
`plan_problem` (``resumed_from``) at the guards.

Names (``cellsched sbatch --runtime NAME``; docs/runtimes.md):

- ``ddp``: any torchrun-style data-parallel script (DDP, Lightning,
  Accelerate). dp only, even batches, one GPU type, replicated state,
  gradients all-reduced. Movable only once the script calls
  ``launch.on_checkpoint(save_fn)``; until then it is static.
- ``sharded``: cellsched's torch-native runtime (FSDP2, DTensor tensor
  parallelism, torch pipelining, DCP checkpoints that reshard on resume).
- ``exact``: cellsched's EasyScale runtime (virtual workers, ordered
  all-gather sum): bitwise the same training for any dp <= V (on one kind
  of device: docs/runtime-exact.md).
- ``torchtitan``: torchtitan's trainer (FSDP2 + TP + PP), options from the
  launcher's adapter.
- ``megatron``: Megatron-LM / megatron-core, options from the adapter;
  always its distributed optimizer (ZeRO-1), so every run of a job reads
  the checkpoint of the one before at any dp, tp or pp.
- ``adaptive``: the simulator's runtime for trace jobs: any dp x tp x pp,
  uneven shares and stages, mixed types, gradients all-reduced and optimizer
  state sharded or not (Arena's assumption of adaptive parallelism). No code
  ships for it, so a submission cannot name it.

Stdlib only (the launcher and the wrapper import it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from solver.contract.errors import SolverError


class UnknownRuntime(ValueError, SolverError):
    """An unknown runtime name."""


class GradSync(StrEnum):
    """How a runtime sums gradients over its dp ranks."""

    ALLREDUCE = "allreduce"  #: ring all-reduce of the gradient (DDP, Megatron)
    ALLGATHER = "allgather"  #: all-gather of every unit's gradient, summed in order (exact)
    REDUCE_SCATTER = "reduce_scatter"  #: FSDP: parameters all-gathered, gradients reduce-scattered


class State(StrEnum):
    """Where a runtime keeps parameters, gradients and optimizer state over dp."""

    REPLICATED = "replicated"  #: everything on every dp rank
    OPTIMIZER = "optimizer"  #: optimizer state sharded over dp when the plan says so (ZeRO-1)
    #: optimizer state sharded evenly over dp in every plan (ZeRO-1 always: Megatron's
    #: distributed optimizer, whose checkpoint only the same optimizer reads back)
    ZERO1 = "zero1"
    FULL = "full"  #: parameters, gradients and optimizer state sharded (FSDP / ZeRO-3)


class Change(StrEnum):
    """What may differ between the plan a job's checkpoint was written under and the plan it resumes with."""

    DP = "dp"
    TP = "tp"
    PP = "pp"
    GPU_TYPE = "gpu type"  #: another GPU type, or into or out of a mixed-type cell


#: every change: a runtime whose checkpoints reshard on load
ANY_CHANGE = frozenset(Change)


@dataclass(frozen=True)
class Layout:
    """What of a plan a resume depends on: its degrees and its GPU types."""

    pp: int
    dp: int
    tp: int
    gpu_types: frozenset[str] = frozenset()

    def changes(self, to: Layout) -> tuple[Change, ...]:
        """What differs from this layout in `to` (GPU types: only when both
        name theirs), in the order of `Change`."""
        if self == to:  # asked for every running job's every option each round: most are equal
            return ()
        named = bool(self.gpu_types and to.gpu_types)
        return tuple(c for c in Change if (named or c != Change.GPU_TYPE) and self._value(c) != to._value(c))

    def shown(self, change: Change) -> str:
        """This layout's value of what `change` changes, as a message shows it."""
        if change == Change.GPU_TYPE:
            return "+".join(sorted(self.gpu_types))
        return str(self._value(change))

    def _value(self, change: Change) -> int | frozenset[str]:
        """This layout's value of what `change` changes."""
        if change == Change.GPU_TYPE:
            return self.gpu_types
        return self.dp if change == Change.DP else self.tp if change == Change.TP else self.pp


class Checkpoint(StrEnum):
    """How a runtime answers the controller's checkpoint signal."""

    SIGNAL = "signal"  #: the runtime saves and exits 75 on its own
    HOOK = "hook"  #: only once the script registered ``launch.on_checkpoint``; static until then


@dataclass(frozen=True)
class Runtime:
    name: str
    tp: bool  #: tensor parallelism
    pp: bool  #: pipeline parallelism
    uneven_batch: bool  #: per-dp-rank batch shares (plan.batch_shares)
    uneven_stages: bool  #: layers per stage other than even (plan.stage_layers)
    mixed_types: bool  #: one job over several GPU types
    virtual_workers: bool  #: EasyScale virtual workers (any dp <= V bitwise)
    grad_sync: GradSync
    state: State
    checkpoint: Checkpoint
    #: its pipelines run torch.distributed.pipelining's Schedule1F1B, which needs
    #: at least pp micro-batches per iteration (per virtual worker)
    m_at_least_pp: bool = False
    submittable: bool = True  #: a user may name it (not a simulation-only runtime)
    doc: str = ""
    #: what may differ between the plan a checkpoint was written under and the
    #: plan a run resumes it with (`move_problem`)
    resumes: frozenset[Change] = ANY_CHANGE
    #: the facts `resumes` stands on: the code (and its version) that resumes
    resume_basis: str = ""


RUNTIMES: dict[str, Runtime] = {
    r.name: r
    for r in (
        Runtime(
            "ddp",
            tp=False,
            pp=False,
            uneven_batch=False,
            uneven_stages=False,
            mixed_types=False,
            virtual_workers=False,
            grad_sync=GradSync.ALLREDUCE,
            state=State.REPLICATED,
            checkpoint=Checkpoint.HOOK,
            doc="torchrun-style data parallelism (DDP, Lightning, Accelerate)",
            resumes=frozenset({Change.DP, Change.GPU_TYPE}),
            resume_basis="the script's own save_fn (launch.on_checkpoint): DDP's state is whole on every rank",
        ),
        Runtime(
            "sharded",
            tp=True,
            pp=True,
            uneven_batch=True,
            uneven_stages=True,
            mixed_types=True,
            virtual_workers=False,
            grad_sync=GradSync.REDUCE_SCATTER,
            state=State.FULL,
            checkpoint=Checkpoint.SIGNAL,
            m_at_least_pp=True,
            doc="cellsched's torch-native runtime: FSDP2, DTensor TP, pipelining, DCP",
            resume_basis="DCP checkpoints keyed by parameter name, resharded on load (launch.sharded)",
        ),
        Runtime(
            "exact",
            tp=True,
            pp=True,
            uneven_batch=True,
            uneven_stages=True,
            mixed_types=True,
            virtual_workers=True,
            grad_sync=GradSync.ALLGATHER,
            state=State.OPTIMIZER,
            checkpoint=Checkpoint.SIGNAL,
            m_at_least_pp=True,
            doc="cellsched's bitwise-reproducible runtime (virtual workers, ordered all-gather sum)",
            resume_basis="whole tensors by name, every virtual worker's data and random state (launch.exact)",
        ),
        Runtime(
            "torchtitan",
            tp=True,
            pp=True,
            uneven_batch=False,
            uneven_stages=False,
            mixed_types=False,
            virtual_workers=False,
            grad_sync=GradSync.REDUCE_SCATTER,
            state=State.FULL,
            checkpoint=Checkpoint.SIGNAL,
            m_at_least_pp=True,
            doc="torchtitan's trainer, options from the launcher's adapter",
            resumes=frozenset({Change.TP, Change.PP, Change.GPU_TYPE}),
            resume_basis=(
                "torchtitan 0.3.0: model and optimizer are DCP state by parameter name, but its dataloader's "
                "state is per dp rank and refuses another dp degree (ParallelAwareDataloader.load_state_dict)"
            ),
        ),
        Runtime(
            "megatron",
            tp=True,
            pp=True,
            uneven_batch=False,
            uneven_stages=False,
            mixed_types=False,
            virtual_workers=False,
            grad_sync=GradSync.ALLREDUCE,
            state=State.ZERO1,
            checkpoint=Checkpoint.SIGNAL,
            doc="Megatron-LM / megatron-core, options from the launcher's adapter",
            resumes=ANY_CHANGE,
            resume_basis=(
                "Megatron-LM core_v0.16.1 load_checkpoint, read, not run (it needs CUDA): the adapter's "
                "--ckpt-format torch_dist and --dist-ckpt-optim-fully-reshardable save model and optimizer "
                "state per parameter, loaded under any dp, tp or pp; the data continue from "
                "consumed_train_samples"
            ),
        ),
        Runtime(
            "adaptive",
            tp=True,
            pp=True,
            uneven_batch=True,
            uneven_stages=True,
            mixed_types=True,
            virtual_workers=True,
            grad_sync=GradSync.ALLREDUCE,
            state=State.OPTIMIZER,
            checkpoint=Checkpoint.SIGNAL,
            submittable=False,
            doc="simulation only: trace jobs under Arena's assumption of adaptive parallelism",
            resume_basis="Arena's assumption: any plan resumes any other",
        ),
    )
}

#: what `cellsched sbatch` records when a job names no runtime: the one
#: runtime whose plans any torchrun-style script carries out as given
#: (dp only, even batches, one GPU type) and that is never moved before the
#: script says it can checkpoint (docs/runtimes.md says why)
DEFAULT_RUNTIME = "ddp"
#: Arena's adaptive parallelism: the runtime of the simulator's trace jobs, and
#: the one whose plans the estimator prices by its own settings (what a
#: measurement, which names no runtime, is compared with). Only the submission
#: has a default runtime (DEFAULT_RUNTIME): a solver's request names its own.
ADAPTIVE = "adaptive"
SUBMITTABLE = tuple(name for name, r in RUNTIMES.items() if r.submittable)


def get_runtime(name: str) -> Runtime:
    """The runtime called NAME; UnknownRuntime naming the known ones otherwise."""
    try:
        return RUNTIMES[name]
    except (KeyError, TypeError):
        raise UnknownRuntime(f"unknown runtime {name!r} (known: {', '.join(RUNTIMES)})") from None


def plan_problem(
    runtime: Runtime,
    *,
    pp: int,
    tp: int,
    gpu_types: Sequence[str] = (),
    batch_shares: Sequence[float] | None = None,
    stage_layers: Sequence[int] | None = None,
    virtual_workers: int | None = None,
    dp: int = 1,
    micro_batches: int | None = None,
    global_batch: int | None = None,
    layers: int | None = None,
    resumed_from: Layout | None = None,
) -> str | None:
    """Why RUNTIME cannot carry out this plan, or None when it can (what is
    not given is not checked): for a model of `layers` layers (the stages
    must hold them all, one at least each), resuming a checkpoint written
    under the plan `resumed_from` (`move_problem`)."""
    name = runtime.name
    if layers is not None and (pp > layers or (stage_layers is not None and sum(stage_layers) != layers)):
        split = f"stage_layers {list(stage_layers)}" if stage_layers is not None else f"pp={pp} stages"
        return f"{split} for a model of {layers} layers (its stages must hold them all)"
    if resumed_from is not None:
        moved = move_problem(runtime, resumed_from, Layout(pp, dp, tp, frozenset(gpu_types)))
        if moved is not None:
            return moved
    if tp > 1 and not runtime.tp:
        return f"runtime {name} has no tensor parallelism (tp={tp})"
    if pp > 1 and not runtime.pp:
        return f"runtime {name} has no pipeline parallelism (pp={pp})"
    if len(set(gpu_types)) > 1 and not runtime.mixed_types:
        return f"runtime {name} runs on one GPU type, not {'+'.join(sorted(set(gpu_types)))}"
    if batch_shares is not None and len(set(batch_shares)) > 1 and not runtime.uneven_batch:
        return f"runtime {name} splits the batch evenly (shares {list(batch_shares)})"
    if stage_layers is not None and len(set(stage_layers)) > 1 and not runtime.uneven_stages:
        return f"runtime {name} splits layers evenly over stages ({list(stage_layers)})"
    if virtual_workers is not None:
        if virtual_workers != dp and not runtime.virtual_workers:
            return f"runtime {name} has no virtual workers (V={virtual_workers}, dp={dp})"
        if global_batch is not None and global_batch % virtual_workers:
            return f"V={virtual_workers} virtual workers do not divide the global batch {global_batch}"
        if dp > virtual_workers:
            return f"needs dp > V: dp={dp}, V={virtual_workers} virtual workers"
    if micro_batches is not None and pp > 1 and micro_batches < pp and runtime.m_at_least_pp:
        return f"runtime {name} runs 1F1B pipelines: {micro_batches} micro-batches for pp={pp} (needs at least pp)"
    return None


def move_problem(runtime: Runtime, before: Layout, after: Layout) -> str | None:
    """Why a job of RUNTIME whose checkpoint was written under the plan
    `before` cannot resume it under `after` (what differs that
    ``runtime.resumes`` does not allow), or None when it can: the one rule of
    a move, asked where a running job's options are made and by
    `plan_problem` at the guards."""
    refused = [c for c in before.changes(after) if c not in runtime.resumes]
    if not refused:
        return None
    what = ", ".join(f"{c} {before.shown(c)} -> {after.shown(c)}" for c in refused)
    return f"runtime {runtime.name} cannot resume its checkpoint with another {what} ({runtime.resume_basis})"


def moved_micro_batches(
    runtime: Runtime, old: int, priced: int, *, pp: int, per_worker: int, same_workers: bool
) -> int:
    """Micro-batches per iteration (per virtual worker) of a plan a job moves
    to from one of `old`: the old count where the runtime keeps a virtual
    worker's work the same (it has virtual workers, the same V of
    `per_worker` samples each, which `old` still splits), so that its
    gradients keep their last bits, and the new plan takes it
    (`plan_problem`: 1F1B needs at least pp); else the count the new plan
    was priced with, `priced`."""
    keep = runtime.virtual_workers and same_workers and old >= 1 and per_worker % old == 0
    if keep and plan_problem(runtime, pp=pp, tp=1, micro_batches=old) is None:
        return old
    return priced


def even_split(total: int, parts: int) -> tuple[int, ...]:
    """`total` samples over `parts` ranks as evenly as whole samples allow (the first ranks take one more)."""
    q, r = divmod(total, parts)
    return (q + 1,) * r + (q,) * (parts - r)


def refusal(
    runtime: str,
    layers: int,
    global_batch: int,
    virtual_workers: int | None = None,
    *,
    pp: int = 1,
    tp: int | None = None,
    dp: int | None = None,
    gpus: int | None = None,
    gpu_types: Sequence[str] = (),
    micro_batches: int | None = None,
) -> str | None:
    """Why RUNTIME cannot run a plan being generated for a job of `layers`
    layers, `global_batch` samples per iteration and V = `virtual_workers`
    (None: one per dp rank), or None when it may: the one rule the cell
    enumerations and the estimators apply (module doc), by `plan_problem`.

    What is None is not decided yet: any value the runtime allows may come.
    `pp` stages, `tp`, `dp` (or `gpus`: dp = gpus / (pp tp), known when tp
    is, and tp is 1 for a runtime without tensor parallelism), the GPU types
    of the cell, and `micro_batches` per iteration (per virtual worker). The
    plan is the one a generator makes for a runtime that splits evenly:
    layers evenly over stages, the batch evenly over dp ranks (without V)."""
    rt = get_runtime(runtime)
    if tp is None and not rt.tp:
        tp = 1
    if dp is None and gpus is not None and tp is not None:
        dp = gpus // (pp * tp)
    return plan_problem(
        rt,
        pp=pp,
        tp=tp or 1,
        gpu_types=gpu_types,
        batch_shares=even_split(global_batch, dp) if dp is not None and virtual_workers is None else None,
        stage_layers=_even_stages(layers, pp),
        virtual_workers=virtual_workers if dp is not None else None,
        dp=dp or 1,
        micro_batches=micro_batches,
        global_batch=global_batch,
    )


def _even_stages(layers: int, pp: int) -> tuple[int, ...] | None:
    """`layers` over `pp` stages as evenly as whole layers allow (None: one stage, or more stages than layers)."""
    if pp < 2 or pp > layers:
        return None
    return even_split(layers, pp)
