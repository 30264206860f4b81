"""What every framework adapter is made of (stdlib only)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from launch.errors import LauncherError
from launch.steplog import StepLog
from solver.contract.plan import JobPlan
from solver.contract.runtimes import get_runtime, plan_problem


class AdapterError(ValueError, LauncherError):
    """The plan cannot be expressed in the framework's options, or the command already sets one of them."""


@dataclass(frozen=True)
class Adapter:
    runtime: str
    options: Callable[[JobPlan], list[str]]  #: the options the plan adds (``--name value`` pairs and flags)
    owned: tuple[str, ...]  #: the options the adapter sets: a command that sets one itself is refused
    supervise: bool = False  #: the launcher stays the command's parent (signal and exit status bridge)
    progress: StepLog | None = None  #: the framework's step lines, read for progress.json (launch.steplog)


@dataclass(frozen=True)
class BatchSizes:
    """A plan's even batch split: samples per iteration in all, per dp rank, per micro-batch."""

    global_batch: int
    local_batch: int
    micro_batch_size: int


def batch_sizes(plan: JobPlan) -> BatchSizes | None:
    """The plan's batch split over dp ranks and micro-batches; None when the
    plan leaves the global batch to the script. AdapterError when it does not
    split evenly (a framework runtime cannot run uneven parts)."""
    if plan.global_batch is None:
        return None
    per_rank, m = plan.dp * plan.micro_batches, plan.micro_batches
    if plan.global_batch % per_rank:
        raise AdapterError(
            f"global batch {plan.global_batch} does not split into dp={plan.dp} ranks x {m} micro-batches "
            f"(it must be a multiple of {per_rank})"
        )
    local = plan.global_batch // plan.dp
    return BatchSizes(plan.global_batch, local, local // m)


def check_plan(plan: JobPlan, runtime: str) -> None:
    """AdapterError when RUNTIME cannot carry the plan out (solver.contract.runtimes.plan_problem)."""
    problem = plan_problem(
        get_runtime(runtime),
        pp=plan.pp,
        tp=plan.tp,
        dp=plan.dp,
        gpu_types=plan.gpu_types,
        batch_shares=plan.batch_shares,
        stage_layers=plan.stage_layers,
        virtual_workers=plan.virtual_workers,
        micro_batches=plan.micro_batches,
        global_batch=plan.global_batch,
    )
    if problem:
        raise AdapterError(problem)


def sets_option(cmd: Sequence[str], name: str) -> bool:
    """Whether CMD gives option NAME (``NAME VALUE`` or ``NAME=VALUE``)."""
    return any(a == name or a.startswith(name + "=") for a in cmd)
