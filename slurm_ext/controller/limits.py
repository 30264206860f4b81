"""The site's GPU limits at the moment of a release (docs/site-policy-slurm.md).

The solver's plan keeps every account, user and QOS within its GPU limits
once the round's moves are done. Between the signal and the end of a moved
job, though, the job still holds its GPUs: a job released onto the GPUs it
gives back would be over the limit until then, and Slurm would keep it
pending (Reason=AssocGrpGRES) and start it once the limit allows. cellsched
does not lean on that: `within_limits` holds back the release of any job
that would put a bucket over its limit counting the GPUs held now (running
and checkpointing jobs, and the released ones that Slurm will start), higher
Slurm priority first; a job held back is placed in a later round.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from slurm_ext.controller.inputs import ManagedJob, Phase
from slurm_ext.controller.reconcile import Action, ActionKind
from solver.placement.siterules import Bucket, bucket_of
from solver.types import JobRequest, ScheduleRequest

log = logging.getLogger("cellsched.controller")

#: the phases in which a job holds GPUs, or will without another word from us
HOLDING = (Phase.RUNNING, Phase.CHECKPOINTING, Phase.RELEASED)


def within_limits(
    actions: Sequence[Action], jobs: Sequence[ManagedJob], request: ScheduleRequest
) -> tuple[tuple[Action, ...], dict[str, str]]:
    """The actions without the releases that would go over a GPU limit now,
    and why each of those waits (module doc)."""
    limits = request.site.limits
    if not limits:
        return tuple(actions), {}
    reqs = {j.job_id: j for j in request.jobs}

    def buckets(job: JobRequest | None) -> list[Bucket]:
        return [] if job is None else [b for lim in limits if (b := bucket_of(lim, job)) is not None]

    placing = {a.job_id for a in actions if a.kind == ActionKind.PLACE}
    held: dict[str, int] = {}
    for m in jobs:
        if m.phase in HOLDING and m.current is not None and not (m.phase == Phase.RELEASED and m.job_id in placing):
            for b in buckets(reqs.get(m.job_id)):
                held[b.key] = held.get(b.key, 0) + b.gpus(m.current.cell)
    waits: dict[str, str] = {}
    for a in sorted(actions, key=lambda a: -(reqs[a.job_id].priority if a.job_id in reqs else 0.0)):
        if a.kind != ActionKind.PLACE or a.placement is None:
            continue
        cell = a.placement.cell
        bs = buckets(reqs.get(a.job_id))
        over = next((b for b in bs if held.get(b.key, 0) + b.gpus(cell) > b.limit.headroom), None)
        if over is not None:
            waits[a.job_id] = (
                f"{over.reason(held.get(over.key, 0) + over.limit.used_outside)}: waits for GPUs being freed"
            )
            continue
        for b in bs:
            held[b.key] = held.get(b.key, 0) + b.gpus(cell)
    for job_id, why in waits.items():
        log.info("release held back by a GPU limit", extra={"fields": {"job": job_id, "why": why}})
    return tuple(a for a in actions if a.job_id not in waits or a.kind != ActionKind.PLACE), waits
