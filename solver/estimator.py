"""The estimator: iteration time, per-GPU memory and best parallel plan of a
model in a cell, from the best source the profile store holds.

Sources, first that applies (the Estimate's ``source`` says which):

1. ``measured``: a cell-level record of exactly this (model name, global
   batch, GPU type, nodes, GPUs per node); source "measured" (our profiler)
   wins over "arena-optimal". Its time is the best over all plans, so it
   belongs to ONE pipeline depth p*: the pp of the fastest per-plan record of
   the layout (measured, else arena-estimated; only plans our search allows)
   or, without those, the pp whose best modelled plan is fastest. The cell
   with pp = p* gets the measured time exactly; a cell with another pp gets
   ``max(T*, T* x model(pp) / model(p*))`` (source ``measured+pp``), so no
   pp beats the measured optimum. An out-of-memory record makes every pp of
   the layout infeasible. Per-plan "measured" records replace the modelled
   time of their (pp, dp, tp) only.
2. ``composed``: from layer profiles of (model signature, GPU type, tp,
   micro-batch) and communication curves (see ``solver.cost``). A profile at
   another micro-batch size is scaled per sample from the nearest profiled
   size (log distance, ties to the larger). When some tp degree of the cell
   has a profile (of at least pp layers), only such tp degrees are
   considered, so one cell's plans come from one source.
3. ``analytic``: the GPU's peak TFLOP/s x `efficiency` and the model's cost
   helpers, through the same pipeline and communication formulas. When the
   store has measured cells of the same model, the time is scaled by
   ``median(measured / analytic)`` over the nearest of them (same GPU type,
   batch and GPU count; else same type and batch; else same type; else all;
   analytic = best plan over all pp, memory ignored): ``analytic+calibrated``.

Modelled times (composed and analytic) include the weight update, a sweep
over the optimizer state at the GPU's memory bandwidth (``mem_bw_gbps``; see
``solver.cost.pipeline``), and the dp gradient sync: a ring all-reduce, or
with ``grad_sync="allgather"`` an all-gather of each rank's gradients (one
per virtual worker it runs) added in rank order, as the reference trainer
does for bitwise-reproducible sums. With ``accumulate_bytes_per_param`` > 0
they also price adding one gradient into another at that bandwidth: each
micro-batch's into the step's (every micro-batch but a worker's first) and,
under "allgather", the gathered gradients in rank order (dp x k - 1 adds).

Runtimes (``JobRequest.runtime``, ``solver.contract.runtimes``): a job is priced as
its runtime runs (``solver.cost.runtime``: its gradient sync, state layout
and buffers, per rank at its peak) and offered only plans it carries out
(tp, pp, even stages, dp = V without virtual workers, m >= pp under torch's
1F1B); a runtime that cannot run a cell gets an infeasible Estimate naming
why. ``adaptive`` (the simulator's trace jobs, and a JobRequest that names
none) keeps this estimator's own settings; the others are priced by their
own model. Measurements name no runtime and hold for every runtime: a
per-plan one prices that plan wherever the runtime runs it; a cell-level one
gives a named runtime its own best plan of the cell at the measured time
(scaled by its model to another pp, or to V virtual workers). Their layers'
times come from the records profiled as the runtime wraps its layers where
the store has them (``runtime_gpu_type``: FSDP2's hooks and copies, DTensor's
dispatch), and a micro-batch size between two profiled ones is priced on the
line through their times (a fixed part per micro-batch, a part per sample:
``Estimator._ref``), not by the nearest one's time per sample.

Inside a cell (pp fixed) the search covers tp dividing the GPUs per node
(and the heads; the hidden size for non-transformers), dp = GPUs / (pp tp)
dividing the global batch, and every micro-batch count m dividing the
per-replica batch. The fastest plan whose peak memory fits `mem_fraction` x
GPU memory wins; none fitting gives an infeasible Estimate noted "OOM".
Estimates are cached per (model signature, global batch, cell, V, runtime), until
the store changes (`refresh`, which the controller calls every round).

Virtual workers (EasyScale; ``JobRequest.virtual_workers`` = V, None = one
per dp rank, the search above): V must divide the global batch B, plans
keep dp <= V (dp need not divide B), m runs over the divisors of B / V (m
micro-batches of b = B / V / m per virtual worker), and the busiest rank
runs k = ceil(V / dp) = max(virtual_worker_counts(V, dp)) virtual workers
one after the other: time = k x pipeline time (m micro-batches of b) + the
gradient sync + the weight update (once); memory is that of micro-batch b.
With dp = V this is the plan without V. A cell whose every plan needs
dp > V, or a V not dividing B, is infeasible with a note. Measured times
are carried by the model: a cell record's T* becomes ``max(T*, T* x
model_V(cell) / model(p*))`` (model_V: the best plan under V; at p* with
none fitting, the measured plan's (dp, tp) under V with the least memory;
model(p*): the measured plan's own modelled time), so T* stands where the model says V
costs nothing (pp 1, dp dividing V) and grows by the busiest rank's
k x dp / V and the extra pipeline fills otherwise; an optimum whose plan
the model lacks is scaled by k x dp / V of the plan shown. A per-plan record
is scaled by ``max(1, model_V(plan) / model(same pp, dp, tp))``, or by
k x dp / V when the plan has no counterpart without V from the same source.
"""

from __future__ import annotations

import bisect
import functools
import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from solver.contract.models import ModelSpec
from solver.contract.profiles.records import CellRecord, GpuSpec, ProfileSource, runtime_gpu_type
from solver.contract.runtimes import SOLVER_DEFAULT_RUNTIME, get_runtime, plan_problem
from solver.cost.comm import Links, load_curves
from solver.cost.layers import (
    LayerCosts,
    StageCosts,
    affine_layers,
    analytic_layers,
    layers_from_records,
    split_even,
    split_stages,
    uniform_sizes,
)
from solver.cost.pipeline import (
    ALLGATHER,
    ALLREDUCE,
    GRAD_SYNCS,
    dp_sync_time,
    pipeline_cost,
    replicated_state,
    sharded_memory,
    sharded_step_time,
    state_split,
    update_time,
)
from solver.cost.runtime import (
    ADD_SWEEP,
    COPY_SWEEP,
    Pricing,
    exact_copy_bytes,
    fsdp_sync_time,
    pricing_of,
    runtime_memory,
    sweep_time,
    zero1_allreduce_time,
    zero1_gather_bytes,
)
from solver.types import Cell, Estimate, EstimateSource, JobRequest, ParallelPlan

if TYPE_CHECKING:
    from solver.contract.profiles.store import ProfileStore

_CELL_SOURCES = (ProfileSource.MEASURED, ProfileSource.ARENA_OPTIMAL)  # cell-level, in order of preference
_GB = 1e9
_MAX_SIGS = 4096

_Layout = tuple[int, str, int, int]  # (global batch, gpu type, nodes, gpus per node)
#: the profile a micro-batch size is priced from (Estimator._ref)
_Ref = int | tuple[int, int, int] | None
_Triple = tuple[int, int, int]  # (pp, dp, tp)


class _Cand(NamedTuple):
    """One candidate plan of a cell (pp is the cell's).

    `layers`: the trainer's layers per stage of its split; `twin`: for a
    plan with sharded optimizer state, the index of the same plan with
    replicated state (-1: this plan's state is replicated); `state_bytes`:
    its optimizer state per GPU at the stage of peak memory (-1: not worked
    out yet, see Estimator._state_gb)."""

    dp: int
    tp: int
    m: int
    time_s: float
    mem_bytes: float
    layers: tuple[int, ...] = ()
    twin: int = -1
    state_bytes: float = 0.0


