"""What an estimator is to the rest of the solver: the interfaces, declared once.

* `EstimatorLike`: what policies, the controller and the simulator ask of
  an estimator. Estimators compose as explicit stages, each over the one
  before it (``solver.estimator.stages`` says which and in what order):
  the profile store's `Estimator` (single-type cells), `MixedEstimator`
  (mixed cells), `NicAwareEstimator` (the cluster's network cards) and
  `CalibratedEstimator` (what jobs reported). A stage forwards to the one
  below only what the protocol names.
* `CostModel`: what a single-type estimator prices its cells with, which
  mixed cells are composed from (solver.mixed): per-layer costs, links,
  GPU specs, memory limits, the runtimes' pricing and the settings. An
  estimator without one (a plain table of iteration times) answers None.
* `CostSettings`: the cost model's assumptions (efficiency, optimizer
  bytes, gradient sync, ...), one frozen value.

`EstimatorBase` gives a stage that has nothing to add the protocol's
neutral answers (no calibration, no store, no cost model).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from solver.cost.pipeline import ALLREDUCE, GRAD_SYNCS
from solver.types import Cell, Estimate, JobRequest

if TYPE_CHECKING:
    from solver.contract.models import ModelSpec
    from solver.contract.profiles.records import GpuSpec
    from solver.cost.comm import Links
    from solver.cost.layers import LayerCosts
    from solver.cost.runtime import Pricing
    from solver.types import ParallelPlan


@dataclass(frozen=True)
class CostSettings:
    """The cost model's assumptions (``Estimator``'s keyword arguments; its
    module doc says what each prices).

    `mem_fraction` of a GPU's memory a plan may use; `optimizer_bytes_per_param`
    parameters, gradients and optimizer state per parameter; `efficiency` the
    fraction of peak TFLOP/s the analytic model assumes; `layer_overhead_s`
    one layer's fixed forward + backward per micro-batch; `max_pp` the
    deepest pipeline considered when locating a measured optimum;
    `update_bytes_per_param` the memory traffic of one weight update per
    parameter (None: the optimizer state read and written once, 2 x
    optimizer_bytes_per_param; 0 leaves the update out); `grad_sync` how
    gradients are summed over dp ranks (``solver.cost.pipeline.GRAD_SYNCS``);
    `state_sharding` lets plans shard the optimizer state over dp ranks,
    chosen where nothing fits without it or it is more than
    `shard_min_gain` faster; `accumulate_bytes_per_param` the memory traffic
    per parameter of adding one gradient into another (0: not priced)."""

    mem_fraction: float = 0.9
    optimizer_bytes_per_param: float = 16.0
    efficiency: float = 0.4
    layer_overhead_s: float = 2e-4
    max_pp: int = 8
    update_bytes_per_param: float | None = None
    grad_sync: str = ALLREDUCE
    state_sharding: bool = True
    shard_min_gain: float = 0.1
    accumulate_bytes_per_param: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.mem_fraction <= 1:
            raise ValueError(f"mem_fraction must be in (0, 1], got {self.mem_fraction}")
        if self.grad_sync not in GRAD_SYNCS:
            raise ValueError(f"grad_sync must be one of {GRAD_SYNCS}, got {self.grad_sync!r}")
        if self.accumulate_bytes_per_param < 0:
            raise ValueError(f"accumulate_bytes_per_param must be >= 0, got {self.accumulate_bytes_per_param}")

    @property
    def update_bytes(self) -> float:
        """`update_bytes_per_param`, its default resolved."""
        if self.update_bytes_per_param is None:
            return 2 * self.optimizer_bytes_per_param
        return self.update_bytes_per_param


class CostModel(Protocol):
    """What a single-type estimator prices its cells with (module doc)."""

    @property
    def settings(self) -> CostSettings: ...

    def pricing(self, runtime: str) -> Pricing:
        """How plans of `runtime` are priced (solver.cost.runtime)."""
        ...

    def layer_costs(self, model: ModelSpec, gpu_type: str, tp: int, b: int) -> LayerCosts | None:
        """Per-layer costs on one GPU of `gpu_type` at `tp` for micro-batches of `b` (None: none)."""
        ...

    def layer_scale(self, model: ModelSpec, global_batch: int, cell: Cell, tp: int) -> float:
        """The factor that puts `layer_costs` on the scale of this estimator's cell estimates."""
        ...

    def links_of(self, gpu_type: str) -> Links:
        """Communication costs of `gpu_type`'s intra-node link and the network."""
        ...

    def gpu_spec(self, gpu_type: str) -> GpuSpec | None: ...

    def mem_limit_gb(self, gpu_type: str) -> float:
        """Memory a plan may use per GPU of this type (inf when the type is unknown)."""
        ...

    def plans(self, job: JobRequest, cell: Cell) -> list[tuple[ParallelPlan, float, float]] | None:
        """Every candidate plan of `job` in a single-type cell, fitting or not, as
        (plan, iteration time s, peak memory GB per GPU); None: this model cannot list them."""
        ...


class EstimatorLike(Protocol):
    """What policies, the controller and the simulator ask of an estimator (module doc)."""

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        """The job's estimate in `cell`: `estimate_shape`'s, `adjust`ed for the job."""
        ...

    def estimate_shape(self, job: JobRequest, cell: Cell) -> Estimate:
        """The estimate before anything of the job itself is applied (its
        calibration): the same for every job of its shape (model, batch,
        runtime, constraints), so a policy may share it between them."""
        ...

    def adjust(self, job: JobRequest, estimates: Iterable[Estimate]) -> list[Estimate]:
        """`estimate_shape`'s estimates of `job` with what is the job's own applied."""
        ...

    def job_key(self, job: JobRequest) -> tuple[object, ...]:
        """What `adjust` does to `job` depends on, hashable (() when nothing)."""
        ...

    def refresh(self) -> bool:
        """Follow the profile store: True when it changed and every estimate was forgotten."""
        ...

    @property
    def cost_model(self) -> CostModel | None:
        """What its single-type cells are priced with (None: no cost model)."""
        ...


class EstimatorBase:
    """The protocol's neutral answers, for a stage (or a test's estimator)
    that defines `estimate` alone: nothing job-specific, no store to follow,
    no cost model."""

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        raise NotImplementedError

    def estimate_shape(self, job: JobRequest, cell: Cell) -> Estimate:
        return self.estimate(job, cell)

    def adjust(self, job: JobRequest, estimates: Iterable[Estimate]) -> list[Estimate]:
        return list(estimates)

    def job_key(self, job: JobRequest) -> tuple[object, ...]:
        return ()

    def refresh(self) -> bool:
        return False

    @property
    def cost_model(self) -> CostModel | None:
        return None
