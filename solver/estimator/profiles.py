"""What the profile store holds, as the estimator prices from it: GPU specs,
communication curves and links, and per model its measured cells and plans
and its layer profiles, with the layer and stage costs built from them
(``solver.estimator``'s module doc, sources 1 and 2).

Read once and kept until the store changes (`Profiles.refresh`); every
per-model table and cache lives in one `ModelData`, so forgetting a model
forgets everything priced from it.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from solver.contract.models import ModelSpec
from solver.contract.profiles.records import CellRecord, GpuSpec, ProfileSource, runtime_gpu_type
from solver.cost.comm import Links, load_curves
from solver.cost.layers import (
    LayerCosts,
    StageCosts,
    affine_layers,
    analytic_layers,
    layers_from_records,
    split_even,
    split_stages,
)
from solver.estimator.candidates import Found
from solver.estimator.protocol import CostSettings
from solver.types import Cell, EstimateSource

if TYPE_CHECKING:
    from solver.contract.profiles.store import ProfileStore
    from solver.cost.runtime import Pricing

CELL_SOURCES = (ProfileSource.MEASURED, ProfileSource.ARENA_OPTIMAL)  # cell-level, in order of preference
GB = 1e9

Layout = tuple[int, str, int, int]  # (global batch, gpu type, nodes, gpus per node)
#: the profile a micro-batch size is priced from (`Profiles.ref`)
Ref = int | tuple[int, int, int] | None
Triple = tuple[int, int, int]  # (pp, dp, tp)
#: what a cell's candidate plans are found for: (batch, cell, source or "", every, V, runtime)
FoundKey = tuple[int, Cell, str, bool, int | None, str]


@dataclass
class ModelData:
    """What the store holds for one model, loaded once, and what is priced from it."""

    model: ModelSpec
    cell_records: dict[Layout, CellRecord]
    plan_records: dict[Layout, dict[Triple, CellRecord]]  # per-plan "measured"
    arena_plans: dict[Layout, list[CellRecord]]  # per-plan "arena-estimated"
    layer_batches: dict[tuple[str, int], list[int]]  # (gpu type, tp) -> profiled micro-batches
    layer_costs: dict[tuple[str, int, Ref], LayerCosts] = field(default_factory=dict)
    stage_costs: dict[tuple[str, int, Ref, int], StageCosts] = field(default_factory=dict)
    found: dict[FoundKey, Found] = field(default_factory=dict)
    calibration: dict[tuple[str, int, int], float | None] = field(default_factory=dict)
    ratios: dict[Layout, float | None] = field(default_factory=dict)
    found_sharded: dict[FoundKey, Found] = field(default_factory=dict)
    # sharded step - replicated step, by (gpu type, id of the stages, dp, k, gpus per node, runtime)
    shard_deltas: dict[tuple[str, int, int, int, int, str], float] = field(default_factory=dict)
    even_stages: dict[tuple[str, int, Ref, int], StageCosts | None] = field(default_factory=dict)


class Profiles:
    """The store's specs, links and per-model profiles (module doc)."""

    def __init__(self, store: ProfileStore, settings: CostSettings) -> None:
        self.store = store
        self.settings = settings
        self._models: dict[str, ModelData] = {}
        self._load()

    def _load(self) -> None:
        self._version = self.store.version()
        self.gpus: dict[str, GpuSpec] = self.store.gpus()
        self._curves = load_curves(r for link, op in self.store.comm_keys() for r in self.store.comm(link, op))
        self._links: dict[str, Links] = {}

    def clear(self) -> None:
        """Forget every model and re-read the store."""
        self._models.clear()
        self._load()

    def changed(self) -> bool:
        """Has the store changed since it was read (new profiles, by this process or another)?"""
        return self.store.version() != self._version

    # ---- specs and links -------------------------------------------------------------

    def gpu_spec(self, gpu_type: str) -> GpuSpec | None:
        return self.gpus.get(gpu_type)

    def mem_limit_gb(self, gpu_type: str) -> float:
        """Memory a plan may use per GPU of this type (inf when the type is unknown)."""
        spec = self.gpus.get(gpu_type)
        return math.inf if spec is None else self.settings.mem_fraction * spec.mem_gb

    def links_of(self, gpu_type: str) -> Links:
        """Communication costs of `gpu_type`'s intra-node link and the network."""
        links = self._links.get(gpu_type)
        if links is None:
            spec = self.gpus.get(gpu_type) or GpuSpec(gpu_type, mem_gb=math.inf, peak_tflops=1.0, mem_bw_gbps=1.0)
            links = self._links[gpu_type] = Links(spec, self._curves)
        return links

    # ---- model data --------------------------------------------------------------------

    def data(self, model: ModelSpec) -> ModelData:
        md = self._models.get(model.signature)
        if md is not None:
            return md
        cell_records: dict[Layout, CellRecord] = {}
        plan_records: dict[Layout, dict[Triple, CellRecord]] = {}
        arena_plans: dict[Layout, list[CellRecord]] = {}
        for r in self.store.cells(model=model.name):
            key = (r.global_batch, r.gpu_type, r.num_nodes, r.gpus_per_node)
            if r.pp is None:
                if r.source in CELL_SOURCES:
                    cur = cell_records.get(key)
                    if cur is None or CELL_SOURCES.index(r.source) < CELL_SOURCES.index(cur.source):
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
        md = self._models[model.signature] = ModelData(model, cell_records, plan_records, arena_plans, layer_batches)
        return md

    # ---- layer and stage costs ---------------------------------------------------------

    def layer_costs(self, model: ModelSpec, gpu_type: str, tp: int, b: int) -> LayerCosts | None:
        """Per-layer costs of `model` on one GPU of `gpu_type` at tensor
        parallel degree `tp` for micro-batches of `b` samples: the layer
        profile (at the nearest profiled micro-batch, per sample), else the
        datasheet (analytic); None when neither exists (solver.mixed prices
        pipelines across types from these)."""
        md = self.data(model)
        if md.layer_batches.get((gpu_type, tp)):
            return self.costs(md, gpu_type, tp, self.ref_batch(md, gpu_type, tp, b))
        if gpu_type in self.gpus:
            return self.costs(md, gpu_type, tp, None)
        return None

    def ref_batch(self, md: ModelData, gpu_type: str, tp: int, b: int) -> int | None:
        """Profiled micro-batch to use for b: b itself, else the nearest (log), ties to the larger."""
        sizes = md.layer_batches[(gpu_type, tp)]
        i = bisect.bisect_left(sizes, b)
        if i < len(sizes) and sizes[i] == b:
            return b
        near = sizes[max(0, i - 1) : i + 1]
        return min(near, key=lambda s: (abs(math.log(s / b)), -s))

    def ref(self, md: ModelData, source: EstimateSource, gpu_type: str, tp: int, b: int, own: bool) -> Ref:
        """The profile that prices micro-batches of b: None (analytic), a
        profiled size (``ref_batch``: b's time per sample is that size's),
        or, for a runtime's own pricing (`own`) where b lies between two
        profiled sizes, (lower, upper, b): each layer's time the line through
        its two times, a fixed part per micro-batch (the framework's dispatch
        and hooks per op, which a per-sample scaling would halve or double
        with b) and a part per sample."""
        if source != EstimateSource.COMPOSED:
            return None
        ref = self.ref_batch(md, gpu_type, tp, b)
        if not own or ref == b:
            return ref
        sizes = md.layer_batches[(gpu_type, tp)]
        i = bisect.bisect_left(sizes, b)
        return (sizes[i - 1], sizes[i], b) if 0 < i < len(sizes) else ref

    def stages(
        self, md: ModelData, source: EstimateSource, gpu_type: str, tp: int, b: int, pp: int, own: bool = False
    ) -> StageCosts:
        ref = self.ref(md, source, gpu_type, tp, b, own)
        key = (gpu_type, tp, ref, pp)
        st = md.stage_costs.get(key)
        if st is None:
            at = float(ref[2] if isinstance(ref, tuple) else ref or 1)
            st = md.stage_costs[key] = split_stages(self.costs(md, gpu_type, tp, ref), pp, at, md.model.num_layers)
        return st

    def even_stages(
        self, md: ModelData, source: EstimateSource, gpu_type: str, tp: int, b: int, pp: int, own: bool = False
    ) -> StageCosts | None:
        """The split of equal layer counts per stage (runtimes without uneven
        stages); None when the layers do not divide by pp."""
        if pp == 1:
            return self.stages(md, source, gpu_type, tp, b, pp, own)
        ref = self.ref(md, source, gpu_type, tp, b, own)
        key = (gpu_type, tp, ref, -pp)  # negative: the even split
        if key not in md.even_stages:
            md.even_stages[key] = split_even(self.costs(md, gpu_type, tp, ref), pp, md.model.num_layers)
        return md.even_stages[key]

    def costs(self, md: ModelData, gpu_type: str, tp: int, ref: Ref) -> LayerCosts:
        """Layer costs from the profile at micro-batch `ref` (None: analytic; see `ref`)."""
        key = (gpu_type, tp, ref)
        costs = md.layer_costs.get(key)
        if costs is None:
            if isinstance(ref, tuple):
                lo, hi, b = ref
                near = self.ref_batch(md, gpu_type, tp, b)  # its memory per sample, as without the line
                costs = affine_layers(
                    self.costs(md, gpu_type, tp, lo), self.costs(md, gpu_type, tp, hi), lo, hi, memory_of=near == hi
                )
            elif ref is None:
                costs = analytic_layers(
                    md.model,
                    self.gpus[gpu_type],
                    tp,
                    efficiency=self.settings.efficiency,
                    layer_overhead_s=self.settings.layer_overhead_s,
                )
            else:
                costs = layers_from_records(self.store.layers(md.model.signature, gpu_type, tp, ref))
            md.layer_costs[key] = costs
        return costs

    def profiled_layers(self, md: ModelData, gpu_type: str, tp: int) -> int:
        """How many layers the profile of (gpu type, tp) has (0: none)."""
        sizes = md.layer_batches.get((gpu_type, tp))
        if not sizes:
            return 0
        return self.costs(md, gpu_type, tp, sizes[0]).num_layers

    def source(self, md: ModelData, cell: Cell, tps: list[int]) -> tuple[EstimateSource, list[int]]:
        """The source of the cell's plans, and its tp degrees: those with a
        layer profile of at least pp layers (composed), else all (analytic,
        when the GPU has a spec), else none."""
        composed = [tp for tp in tps if self.profiled_layers(md, cell.gpu_type, tp) >= cell.pp]
        if composed:
            return EstimateSource.COMPOSED, composed
        if cell.gpu_type in self.gpus:
            return EstimateSource.ANALYTIC, tps
        return EstimateSource.NONE, []

    @staticmethod
    def layer_type(md: ModelData, source: EstimateSource, gpu_type: str, tp: int, pr: Pricing) -> str:
        """The GPU type whose layer records price runtime `pr`'s plans: those
        profiled as the runtime wraps its layers (``runtime_gpu_type``) where
        the store has them for this tp degree, else the plain ones."""
        if source != EstimateSource.COMPOSED or not pr.own:
            return gpu_type
        wrapped = runtime_gpu_type(gpu_type, pr.name)
        return wrapped if md.layer_batches.get((wrapped, tp)) else gpu_type

    def plan_stages(
        self, md: ModelData, source: EstimateSource, gpu_type: str, tp: int, b: int, pp: int, pr: Pricing
    ) -> StageCosts:
        """The stages a candidate plan was priced with (even where the runtime needs them)."""
        gpu_type = self.layer_type(md, source, gpu_type, tp, pr)
        if pr.runtime.uneven_stages:
            return self.stages(md, source, gpu_type, tp, b, pp, pr.own)
        st = self.even_stages(md, source, gpu_type, tp, b, pp, pr.own)
        assert st is not None  # the search lists no candidate without its split
        return st
