"""Mixed cells whose pipeline stages run on different GPU types (see
solver.mixed): every tp and micro-batch count the job's runtime allows,
priced stage by stage by ``solver.cost.typed_pipeline`` from the inner
estimator's cost model, each type's layers on the scale of its own
single-type cells."""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

from solver.contract.runtimes import refusal
from solver.cost.layers import LayerCosts
from solver.cost.typed_pipeline import TypedPlan, TypeSide, typed_pipeline_cost
from solver.estimator.protocol import CostModel, CostSettings
from solver.mixed.cells import _divisors, stages_per_part
from solver.types import Cell, Estimate, EstimateSource, JobRequest, ParallelPlan


class Pricer(Protocol):
    """What a pipeline across types is priced with (solver.mixed.MixedEstimator is one)."""

    @property
    def costs(self) -> CostModel | None: ...

    @property
    def settings(self) -> CostSettings: ...

    def grad_sync(self, job: JobRequest) -> str: ...

    def held_per_param(self, job: JobRequest, dp: int, units: int) -> float: ...

    def pick(self, plain: Estimate | None, sharded: Estimate | None) -> Estimate | None: ...

    def none(self, cell: Cell, note: str, mem: float = ...) -> Estimate: ...


def price_pipeline(mixed: Pricer, job: JobRequest, cell: Cell, shard: bool) -> Estimate:
    """The best plan of a pipeline across types (solver.mixed's module doc), by `mixed`'s cost model."""
    per_part = stages_per_part(cell)
    model, batch, vw = job.model, job.global_batch, job.virtual_workers
    if per_part is None:
        return mixed.none(cell, f"a part does not hold whole stages of {cell.num_gpus // cell.pp} GPUs")
    if cell.pp > model.num_layers:
        return mixed.none(cell, "more pipeline stages than layers")
    costs = mixed.costs
    if costs is None:
        return mixed.none(cell, "pipelines across types need an estimator with per-layer costs")
    types = [t for t, _ in cell.parts]
    known = [costs.gpu_spec(t) for t in types]
    specs = [s for s in known if s is not None]
    if len(specs) != len(known):
        return mixed.none(cell, "no GPU spec for a part's type")
    per_stage, g = cell.num_gpus // cell.pp, cell.gpus_per_node
    width = model.heads if model.heads > 1 else model.hidden
    obpp = mixed.settings.optimizer_bytes_per_param
    upd = mixed.settings.update_bytes
    grad_sync = mixed.grad_sync(job)
    limits = [costs.mem_limit_gb(t) * 1e9 for t in types]
    best: tuple[float, ParallelPlan, float, float] | None = None
    best_sharded: tuple[float, ParallelPlan, float, float] | None = None
    for tp in (d for d in range(1, g + 1) if g % d == 0 and width % d == 0 and per_stage % d == 0):
        dp = per_stage // tp
        # each type's layers on the scale of the inner estimator's cells of that type (its part's layout)
        scales = [costs.layer_scale(model, batch, Cell(t, n, g, 1), tp) for t, n in cell.parts]
        largest = max(scales)
        shape = (job.runtime, model.num_layers, batch, vw)
        if refusal(*shape, pp=cell.pp, tp=tp, dp=dp, gpu_types=types):
            continue
        if vw is None:
            if batch % dp:
                continue
            per_worker, units = batch // dp, 1
        else:
            per_worker, units = batch // vw, -(-vw // dp)
        prev = math.inf
        for m in _divisors(per_worker):
            if refusal(*shape, pp=cell.pp, tp=tp, dp=dp, gpu_types=types, micro_batches=m):
                continue
            b = per_worker // m
            sides = []
            for t, spec, lim, f in zip(types, specs, limits, scales, strict=True):
                layers = costs.layer_costs(model, t, tp, b)
                if layers is None:
                    break
                sides.append(TypeSide(t, _scaled(layers, f / largest), costs.links_of(t), lim, spec.mem_bw_gbps))
            if len(sides) != len(types):
                continue
            t_plain: float | None = None
            for sharded in (False, True) if shard and dp > 1 else (False,):
                c = typed_pipeline_cost(
                    sides,
                    per_part,
                    model.num_layers,
                    TypedPlan(dp, tp, m, b, g, units, sharded),
                    dtype_bytes=model.dtype_bytes,
                    optimizer_bytes_per_param=obpp,
                    update_bytes_per_param=upd,
                    grad_sync=grad_sync,
                    held_bytes_per_param=mixed.held_per_param(job, dp, units),
                )
                if c is None:
                    continue
                plan = ParallelPlan(
                    cell.pp, dp, tp, m, stage_layers=c.stage_layers, state_shares=(1.0,) * len(types) if sharded else ()
                )
                cand = (c.time_s * largest, plan, c.mem_bytes / 1e9, c.state_bytes / 1e9)
                if sharded:
                    if best_sharded is None or cand[0] < best_sharded[0]:
                        best_sharded = cand
                elif best is None or cand[0] < best[0]:
                    best = cand
                if not sharded:
                    t_plain = cand[0]
            if t_plain is not None and t_plain > prev:
                break  # past the optimum: time is unimodal in m, and the replicated plan fits here
            prev = t_plain if t_plain is not None else prev

    def est(c: tuple[float, ParallelPlan, float, float] | None) -> Estimate | None:
        if c is None:
            return None
        layers = "+".join(map(str, c[1].stage_layers))
        state = "; state sharded" if c[1].sharded else ""
        return Estimate(
            cell, c[1], c[0], c[2], EstimateSource.MIXED, f"pipeline across types, layers {layers}{state}", c[3]
        )

    pick = mixed.pick(est(best), est(best_sharded))
    if pick is None:
        return mixed.none(cell, "no plan fits: the layers do not split within the stages' memory (or no valid tp/dp)")
    return pick


def _scaled(costs: LayerCosts, factor: float) -> LayerCosts:
    """`costs` with every layer's compute time times `factor`."""
    if factor == 1.0:
        return costs
    return dataclasses.replace(
        costs,
        time_per_sample=tuple(x * factor for x in costs.time_per_sample),
        time_fixed=tuple(x * factor for x in costs.time_fixed),
    )
