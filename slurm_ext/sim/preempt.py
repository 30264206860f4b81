"""Slurm's own preemption in the simulated Slurm (``PreemptType=preempt/qos``;
docs/simulator.md#slurms-preemption): the rule by which a pending job of a
QOS that preempts picks its victims, and what the site's preemption is.

* A QOS of the cluster file may name the QOS it preempts (``preempt =
  ["normal"]``, Slurm's Preempt=); a QOS's ``grace_s`` is its GraceTime;
  the site's ``preempt_mode`` is Slurm's PreemptMode, REQUEUE (default) or
  CANCEL.
* A pending job of a QOS that preempts, which Slurm would start (not held,
  at its begin time, within its limits: Slurm does not preempt past a
  limit) but which does not fit, picks running jobs of the QOS it preempts
  as preempt/qos does: lowest priority (their QOS's Priority) first,
  youngest (latest start) first among equals, until it would fit on the
  nodes it may use with their GPUs freed; then those it does not need are
  let go, the last picked first. The GPUs of jobs already preempted (in
  their grace time) count as free: a job they would make fit picks no more.
* A victim gets its PreemptTime (``SlurmJob.preempted_at``) and Slurm's
  SIGTERM. A managed elastic job (its launcher checkpoints on the signal)
  whose checkpoint (the world's ``checkpoint_s``, the time it prices a
  move's checkpoint at) fits in its grace time checkpoints and ends FAILED
  with exit 75, its progress kept, PreemptTime set: Slurm 22.05 does not
  requeue it, whatever the mode. Any other is killed at the end of its
  grace time: with REQUEUE it is pending again, not held, its restarts + 1,
  its progress back to its last checkpoint, its SubmitTime moved to the
  requeue, its BeginTime the world's ``requeue_delay_s`` later and its
  PreemptTime reset; with CANCEL it ends PREEMPTED, exit 0, PreemptTime
  kept (docs/preemption.md).

Not modelled: 22.05's grace time ending up to 5 s late, KillWait (a job
killed at the end of its grace time saves nothing after it), SUSPEND and
GANG, preemption by partition PriorityTier, PreemptExemptTime, and the
multifactor priority of a victim (its QOS's Priority stands for it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from slurm_ext.sim.types import SiteSpec

#: Slurm's PreemptMode values the simulated Slurm models
PREEMPT_MODES = ("REQUEUE", "CANCEL")


class Running(Protocol):
    """What the rule reads of a running job (slurm_ext.sim.world.SimJob)."""

    @property
    def job_id(self) -> str: ...

    @property
    def qos(self) -> str: ...

    @property
    def nodes(self) -> tuple[str, ...]: ...

    @property
    def gres(self) -> int: ...

    @property
    def start_time(self) -> float | None: ...

    @property
    def preempt_at(self) -> float | None: ...


def _free(freed: dict[str, int], job: Running, sign: int) -> None:
    for n in job.nodes:
        freed[n] = freed.get(n, 0) + sign * job.gres


@dataclass(frozen=True)
class SlurmPreemption:
    """The site's preemption (module doc): QOS -> the QOS it preempts, each
    QOS's GraceTime and Priority, and the PreemptMode."""

    preempts: Mapping[str, frozenset[str]]
    grace_s: Mapping[str, float]
    priority: Mapping[str, float]
    mode: str = "REQUEUE"

    @classmethod
    def of_site(cls, site: SiteSpec | None) -> SlurmPreemption | None:
        """The preemption of a simulated site; None when no QOS preempts (or no site)."""
        if site is None or not any(q.preempt for q in site.qos):
            return None
        return cls(
            {q.name: frozenset(q.preempt) for q in site.qos if q.preempt},
            {q.name: q.grace_s for q in site.qos},
            {q.name: q.priority for q in site.qos},
            site.preempt_mode,
        )

    def preempts_any(self, qos: str) -> bool:
        """May a job of `qos` preempt others?"""
        return bool(self.preempts.get(qos))

    def grace(self, qos: str) -> float:
        """The GraceTime of a job of `qos` (0: none)."""
        return self.grace_s.get(qos, 0.0)

    def victims(
        self, qos: str, running: Iterable[Running], nodes_for: Callable[[Mapping[str, int]], object]
    ) -> tuple[str, ...]:
        """The ids of the running jobs a pending job of `qos` preempts (module
        doc); () when it needs none or cannot fit even with all of them.
        `running`: every running job (those preempted already free their GPUs
        soon); `nodes_for(freed)`: where the job would start with `freed`
        (node -> GPUs) more GPUs free, None (falsy) where nowhere."""
        running = tuple(running)
        freed: dict[str, int] = {}
        for j in running:
            if j.preempt_at is not None:
                _free(freed, j, 1)
        if nodes_for(freed):
            return ()
        mine = self.preempts.get(qos, frozenset())
        pool = sorted(
            (j for j in running if j.preempt_at is None and j.qos in mine),
            key=lambda j: (self.priority.get(j.qos, 0.0), -(j.start_time or 0.0), j.job_id),
        )
        chosen: list[Running] = []
        for j in pool:
            chosen.append(j)
            _free(freed, j, 1)
            if nodes_for(freed):
                break
        else:
            return ()
        for j in reversed(chosen[:-1]):  # let go those it does not need, the last picked first
            _free(freed, j, -1)
            if nodes_for(freed):
                chosen.remove(j)
            else:
                _free(freed, j, 1)
        return tuple(j.job_id for j in chosen)
