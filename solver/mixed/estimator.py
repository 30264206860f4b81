"""MixedEstimator: the pricing of mixed cells (see solver.mixed)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from solver.cost.layers import LayerCosts
from solver.cost.pipeline import ALLREDUCE, state_split
from solver.cost.typed_pipeline import TypeSide, typed_pipeline_cost
from solver.mixed.cells import _divisors, stages_per_part
from solver.mixed.split import split_batch
from solver.profiles.records import NET_GBPS
from solver.types import Cell, Estimate, EstimateSource, EstimatorLike, JobRequest, ParallelPlan

#: per-message latency (s) on the network; its bandwidth is NET_GBPS when the inner estimator knows no GPU spec
NET_LATENCY_S = 2.5e-5


class MixedEstimator:
    """EstimatorLike: mixed cells priced here, every other cell by `inner`.

    `state_sharding` false prices replicated optimizer state only (as the
    inner Estimator's own switch does for single-type cells)."""

    def __init__(
        self,
        inner: EstimatorLike,
        net_gbps: float | None = None,
        state_sharding: bool = True,
        shard_min_gain: float | None = None,
    ) -> None:
        self.inner = inner
        self.net_gbps = net_gbps
        self.state_sharding = state_sharding
        self.shard_min_gain = shard_min_gain if shard_min_gain is not None else getattr(inner, "shard_min_gain", 0.1)
        self._cache: dict[tuple, Estimate] = {}

    def __getattr__(self, name: str):  # the inner estimator's other helpers (plans, mem_limit_gb, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _net_bps(self, types: Sequence[str]) -> float:
        if self.net_gbps is not None:
            return self.net_gbps * 1e9
        gpus = {}
        store = getattr(self.inner, "store", None)
        if store is not None and hasattr(store, "gpus"):
            gpus = store.gpus()
        bws = [gpus[t].inter_bw_gbps for t in types if t in gpus]
        return (min(bws) if bws else NET_GBPS) * 1e9

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        if not cell.mixed:
            return self.inner.estimate(job, cell)
        shard = job.state_sharding and self.state_sharding
        key = (job.model.signature, job.global_batch, cell, job.virtual_workers, shard)
        est = self._cache.get(key)
        if est is None:
            est = self._cache[key] = (
                self._price_pipeline(job, cell, shard) if cell.pp > 1 else self._price(job, cell, shard)
            )
        return est

    @staticmethod
    def _none(cell: Cell, note: str, mem: float = math.inf) -> Estimate:
        return Estimate(cell, None, math.inf, mem, EstimateSource.NONE, note)

    # ---- data parallel across types ----------------------------------------------------------------------

    def _price(self, job: JobRequest, cell: Cell, shard: bool) -> Estimate:
        vw = job.virtual_workers
        part_job = dataclasses.replace(job, virtual_workers=None, state_sharding=False)  # speeds per sample
        subs = [self.inner.estimate(part_job, Cell(t, n, cell.gpus_per_node, 1)) for t, n in cell.parts]
        bad = [e for e in subs if not e.feasible]
        if bad and not shard:
            return self._none(
                cell, f"part {bad[0].cell.key()} infeasible: {bad[0].note}", min(e.mem_per_gpu_gb for e in bad)
            )
        if bad:  # a part out of memory on its own may still fit with the state sharded over every rank
            subs = [e if e.feasible else self._roomy(part_job, e) for e in subs]
            bad = [e for e in subs if e is None or not e.feasible]
            if bad:
                return self._none(cell, "a part has no plan even with its state sharded over the cell")
        tps = {e.plan.tp for e in subs}
        if len(tps) != 1:
            return self._none(cell, f"parts want different tp {sorted(tps)}")
        tp = tps.pop()
        batch = job.global_batch
        ranks = [e.cell.num_gpus // tp for e in subs]
        per_sample = [e.iter_time_s * r / batch for e, r in zip(subs, ranks)]
        if vw is not None and (batch % vw or vw < sum(ranks)):
            why = "do not divide the global batch" if batch % vw else f"are fewer than the {sum(ranks)} dp ranks"
            return self._none(cell, f"V={vw} virtual workers {why}")
        split = split_batch(batch, ranks, per_sample, max(e.plan.micro_batches for e in subs), vw)
        if split is None:
            why = (
                f"global batch {batch} < {sum(ranks)} dp ranks"
                if vw is None
                else f"V={vw} virtual workers do not split into whole ones per rank over {'+'.join(map(str, ranks))}"
                " ranks"
            )
            return self._none(cell, why)
        shares, m = split
        compute = max(s * c for s, c in zip(shares, per_sample))
        grad_bytes = job.model.params * job.model.dtype_bytes / tp
        n = cell.num_nodes
        net = self._net_bps([t for t, _ in cell.parts])
        sync = 2 * (n - 1) * NET_LATENCY_S + 2.0 * (n - 1) / n * grad_bytes / net
        # a rank's micro-batch is shares/m here (batch/V/m with V), batch/(ranks*m_i) in the part's own estimate
        mb = [s / m for s in shares] if vw is None else [batch / vw / m] * len(shares)
        grow = [max(1.0, b / (batch / (r * e.plan.micro_batches))) for e, b, r in zip(subs, mb, ranks)]
        mems = [e.mem_per_gpu_gb * f for e, f in zip(subs, grow)]
        limit = getattr(self.inner, "mem_limit_gb", None)
        limits = [limit(t) if limit is not None else math.inf for t, _ in cell.parts]
        fits = all(need <= lim for need, lim in zip(mems, limits))
        plan = ParallelPlan(1, sum(ranks), tp, m, tuple(shares))
        parts = "+".join(sorted({e.source for e in subs}))
        vws = "" if vw is None else f" ({', '.join(str(s * vw // batch) for s in shares)} of V={vw})"
        note = f"parts {parts}; shares {tuple(shares)} per rank{vws}; sync {sync:.4f} s"
        replicated = Estimate(
            cell, plan, compute + sync, max(mems), EstimateSource.MIXED, note, max(e.state_gb for e in subs)
        )
        sharded = self._sharded_dp(job, cell, subs, grow, limits, ranks, plan, compute + sync, net) if shard else None
        if fits and all(e.plan.state_shares == () for e in subs):
            plain: Estimate | None = replicated
        else:
            plain = None
        pick = self._pick(plain, sharded)
        if pick is not None:
            return pick
        worst = max(range(len(mems)), key=lambda i: mems[i] / limits[i])
        return self._none(cell, f"OOM: {mems[worst]:.1f} GB per {cell.parts[worst][0]} GPU", max(mems))

    def _roomy(self, job: JobRequest, e: Estimate) -> Estimate | None:
        """A part's estimate as if its memory were unlimited: its fastest plan
        and that plan's memory (None: the inner estimator cannot say)."""
        plans = getattr(self.inner, "plans", None)
        if plans is None:
            return None
        every = plans(job.model, job.global_batch, e.cell)
        if not every:
            return None
        plan, t, mem = min(every, key=lambda x: (x[2], x[1]))  # the least memory: sharding must cover the rest
        _, state = state_split(job.model.dtype_bytes, getattr(self.inner, "optimizer_bytes_per_param", 16.0))
        obpp = getattr(self.inner, "optimizer_bytes_per_param", 16.0)
        state_gb = self._state_of(job, plan.tp, mem, state, obpp)
        return Estimate(e.cell, plan, t, mem, e.source, "memory not limited", state_gb)

    @staticmethod
    def _state_of(job: JobRequest, tp: int, mem: float, state: float, obpp: float) -> float:
        """The optimizer state (GB per GPU) of a replicated pp-1 plan at tp: params / tp x state bytes."""
        return min(mem, job.model.params / tp * state / 1e9) if obpp > 0 else 0.0

    def _sharded_dp(
        self,
        job: JobRequest,
        cell: Cell,
        subs: list[Estimate],
        grow: list[float],
        limits: list[float],
        ranks: list[int],
        plan: ParallelPlan,
        time_s: float,
        net_bps: float,
    ) -> Estimate | None:
        """The data-parallel mixed plan with its state sharded by free memory (module doc)."""
        d = job.model.dtype_bytes
        obpp = getattr(self.inner, "optimizer_bytes_per_param", 16.0)
        _, state = state_split(d, obpp)
        if state <= 0 or not all(e.state_gb > 0 for e in subs):
            return None
        # per GPU: what stays replicated, and the whole state with the runtime's slice copy
        reps = [(e.mem_per_gpu_gb - e.state_gb) * f for e, f in zip(subs, grow)]
        full = max(e.state_gb for e in subs) * (state + d) / state
        free = [lim - r for lim, r in zip(limits, reps)]
        if min(free) <= 0 or not all(math.isfinite(x) for x in free):
            return None
        total = sum(r * f for r, f in zip(ranks, free))
        if full > total:
            return None
        slices = [full * f / total for f in free]
        mems = [r + s for r, s in zip(reps, slices)]
        # the all-gather of the updated slices (padded to the largest) over the network
        max_slice_bytes = max(slices) / (state + d) * d * 1e9
        n_ranks = sum(ranks)
        gather = (n_ranks - 1) * NET_LATENCY_S + (n_ranks - 1) * max_slice_bytes / net_bps
        shares = tuple(free)
        return Estimate(
            cell,
            dataclasses.replace(plan, state_shares=shares),
            time_s + gather,
            max(mems),
            EstimateSource.MIXED,
            f"state sharded by free memory ({', '.join(f'{x:.3g}' for x in shares)} GB per rank);"
            f" +{gather:.4f} s gathering the slices",
            max(slices),
        )

    def _pick(self, plain: Estimate | None, sharded: Estimate | None) -> Estimate | None:
        if sharded is None:
            return plain
        if plain is None or sharded.iter_time_s < plain.iter_time_s * (1.0 - self.shard_min_gain):
            return sharded
        return plain

    # ---- pipelines across types ---------------------------------------------------------------------------

    def _price_pipeline(self, job: JobRequest, cell: Cell, shard: bool) -> Estimate:
        per_part = stages_per_part(cell)
        model, batch, vw = job.model, job.global_batch, job.virtual_workers
        if per_part is None:
            return self._none(cell, f"a part does not hold whole stages of {cell.num_gpus // cell.pp} GPUs")
        if cell.pp > model.num_layers:
            return self._none(cell, "more pipeline stages than layers")
        layer_costs = getattr(self.inner, "layer_costs", None)
        links_of = getattr(self.inner, "links_of", None)
        spec_of = getattr(self.inner, "gpu_spec", None)
        if layer_costs is None or links_of is None or spec_of is None:
            return self._none(cell, "pipelines across types need an estimator with per-layer costs")
        types = [t for t, _ in cell.parts]
        specs = [spec_of(t) for t in types]
        if any(s is None for s in specs):
            return self._none(cell, "no GPU spec for a part's type")
        per_stage, g = cell.num_gpus // cell.pp, cell.gpus_per_node
        width = model.heads if model.heads > 1 else model.hidden
        obpp = getattr(self.inner, "optimizer_bytes_per_param", 16.0)
        upd = getattr(self.inner, "update_bytes_per_param", 2 * obpp)
        grad_sync = getattr(self.inner, "grad_sync", ALLREDUCE)
        limits = [self.inner.mem_limit_gb(t) * 1e9 for t in types]
        scale_of = getattr(self.inner, "layer_scale", None)
        best: tuple[float, ParallelPlan, float, float] | None = None
        best_sharded: tuple[float, ParallelPlan, float, float] | None = None
        for tp in (d for d in range(1, g + 1) if g % d == 0 and width % d == 0 and per_stage % d == 0):
            dp = per_stage // tp
            # each type's layers on the scale of the inner estimator's cells of that type (its part's layout)
            scales = [
                scale_of(model, batch, Cell(t, n, g, 1), tp) if scale_of is not None else 1.0 for t, n in cell.parts
            ]
            top = max(scales)
            if vw is None:
                if batch % dp:
                    continue
                per_worker, units = batch // dp, 1
            else:
                if batch % vw or dp > vw:
                    continue
                per_worker, units = batch // vw, -(-vw // dp)
            prev = math.inf
            for m in _divisors(per_worker):
                b = per_worker // m
                sides = []
                for t, spec, lim, f in zip(types, specs, limits, scales):
                    costs = layer_costs(model, t, tp, b)
                    if costs is None:
                        break
                    sides.append(TypeSide(t, _scaled(costs, f / top), links_of(t), lim, spec.mem_bw_gbps))
                if len(sides) != len(types):
                    continue
                t_plain: float | None = None
                for sharded in (False, True) if shard and dp > 1 else (False,):
                    c = typed_pipeline_cost(
                        sides,
                        per_part,
                        model.num_layers,
                        dp=dp,
                        tp=tp,
                        m=m,
                        b=b,
                        gpus_per_node=g,
                        dtype_bytes=model.dtype_bytes,
                        optimizer_bytes_per_param=obpp,
                        update_bytes_per_param=upd,
                        grad_sync=grad_sync,
                        units=units,
                        sharded=sharded,
                    )
                    if c is None:
                        continue
                    plan = ParallelPlan(
                        cell.pp,
                        dp,
                        tp,
                        m,
                        stage_layers=c.stage_layers,
                        state_shares=(1.0,) * len(types) if sharded else (),
                    )
                    cand = (c.time_s * top, plan, c.mem_bytes / 1e9, c.state_bytes / 1e9)
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

        pick = self._pick(est(best), est(best_sharded))
        if pick is None:
            return self._none(
                cell, "no plan fits: the layers do not split within the stages' memory (or no valid tp/dp)"
            )
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
