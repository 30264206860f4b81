"""What a job's declared iterations are worth: learned from the jobs that completed.

A user's ``--iterations`` is a guess, as a Slurm time limit is: a job may end
(early stopping, a target reached, the user's own cancel that exits 0)
before the iterations it declared, never after them (the controller does not
believe progress beyond them: slurm_ext.controller.progress). With
``[controller] learn_declared_work`` the controller keeps, for each managed
job that COMPLETED, the fraction of its declared iterations it trained
(its last progress over its spec's iterations: its *accuracy*), the last
`KEEP` of them, and schedules every other job on its expected total given how
far it is: with declared D, d iterations done and the accuracies a_i seen,

    E[T | T > d] = mean of a_i D over the a_i with a_i D > d   (at most D),

the declared D when no completed job ran that long (or none completed yet).
So a job that has outlived most of its like is expected to run to its
declaration, and one that just started to the site's typical fraction of it.
The policy sees that total as the request's ``iterations`` (its remaining
work is the total less the progress), every round; the job's spec, statuses
and progress checks keep the declared one. Nothing is written to the state
DB: a restarted controller learns again.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Iterable

from slurm_ext.controller import inputs as inp
from slurm_ext.controller.progress import ProgressReader, Unreadable

#: the completed jobs whose accuracy is kept (the most recent)
KEEP = 1000


class DeclaredWork:
    """The accuracies of completed jobs and the expected totals they give (module doc)."""

    def __init__(self, progress: ProgressReader, keep: int = KEEP) -> None:
        self.progress = progress
        self.accuracies: deque[float] = deque(maxlen=keep)
        self._seen: set[str] = set()

    def observe(self, jobs: Iterable[inp.ManagedJob]) -> None:
        """Each managed job that completed since the last call: its accuracy
        (its own last progress report over its declared iterations, read once)."""
        for m in jobs:
            if m.phase != inp.Phase.FINISHED or m.job.state != "COMPLETED" or m.job_id in self._seen:
                continue
            self._seen.add(m.job_id)
            if m.spec is None or m.spec.iterations < 1:
                continue
            try:
                report = self.progress(m)
            except Unreadable:
                continue
            if report is not None:
                self.accuracies.append(min(1.0, max(0.0, report.iterations_done / m.spec.iterations)))

    def expected(self, declared: float, done: float) -> float:
        """The expected total iterations of a job that declared `declared` and has done `done` (module doc)."""
        longer = [a * declared for a in self.accuracies if a * declared > done]
        return min(declared, sum(longer) / len(longer)) if longer else declared

    def applied(self, built: inp.Inputs) -> inp.Inputs:
        """The round's request with each job's expected total as its iterations."""
        if not self.accuracies:
            return built
        jobs = tuple(
            dataclasses.replace(j, iterations=math.ceil(self.expected(j.iterations, j.iterations_done)))
            for j in built.request.jobs
        )
        return dataclasses.replace(built, request=dataclasses.replace(built.request, jobs=jobs))
