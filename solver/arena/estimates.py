"""What a scheduler believes before a job runs, from Arena's own profiler:
its per-plan estimates (``profiles_plans_estimated.json``), the best plan
of each configuration, as an estimator (EstimatorLike).

Arena's measured optimal-plan table (arena_lookup.ArenaTable) is the
simulator's truth; these estimates are Arena's predictions of the same
configurations and differ from it by about 15-30% (log standard deviation
per GPU type, measured over the configurations both hold), so a
simulation that decides with them pays for estimation error.

Lookup: for a (model, GPU type) Arena estimated, Arena's own rules (exact
layout, best locality x 0.9^log2, next larger model x 1.8^steps) over the
best-plan table, infeasible where they find nothing, as in Arena's
simulator. For a pair Arena has no estimate of at all (every V100 cell,
models it never ran on a type), our estimator over a store that holds only
these best-plan times and the GPU specs: the analytic model scaled by the
model's estimated cells on other types, never the measured table. As in
Arena's tables, a time is that of the best plan over every pipeline depth,
so only pp = 1 cells are feasible (their plan shown as data parallelism).

`ArenaEstimates.filled_truth()` is the realistic simulator's truth: Arena's
measured table by the same rules, and where they find no entry at all (a
layout or size Arena never ran: 16 A100s of most models), our estimator
over the measured table, rather than a cell that fails for want of a
number. An out-of-memory entry stays infeasible.

Pipelines across GPU types (solver.mixed.MixedEstimator) need per-layer
costs and memory, which Arena's tables do not hold: ``layer_costs``,
``mem_limit_gb``, ``links_of`` and ``gpu_spec`` are our estimator's (the
datasheet's), and ``layer_scale`` puts each type's layers on this table's
scale (its time over our analytic time for the part's nearest layouts, as
our estimator calibrates an analytic cell). So such a pipeline's time
follows the table type by type, and its memory is our model's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

from solver.arena.lookup import NO_PROFILE, ArenaTable
from solver.contract.models import ModelSpec, get_model
from solver.contract.profiles.arena import ESTIMATED_FILE, OPTIMAL_FILE, load_device_specs, shipped_path
from solver.contract.profiles.arena_import import arena_records
from solver.contract.profiles.gpus import default_gpu_specs
from solver.contract.profiles.records import CellRecord, GpuSpec, ProfileSource
from solver.contract.runtimes import ADAPTIVE
from solver.cost.comm import Links
from solver.cost.layers import LayerCosts
from solver.cost.runtime import Pricing, pricing_of
from solver.estimator import CostModel, CostSettings, Estimator, EstimatorBase, divisors
from solver.types import Cell, Estimate, JobRequest, ParallelPlan

_Key = tuple[str, int, str, int, int]


def best_plan_records(path: str | os.PathLike[str] | None = None) -> list[CellRecord]:
    """One record per (model, batch, GPU type, layout) of Arena's per-plan
    estimates: the fastest plan's time (None when every plan is out of
    memory). Only plans of the simulator's convention (comm profile prefix
    = nodes), labelled ones."""
    src = pathlib.Path(shipped_path(ESTIMATED_FILE) if path is None else path)
    best: dict[_Key, float | None] = {}
    for r in json.loads(src.read_text(encoding="utf-8"))["records"]:
        if r.get("pp") is None or r.get("comm_profile_prefix") != r.get("num_nodes"):
            continue
        key: _Key = (
            r["trace_model_name"],
            int(r["batch_size"]),
            str(r["gpu_type"]).lower(),
            r["num_nodes"],
            r["gpus_per_node"],
        )
        t = r["iter_time_s"] if r.get("status") == "ok" else None
        if key not in best or (t is not None and (best[key] is None or t < best[key])):
            best[key] = t
    return [CellRecord(m, b, g, n, p, t, source=ProfileSource.ARENA_ESTIMATED) for (m, b, g, n, p), t in best.items()]


#: at most this many memoised estimates (then the memo starts over)
_MEMO_MAX = 50_000


class ArenaEstimates(EstimatorBase):
    """Arena's profiler estimates, best plan per configuration (module doc);
    its cost model is our estimator's over the same times (`TableCosts`)."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        records: list[CellRecord] | None = None,
        fill_missing: bool = False,
    ) -> None:
        """Arena's estimates at `path` (default: the shipped file), or
        `records` of best-plan times. `fill_missing`: ours wherever Arena's
        lookup finds no entry (an out-of-memory entry stays infeasible),
        not only for the (model, GPU type) pairs it has nothing of."""
        recs = best_plan_records(path) if records is None else records
        self.table = ArenaTable(records=recs)
        self._fallback_recs = recs
        self._covered = {(r.model, r.gpu_type) for r in recs}  # (model, GPU type) pairs Arena has
        self._fill_missing = fill_missing
        self._fallback: Estimator | None = None
        self._memo: dict[tuple[object, ...], Estimate] = {}  # see estimate

    @classmethod
    def filled_truth(cls) -> ArenaEstimates:
        """Arena's measured optimal-plan table by Arena's rules, and where
        they find no entry, our estimator over the measured table (module doc)."""
        data = json.loads(shipped_path(OPTIMAL_FILE).read_text(encoding="utf-8"))
        return cls(records=arena_records(data, OPTIMAL_FILE)[1], fill_missing=True)

    def iter_time(self, model: str, batch: int, gpu_type: str, num_nodes: int, gpus_per_node: int) -> float | None:
        """The cell's time (None: infeasible), for a truth speed."""
        job = JobRequest("truth", get_model(model), batch, 1, runtime=ADAPTIVE)
        est = self.estimate(job, Cell(gpu_type, num_nodes, gpus_per_node, 1))
        return est.iter_time_s if est.feasible else None

    def fallback(self) -> Estimator:
        """Our estimator over the best-plan times (built on first use)."""
        if self._fallback is None:
            from solver.contract.profiles.store import ProfileStore

            store = ProfileStore(":memory:")
            store.put_cells(dataclasses.replace(r, source=ProfileSource.ARENA_OPTIMAL) for r in self._fallback_recs)
            for spec in default_gpu_specs(load_device_specs()["simulator_gpu_specs"]).values():
                store.put_gpu(spec)
            self._fallback = Estimator(store)
        return self._fallback

    @property
    def cost_model(self) -> CostModel:
        return TableCosts(self)

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        """Arena's estimate by Arena's rules; ours for a (model, GPU type) Arena never estimated.
        Memoised: the tables never change, and an estimate depends on the
        job's model, batch, V, state sharding and runtime alone (as the
        estimator's own cache key says)."""
        key = (job.model.signature, job.global_batch, job.virtual_workers, job.state_sharding, job.runtime, cell)
        est = self._memo.get(key)
        if est is None:
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            est = self._memo[key] = self._estimate(job, cell)
        return est

    def __getstate__(self) -> dict[str, object]:
        """Pickled without the memo (a cache, refilled on use)."""
        return {k: v for k, v in self.__dict__.items() if k != "_memo"}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._memo = {}

    def _estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        est = self.table.estimate(job, cell)
        if cell.pp != 1 or cell.mixed:
            return est
        if self._fill_missing:
            if est.feasible or not est.note.startswith(NO_PROFILE):
                return est
        elif (self.table.model_name(job.model.name), cell.gpu_type.lower()) in self._covered:
            return est
        ours = [self.fallback().estimate(job, dataclasses.replace(cell, pp=pp)) for pp in divisors(cell.num_gpus)]
        best = min(ours, key=lambda e: e.iter_time_s)
        if not best.feasible:
            return ours[0]
        plan = ParallelPlan(1, cell.num_gpus, 1)
        note = (
            f"{best.note}; best plan pp={best.cell.pp}, shown as DP as Arena's times are"
            if best.cell.pp > 1
            else best.note
        )
        return dataclasses.replace(best, cell=cell, plan=plan, note=note)


