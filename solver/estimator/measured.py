"""Measurements in the estimates (``solver.estimator``'s module doc, source 1
and the calibration of source 3): a measured cell's time carried to the
cell's pp, to V virtual workers and to a named runtime's own plans; per-plan
measurements carried to V; and the analytic model scaled by the model's
measured cells."""

from __future__ import annotations

import math
import statistics

from solver.contract.models import ModelSpec
from solver.contract.profiles.records import CellRecord
from solver.contract.runtimes import ADAPTIVE, refusal
from solver.cost.layers import uniform_sizes
from solver.estimator.candidates import Cand
from solver.estimator.profiles import GB, Layout, ModelData
from solver.estimator.search import PlanSearch, busiest_factor
from solver.types import Cell, Estimate, EstimateSource, ParallelPlan

#: the runtime whose pricing is the settings' own (solver.cost.runtime: `adaptive`): what a
#: measurement is compared with, since it names no runtime
OWN = ADAPTIVE


def infeasible(cell: Cell, source: EstimateSource, note: str, mem_gb: float = math.inf) -> Estimate:
    return Estimate(cell, None, math.inf, mem_gb, source, note)


def _even_layers(model: ModelSpec, pp: int) -> tuple[int, ...]:
    """The analytic model's split of the trainer's layers into pp stages (pp 1: none)."""
    return uniform_sizes(model.num_layers, pp) if 1 < pp <= model.num_layers else ()


