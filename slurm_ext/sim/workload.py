"""What a trace job runs and what its user declares (docs/simulator.md#what-trace-jobs-run-and-declare).

A trace says how much a job really trained (Arena: its iterations; sacct:
its run time), rarely which code ran it and never what its user guessed.
`Workload` adds both, per job, by fixed rules of the job id and the
simulation's seed, so that every policy of a run meets the same jobs:

* **Runtime.** The trace's, where it names one (a managed job's spec in a
  sacct Comment); else u = `unit("runtime:<seed>:<job id>")` falls in one
  runtime's slice of [0, 1), the slices laid out in the mix's order, each as
  wide as its share; a runtime that cannot run the job where its user ran it
  (the simulation's estimator says so: a ddp job of a model whose replicated
  state fits no GPU; slurm_ext.sim.engine.RequestedCell) gives way to the next
  of the mix that can.
  What each runtime may run and how it may move is
  solver.contract.runtimes's, asked by every policy and the controller, not
  here.
* **Checkpoint hook.** A ``ddp`` job (Checkpoint.HOOK) registers
  ``launch.on_checkpoint`` when v = `unit("hook:<seed>:<job id>")` is below
  `hook_fraction`; the simulator then tells the controller so at its first
  step of each run, and it may be moved; otherwise it is static while it runs.
* **Declared work.** The job's spec carries ceil(truth x (1 + f w)), w =
  `unit("declared:<seed>:<job id>")`: the "badness factor" model of user
  runtime estimates (an estimate uniform in [r, (f + 1) r] for a run time
  r), in which earlier backfilling studies modelled inaccuracy (described
  by Tsafrir and Feitelson, "The dynamics of backfilling: solving the
  mystery of why increased inaccuracy may help", IISWC 2006). f = 0 is
  exact. The job runs its true iterations and ends there.

`DEFAULT_MIX`, `DEFAULT_HOOK_FRACTION` and `DEFAULT_BADNESS` are the
``--realistic`` defaults; all three are assumptions, not measurements
(docs/simulator.md says why each).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from slurm_ext.errors import CellschedError
from slurm_ext.sim.site import unit
from slurm_ext.sim.types import TraceJob
from solver.contract.runtimes import ADAPTIVE, RUNTIMES, SUBMITTABLE, Checkpoint, get_runtime

#: the shares of each runtime among trace jobs under --realistic: an assumption (docs/simulator.md)
DEFAULT_MIX: tuple[tuple[str, float], ...] = (
    ("ddp", 0.4),
    ("megatron", 0.25),
    ("torchtitan", 0.15),
    ("sharded", 0.15),
    ("exact", 0.05),
)
#: the fraction of ddp jobs whose script registers the checkpoint hook under --realistic: an assumption
DEFAULT_HOOK_FRACTION = 0.5
#: the badness factor f of declared work under --realistic: declared / true uniform in [1, 1 + f]; an assumption
DEFAULT_BADNESS = 3.0
#: how far the shares of a mix may sum from 1
SUM_TOLERANCE = 1e-6


class WorkloadError(ValueError, CellschedError):
    """A runtime mix, hook fraction or declared error that cannot be used (the message says why)."""


def parse_runtime_mix(text: str) -> tuple[tuple[str, float], ...]:
    """``ddp=0.5,megatron=0.5`` as ((name, share), ...): known submittable
    runtimes, each once, shares in [0, 1] summing to 1; WorkloadError naming
    the part otherwise."""
    if not text.strip():
        raise WorkloadError("--runtime-mix: empty (expected NAME=SHARE,... e.g. ddp=0.6,megatron=0.4)")
    out: list[tuple[str, float]] = []
    for part in text.split(","):
        name, eq, value = (s.strip() for s in part.partition("="))
        if not eq or not name:
            raise WorkloadError(f"--runtime-mix: {part.strip()!r} is not NAME=SHARE")
        if name not in RUNTIMES or name not in SUBMITTABLE:
            known = ", ".join(SUBMITTABLE)
            extra = " (adaptive is Arena's assumption: --arena-compat)" if name == ADAPTIVE else ""
            raise WorkloadError(f"--runtime-mix: unknown runtime {name!r}{extra} (known: {known})")
        if name in (n for n, _ in out):
            raise WorkloadError(f"--runtime-mix: runtime {name!r} given twice")
        try:
            share = float(value)
        except ValueError:
            share = math.nan
        if not 0.0 <= share <= 1.0:
            raise WorkloadError(f"--runtime-mix: share of {name} must be a number in [0, 1], got {value!r}")
        out.append((name, share))
    total = sum(s for _, s in out)
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise WorkloadError(f"--runtime-mix: shares must sum to 1, got {total:g}")
    return tuple(out)


@dataclass(frozen=True)
class Workload:
    """The rules of the module doc. `mix` empty: every job runs `runtime`
    (the trace's own where it names one)."""

    runtime: str = ADAPTIVE
    mix: tuple[tuple[str, float], ...] = ()
    hook_fraction: float = 1.0
    badness: float = 0.0
    seed: int = 0
    #: a job keeps the runtime its trace names (False: Arena's assumption, `runtime` for all)
    trace_runtimes: bool = True

    def __post_init__(self) -> None:
        try:
            get_runtime(self.runtime)
        except ValueError as exc:
            raise WorkloadError(f"runtime: {exc}") from None
        if self.mix:
            parse_runtime_mix(",".join(f"{n}={s!r}" for n, s in self.mix))
        if not 0.0 <= self.hook_fraction <= 1.0:
            raise WorkloadError(f"--hook-fraction must be in [0, 1], got {self.hook_fraction!r}")
        if not (math.isfinite(self.badness) and self.badness >= 0):
            raise WorkloadError(f"--declared-error must be a number >= 0, got {self.badness!r}")

    def runtime_of(self, job: TraceJob, fits: Callable[[str], bool] | None = None) -> str:
        """The runtime job `job` runs (module doc): the trace's, else its
        slice of the mix; when `fits(runtime)` says the drawn one cannot run
        the job where its user ran it, the next runtime of the mix (in its
        order, from the drawn one on, shares above 0) that can, as a user picks
        a framework that holds the model (none can: the drawn one)."""
        if job.runtime and self.trace_runtimes:
            return job.runtime
        if not self.mix:
            return self.runtime
        names = [name for name, share in self.mix if share > 0]
        u, edge, drawn = unit(f"runtime:{self.seed}:{job.job_id}"), 0.0, len(names) - 1
        for i, (_, share) in enumerate((n, s) for n, s in self.mix if s > 0):
            edge += share
            if u < edge:
                drawn = i
                break
        order = names[drawn:] + names[:drawn]
        if fits is None:
            return order[0]
        return next((name for name in order if fits(name)), order[0])

    def hooked(self, job: TraceJob, runtime: str) -> bool:
        """Does the script of `job`, running `runtime`, register the checkpoint
        hook? (Only a runtime that checkpoints through it asks.)"""
        if get_runtime(runtime).checkpoint != Checkpoint.HOOK:
            return False
        return unit(f"hook:{self.seed}:{job.job_id}") < self.hook_fraction

    def declared(self, job: TraceJob, iterations: int) -> int:
        """The iterations the job's user declares for `iterations` true ones (module doc)."""
        if self.badness == 0:
            return iterations
        return math.ceil(iterations * (1.0 + self.badness * unit(f"declared:{self.seed}:{job.job_id}")))
