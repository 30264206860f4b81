"""The site's GPU and job-count limits at the moment of a release
(docs/site-policy-slurm.md).

The solver's plan keeps every account, user and QOS within its limits once
the round's moves are done. Between the signal and the end of a moved job,
though, the job still runs and holds its GPUs: a job released onto the GPUs
it gives back would be over the limit until then, and Slurm would keep it
pending (Reason=AssocGrpGRES, AssocGrpJobsLimit) and start it once the limit
allows. cellsched does not lean on that: `within_limits` holds back the
release of any job that would put a bucket over its limit counting what is
held now (running and checkpointing jobs, and the released ones that Slurm
will start), higher Slurm priority first; a job held back is placed in a
later round.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from slurm_ext.controller.inputs import ManagedJob, Phase
from slurm_ext.controller.reconcile import Action, ActionKind
from solver.limits import Bucket, Loads, bindings, held_in
from solver.types import ScheduleRequest

log = logging.getLogger("cellsched.controller")

#: the phases in which a job holds GPUs, or will without another word from us
HOLDING = (Phase.RUNNING, Phase.CHECKPOINTING, Phase.RELEASED)


def within_limits(
    actions: Sequence[Action], jobs: Sequence[ManagedJob], request: ScheduleRequest
) -> tuple[tuple[Action, ...], dict[str, str]]:
    """The actions without the releases that would go over a GPU limit now,
    and why each of those waits (module doc; which limit binds which job and
    the count against its headroom: solver.limits)."""
    limits = request.site.limits
    if not limits:
        return tuple(actions), {}
    reqs = {j.job_id: j for j in request.jobs}

    def buckets(job_id: str) -> list[Bucket]:  # per-job limits are the plan's: nothing frees them
        job = reqs.get(job_id)
        return [] if job is None else [b for b in bindings(limits, job) if not b.per_job]

    placing = {a.job_id for a in actions if a.kind == ActionKind.PLACE}
    held = Loads()
    for m in jobs:
        if m.phase in HOLDING and m.current is not None and not (m.phase == Phase.RELEASED and m.job_id in placing):
            held.add(buckets(m.job_id), held_in(m.current.cell))
    waits: dict[str, str] = {}
    for a in sorted(actions, key=lambda a: -(reqs[a.job_id].priority if a.job_id in reqs else 0.0)):
        if a.kind != ActionKind.PLACE or a.placement is None:
            continue
        bs, cell = buckets(a.job_id), held_in(a.placement.cell)
        over = held.blocking(bs, cell)
        if over is not None:
            freed = "running jobs to end" if over[0].limit.kind.jobs else "GPUs being freed"
            waits[a.job_id] = f"{over[0].reason(over[1])}: waits for {freed}"
            continue
        held.add(bs, cell)
    for job_id, why in waits.items():
        log.info("release held back by a GPU limit", extra={"fields": {"job": job_id, "why": why}})
    return tuple(a for a in actions if a.job_id not in waits or a.kind != ActionKind.PLACE), waits
