"""The job plan: what the controller writes into a job's AdminComment and the
launch runtime reads back (or from ``CELLSCHED_PLAN``).

Kept free of heavy imports (stdlib only) so ``cellsched-launch`` starts fast.
A minimal plan ``{"pp": 2, "dp": 2, "tp": 2}`` is valid; everything else has
a default.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from fractions import Fraction
from typing import Any

from solver.contract.errors import SolverError
from solver.contract.runtimes import RUNTIMES, Layout, UnknownRuntime, get_runtime

PLAN_VERSION = 1
#: Slurm keeps comments of any length, but a plan stays small: refuse a plan
#: that would not fit comfortably in an AdminComment / environment variable.
MAX_PLAN_BYTES = 8192


class PlanError(ValueError, SolverError):
    """A plan is missing, malformed or inconsistent."""


@dataclass(frozen=True)
class JobPlan:
    """Parallel layout and run-time settings of one job.

    pp/dp/tp: pipeline, data and tensor parallel degrees (pp*dp*tp tasks).
    micro_batches: micro-batches per iteration per pipeline (per virtual
      worker when virtual_workers is set).
    global_batch: samples per iteration (None: the trainer decides).
    gpu_types / nodes / gpus_per_node: where it runs (informational for the job).
    batch_shares: one weight per dp rank (uneven batches, Cephalo); None = even.
    stage_layers: layers per pipeline stage; None = split evenly.
    state_sharding: optimizer state over the dp ranks: None / "none"
      (replicated), "even", or "memory" (slices proportional to
      state_shares, else to each GPU's memory; Cephalo).
    state_shares: one memory weight per dp rank for "memory" sharding;
      giving them without state_sharding means "memory".
    virtual_workers: EasyScale virtual dp workers V (None = dp). dp rank d
      runs ``virtual_worker_counts(V, dp, batch_shares)[d]`` consecutive
      ones (uneven when dp does not divide V), so any dp <= V trains
      bitwise the same.
    checkpoint_dir: where to checkpoint / resume; the job also writes its
      progress there (``progress.json``: step, iterations_done, time), the
      channel through which the controller learns a running job's progress.
    runtime: the runtime that carries the plan out (solver.contract.runtimes; None:
      the job's code reads the degrees itself, as ``exact`` did before runtimes
      had names).
    cell: the cell key the solver chose; job_id: the Slurm job id (the
      launcher refuses a plan whose job_id is not its SLURM_JOB_ID).
    """

    pp: int = 1
    dp: int = 1
    tp: int = 1
    micro_batches: int = 1
    global_batch: int | None = None
    gpu_types: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    gpus_per_node: int | None = None
    batch_shares: tuple[float, ...] | None = None
    stage_layers: tuple[int, ...] | None = None
    state_sharding: str | None = None
    state_shares: tuple[float, ...] | None = None
    virtual_workers: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    runtime: str | None = None
    cell: str | None = None
    job_id: str | None = None
    iter_time_s: float | None = None
    version: int = PLAN_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for k in ("pp", "dp", "tp", "micro_batches"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise PlanError(f"plan field '{k}' must be an integer >= 1, got {v!r}")
        if self.global_batch is not None and (not isinstance(self.global_batch, int) or self.global_batch < 1):
            raise PlanError(f"plan field 'global_batch' must be an integer >= 1, got {self.global_batch!r}")
        for k in ("batch_shares", "state_shares"):
            shares = getattr(self, k)
            if shares is None:
                continue
            if len(shares) != self.dp:
                raise PlanError(f"plan field '{k}' needs {self.dp} entries (one per dp rank), got {len(shares)}")
            if any((not isinstance(s, (int, float))) or isinstance(s, bool) or s <= 0 for s in shares):
                raise PlanError(f"plan field '{k}' must hold positive numbers")
        if self.state_sharding not in (None, "none", "even", "memory"):
            raise PlanError(
                f"plan field 'state_sharding' must be 'none', 'even' or 'memory', got {self.state_sharding!r}"
            )
        if self.stage_layers is not None:
            if len(self.stage_layers) != self.pp or any(
                not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in self.stage_layers
            ):
                raise PlanError(
                    f"plan field 'stage_layers' needs {self.pp} integers >= 1 (one per stage),"
                    f" got {list(self.stage_layers)}"
                )
        if self.virtual_workers is not None:
            if (
                not isinstance(self.virtual_workers, int)
                or isinstance(self.virtual_workers, bool)
                or self.virtual_workers < 1
            ):
                raise PlanError(f"plan field 'virtual_workers' must be an integer >= 1, got {self.virtual_workers!r}")
            if self.virtual_workers < self.dp:
                raise PlanError(
                    f"plan field 'virtual_workers' ({self.virtual_workers}) must be at least dp ({self.dp}):"
                    " every dp rank runs at least one virtual worker"
                )
        if self.runtime is not None:
            try:
                get_runtime(self.runtime)
            except UnknownRuntime:
                raise PlanError(
                    f"plan field 'runtime' must be one of {', '.join(RUNTIMES)}, got {self.runtime!r}"
                ) from None
        if self.version > PLAN_VERSION:
            raise PlanError(f"plan version {self.version} is newer than this cellsched understands ({PLAN_VERSION})")

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def layout(self) -> Layout:
        """What of this plan a resume depends on (solver.contract.runtimes.move_problem)."""
        return Layout(self.pp, self.dp, self.tp, frozenset(self.gpu_types))

    def to_json(self) -> str:
        """Compact JSON without defaults that carry no information."""
        d = {k: v for k, v in asdict(self).items() if v not in (None, (), {}) or k in ("pp", "dp", "tp")}
        text = json.dumps(d, separators=(",", ":"), sort_keys=True)
        if len(text.encode()) > MAX_PLAN_BYTES:
            raise PlanError(f"plan is {len(text)} bytes, more than {MAX_PLAN_BYTES}")
        return text

    @classmethod
    def from_dict(cls, d: object) -> JobPlan:
        if not isinstance(d, dict):
            raise PlanError(f"plan must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        kwargs = {k: v for k, v in d.items() if k in known}
        for k in ("gpu_types", "nodes", "batch_shares", "state_shares", "stage_layers"):
            if kwargs.get(k) is not None:
                if not isinstance(kwargs[k], (list, tuple)):
                    raise PlanError(f"plan field '{k}' must be a list")
                kwargs[k] = tuple(kwargs[k])
        extra = dict(kwargs.pop("extra", {}) or {})
        extra.update({k: d[k] for k in unknown})
        try:
            return cls(**kwargs, extra=extra)
        except TypeError as e:  # pragma: no cover - defensive
            raise PlanError(str(e)) from None

    @classmethod
    def from_json(cls, text: str) -> JobPlan:
        if text is None or not str(text).strip():
            raise PlanError("plan is empty")
        if len(text.encode()) > MAX_PLAN_BYTES:
            raise PlanError(f"plan is {len(text)} bytes, more than {MAX_PLAN_BYTES}")
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"plan is not valid JSON: {e}") from None
        return cls.from_dict(d)


def largest_remainder(total: int, weights: Sequence[float]) -> tuple[int, ...]:
    """Split TOTAL into integers proportional to WEIGHTS (Hamilton's method).

    Deterministic: leftover units go to the largest remainders, ties to the
    lower index.
    """
    if total < 0 or not weights or any(w <= 0 for w in weights):
        raise PlanError(f"cannot split {total} by weights {list(weights)}")
    exact = [Fraction(w) for w in weights]  # exact remainders: equal ones really tie
    s = sum(exact)
    quotas = [total * w / s for w in exact]
    parts = [int(q) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - parts[i]), i))
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return tuple(parts)


def virtual_worker_counts(virtual_workers: int, dp: int, shares: Sequence[float] | None = None) -> tuple[int, ...]:
    """How many of V virtual workers each of `dp` ranks runs: in proportion
    to `shares` (one weight per rank, e.g. its GPU's speed), evenly without;
    largest remainder, so the first ranks take the leftovers (V=4, dp=3:
    2, 1, 1). Every rank runs at least one; PlanError otherwise."""
    if dp < 1 or virtual_workers < dp:
        raise PlanError(f"{virtual_workers} virtual workers cannot be spread over dp={dp} ranks (need dp <= V)")
    if shares is not None and len(shares) != dp:
        raise PlanError(f"{len(shares)} shares for dp={dp} ranks")
    counts = largest_remainder(virtual_workers, list(shares) if shares is not None else [1] * dp)
    if min(counts) < 1:
        raise PlanError(f"shares {list(shares or ())} leave a dp rank without a virtual worker of {virtual_workers}")
    return counts


def default_virtual_workers(global_batch: int, max_dp: int) -> int:
    """The V an elastic job gets when it names none: the smallest divisor of
    the global batch that covers `max_dp` ranks (the largest dp the job may
    get), so every dp <= V keeps whole samples per virtual worker; the global
    batch itself when no divisor is that large (dp cannot exceed it)."""
    if global_batch < 1 or max_dp < 1:
        raise PlanError(f"need global_batch >= 1 and max_dp >= 1, got {global_batch}, {max_dp}")
    if max_dp >= global_batch:
        return global_batch
    return next(d for d in range(max_dp, global_batch + 1) if global_batch % d == 0)
