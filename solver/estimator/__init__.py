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

The package, by what each part does: `protocol` (the interfaces every
estimator stage answers: `EstimatorLike`, `CostModel`, `CostSettings`),
`profiles` (what the store holds, and the layer and stage costs built from
it), `memory` (what a plan holds per GPU), `search` (the plans of a cell, as
the job's runtime allows them: ``solver.contract.runtimes.refusal``),
`measured` (measurements carried to other pp, V and runtimes; the analytic
model's calibration), and here `Estimator`, which answers from the best
source. Mixed cells, the cluster's network cards and what jobs report are
stages over it (``solver.mixed``, ``solver.contention``, ``solver.calibration``).

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

from typing import TYPE_CHECKING

from solver.contract.models import ModelSpec
from solver.contract.profiles.records import GpuSpec
from solver.contract.runtimes import ADAPTIVE, refusal
from solver.cost.comm import Links
from solver.cost.layers import LayerCosts
from solver.cost.pipeline import ALLREDUCE
from solver.cost.runtime import Pricing
from solver.estimator.measured import OWN, Measured, infeasible
from solver.estimator.profiles import GB, ModelData, Profiles
from solver.estimator.protocol import CostModel, CostSettings, EstimatorBase, EstimatorLike
from solver.estimator.search import PlanSearch, busiest_factor, divisors, pick_sharded
from solver.types import Cell, Estimate, EstimateSource, JobRequest, ParallelPlan

if TYPE_CHECKING:
    from solver.contract.profiles.store import ProfileStore

__all__ = [
    "CostModel",
    "CostSettings",
    "Estimator",
    "EstimatorBase",
    "EstimatorLike",
    "busiest_factor",
    "divisors",
    "pick_sharded",
]

_MAX_SIGS = 4096


class Estimator(EstimatorBase):
    """Estimates single-type cells from a ProfileStore (see the module doc),
    and is the cost model mixed cells are composed from (`CostModel`)."""

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
        curves, later once per model); the rest are `CostSettings`' fields
        (what each prices: there). A job whose JobRequest.state_sharding is
        false never gets its state sharded, whatever `state_sharding` says."""
        self.store = store
        self.settings = CostSettings(
            mem_fraction=mem_fraction,
            optimizer_bytes_per_param=optimizer_bytes_per_param,
            efficiency=efficiency,
            layer_overhead_s=layer_overhead_s,
            max_pp=max_pp,
            update_bytes_per_param=update_bytes_per_param,
            grad_sync=grad_sync,
            state_sharding=state_sharding,
            shard_min_gain=shard_min_gain,
            accumulate_bytes_per_param=accumulate_bytes_per_param,
        )
        self.profiles = Profiles(store, self.settings)
        self.search = PlanSearch(self.profiles)
        self.measured = Measured(self.search)
        self._cache: dict[tuple[str, int, Cell, int | None, bool, str], Estimate] = {}
        self._sigs: dict[int, tuple[ModelSpec, str]] = {}  # id -> (model, signature): skips rebuilding the key

    # ---- EstimatorLike -------------------------------------------------------------

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        return self.estimate_model(
            job.model, job.global_batch, cell, job.virtual_workers, job.state_sharding, runtime=job.runtime
        )

    def refresh(self) -> bool:
        """Follow the store: when it changed since it was read (new profiles
        imported, by this process or another), forget every estimate (True)."""
        if not self.profiles.changed():
            return False
        self.clear_cache()
        return True

    @property
    def cost_model(self) -> CostModel:
        return self

    # ---- the cost model ----------------------------------------------------------------

    def pricing(self, runtime: str = ADAPTIVE) -> Pricing:
        """How plans of `runtime` are priced (solver.cost.runtime): its own
        gradient sync, state layout and buffers; ``adaptive`` this
        estimator's own settings (`grad_sync`, ZeRO-1 where it may shard)."""
        return self.search.pricing(runtime)

    def layer_costs(self, model: ModelSpec, gpu_type: str, tp: int, b: int) -> LayerCosts | None:
        """Per-layer costs of `model` on one GPU of `gpu_type` (Profiles.layer_costs)."""
        return self.profiles.layer_costs(model, gpu_type, tp, b)

    def layer_scale(self, model: ModelSpec, global_batch: int, cell: Cell, tp: int) -> float:
        """The factor that puts `layer_costs` of (cell's GPU type, `tp`) on the
        scale of this estimator's cell estimates, as `estimate` scales an
        analytic time: 1 for profiled layers (composed, not calibrated), else
        the model's calibration for `cell` (median measured / analytic over
        its nearest measured cells, module doc; 1 without any)."""
        md = self.profiles.data(model)
        if md.layer_batches.get((cell.gpu_type, tp)) or cell.gpu_type not in self.profiles.gpus:
            return 1.0
        return self.measured.calibration(md, global_batch, cell) or 1.0

    def links_of(self, gpu_type: str) -> Links:
        """Communication costs of `gpu_type`'s intra-node link and the network."""
        return self.profiles.links_of(gpu_type)

    def gpu_spec(self, gpu_type: str) -> GpuSpec | None:
        return self.profiles.gpu_spec(gpu_type)

    def mem_limit_gb(self, gpu_type: str) -> float:
        """Memory a plan may use per GPU of this type (inf when the type is unknown)."""
        return self.profiles.mem_limit_gb(gpu_type)

    def plans(self, job: JobRequest, cell: Cell) -> list[tuple[ParallelPlan, float, float]]:
        """Every candidate plan of `job` in the cell under its model source
        (composed, else analytic, calibrated as in `estimate`): (plan,
        iteration time s, peak memory GB per GPU), feasible or not; with the
        job's V, those of the module doc's virtual-worker search; where the
        job may shard its state, also each plan of dp > 1 with its state
        sharded; under its runtime, its plans only, priced as it runs them."""
        md = self.profiles.data(job.model)
        runtime, global_batch = job.runtime, job.global_batch
        shard = self.pricing(runtime).shards_optimizer(job.state_sharding)
        found = self.search.found(md, global_batch, cell, runtime, every=True, vw=job.virtual_workers, shard=shard)
        scale = self.measured.scale(md, global_batch, cell, found.source)
        pr = self.pricing(runtime)
        return [
            (found.plan(i, cell.pp), c.time_s * scale, c.mem_bytes / GB)
            for i, c in enumerate(found.plans)
            if c.twin >= 0 or pr.runs_replicated(c.dp)
        ]

    # ---- estimates -----------------------------------------------------------------------

    def estimate_model(
        self,
        model: ModelSpec,
        global_batch: int,
        cell: Cell,
        virtual_workers: int | None = None,
        state_sharding: bool = True,
        runtime: str = ADAPTIVE,
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
        shard = pr.shards_optimizer(state_sharding and self.settings.state_sharding)
        key = (memo[1], global_batch, cell, virtual_workers, shard, runtime)
        est = self._cache.get(key)
        if est is None:
            est = self._cache[key] = self._estimate(
                self.profiles.data(model), global_batch, cell, virtual_workers, shard, runtime
            )
        return est

    def cache_size(self) -> int:
        return len(self._cache)

    def clear_cache(self) -> None:
        """Forget estimates and re-read the store (after it changed)."""
        self._cache.clear()
        self.profiles.clear()

    def _estimate(self, md: ModelData, batch: int, cell: Cell, vw: int | None, shard: bool, rt: str) -> Estimate:
        if cell.mixed:
            return infeasible(cell, EstimateSource.NONE, "mixed-type cells are priced by solver.mixed")
        pr = self.pricing(rt)
        why = refusal(rt, md.model.num_layers, batch, pp=cell.pp, gpus=cell.num_gpus)
        if why:
            return infeasible(cell, EstimateSource.NONE, why)
        # a cell-level measurement names no runtime: it holds for every runtime that may run the cell
        rec = md.cell_records.get((batch, cell.gpu_type, cell.num_nodes, cell.gpus_per_node))
        if vw is not None:
            why = self._vw_problem(md.model, batch, cell, vw, rt)
            if why:
                src = (
                    EstimateSource.MEASURED
                    if rec is not None
                    else self.search.found(md, batch, cell, OWN, vw=vw).source
                )
                return infeasible(cell, src, why)
        if rec is not None and pr.own:
            return self.measured.as_run(md, batch, cell, rec, vw, shard, rt)
        if rec is not None:
            return self.measured.as_measured(md, batch, cell, rec, vw, shard)
        return self._from_model(md, batch, cell, vw, shard, rt)

    def _vw_problem(self, model: ModelSpec, batch: int, cell: Cell, vw: int, rt: str) -> str:
        """Why no plan of the cell can run V = `vw` virtual workers under
        runtime `rt` ("" when some may)."""
        if batch % vw:
            return f"V={vw} virtual workers do not divide the global batch {batch}"
        tps = self.search.tp_options(model, cell)
        dps = [cell.num_gpus // (cell.pp * tp) for tp in tps]
        if dps and min(dps) > vw:
            return f"needs dp > V: the cell's smallest dp is {min(dps)}, V={vw} virtual workers"
        refused = [
            refusal(rt, model.num_layers, batch, vw, pp=cell.pp, tp=tp, dp=dp) for tp, dp in zip(tps, dps, strict=True)
        ]
        return next((why for why in refused if why), "") if refused and all(refused) else ""

    def _from_model(self, md: ModelData, batch: int, cell: Cell, vw: int | None, shard: bool, rt: str) -> Estimate:
        found = self.search.found(md, batch, cell, rt, vw=vw, shard=shard)
        if found.source == EstimateSource.NONE:
            return infeasible(cell, EstimateSource.NONE, "no profile, measurement or GPU spec for this cell")
        factor = self.measured.calibration(md, batch, cell) if found.source == EstimateSource.ANALYTIC else None
        scale, source = (1.0, found.source) if factor is None else (factor, EstimateSource.ANALYTIC_CALIBRATED)
        limit = self.search.memory.limit(cell.gpu_type)
        pr = self.pricing(rt)
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
                t = t_rec if vw is None else t_rec * self.measured.plan_ratio(md, batch, cell, c, vw, found.source)
                cand = (t, i, EstimateSource.MEASURED)
                times[i] = (t, EstimateSource.MEASURED)
            elif c.mem_bytes > limit:
                continue
            else:
                cand = (c.time_s * scale, i, source)
            if not pr.runs_replicated(c.dp):  # measured or not, it runs only sharded (its twin)
                continue
            if best is None or cand[:2] < best[:2]:
                best = cand
        if best_sharded is not None:
            gain = 0.0 if pr.always_shards_optimizer else self.settings.shard_min_gain
            pick = pick_sharded(best[:2] if best else None, best_sharded[:2], gain)
            best = best_sharded if pick == best_sharded[:2] else best
        if best is None:
            if not found.plans:
                return infeasible(cell, found.source, "no valid plan (tp, dp, batch divisibility)")
            least = min(c.mem_bytes for c in found.plans) / GB
            return infeasible(cell, found.source, f"OOM: least plan needs {least:.1f} GB > {limit / GB:.1f} GB", least)
        time_s, i, src = best
        return Estimate(
            cell,
            found.plan(i, cell.pp),
            time_s,
            found.plans[i].mem_bytes / GB,
            src,
            "" if not self.pricing(rt).own else f"runtime {rt}",
            state_gb=self.search.state_gb(md, batch, cell, found, i, rt, vw),
        )