class TableCosts:
    """The cost model of Arena's tables (solver.estimator.CostModel), for
    pipelines across types (solver.mixed): our estimator's per-layer costs,
    links, GPU specs and memory limits (the datasheet's: Arena's tables have
    none), `layer_scale` putting each type's layers on the table's scale;
    the default settings; and no list of plans (the tables hold one best
    time per cell)."""

    settings = CostSettings()

    def __init__(self, table: ArenaEstimates) -> None:
        self.table = table

    def pricing(self, runtime: str) -> Pricing:
        return pricing_of(runtime, self.settings.grad_sync)

    def layer_costs(self, model: ModelSpec, gpu_type: str, tp: int, b: int) -> LayerCosts | None:
        return self.table.fallback().layer_costs(model, gpu_type, tp, b)

    def layer_scale(self, model: ModelSpec, global_batch: int, cell: Cell, tp: int) -> float:
        """The table's time over our analytic time for `cell`'s nearest layouts (Estimator.layer_scale)."""
        return self.table.fallback().layer_scale(model, global_batch, cell, tp)

    def links_of(self, gpu_type: str) -> Links:
        return self.table.fallback().links_of(gpu_type)

    def gpu_spec(self, gpu_type: str) -> GpuSpec | None:
        return self.table.fallback().gpu_spec(gpu_type)

    def mem_limit_gb(self, gpu_type: str) -> float:
        """Memory a stage may use per GPU (our estimator's: Arena's tables have no memory figure)."""
        return self.table.fallback().mem_limit_gb(gpu_type)

    def plans(self, job: JobRequest, cell: Cell) -> list[tuple[ParallelPlan, float, float]] | None:
        return None


__all__ = ["ArenaEstimates", "TableCosts", "best_plan_records"]