class Measured:
    """Prices cells from measured records, through the plan search (module doc)."""

    def __init__(self, search: PlanSearch) -> None:
        self.search = search
        self.memory = search.memory

    # ---- the analytic model, calibrated by measured cells -------------------------------------

    def scale(self, md: ModelData, batch: int, cell: Cell, source: EstimateSource) -> float:
        if source != EstimateSource.ANALYTIC:
            return 1.0
        return self.calibration(md, batch, cell) or 1.0

    def calibration(self, md: ModelData, batch: int, cell: Cell) -> float | None:
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

    def _ratio(self, md: ModelData, key: Layout, rec: CellRecord) -> float | None:
        if key not in md.ratios:
            assert rec.iter_time_s is not None  # calibration passes the records that ran only
            times = []
            for pp in self.search.stage_counts(md.model, rec.num_gpus):
                cell = Cell(rec.gpu_type, rec.num_nodes, rec.gpus_per_node, pp)
                f = self.search.found(md, rec.global_batch, cell, OWN, EstimateSource.ANALYTIC)
                if f.fastest is not None:
                    times.append(f.plans[f.fastest].time_s)
            md.ratios[key] = rec.iter_time_s / min(times) if times else None
        return md.ratios[key]

    # ---- per-plan measurements ----------------------------------------------------------------

    def plan_ratio(self, md: ModelData, batch: int, cell: Cell, c: Cand, vw: int, source: EstimateSource) -> float:
        """What V costs a per-plan measurement of (cell.pp, c.dp, c.tp): the
        `source` model's time of candidate c under V over its best time of that
        plan without V (at least 1), else the busiest rank's k x dp / V."""
        free = self.search.found(md, batch, cell, OWN)
        same = [o.time_s for o in free.plans if (o.dp, o.tp) == (c.dp, c.tp)] if free.source == source else []
        if not same:
            return busiest_factor(vw, c.dp)
        return max(1.0, c.time_s / min(same))

    # ---- cell-level measurements ------------------------------------------------------------------

    def measured_plan(self, md: ModelData, batch: int, cell: Cell) -> tuple[int, int | None, float | None]:
        """Where a measured layout's optimum sits: (p*, index of its plan in the
        cell-at-p*'s candidates, that plan's modelled time); None: not modelled."""
        search = self.search
        layout = (batch, cell.gpu_type, cell.num_nodes, cell.gpus_per_node)
        limit = self.memory.limit(cell.gpu_type)
        allowed = set(search.stage_counts(md.model, cell.num_gpus))
        for recs in (list(md.plan_records.get(layout, {}).values()), md.arena_plans.get(layout, [])):
            ok = sorted(
                (r.iter_time_s, r.pp, r.dp, r.tp)
                for r in recs
                if r.iter_time_s is not None  # not out of memory
                and r.pp in allowed
                and r.dp is not None
                and r.tp is not None  # a plan record (pp, dp, tp all set)
                and search.tp_ok(md.model, r.tp, cell.gpus_per_node)
            )
            if ok:
                _, pp, dp, tp = ok[0]
                found = search.found(md, batch, Cell(cell.gpu_type, cell.num_nodes, cell.gpus_per_node, pp), OWN)
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
            found = search.found(md, batch, Cell(cell.gpu_type, cell.num_nodes, cell.gpus_per_node, pp), OWN)
            for unfit, at in ((False, found.best), (True, found.fastest)):
                if at is not None:
                    options.append((unfit, found.plans[at].time_s, pp, at))
                    break
        if not options:
            return (min(allowed) if allowed else 1), None, None
        _, t, pp, i = min(options)
        return pp, i, t

    def as_run(
        self, md: ModelData, batch: int, cell: Cell, rec: CellRecord, vw: int | None, shard: bool, rt: str
    ) -> Estimate:
        """A cell-level measurement (it names no runtime) priced for the named
        runtime `rt`: the runtime's best plan of the cell, at the measured time
        where the measured optimum's pp is the cell's, else scaled by the
        runtime's model from that pp to the cell's; x what V costs by that model."""
        search = self.search
        t_star = rec.iter_time_s
        if t_star is None:
            return infeasible(cell, EstimateSource.MEASURED, f"OOM ({rec.source} record)")
        p_star, _, model_star = self.measured_plan(md, batch, cell)
        found = search.found(md, batch, cell, rt, vw=vw, shard=shard)
        ref_cell = Cell(cell.gpu_type, cell.num_nodes, cell.gpus_per_node, p_star)
        runs = refusal(rt, md.model.num_layers, batch, pp=p_star, gpus=ref_cell.num_gpus) is None
        ref = search.found(md, batch, ref_cell, rt, shard=shard) if runs else None
        # the reference: the runtime's own best at the measured pp, else the measured plan's modelled time
        t_ref = ref.plans[ref.best].time_s if ref is not None and ref.best is not None else model_star
        if found.best is None or t_ref is None:
            why = "OOM at this pp (model)" if found.plans else "no model for this pp"
            return infeasible(cell, EstimateSource.MEASURED_PP, f"{why}; measured optimum at pp={p_star}")
        c = found.plans[found.best]
        t = t_star * max(1.0, c.time_s / t_ref) if (cell.pp != p_star or vw) else t_star
        src = EstimateSource.MEASURED if cell.pp == p_star else EstimateSource.MEASURED_PP
        return Estimate(
            cell,
            found.plan(found.best, cell.pp),
            t,
            c.mem_bytes / GB,
            src,
            f"{rec.source}; runtime {rt}" + ("" if cell.pp == p_star else f", scaled from pp={p_star} by its model"),
            state_gb=search.state_gb(md, batch, cell, found, found.best, rt, vw),
        )

    def as_measured(
        self, md: ModelData, batch: int, cell: Cell, rec: CellRecord, vw: int | None = None, shard: bool = False
    ) -> Estimate:
        """A cell-level measurement for the settings' own pricing: the measured
        time at the measured optimum's pp, carried to the cell's pp (and to V) by the model."""
        search = self.search
        t_star = rec.iter_time_s
        if t_star is None:
            return infeasible(cell, EstimateSource.MEASURED, f"OOM ({rec.source} record)")
        if cell.pp > md.model.num_layers:
            return infeasible(cell, EstimateSource.MEASURED, "more pipeline stages than layers")
        p_star, i_star, model_star = self.measured_plan(md, batch, cell)
        if vw is not None:
            return self._with_vw(md, batch, cell, rec, vw, p_star, i_star, model_star, shard)
        # the measured run's pp keeps its (replicated) plan; other pp may shard where the model says so
        found = search.found(md, batch, cell, OWN, shard=shard and cell.pp != p_star)
        limit = self.memory.limit(cell.gpu_type)
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
                mem / GB,
                EstimateSource.MEASURED,
                note,
                state_gb=search.state_gb(md, batch, cell, found, i_star, OWN, None),
            )
        if model_star is None or found.best is None:
            why = "OOM at this pp (model)" if found.plans else "no model for this pp"
            return infeasible(cell, EstimateSource.MEASURED_PP, f"{why}; measured optimum at pp={p_star}")
        c = found.plans[found.best]
        return Estimate(
            cell,
            found.plan(found.best, cell.pp),
            max(t_star, t_star * c.time_s / model_star),
            c.mem_bytes / GB,
            EstimateSource.MEASURED_PP,
            f"{rec.source} optimum at pp={p_star}, scaled by the {found.source} model",
            state_gb=search.state_gb(md, batch, cell, found, found.best, OWN, None),
        )

    def _with_vw(
        self,
        md: ModelData,
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
        search = self.search
        t_star, pp = rec.iter_time_s, cell.pp
        assert t_star is not None  # as_measured answered an OOM record itself
        found = search.found(md, batch, cell, OWN, vw=vw, shard=shard and pp != p_star)
        source = EstimateSource.MEASURED if pp == p_star else EstimateSource.MEASURED_PP
        if model_star is None:  # the optimum's plan is not modelled: price the busiest rank only
            if pp != p_star:
                why = "OOM at this pp (model)" if found.plans else "no model for this pp"
                return infeasible(cell, source, f"{why}; measured optimum at pp={p_star}")
            i = found.best if found.best is not None else found.fastest
            if i is not None:
                plan, mem = found.plan(i, pp), found.plans[i].mem_bytes / GB
            elif cell.num_gpus // pp <= vw:
                plan, mem = ParallelPlan(pp, cell.num_gpus // pp, 1, stage_layers=_even_layers(md.model, pp)), math.nan
            else:
                return infeasible(
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
            assert i_star is not None  # measured_plan gives the index with its time (model_star)
            c_star = search.found(md, batch, cell, OWN).plans[i_star]
            idx = [j for j, c in enumerate(found.plans) if (c.dp, c.tp) == (c_star.dp, c_star.tp)]
            if idx:
                i = min(idx, key=lambda j: found.plans[j].mem_bytes)
                extra = "; the memory model exceeds the limit, the measured run fits"
        if i is None:
            why = "OOM at this pp (model)" if found.plans else "no model for this pp"
            return infeasible(cell, source, f"{why} under V={vw}; measured optimum at pp={p_star}")
        c = found.plans[i]
        # max(T*, T* x model_V / model(p*)); T* kept where they differ by rounding only
        t = t_star if c.time_s <= model_star * (1 + 1e-9) else t_star * c.time_s / model_star
        return Estimate(
            cell,
            found.plan(i, pp),
            t,
            c.mem_bytes / GB,
            source,
            f"{rec.source} optimum at pp={p_star}, x{t / t_star:.4g} by the {found.source} model for V={vw}{extra}",
            state_gb=search.state_gb(md, batch, cell, found, i, OWN, vw),
        )