class _StepAt(NamedTuple):
    """Where a step's end is priced: dp x tp ranks, `g` GPUs a node on
    `links`, `k` gradient units per rank, the model's dtype and the GPU's
    memory bandwidth."""

    dp: int
    tp: int
    g: int
    links: Links
    k: int
    dtype_bytes: int
    mem_bw: float


@dataclass(frozen=True)
class _Found:
    """The candidate plans of a cell under one model source.

    `best`: index of the best plan that fits in memory (`pick_sharded`),
    `fastest`: of the fastest plan with replicated state at all (None when
    there are no candidates). Plans with sharded state come after all the
    others, so a replicated plan has the same index with or without them."""

    source: EstimateSource
    plans: tuple[_Cand, ...]
    best: int | None
    fastest: int | None

    def plan(self, i: int, pp: int) -> ParallelPlan:
        c = self.plans[i]
        return ParallelPlan(
            pp, c.dp, c.tp, c.m, stage_layers=c.layers if pp > 1 else (), state_shares=(1.0,) if c.twin >= 0 else ()
        )


def pick_sharded(
    plain: tuple[float, int] | None, sharded: tuple[float, int] | None, min_gain: float
) -> tuple[float, int] | None:
    """The better of the best fitting plan with replicated state and the best
    with sharded state, as (time, index): the sharded one only where no
    replicated plan fits or it is faster by more than `min_gain` (a fraction)."""
    if sharded is None:
        return plain
    if plain is None or sharded[0] < plain[0] * (1.0 - min_gain):
        return sharded
    return plain


@dataclass
class _ModelData:
    """What the store holds for one model, loaded once."""

    model: ModelSpec
    cell_records: dict[_Layout, CellRecord]
    plan_records: dict[_Layout, dict[_Triple, CellRecord]]  # per-plan "measured"
    arena_plans: dict[_Layout, list[CellRecord]]  # per-plan "arena-estimated"
    layer_batches: dict[tuple[str, int], list[int]]  # (gpu type, tp) -> profiled micro-batches
    layer_costs: dict[tuple[str, int, _Ref], LayerCosts] = field(default_factory=dict)
    stage_costs: dict[tuple[str, int, _Ref, int], StageCosts] = field(default_factory=dict)
    found: dict[tuple[int, Cell, str, bool, int | None, str], _Found] = field(default_factory=dict)
    calibration: dict[tuple[str, int, int], float | None] = field(default_factory=dict)
    ratios: dict[_Layout, float | None] = field(default_factory=dict)
    found_sharded: dict[tuple[int, Cell, str, bool, int | None, str], _Found] = field(default_factory=dict)
    # sharded step - replicated step, by (gpu type, id of the stages, dp, k, gpus per node, runtime)
    shard_deltas: dict[tuple[str, int, int, int, int, str], float] = field(default_factory=dict)
    even_stages: dict[tuple[str, int, _Ref, int], StageCosts | None] = field(default_factory=dict)


