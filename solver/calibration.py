"""Online calibration: the iteration times jobs really reach correct the
estimates the policy decides with.

An observation is one job's observed / estimated iteration time on one GPU
type (its running cell, against the uncalibrated estimate of that cell),
with the number of rounds that saw it. `Calibration` turns them into a
factor per (job, cell), in log space, from two levels:

* the group of a (model, GPU type): the median over users of each user's
  median log ratio (one vote per user, so no user moves another's estimates
  alone), shrunk towards 1 by W / (W + 1), W the votes' summed weight
  n / (n + 1);
* the job itself: on a GPU type it was observed on, its own ratio (a direct
  measurement of this job on this type; nothing to shrink); on another type,
  the group's, plus the job's own deviation from its observed type's group,
  weighted n / (n + 1) (the part of a slowdown that belongs to the job, such
  as its input pipeline, travels with it).

A mixed-type cell takes the largest factor of its types (its slowest part
sets the pace). Every factor is bounded by [1 / max_factor, max_factor].
`CalibratedEstimator` wraps any EstimatorLike with one.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from solver.estimator.protocol import CostModel, EstimatorBase, EstimatorLike
from solver.types import Cell, Estimate, JobRequest


@dataclass(frozen=True)
class Observation:
    """`job_id` (of `user`, model `model`) ran on `gpu_type` at `ratio` x its
    estimated iteration time, seen in `samples` rounds."""

    job_id: str
    user: str
    model: str
    gpu_type: str
    ratio: float
    samples: int = 1

    @property
    def weight(self) -> float:
        return self.samples / (self.samples + 1)


#: a job's ratio on a GPU type is the mean of about this many rounds' ratios (older ones fade)
MEMORY = 10


def running_ratio(prev: tuple[float, int] | None, ratio: float, memory: int = MEMORY) -> tuple[float, int]:
    """(mean ratio, samples) after one more round's `ratio`: the geometric
    mean with the previous mean weighted as min(samples, memory - 1) rounds."""
    if prev is None:
        return ratio, 1
    mean, n = prev
    k = min(n, memory - 1)
    return math.exp((k * math.log(mean) + math.log(ratio)) / (k + 1)), n + 1


class Calibration:
    """Factors on estimated iteration times, from observations (module doc)."""

    def __init__(self, observations: Iterable[Observation] = (), max_factor: float = 10.0) -> None:
        self.max_factor = max_factor
        bound = self._bound = math.log(max_factor)
        self._own: dict[str, dict[str, tuple[float, float]]] = defaultdict(dict)  # job -> type -> (log r, weight)
        votes: dict[tuple[str, str], dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
        for o in observations:
            if not (o.ratio > 0 and math.isfinite(o.ratio)) or o.samples < 1:
                continue
            lr = max(-bound, min(bound, math.log(o.ratio)))
            self._own[o.job_id][o.gpu_type] = (lr, o.weight)
            votes[(o.model, o.gpu_type)][o.user].append((lr, o.weight))
        self._group: dict[tuple[str, str], float] = {}
        for key, by_user in votes.items():
            per_user = [statistics.median(lr for lr, _ in v) for v in by_user.values()]
            w = sum(max(wt for _, wt in v) for v in by_user.values())
            self._group[key] = statistics.median(per_user) * w / (w + 1)
        self._by_model: dict[str, tuple[tuple[str, float], ...]] | None = None  # (type, group factor) by model

    def __bool__(self) -> bool:
        return bool(self._own)

    def key(self, job_id: str, model: str) -> tuple[object, ...]:
        """What the factors of `job_id` (of `model`) depend on, hashable: two
        equal keys give equal factors in every cell, so a cache of calibrated
        estimates keys on it (one key for the jobs of a model not seen yet)."""
        if self._by_model is None:
            by_model: dict[str, list[tuple[str, float]]] = defaultdict(list)
            for (m, t), v in sorted(self._group.items()):
                by_model[m].append((t, v))
            self._by_model = {m: tuple(v) for m, v in by_model.items()}
        own = self._own.get(job_id)
        return (tuple(sorted(own.items())) if own else (), self._by_model.get(model, ()), self.max_factor)

    def group(self, model: str, gpu_type: str) -> float:
        """The (model, GPU type) factor alone."""
        return math.exp(self._group.get((model, gpu_type), 0.0))

    def _log_factor(self, job_id: str, model: str, gpu_type: str) -> float:
        own = self._own.get(job_id, {})
        if gpu_type in own:
            return own[gpu_type][0]
        base = self._group.get((model, gpu_type), 0.0)
        if not own:
            return base
        t, (lr, w) = max(own.items(), key=lambda kv: kv[1][1])  # the type seen longest
        return base + w * (lr - self._group.get((model, t), 0.0))

    def factor(self, job_id: str, model: str, cell: Cell) -> float:
        """The factor on the estimated iteration time of `job_id` in `cell`."""
        if cell.mixed:
            lf = max(self._log_factor(job_id, model, t) for t, _ in cell.by_type())
        else:
            lf = self._log_factor(job_id, model, cell.gpu_type)
        bound = self._bound
        return math.exp(max(-bound, min(bound, lf)))


class CalibratedEstimator(EstimatorBase):
    """An EstimatorLike stage whose times are the inner estimator's times the
    calibration's factor (`calibration` is replaced every round): the
    factor is the job's own (`adjust`), on estimates that are its shape's
    (`estimate_shape`: the inner estimator's)."""

    def __init__(self, inner: EstimatorLike, calibration: Calibration | None = None) -> None:
        self.inner = inner
        self.calibration = calibration or Calibration()

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        return self.adjust(job, (self.estimate_shape(job, cell),))[0]

    def estimate_shape(self, job: JobRequest, cell: Cell) -> Estimate:
        return self.inner.estimate_shape(job, cell)

    def adjust(self, job: JobRequest, estimates: Iterable[Estimate]) -> list[Estimate]:
        """Each of `estimates` (the inner estimator's for `job`) times the
        job's factor in its cell; a factor depends on the cell's GPU type(s)
        alone (``Calibration.factor``), so each is computed once."""
        ests = self.inner.adjust(job, estimates)
        if not self.calibration:
            return ests
        marks: dict[str, tuple[float, str]] = {}  # GPU type -> (factor, its note)
        out = []
        for est in ests:
            if est.feasible:
                mark = marks.get(est.cell.gpu_type)
                if mark is None:
                    f = self.calibration.factor(job.job_id, job.model.name, est.cell)
                    mark = marks[est.cell.gpu_type] = (f, f"x{f:.3g} calibrated")
                f, note = mark
                if f != 1.0:
                    est = est.scaled(f, f"{est.note}; {note}" if est.note else note)
            out.append(est)
        return out

    def job_key(self, job: JobRequest) -> tuple[object, ...]:
        """What calibration does to `job`'s estimates now (``Calibration.key``; () when uncalibrated):
        a policy that caches estimates by the job's shape adds it to its key."""
        own = self.calibration.key(job.job_id, job.model.name) if self.calibration else ()
        inner = self.inner.job_key(job)
        return own if not inner else (own, inner)

    def refresh(self) -> bool:
        return self.inner.refresh()

    @property
    def cost_model(self) -> CostModel | None:
        return self.inner.cost_model


__all__ = ["Observation", "Calibration", "CalibratedEstimator", "running_ratio"]
