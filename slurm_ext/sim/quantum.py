"""Arena's quantum mode: the simulated cluster as Arena's simulator sees it,
in fixed rounds (``simulate --arena-compat``; solver/data/arena/README.md).

In this mode the world (slurm_ext.sim.world) schedules no completions of its
own (it charges restarts and counts progress through its ``Rounds``
protocol, which QuantumMode fulfils): at each round start the engine calls
`QuantumMode.settle`, which accounts the round for every running job and completes the jobs whose work
is done then (they end at the round boundary where the completion is
detected, their GPUs taken until then). A restart charge within one round
only lowers that round's throughput (`round_throughput`); a longer one costs
the job one round of progress. Progress between two settlements is not
interpolated, and follows one of two models:

* ``executed-seconds`` (Arena's quirk, the default): a job's iterations
  done are its executed seconds over its CURRENT iteration time, so a move
  to a faster or slower cell rescales them;
* ``iterations``: the iterations are counted as they are made.

Contention is not modelled in this mode (Arena's simulator has none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slurm_ext.sim.world import SimJob, SimWorld

#: progress models in quantum (round) mode
EXECUTED_SECONDS, ITERATIONS = "executed-seconds", "iterations"


@dataclass(frozen=True)
class QuantumMode:
    """Rounds of `quantum_s` seconds and the `progress_model` (module doc)."""

    quantum_s: float
    progress_model: str = EXECUTED_SECONDS

    def __post_init__(self) -> None:
        if not (isinstance(self.quantum_s, (int, float)) and self.quantum_s > 0):
            raise ValueError(f"QuantumMode: quantum_s must be > 0, got {self.quantum_s!r}")
        if self.progress_model not in (EXECUTED_SECONDS, ITERATIONS):
            raise ValueError(
                f"QuantumMode: progress_model must be {EXECUTED_SECONDS!r} or {ITERATIONS!r},"
                f" got {self.progress_model!r}"
            )

    def charge(self, job: SimJob, cost: float, now: float) -> None:
        """A (re)start at `now` that costs `cost` seconds, as Arena charges it:
        progress accrues from now, the stall lowers the round's throughput, and
        a charge longer than a round costs one round of progress."""
        job.accrue_from = now
        job.penalty_left = self.quantum_s if cost > self.quantum_s else 0.0
        job.stall_until = now + min(cost, self.quantum_s)

    def iterations_done(self, job: SimJob) -> float:
        """The job's iterations done as of the last settlement (module doc)."""
        if self.progress_model == EXECUTED_SECONDS:
            if not job.iter_time:
                return 0.0
            done: float = math.floor(job.exec_s / job.iter_time)
        else:
            done = job.done
        return float(min(done, job.total)) if job.spec else float(done)

    def settle(self, world: SimWorld, now: float) -> list[str]:
        """At a round start: the world's events up to `now`, the round
        accounted for every running job, and those whose work is done
        completed now. Returns the ids completed."""
        world.advance(now)
        ended = []
        for job in list(world.running.values()):
            world.accrue(job, now)
            if job.spec is None or job.checkpointing or not job.iter_time:
                continue
            remaining: float
            if self.progress_model == EXECUTED_SECONDS:
                remaining = job.total - math.floor(job.exec_s / job.iter_time)
            else:
                remaining = job.total - job.done
            if remaining <= 0:
                job.done = job.total
                world.end(job, "COMPLETED", 0)
                ended.append(job.job_id)
        return ended

    def round_throughput(self, world: SimWorld, start: float) -> float:
        """Samples/s of the world's running jobs over the round [start, start +
        quantum_s), as Arena counts it: each job at its speed, less its restart
        stall's share of the round."""
        q = self.quantum_s
        thr = 0.0
        for j in world.running.values():
            if j.iter_time and j.spec is not None and not j.checkpointing:
                stalled = min(q, max(0.0, j.stall_until - start))
                thr += j.spec.global_batch / j.iter_time * (1.0 - stalled / q)
        return thr