@functools.lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    """The divisors of n, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(small + [n // d for d in reversed(small) if d * d != n])


def _even_layers(model: ModelSpec, pp: int) -> tuple[int, ...]:
    """The analytic model's split of the trainer's layers into pp stages (pp 1: none)."""
    return uniform_sizes(model.num_layers, pp) if 1 < pp <= model.num_layers else ()


def busiest_factor(virtual_workers: int, dp: int) -> float:
    """k x dp / V: the busiest of dp ranks runs k = ceil(V / dp) of V
    virtual workers, this many times an even share (1 when dp divides V)."""
    return -(-virtual_workers // dp) * dp / virtual_workers


class Estimator:
    """Estimates cells from a ProfileStore (see the module doc)."""

    def __init__(
        self,
        store: ProfileStore,
        *,
        mem_fraction: float = 0.9,
        optimizer_bytes_per_param: float = 16.0,
        efficiency: float = 0.4,
        layer_overhead_s: float = 2e-4,
        max_pp: int = 8,
        update_bytes_per_param: float | None = None,
        grad_sync: str = ALLREDUCE,
        state_sharding: bool = True,
        shard_min_gain: float = 0.1,
        accumulate_bytes_per_param: float = 0.0,
    ) -> None:
        """`store` is a ProfileStore (read here once for GPU specs and comm
        curves, later once per model); `efficiency` is the fraction of peak
        TFLOP/s the analytic model assumes; `layer_overhead_s` the fixed time
        of one layer's forward + backward per micro-batch; `max_pp` the
        deepest pipeline considered when locating a measured optimum;
        `update_bytes_per_param` the memory traffic of one weight update per
        parameter, priced at the GPU's ``mem_bw_gbps`` (default: the
        optimizer state read and written once, 2 x optimizer_bytes_per_param;
        0 leaves the update out); `grad_sync` how gradients are summed over dp
        ranks (``solver.cost.pipeline.GRAD_SYNCS``: "allreduce", or
        "allgather" for trainers that add every rank's gradients in rank order,
        as the reference trainer does); `state_sharding` lets plans shard the
        optimizer state over dp ranks (ZeRO-1, ``launch.sharding``; a job
        whose JobRequest.state_sharding is false never gets it), chosen
        where no plan of the cell fits without it or where it is more than
        `shard_min_gain` faster (what the model leaves out of the sharded
        step, one gather per owner in turn and the copies into and out of
        the flat slices, asks for a clear gain); `accumulate_bytes_per_param`
        the memory traffic per parameter of adding one gradient into another
        (3 x dtype bytes for a plain ``grad += new``), priced like the update
        for every micro-batch but a worker's first and, under "allgather",
        for the sum of the gathered gradients (0: not priced)."""
        if not 0 < mem_fraction <= 1:
            raise ValueError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
        if grad_sync not in GRAD_SYNCS:
            raise ValueError(f"grad_sync must be one of {GRAD_SYNCS}, got {grad_sync!r}")
        if accumulate_bytes_per_param < 0:
            raise ValueError(f"accumulate_bytes_per_param must be >= 0, got {accumulate_bytes_per_param}")
        self.grad_sync = grad_sync
        self.accumulate_bytes_per_param = accumulate_bytes_per_param
        self.store = store
        self.mem_fraction = mem_fraction
        self.optimizer_bytes_per_param = optimizer_bytes_per_param
        self.update_bytes_per_param = (
            2 * optimizer_bytes_per_param if update_bytes_per_param is None else update_bytes_per_param
        )
        self.efficiency = efficiency
        self.layer_overhead_s = layer_overhead_s
        self.max_pp = max_pp
        self.state_sharding = state_sharding
        self.shard_min_gain = shard_min_gain
        self._cache: dict[tuple[str, int, Cell, int | None, bool, str], Estimate] = {}
        self._pricing: dict[str, Pricing] = {}
        self._sigs: dict[int, tuple[ModelSpec, str]] = {}  # id -> (model, signature): skips rebuilding the key
        self._models: dict[str, _ModelData] = {}
        self._load()

    def _load(self) -> None:
        self._version = self.store.version()
        self._gpus: dict[str, GpuSpec] = self.store.gpus()
        self._curves = load_curves(r for link, op in self.store.comm_keys() for r in self.store.comm(link, op))
        self._links: dict[str, Links] = {}

    # ---- public ------------------------------------------------------------

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        return self.estimate_model(
            job.model, job.global_batch, cell, job.virtual_workers, job.state_sharding, runtime=job.runtime
        )

    def pricing(self, runtime: str = SOLVER_DEFAULT_RUNTIME) -> Pricing:
        """How plans of `runtime` are priced (solver.cost.runtime): its own
        gradient sync, state layout and buffers; ``adaptive`` this
        estimator's own settings (`grad_sync`, ZeRO-1 where it may shard)."""
        pr = self._pricing.get(runtime)
        if pr is None:
            get_runtime(runtime)  # UnknownRuntime naming the known ones
            pr = self._pricing[runtime] = pricing_of(runtime, self.grad_sync)
        return pr

    def estimate_model(
        self,
        model: ModelSpec,
        global_batch: int,
        cell: Cell,
        virtual_workers: int | None = None,
        state_sharding: bool = True,
        runtime: str = SOLVER_DEFAULT_RUNTIME,
    ) -> Estimate:
        """The cell's estimate for a job of V = `virtual_workers` (None: dp
        free) that may shard its optimizer state (`state_sharding`, and the
        estimator's own setting), run by `runtime` (solver.contract.runtimes): only
        plans that runtime carries out, priced as it runs them."""
        memo = self._sigs.get(id(model))
        if memo is None or memo[0] is not model:
            if len(self._sigs) > _MAX_SIGS:
                self._sigs.clear()
            memo = self._sigs[id(model)] = (model, model.signature)
        pr = self.pricing(runtime)
        shard = state_sharding and self.state_sharding and pr.may_shard_optimizer
        key = (memo[1], global_batch, cell, virtual_workers, shard, runtime)
        est = self._cache.get(key)
        if est is None:
            est = self._cache[key] = self._estimate(
                self._data(model), global_batch, cell, virtual_workers, shard, runtime
            )
        return est

    def plans(
        self,
        model: ModelSpec,
        global_batch: int,
        cell: Cell,
        virtual_workers: int | None = None,
        state_sharding: bool = False,
        runtime: str = SOLVER_DEFAULT_RUNTIME,
    ) -> list[tuple[ParallelPlan, float, float]]:
        """Every candidate plan of the cell under its model source (composed,
        else analytic, calibrated as in `estimate`): (plan, iteration time s,
        peak memory GB per GPU), feasible or not; with V = `virtual_workers`,
        those of the module doc's virtual-worker search; with
        `state_sharding`, also each plan of dp > 1 with its state sharded;
        under `runtime`, its plans only, priced as it runs them."""
        md = self._data(model)
        shard = state_sharding and self.pricing(runtime).may_shard_optimizer
        found = self._found(md, global_batch, cell, every=True, vw=virtual_workers, shard=shard, rt=runtime)
        scale = self._scale(md, global_batch, cell, found.source)
        return [(found.plan(i, cell.pp), c.time_s * scale, c.mem_bytes / _GB) for i, c in enumerate(found.plans)]

    def layer_costs(self, model: ModelSpec, gpu_type: str, tp: int, b: int) -> LayerCosts | None:
        """Per-layer costs of `model` on one GPU of `gpu_type` at tensor
        parallel degree `tp` for micro-batches of `b` samples: the layer
        profile (at the nearest profiled micro-batch, per sample), else the
        datasheet (analytic); None when neither exists (solver.mixed prices
        pipelines across types from these)."""
        md = self._data(model)
        if md.layer_batches.get((gpu_type, tp)):
            return self._costs(md, gpu_type, tp, self._ref_batch(md, gpu_type, tp, b))
        if gpu_type in self._gpus:
            return self._costs(md, gpu_type, tp, None)
        return None

    def layer_scale(self, model: ModelSpec, global_batch: int, cell: Cell, tp: int) -> float:
        """The factor that puts `layer_costs` of (cell's GPU type, `tp`) on the
        scale of this estimator's cell estimates, as `estimate` scales an
        analytic time: 1 for profiled layers (composed, not calibrated), else
        the model's calibration for `cell` (median measured / analytic over
        its nearest measured cells, module doc; 1 without any)."""
        md = self._data(model)
        if md.layer_batches.get((cell.gpu_type, tp)) or cell.gpu_type not in self._gpus:
            return 1.0
        return self._calibration(md, global_batch, cell) or 1.0

    def links_of(self, gpu_type: str) -> Links:
        """Communication costs of `gpu_type`'s intra-node link and the network."""
        return self._links_of(gpu_type)

    def gpu_spec(self, gpu_type: str) -> GpuSpec | None:
        return self._gpus.get(gpu_type)

    def mem_limit_gb(self, gpu_type: str) -> float:
        """Memory a plan may use per GPU of this type (inf when the type is unknown)."""
        spec = self._gpus.get(gpu_type)
        return math.inf if spec is None else self.mem_fraction * spec.mem_gb

    def cache_size(self) -> int:
        return len(self._cache)

    def clear_cache(self) -> None:
        """Forget estimates and re-read the store (after it changed)."""
        self._cache.clear()
        self._models.clear()
        self._load()

    def refresh(self) -> bool:
        """Follow the store: when it changed since it was read (new profiles
        imported, by this process or another), forget every estimate (True)."""
        if self.store.version() == self._version:
            return False
        self.clear_cache()
        return True

    # ---- model data ----------------------------------------------------------

    def _data(self, model: ModelSpec) -> _ModelData:
        md = self._models.get(model.signature)
        if md is not None:
            return md
        cell_records: dict[_Layout, CellRecord] = {}
        plan_records: dict[_Layout, dict[_Triple, CellRecord]] = {}
        arena_plans: dict[_Layout, list[CellRecord]] = {}
        for r in self.store.cells(model=model.name):
            key = (r.global_batch, r.gpu_type, r.num_nodes, r.gpus_per_node)
            if r.pp is None:
                if r.source in _CELL_SOURCES:
                    cur = cell_records.get(key)
                    if cur is None or _CELL_SOURCES.index(r.source) < _CELL_SOURCES.index(cur.source):
                        cell_records[key] = r
            elif r.source == ProfileSource.MEASURED:
                assert r.dp is not None and r.tp is not None  # the store keeps pp, dp, tp all set or all None
                plan_records.setdefault(key, {})[(r.pp, r.dp, r.tp)] = r
            elif r.source == ProfileSource.ARENA_ESTIMATED:
                arena_plans.setdefault(key, []).append(r)
        layer_batches: dict[tuple[str, int], list[int]] = {}
        for gpu_type, tp, mb in self.store.layer_keys(model.signature):
            layer_batches.setdefault((gpu_type, tp), []).append(mb)
        for v in layer_batches.values():
            v.sort()
        md = self._models[model.signature] = _ModelData(model, cell_records, plan_records, arena_plans, layer_batches)
        return md

    def _links_of(self, gpu_type: str) -> Links:
        links = self._links.get(gpu_type)
        if links is None:
            spec = self._gpus.get(gpu_type) or GpuSpec(gpu_type, mem_gb=math.inf, peak_tflops=1.0, mem_bw_gbps=1.0)
            links = self._links[gpu_type] = Links(spec, self._curves)
        return links

    def _tp_ok(self, model: ModelSpec, tp: int, gpus_per_node: int) -> bool:
        width = model.heads if model.heads > 1 else model.hidden
        return gpus_per_node % tp == 0 and width % tp == 0

    # ---- costs -----------------------------------------------------------------

    def _ref_batch(self, md: _ModelData, gpu_type: str, tp: int, b: int) -> int | None:
        """Profiled micro-batch to use for b: b itself, else the nearest (log), ties to the larger."""
        sizes = md.layer_batches[(gpu_type, tp)]
        i = bisect.bisect_left(sizes, b)
        if i < len(sizes) and sizes[i] == b:
            return b
        near = sizes[max(0, i - 1) : i + 1]
        return min(near, key=lambda s: (abs(math.log(s / b)), -s))

    def _ref(self, md: _ModelData, source: EstimateSource, gpu_type: str, tp: int, b: int, own: bool) -> _Ref:
        """The profile that prices micro-batches of b: None (analytic), a
        profiled size (``_ref_batch``: b's time per sample is that size's),
        or, for a runtime's own pricing (`own`) where b lies between two
        profiled sizes, (lower, upper, b): each layer's time the line through
        its two times, a fixed part per micro-batch (the framework's dispatch
        and hooks per op, which a per-sample scaling would halve or double
        with b) and a part per sample."""
        if source != EstimateSource.COMPOSED:
            return None
        ref = self._ref_batch(md, gpu_type, tp, b)
        if not own or ref == b:
            return ref
        sizes = md.layer_batches[(gpu_type, tp)]
        i = bisect.bisect_left(sizes, b)
        return (sizes[i - 1], sizes[i], b) if 0 < i < len(sizes) else ref

    def _stages(
        self, md: _ModelData, source: EstimateSource, gpu_type: str, tp: int, b: int, pp: int, own: bool = False
    ) -> StageCosts:
        ref = self._ref(md, source, gpu_type, tp, b, own)
        key = (gpu_type, tp, ref, pp)
        st = md.stage_costs.get(key)
        if st is None:
            at = float(ref[2] if isinstance(ref, tuple) else ref or 1)
            st = md.stage_costs[key] = split_stages(self._costs(md, gpu_type, tp, ref), pp, at, md.model.num_layers)
        return st

    def _even_stages(
        self, md: _ModelData, source: EstimateSource, gpu_type: str, tp: int, b: int, pp: int, own: bool = False
    ) -> StageCosts | None:
        """The split of equal layer counts per stage (runtimes without uneven
        stages); None when the layers do not divide by pp."""
        if pp == 1:
            return self._stages(md, source, gpu_type, tp, b, pp, own)
        ref = self._ref(md, source, gpu_type, tp, b, own)
        key = (gpu_type, tp, ref, -pp)  # negative: the even split
        if key not in md.even_stages:
            md.even_stages[key] = split_even(self._costs(md, gpu_type, tp, ref), pp, md.model.num_layers)
        return md.even_stages[key]

    def _costs(self, md: _ModelData, gpu_type: str, tp: int, ref: _Ref) -> LayerCosts:
        """Layer costs from the profile at micro-batch `ref` (None: analytic; see `_ref`)."""
        key = (gpu_type, tp, ref)
        costs = md.layer_costs.get(key)
        if costs is None:
            if isinstance(ref, tuple):
                lo, hi, b = ref
                near = self._ref_batch(md, gpu_type, tp, b)  # its memory per sample, as without the line
                costs = affine_layers(
                    self._costs(md, gpu_type, tp, lo), self._costs(md, gpu_type, tp, hi), lo, hi, memory_of=near == hi
                )
            elif ref is None:
                costs = analytic_layers(
                    md.model,
                    self._gpus[gpu_type],
                    tp,
                    efficiency=self.efficiency,
                    layer_overhead_s=self.layer_overhead_s,
                )
            else:
                costs = layers_from_records(self.store.layers(md.model.signature, gpu_type, tp, ref))
            md.layer_costs[key] = costs
        return costs

    def _profiled_layers(self, md: _ModelData, gpu_type: str, tp: int) -> int:
        """How many layers the profile of (gpu type, tp) has (0: none)."""
        sizes = md.layer_batches.get((gpu_type, tp))
        if not sizes:
            return 0
        return self._costs(md, gpu_type, tp, sizes[0]).num_layers

    def _source(self, md: _ModelData, cell: Cell, tps: list[int]) -> tuple[EstimateSource, list[int]]:
        composed = [tp for tp in tps if self._profiled_layers(md, cell.gpu_type, tp) >= cell.pp]
        if composed:
            return EstimateSource.COMPOSED, composed
        if cell.gpu_type in self._gpus:
            return EstimateSource.ANALYTIC, tps
        return EstimateSource.NONE, []

    def _tp_options(self, model: ModelSpec, cell: Cell) -> list[int]:
        """The tp degrees a cell allows (before any source or V narrows them)."""
        pp, g = cell.pp, cell.gpus_per_node
        if pp > model.num_layers:
            return []
        return [tp for tp in divisors(g) if self._tp_ok(model, tp, g) and cell.num_gpus % (pp * tp) == 0]

    def _found(
        self,
        md: _ModelData,
        batch: int,
        cell: Cell,
        source: EstimateSource | None = None,
        every: bool = False,
        vw: int | None = None,
        shard: bool = False,
        rt: str = SOLVER_DEFAULT_RUNTIME,
    ) -> _Found:
        """Candidate plans of the cell under `source` (None: the best available)
        for V = `vw` virtual workers (None: one per dp rank); with `shard`,
        also each plan of dp > 1 with its optimizer state sharded evenly
        (after all the others; see _Found).

        The analytic search stops raising m once past the fastest plan that
        fits (its time is unimodal in m); `every` lists all candidates."""
        if shard:
            skey = (batch, cell, source or "", every, vw, rt)
            found = md.found_sharded.get(skey)
            if found is None:
                found = md.found_sharded[skey] = self._with_sharded(md, batch, cell, source, every, vw, rt)
            return found
        key = (batch, cell, source or "", every, vw, rt)
        found = md.found.get(key)
        if found is not None:
            return found
        model, pp, g = md.model, cell.pp, cell.gpus_per_node
        pr = self.pricing(rt)
        tps = self._tp_options(model, cell)
        # bytes of the embedding and of one block (FSDP's units where the layer costs are uniform)
        root = model.vocab * model.hidden * model.dtype_bytes if model.heads > 1 else 0.0
        block = (model.params * model.dtype_bytes - root) / max(1, model.num_layers) if root else 0.0
        if not pr.tp:
            tps = [tp for tp in tps if tp == 1]
        if pp > 1 and not pr.pp:
            tps = []
        if vw is not None:  # dp <= V (dp = V without virtual workers), and whole samples per virtual worker
            dps = {tp: cell.num_gpus // (pp * tp) for tp in tps}
            if batch % vw:
                tps = []
            elif pr.virtual_workers:
                tps = [tp for tp in tps if dps[tp] <= vw]
            else:
                tps = [tp for tp in tps if dps[tp] == vw]
        if source is None:
            chosen, tps = self._source(md, cell, tps)
        else:  # analytic on purpose (calibration)
            chosen, tps = (EstimateSource.ANALYTIC, tps) if cell.gpu_type in self._gpus else (EstimateSource.NONE, [])
        plans: list[_Cand] = []
        prune_m = chosen == EstimateSource.ANALYTIC and not every
        links = self._links_of(cell.gpu_type)
        spec = self._gpus.get(cell.gpu_type)
        mem_bw = spec.mem_bw_gbps if spec is not None else 0.0
        limit = self.mem_limit_gb(cell.gpu_type) * _GB
        best = fastest = None
        for tp in tps:
            dp = cell.num_gpus // (pp * tp)
            if vw is None:
                if batch % dp:
                    continue
                per_worker, k = batch // dp, 1
            else:  # the busiest rank runs k virtual workers of batch / V samples in turn
                per_worker, k = batch // vw, -(-vw // dp)
            prev, last_st, sync, accumulate = math.inf, None, 0.0, 0.0
            for m in divisors(per_worker):
                if m < pp and pr.m_at_least_pp:
                    continue
                b = per_worker // m
                ltype = self._layer_type(md, chosen, cell.gpu_type, tp, pr)
                if pr.uneven_stages:
                    st = self._stages(md, chosen, ltype, tp, b, pp, pr.own)
                else:
                    even = self._even_stages(md, chosen, ltype, tp, b, pp, pr.own)
                    if even is None:
                        continue
                    st = even
                if st is not last_st:  # gradient sync and weight update: once per iteration
                    sync = self._sync_and_update(st, _StepAt(dp, tp, g, links, k, model.dtype_bytes, mem_bw), pr)
                    # the runtimes' autograd adds each micro-batch's gradients into the step's (the
                    # simulator's runtime: only at the estimator's accumulate_bytes_per_param)
                    acc = ADD_SWEEP * model.dtype_bytes if pr.own else self.accumulate_bytes_per_param
                    accumulate = update_time(
                        st, dtype_bytes=model.dtype_bytes, update_bytes_per_param=acc, mem_bw_gbps=mem_bw
                    )
                    if pr.grad_sync == ALLGATHER and not pr.own:  # the dp x k gathered gradients added in rank order
                        sync += (dp * k - 1) * accumulate
                    last_st = st
                t, mem = pipeline_cost(
                    st,
                    dp=dp,
                    tp=tp,
                    m=m,
                    b=b,
                    gpus_per_node=g,
                    links=links,
                    dtype_bytes=model.dtype_bytes,
                    optimizer_bytes_per_param=self.optimizer_bytes_per_param,
                )
                t += (m - 1) * accumulate  # the largest stage adds m - 1 micro-batches into its gradients
                t = (t if k == 1 else k * t) + sync
                if pr.own:
                    if pr.fsdp:  # FSDP's parameter all-gathers and gradient reduce-scatters, every micro-batch
                        t += fsdp_sync_time(st, dp=dp, tp=tp, m=m, gpus_per_node=g, links=links)
                    mem = runtime_memory(
                        pr,
                        st,
                        dp=dp,
                        m=m,
                        b=b,
                        units=k,
                        dtype_bytes=model.dtype_bytes,
                        optimizer_bytes_per_param=self.optimizer_bytes_per_param,
                        base=mem,
                        root_bytes=root / tp,
                        block_bytes=block / tp,
                    )
                i = len(plans)
                plans.append(_Cand(dp, tp, m, t, mem, st.blocks, -1, -1.0))
                if fastest is None or t < plans[fastest].time_s:
                    fastest = i
                fits = mem <= limit
                if fits and (best is None or t < plans[best].time_s):
                    best = i
                if prune_m and fits and t > prev:
                    break  # past the optimum: time is unimodal in m, memory only falls
                prev = t
        found = md.found[key] = _Found(chosen, tuple(plans), best, fastest)
        return found

    def _sync_and_update(self, st: StageCosts, at: _StepAt, pr: Pricing | None = None) -> float:
        """The replicated step's end: the dp gradient sync (of `k` units per
        rank) and the weight update, as the runtime priced by `pr` does them
        (None: the estimator's own settings; FSDP: the update of 1/dp of the
        state, its communication is per micro-batch, see _found)."""
        d, dp, mem_bw = at.dtype_bytes, at.dp, at.mem_bw
        upd = update_time(st, dtype_bytes=d, update_bytes_per_param=self.update_bytes_per_param, mem_bw_gbps=mem_bw)
        if pr is not None and pr.fsdp:
            return upd / dp
        sync = dp_sync_time(
            st,
            dp=dp,
            tp=at.tp,
            gpus_per_node=at.g,
            links=at.links,
            collective=self.grad_sync if pr is None else pr.grad_sync,
            units=at.k,
        )
        if pr is not None and pr.own and pr.grad_sync == ALLGATHER:  # its copies and the ordered sum's adds
            upd += sweep_time(st, dtype_bytes=d, bytes_per_param=exact_copy_bytes(d, dp, at.k), mem_bw_gbps=mem_bw)
        return sync + upd

    @staticmethod
    def _layer_type(md: _ModelData, source: EstimateSource, gpu_type: str, tp: int, pr: Pricing) -> str:
        """The GPU type whose layer records price runtime `pr`'s plans: those
        profiled as the runtime wraps its layers (``runtime_gpu_type``) where
        the store has them for this tp degree, else the plain ones."""
        if source != EstimateSource.COMPOSED or not pr.own:
            return gpu_type
        wrapped = runtime_gpu_type(gpu_type, pr.runtime)
        return wrapped if md.layer_batches.get((wrapped, tp)) else gpu_type

    def _plan_stages(
        self, md: _ModelData, source: EstimateSource, gpu_type: str, tp: int, b: int, pp: int, pr: Pricing
    ) -> StageCosts:
        """The stages a candidate of `_found` was priced with (even where the runtime needs them)."""
        gpu_type = self._layer_type(md, source, gpu_type, tp, pr)
        if pr.uneven_stages:
            return self._stages(md, source, gpu_type, tp, b, pp, pr.own)
        st = self._even_stages(md, source, gpu_type, tp, b, pp, pr.own)
        assert st is not None  # _found lists no candidate without its split
        return st

    def _with_sharded(
        self,
        md: _ModelData,
        batch: int,
        cell: Cell,
        source: EstimateSource | None,
        every: bool,
        vw: int | None,
        rt: str = SOLVER_DEFAULT_RUNTIME,
    ) -> _Found:
        """The plans of `_found` followed by each of dp > 1 with its optimizer
        state sharded evenly (solver.cost.pipeline: ZeRO-1 memory and the
        sharded step; the runtime's own, solver.cost.runtime); `best` by
        `pick_sharded`."""
        plain = self._found(md, batch, cell, source, every, vw, rt=rt)
        pr = self.pricing(rt)
        model, pp, g = md.model, cell.pp, cell.gpus_per_node
        _, state = state_split(model.dtype_bytes, self.optimizer_bytes_per_param)
        if state <= 0:
            return plain
        links = self._links_of(cell.gpu_type)
        spec = self._gpus.get(cell.gpu_type)
        mem_bw = spec.mem_bw_gbps if spec is not None else 0.0
        limit = self.mem_limit_gb(cell.gpu_type) * _GB
        steps = md.shard_deltas

        def delta(st: StageCosts, dp: int, tp: int, k: int) -> float:
            key = (cell.gpu_type, id(st), dp, k, g, rt)
            if key not in steps:
                at = _StepAt(dp, tp, g, links, k, model.dtype_bytes, mem_bw)
                if pr.own:
                    steps[key] = self._zero1_step(st, at, pr) - self._sync_and_update(st, at, pr)
                    return steps[key]
                plain_step = self._sync_and_update(st, at)
                steps[key] = (
                    sharded_step_time(
                        st,
                        dp=dp,
                        tp=tp,
                        gpus_per_node=g,
                        links=links,
                        units=k,
                        fraction=1.0 / dp,
                        dtype_bytes=model.dtype_bytes,
                        update_bytes_per_param=self.update_bytes_per_param,
                        mem_bw_gbps=mem_bw,
                    )
                    - plain_step
                )
            return steps[key]

        twins: list[tuple[int, StageCosts, int, int]] = []  # (replicated plan, its stages, b, k)
        for i, c in enumerate(plain.plans):
            if c.dp < 2:
                continue
            per_worker, k = (batch // c.dp, 1) if vw is None else (batch // vw, -(-vw // c.dp))
            b = per_worker // c.m
            twins.append((i, self._plan_stages(md, plain.source, cell.gpu_type, c.tp, b, pp, pr), b, k))
        if plain.best is not None and not every:  # no sharded plan can win by shard_min_gain: none at all
            bar = plain.plans[plain.best].time_s * (1.0 - self.shard_min_gain)
            if all(
                plain.plans[i].time_s + delta(st, plain.plans[i].dp, plain.plans[i].tp, k) >= bar
                for i, st, _, k in twins
            ):
                return plain
        plans = list(plain.plans)
        best_s = None
        for i, st, b, k in twins:
            c = plain.plans[i]
            mem, st_bytes = sharded_memory(
                st,
                m=c.m,
                b=b,
                dtype_bytes=model.dtype_bytes,
                optimizer_bytes_per_param=self.optimizer_bytes_per_param,
                fraction=1.0 / c.dp,
            )
            gather = zero1_gather_bytes(pr, st, units=k)
            if gather > 0:  # the exact runtime's owners gather every unit's slices (no activations held then)
                state_only, _ = sharded_memory(
                    st,
                    m=c.m,
                    b=0.0,
                    dtype_bytes=model.dtype_bytes,
                    optimizer_bytes_per_param=self.optimizer_bytes_per_param,
                    fraction=1.0 / c.dp,
                )
                mem = max(mem, state_only + gather)
            t = c.time_s + delta(st, c.dp, c.tp, k)
            j = len(plans)
            plans.append(_Cand(c.dp, c.tp, c.m, t, mem, c.layers, i, st_bytes))
            if mem <= limit and (best_s is None or t < plans[best_s].time_s):
                best_s = j
        plain_best = None if plain.best is None else (plain.plans[plain.best].time_s, plain.best)
        sharded_best = None if best_s is None else (plans[best_s].time_s, best_s)
        pick = pick_sharded(plain_best, sharded_best, self.shard_min_gain)
        return _Found(plain.source, tuple(plans), None if pick is None else pick[1], plain.fastest)

    def _zero1_step(self, st: StageCosts, at: _StepAt, pr: Pricing) -> float:
        """The step's end with the optimizer state sharded, as runtime `pr`
        does it: the exact runtime's gathers to the owners and its copies
        (``launch.sharding``), else a reduce-scatter and an all-gather
        (Megatron's distributed optimizer); the update of 1/dp."""
        upd, dp, tp, g, links, k, d, mem_bw = self.update_bytes_per_param, *at
        if pr.grad_sync == ALLGATHER:
            extra = 2 * COPY_SWEEP * d + max(0, dp * k - 1) * ADD_SWEEP * d / dp  # flatten, stack; the slice's adds
            return sharded_step_time(
                st,
                dp=dp,
                tp=tp,
                gpus_per_node=g,
                links=links,
                units=k,
                fraction=1.0 / dp,
                dtype_bytes=d,
                update_bytes_per_param=upd,
                mem_bw_gbps=mem_bw,
            ) + sweep_time(st, dtype_bytes=d, bytes_per_param=extra, mem_bw_gbps=mem_bw)
        comm = zero1_allreduce_time(st, dp=dp, tp=tp, gpus_per_node=g, links=links)
        return comm + update_time(st, dtype_bytes=d, update_bytes_per_param=upd, mem_bw_gbps=mem_bw) / dp

    def _state_gb(
        self,
        md: _ModelData,
        batch: int,
        cell: Cell,
        found: _Found,
        i: int,
        vw: int | None = None,
        rt: str = SOLVER_DEFAULT_RUNTIME,
    ) -> float:
        """The optimizer state (GB per GPU, at the stage of peak memory) of
        candidate i (FSDP runtimes: the dp-th each rank holds)."""
        c = found.plans[i]
        if c.state_bytes >= 0:
            return c.state_bytes / _GB
        pr = self.pricing(rt)
        per_worker = batch // c.dp if vw is None else batch // vw
        b = per_worker // c.m
        st = self._plan_stages(md, found.source, cell.gpu_type, c.tp, b, cell.pp, pr)
        state = replicated_state(
            st, m=c.m, b=b, dtype_bytes=md.model.dtype_bytes, optimizer_bytes_per_param=self.optimizer_bytes_per_param
        )
        return state / (c.dp if pr.fsdp else 1) / _GB

    def _scale(self, md: _ModelData, batch: int, cell: Cell, source: EstimateSource) -> float:
        if source != EstimateSource.ANALYTIC:
            return 1.0
        return self._calibration(md, batch, cell) or 1.0

    def _calibration(self, md: _ModelData, batch: int, cell: Cell) -> float | None:
        """median(measured / analytic) over the model's nearest measured cells:
        same GPU type, batch and GPU count; else same type and batch; else
        same type; else all."""
        key = (cell.gpu_type, batch, cell.num_gpus)
        if key in md.calibration:
            return md.calibration[key]
        recs = [(k, r) for k, r in md.cell_records.items() if not r.oom]
        tiers = (
            [(k, r) for k, r in recs if (r.gpu_type, r.global_batch, r.num_gpus) == key],
            [(k, r) for k, r in recs if (r.gpu_type, r.global_batch) == key[:2]],
            [(k, r) for k, r in recs if r.gpu_type == cell.gpu_type],
            recs,
        )
        factor = None
        for tier in tiers:
            ratios = [x for x in (self._ratio(md, k, r) for k, r in tier) if x is not None]
            if ratios:
                factor = statistics.median(ratios)
                break
        md.calibration[key] = factor
        return factor

    def _ratio(self, md: _ModelData, key: _Layout, rec: CellRecord) -> float | None:
        if key not in md.ratios:
            assert rec.iter_time_s is not None  # _calibration passes the records that ran only
            times = []
            for pp in self._stage_counts(md.model, rec.num_gpus):
                f = self._found(
                    md,
                    rec.global_batch,
                    Cell(rec.gpu_type, rec.num_nodes, rec.gpus_per_node, pp),
                    EstimateSource.ANALYTIC,
                )
                if f.fastest is not None:
                    times.append(f.plans[f.fastest].time_s)
            md.ratios[key] = rec.iter_time_s / min(times) if times else None
        return md.ratios[key]

    def _stage_counts(self, model: ModelSpec, num_gpus: int) -> list[int]:
        return [p for p in divisors(num_gpus) if p <= min(self.max_pp, model.num_layers)]

    # ---- estimates ---------------------------------------------------------------

    def _estimate(
        self,
        md: _ModelData,
        batch: int,
        cell: Cell,
        vw: int | None = None,
        shard: bool = False,
        rt: str = SOLVER_DEFAULT_RUNTIME,
    ) -> Estimate:
        if cell.mixed:
            return self._infeasible(cell, EstimateSource.NONE, "mixed-type cells are priced by solver.mixed")
        pr = self.pricing(rt)
        why = self._runtime_problem(md.model, cell, pr)
        if why:
            return self._infeasible(cell, EstimateSource.NONE, why)
        # a cell-level measurement names no runtime: it holds for every runtime that may run the cell
        rec = md.cell_records.get((batch, cell.gpu_type, cell.num_nodes, cell.gpus_per_node))
        if vw is not None:
            why = self._vw_problem(md.model, batch, cell, vw, pr)
            if why:
                src = EstimateSource.MEASURED if rec is not None else self._found(md, batch, cell, vw=vw).source
                return self._infeasible(cell, src, why)
        if rec is not None and pr.own:
            return self._measured_as_run(md, batch, cell, rec, vw, shard, rt)
        if rec is not None:
            return self._from_measured(md, batch, cell, rec, vw, shard)
        return self._from_model(md, batch, cell, vw, shard, rt)

    @staticmethod
    def _runtime_problem(model: ModelSpec, cell: Cell, pr: Pricing) -> str:
        """Why the runtime priced by `pr` runs no plan in `cell` ("" when it may)."""
        if not pr.own:
            return ""
        why = plan_problem(get_runtime(pr.runtime), pp=cell.pp, tp=1)
        if why:
            return why
        if cell.pp > 1 and not pr.uneven_stages and model.num_layers % cell.pp:
            return f"runtime {pr.runtime} splits layers evenly: {model.num_layers} layers do not divide by pp={cell.pp}"
        return ""

    def _vw_problem(self, model: ModelSpec, batch: int, cell: Cell, vw: int, pr: Pricing | None = None) -> str:
        """Why no plan of the cell can run V = `vw` virtual workers ("" when some may)."""
        if batch % vw:
            return f"V={vw} virtual workers do not divide the global batch {batch}"
        tps = self._tp_options(model, cell)
        dps = [cell.num_gpus // (cell.pp * tp) for tp in tps]
        if pr is not None and not pr.virtual_workers:
            if not any(d == vw and (pr.tp or tp == 1) for tp, d in zip(tps, dps, strict=True)):
                return f"runtime {pr.runtime} has no virtual workers: no plan of the cell has dp = V={vw}"
        if dps and min(dps) > vw:
            return f"needs dp > V: the cell's smallest dp is {min(dps)}, V={vw} virtual workers"
        return ""

    @staticmethod
    def _infeasible(cell: Cell, source: EstimateSource, note: str, mem_gb: float = math.inf) -> Estimate:
        return Estimate(cell, None, math.inf, mem_gb, source, note)

    def _from_model(
        self,
        md: _ModelData,
        batch: int,
        cell: Cell,
        vw: int | None = None,
        shard: bool = False,
        rt: str = SOLVER_DEFAULT_RUNTIME,
    ) -> Estimate:
        found = self._found(md, batch, cell, vw=vw, shard=shard, rt=rt)
        if found.source == EstimateSource.NONE:
            return self._infeasible(cell, EstimateSource.NONE, "no profile, measurement or GPU spec for this cell")
        factor = self._calibration(md, batch, cell) if found.source == EstimateSource.ANALYTIC else None
        scale, source = (1.0, found.source) if factor is None else (factor, EstimateSource.ANALYTIC_CALIBRATED)
        limit = self.mem_limit_gb(cell.gpu_type) * _GB
        # per-plan measurements name no runtime: each prices its plan for every runtime that runs that plan
        measured = md.plan_records.get((batch, cell.gpu_type, cell.num_nodes, cell.gpus_per_node), {})
        best: tuple[float, int, EstimateSource] | None = None
        best_sharded: tuple[float, int, EstimateSource] | None = None
        times: dict[int, tuple[float, EstimateSource]] = {}  # a replicated plan's measured time
        for i, c in enumerate(found.plans):
            rec = measured.get((cell.pp, c.dp, c.tp))
            if c.twin >= 0:  # sharded state: its replicated twin's time, x what sharding changes
                if c.mem_bytes > limit or (rec is not None and rec.oom):
                    continue  # a plan measured out of memory: the memory model is not to be trusted there
                twin = found.plans[c.twin]
                if c.twin in times:
                    t_twin, src = times[c.twin]
                    cand = (t_twin * c.time_s / twin.time_s, i, src)
                else:
                    cand = (c.time_s * scale, i, source)
                if best_sharded is None or cand[:2] < best_sharded[:2]:
                    best_sharded = cand
                continue
            if rec is not None:
                t_rec = rec.iter_time_s
                if t_rec is None:  # out of memory
                    continue
                t = t_rec if vw is None else t_rec * self._plan_ratio(md, batch, cell, c, vw, found.source)
                cand = (t, i, EstimateSource.MEASURED)
                times[i] = (t, EstimateSource.MEASURED)
            elif c.mem_bytes > limit:
                continue
            else:
                cand = (c.time_s * scale, i, source)
            if best is None or cand[:2] < best[:2]:
                best = cand
        if best_sharded is not None:
            pick = pick_sharded(best[:2] if best else None, best_sharded[:2], self.shard_min_gain)
            best = best_sharded if pick == best_sharded[:2] else best
        if best is None:
            if not found.plans:
                return self._infeasible(cell, found.source, "no valid plan (tp, dp, batch divisibility)")
            least = min(c.mem_bytes for c in found.plans) / _GB
            return self._infeasible(
                cell, found.source, f"OOM: least plan needs {least:.1f} GB > {limit / _GB:.1f} GB", least
            )
        time_s, i, src = best
        return Estimate(
            cell,
            found.plan(i, cell.pp),
            time_s,
            found.plans[i].mem_bytes / _GB,
            src,
            "" if not self.pricing(rt).own else f"runtime {rt}",
            state_gb=self._state_gb(md, batch, cell, found, i, vw, rt),
        )

    def _plan_ratio(self, md: _ModelData, batch: int, cell: Cell, c: _Cand, vw: int, source: EstimateSource) -> float:
        """What V costs a per-plan measurement of (cell.pp, c.dp, c.tp): the
        `source` model's time of candidate c under V over its best time of that
        plan without V (at least 1), else the busiest rank's k x dp / V."""
        free = self._found(md, batch, cell)
        same = [o.time_s for o in free.plans if (o.dp, o.tp) == (c.dp, c.tp)] if free.source == source else []
        if not same:
            return busiest_factor(vw, c.dp)
        return max(1.0, c.time_s / min(same))

    def _measured_plan(self, md: _ModelData, batch: int, cell: Cell) -> tuple[int, int | None, float | None]:
        """Where a measured layout's optimum sits: (p*, index of its plan in the
        cell-at-p*'s candidates, that plan's modelled time); None: not modelled."""
        layout = (batch, cell.gpu_type, cell.num_nodes, cell.gpus_per_node)
        limit = self.mem_limit_gb(cell.gpu_type) * _GB
        allowed = set(self._stage_counts(md.model, cell.num_gpus))
        for recs in (list(md.plan_records.get(layout, {}).values()), md.arena_plans.get(layout, [])):
            ok = sorted(
                (r.iter_time_s, r.pp, r.dp, r.tp)
                for r in recs
                if r.iter_time_s is not None  # not out of memory
                and r.pp in allowed
                and r.dp is not None
                and r.tp is not None  # a plan record (pp, dp, tp all set)
                and self._tp_ok(md.model, r.tp, cell.gpus_per_node)
            )
            if ok:
                _, pp, dp, tp = ok[0]
                found = self._found(md, batch, Cell(cell.gpu_type, cell.num_nodes, cell.gpus_per_node, pp))
                idx = [i for i, c in enumerate(found.plans) if (c.dp, c.tp) == (dp, tp)]
                if not idx:
                    return pp, None, None
                fit = [j for j in idx if found.plans[j].mem_bytes <= limit]
                i = (
                    min(fit, key=lambda j: found.plans[j].time_s)
                    if fit
                    else min(idx, key=lambda j: found.plans[j].mem_bytes)
                )
                return pp, i, found.plans[i].time_s
        options: list[tuple[bool, float, int, int]] = []
        for pp in sorted(allowed):
            found = self._found(md, batch, Cell(cell.gpu_type, cell.num_nodes, cell.gpus_per_node, pp))
            for unfit, at in ((False, found.best), (True, found.fastest)):
                if at is not None:
                    options.append((unfit, found.plans[at].time_s, pp, at))
                    break
        if not options:
            return (min(allowed) if allowed else 1), None, None
        _, t, pp, i = min(options)
        return pp, i, t

    def _measured_as_run(
        self, md: _ModelData, batch: int, cell: Cell, rec: CellRecord, vw: int | None, shard: bool, rt: str
    ) -> Estimate:
        """A cell-level measurement (it names no runtime) priced for the named
        runtime `rt`: the runtime's best plan of the cell, at the measured time
        where the measured optimum's pp is the cell's, else scaled by the
        runtime's model from that pp to the cell's; x what V costs by that model."""
        t_star = rec.iter_time_s
        if t_star is None:
            return self._infeasible(cell, EstimateSource.MEASURED, f"OOM ({rec.source} record)")
        p_star, _, model_star = self._measured_plan(md, batch, cell)
        found = self._found(md, batch, cell, vw=vw, shard=shard, rt=rt)
        ref_cell = Cell(cell.gpu_type, cell.num_nodes, cell.gpus_per_node, p_star)
        ref = self._found(md, batch, ref_cell, shard=shard, rt=rt) if self._runtime_ok(md, ref_cell, rt) else None
        # the reference: the runtime's own best at the measured pp, else the measured plan's modelled time
        t_ref = ref.plans[ref.best].time_s if ref is not None and ref.best is not None else model_star
        if found.best is None or t_ref is None:
            why = "OOM at this pp (model)" if found.plans else "no model for this pp"
            return self._infeasible(cell, EstimateSource.MEASURED_PP, f"{why}; measured optimum at pp={p_star}")
        c = found.plans[found.best]
        t = t_star * max(1.0, c.time_s / t_ref) if (cell.pp != p_star or vw) else t_star
        src = EstimateSource.MEASURED if cell.pp == p_star else EstimateSource.MEASURED_PP
        return Estimate(
            cell,
            found.plan(found.best, cell.pp),
            t,
            c.mem_bytes / _GB,
            src,
            f"{rec.source}; runtime {rt}" + ("" if cell.pp == p_star else f", scaled from pp={p_star} by its model"),
            state_gb=self._state_gb(md, batch, cell, found, found.best, vw, rt),
        )

    def _runtime_ok(self, md: _ModelData, cell: Cell, rt: str) -> bool:
        return not self._runtime_problem(md.model, cell, self.pricing(rt))

    def _from_measured(
        self, md: _ModelData, batch: int, cell: Cell, rec: CellRecord, vw: int | None = None, shard: bool = False
    ) -> Estimate:
        t_star = rec.iter_time_s
        if t_star is None:
            return self._infeasible(cell, EstimateSource.MEASURED, f"OOM ({rec.source} record)")
        if cell.pp > md.model.num_layers:
            return self._infeasible(cell, EstimateSource.MEASURED, "more pipeline stages than layers")
        p_star, i_star, model_star = self._measured_plan(md, batch, cell)
        if vw is not None:
            return self._measured_vw(md, batch, cell, rec, vw, p_star, i_star, model_star, shard)
        # the measured run's pp keeps its (replicated) plan; other pp may shard where the model says so
        found = self._found(md, batch, cell, shard=shard and cell.pp != p_star)
        limit = self.mem_limit_gb(cell.gpu_type) * _GB
        if cell.pp == p_star:
            if i_star is None:
                return Estimate(
                    cell,
                    ParallelPlan(cell.pp, cell.num_gpus // cell.pp, 1, stage_layers=_even_layers(md.model, cell.pp)),
                    t_star,
                    math.nan,
                    EstimateSource.MEASURED,
                    f"{rec.source}; plan and memory not modelled",
                )
            mem = found.plans[i_star].mem_bytes
            note = rec.source + ("; the memory model exceeds the limit, the measured run fits" if mem > limit else "")
            return Estimate(
                cell,
                found.plan(i_star, cell.pp),
                t_star,
                mem / _GB,
                EstimateSource.MEASURED,
                note,
                state_gb=self._state_gb(md, batch, cell, found, i_star),
            )
        if model_star is None or found.best is None:
            why = "OOM at this pp (model)" if found.plans else "no model for this pp"
            return self._infeasible(cell, EstimateSource.MEASURED_PP, f"{why}; measured optimum at pp={p_star}")
        c = found.plans[found.best]
        return Estimate(
            cell,
            found.plan(found.best, cell.pp),
            max(t_star, t_star * c.time_s / model_star),
            c.mem_bytes / _GB,
            EstimateSource.MEASURED_PP,
            f"{rec.source} optimum at pp={p_star}, scaled by the {found.source} model",
            state_gb=self._state_gb(md, batch, cell, found, found.best),
        )

    def _measured_vw(
        self,
        md: _ModelData,
        batch: int,
        cell: Cell,
        rec: CellRecord,
        vw: int,
        p_star: int,
        i_star: int | None,
        model_star: float | None,
        shard: bool = False,
    ) -> Estimate:
        """A cell record carried to V virtual workers (see the module doc)."""
        t_star, pp = rec.iter_time_s, cell.pp
        assert t_star is not None  # _from_measured answered an OOM record itself
        found = self._found(md, batch, cell, vw=vw, shard=shard and pp != p_star)
        source = EstimateSource.MEASURED if pp == p_star else EstimateSource.MEASURED_PP
        if model_star is None:  # the optimum's plan is not modelled: price the busiest rank only
            if pp != p_star:
                why = "OOM at this pp (model)" if found.plans else "no model for this pp"
                return self._infeasible(cell, source, f"{why}; measured optimum at pp={p_star}")
            i = found.best if found.best is not None else found.fastest
            if i is not None:
                plan, mem = found.plan(i, pp), found.plans[i].mem_bytes / _GB
            elif cell.num_gpus // pp <= vw:
                plan, mem = ParallelPlan(pp, cell.num_gpus // pp, 1, stage_layers=_even_layers(md.model, pp)), math.nan
            else:
                return self._infeasible(
                    cell, source, f"{rec.source}; plan not modelled, and pure data parallelism needs dp > V={vw}"
                )
            f = busiest_factor(vw, plan.dp)
            return Estimate(
                cell,
                plan,
                t_star * f,
                mem,
                source,
                f"{rec.source}; plan not modelled; x{f:.4g} for V={vw} over dp={plan.dp}",
            )
        i, extra = found.best, ""
        if i is None and pp == p_star and found.plans:  # the measured run fits: its (dp, tp) under V
            assert i_star is not None  # _measured_plan gives the index with its time (model_star)
            c_star = self._found(md, batch, cell).plans[i_star]
            idx = [j for j, c in enumerate(found.plans) if (c.dp, c.tp) == (c_star.dp, c_star.tp)]
            if idx:
                i = min(idx, key=lambda j: found.plans[j].mem_bytes)
                extra = "; the memory model exceeds the limit, the measured run fits"
        if i is None:
            why = "OOM at this pp (model)" if found.plans else "no model for this pp"
            return self._infeasible(cell, source, f"{why} under V={vw}; measured optimum at pp={p_star}")
        c = found.plans[i]
        # max(T*, T* x model_V / model(p*)); T* kept where they differ by rounding only
        t = t_star if c.time_s <= model_star * (1 + 1e-9) else t_star * c.time_s / model_star
        return Estimate(
            cell,
            found.plan(i, pp),
            t,
            c.mem_bytes / _GB,
            source,
            f"{rec.source} optimum at pp={p_star}, x{t / t_star:.4g} by the {found.source} model for V={vw}{extra}",
            state_gb=self._state_gb(md, batch, cell, found, i, vw),
        )
