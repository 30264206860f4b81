"""MixedEstimator: the pricing of mixed cells (see solver.mixed)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from solver.contract.profiles.records import GpuSpec
from solver.contract.runtimes import ADAPTIVE, refusal
from solver.cost.comm import NET_LATENCY_S, Links
from solver.cost.pipeline import ALLGATHER, state_split
from solver.cost.runtime import REDUCE_SCATTER, Pricing, pricing_of
from solver.estimator.protocol import CostModel, CostSettings, EstimatorBase, EstimatorLike
from solver.mixed.dp import DpStep, PartStep, Sync, dp_step, part_step, sync_time
from solver.mixed.pipeline import price_pipeline
from solver.mixed.split import split_batch
from solver.types import Cell, Estimate, EstimateSource, JobRequest, ParallelPlan

__all__ = ["NET_LATENCY_S", "MixedEstimator"]  # NET_LATENCY_S: the network's per-message latency (s)


@dataclass(frozen=True)
class _Split:
    """A data-parallel mixed plan's batch split: samples per rank of each
    part, micro-batches (per virtual worker with V), virtual workers per
    rank of each part (1 each without V), the step it prices to, and how
    much each part's micro-batch (and so its activations) grows over its
    own estimate's."""

    shares: tuple[int, ...]
    m: int
    units: tuple[int, ...]
    step: DpStep
    grow: tuple[float, ...]

    def note(self, vw: int | None, sync: str = "sync") -> str:
        of = "" if vw is None else f" ({', '.join(map(str, self.units))} of V={vw})"
        return (
            f"shares {self.shares} per rank{of}; compute {self.step.compute_s:.4f} s,"
            f" {sync} {self.step.sync_s:.4f} s, update {self.step.update_s:.4f} s"
        )


class MixedEstimator(EstimatorBase):
    """EstimatorLike: mixed cells priced here, every other cell by `inner`,
    from `inner`'s cost model (its per-layer costs, links, GPU specs, memory
    limits and settings; without one, the datasheet's specs and the settings'
    defaults, and no pipelines across types).

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
        self.costs: CostModel | None = inner.cost_model
        self.settings = self.costs.settings if self.costs is not None else CostSettings()
        self.net_gbps = net_gbps
        self.state_sharding = state_sharding
        self.shard_min_gain = shard_min_gain if shard_min_gain is not None else self.settings.shard_min_gain
        # (model signature, global batch, cell, V, shard, runtime) -> estimate
        self._cache: dict[tuple[str, int, Cell, int | None, bool, str], Estimate] = {}
        # (model signature, global batch, cell, shard) -> _dp_parts
        self._parts_cache: dict[tuple[str, int, Cell, bool], tuple[list[Estimate], list[PartStep]] | Estimate] = {}

    @property
    def cost_model(self) -> CostModel | None:
        return self.costs

    def refresh(self) -> bool:
        """Follow the inner estimator's store (its `refresh`): when it changed, forget every mixed estimate too."""
        changed = self.inner.refresh()
        if changed:
            self._cache.clear()
            self._parts_cache.clear()
        return changed

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        if not cell.mixed:
            return self.inner.estimate(job, cell)
        pr = self.pricing(job)
        shard = pr.shards_optimizer(job.state_sharding and self.state_sharding)
        key = (job.model.signature, job.global_batch, cell, job.virtual_workers, shard, job.runtime)
        est = self._cache.get(key)
        if est is None:
            types = [t for t, _ in cell.parts]
            why = refusal(job.runtime, job.model.num_layers, job.global_batch, pp=cell.pp, gpu_types=types)
            if why:
                est = self.none(cell, why)
            else:
                est = price_pipeline(self, job, cell, shard) if cell.pp > 1 else self._price(job, cell, shard)
            self._cache[key] = est
        return est

    def pricing(self, job: JobRequest) -> Pricing:
        """How `job`'s runtime is priced (the cost model's `pricing`; without
        one, the runtime's own table, or the settings' grad_sync for ``adaptive``)."""
        if self.costs is not None:
            return self.costs.pricing(job.runtime)
        return pricing_of(job.runtime, self.settings.grad_sync)

    def grad_sync(self, job: JobRequest) -> str:
        return self.pricing(job).grad_sync

    def _held_gb(self, job: JobRequest, tp: int, ranks: int, units: int) -> tuple[float, float]:
        """(gradient GB per GPU, GB the exact runtime holds at its all-gather
        besides the state: flat unit gradients, send buffer and every rank's
        received ones, solver.cost.runtime); (G, 0) for other runtimes."""
        grads = job.model.params * job.model.dtype_bytes / tp / 1e9
        pr = self.pricing(job)
        if not pr.own or pr.grad_sync != ALLGATHER:
            return grads, 0.0
        return grads, grads * ((units + 1) if ranks <= 1 else (2 * units + 2 * ranks * units - 1))

    @staticmethod
    def none(cell: Cell, note: str, mem: float = math.inf) -> Estimate:
        return Estimate(cell, None, math.inf, mem, EstimateSource.NONE, note)

    # ---- data parallel across types ----------------------------------------------------------------------

    def _dp_parts(self, job: JobRequest, cell: Cell, shard: bool) -> tuple[list[Estimate], list[PartStep]] | Estimate:
        """The parts' single-type estimates (whole batch, replicated state, no V)
        and their steps taken apart (solver.mixed.dp); an infeasible Estimate
        when a part has no plan or the parts want different tp."""
        key = (job.model.signature, job.global_batch, cell, shard)
        got = self._parts_cache.get(key)
        if got is not None:
            return got
        # speeds per sample: the compute is the runtime's, its sync and memory are added here
        part_job = dataclasses.replace(job, virtual_workers=None, state_sharding=False, runtime=ADAPTIVE)
        subs = [self.inner.estimate(part_job, Cell(t, n, cell.gpus_per_node, 1)) for t, n in cell.parts]
        bad = [e for e in subs if not e.feasible]
        out: tuple[list[Estimate], list[PartStep]] | Estimate
        if bad and not shard:
            out = self.none(
                cell, f"part {bad[0].cell.key()} infeasible: {bad[0].note}", min(e.mem_per_gpu_gb for e in bad)
            )
        else:
            if bad:  # a part out of memory on its own may still fit with the state sharded over every rank
                roomy = [e if e.feasible else self._roomy(part_job, e) for e in subs]
                subs = [e for e in roomy if e is not None and e.feasible]
            tps = {e.plan.tp for e in subs if e.plan is not None}
            if len(subs) != len(cell.parts):
                out = self.none(cell, "a part has no plan even with its state sharded over the cell")
            elif len(tps) != 1:
                out = self.none(cell, f"parts want different tp {sorted(tps)}")
            else:
                out = (subs, [part_step(self.costs, self.settings, part_job, e) for e in subs])
        self._parts_cache[key] = out
        return out

    def _net(self) -> Links | None:
        """The network a mixed cell syncs on when `net_gbps` is given (None: the slowest of its parts')."""
        if self.net_gbps is None:
            return None
        return Links(GpuSpec("net", math.inf, 1.0, 1.0, inter_bw_gbps=self.net_gbps), {})

    def dp_time(
        self,
        job: JobRequest,
        cell: Cell,
        samples: Sequence[float],
        micro_batches: Sequence[float],
        units: int = 1,
        slices: Sequence[float] | None = None,
    ) -> float | None:
        """The iteration time of data-parallel mixed `cell` when the busiest
        rank of part i runs samples[i] in micro_batches[i] micro-batches, by
        the composition this estimator prices with (``solver.mixed.dp.dp_step``:
        `units` unit gradients per rank at most, `slices` the sharded state's
        largest slice per rank of each part, None: replicated); None when a
        part has no estimate. The simulator's truth of a mixed cell is this,
        over the truth, at the plan's shares."""
        got = self._dp_parts(job, cell, job.state_sharding and self.state_sharding)
        if isinstance(got, Estimate):
            return None
        step = dp_step(got[1], samples, micro_batches, Sync(units, self.grad_sync(job), slices, self._net()))
        return step.time_s

    def _split(
        self,
        job: JobRequest,
        subs: list[Estimate],
        parts: list[PartStep],
        slices: Sequence[float] | None,
        micro_batches: int,
    ) -> _Split | None:
        """The batch shares of the parts' ranks with at most `micro_batches`
        micro-batches (``split_batch`` by their compute per sample and per
        micro-batch; with V, the sync of the most virtual workers a rank holds
        counts too: every one's gradients are gathered where the state is
        sharded (`slices`) or the sync is an all-gather)."""
        batch, vw = job.global_batch, job.virtual_workers
        ranks = [p.ranks for p in parts]
        grad_sync = self.grad_sync(job)
        per_units = vw is not None and (slices is not None or grad_sync == ALLGATHER)
        if grad_sync == REDUCE_SCATTER:  # FSDP: every rank holds 1/dp of the state and updates it
            slices = [1.0 / sum(ranks)] * len(parts)

        def sync_of(units: int) -> float:
            return sync_time(parts, Sync(units, grad_sync, slices, self._net()))

        split = split_batch(
            batch,
            ranks,
            [p.per_sample_s for p in parts],
            micro_batches,
            vw,
            [p.per_micro_batch_s for p in parts],
            sync_of if per_units else None,
        )
        if split is None:
            return None
        shares, m = split
        # a rank runs m micro-batches (of shares/m samples); with V, m per virtual worker (of batch/V/m samples)
        units = tuple([1] * len(shares) if vw is None else [s * vw // batch for s in shares])
        # FSDP's gathers and reduce-scatters come once per micro-batch (dp.sync_time counts them as units)
        n_units = m if grad_sync == REDUCE_SCATTER else max(units)
        step = dp_step(parts, shares, [m * u for u in units], Sync(n_units, grad_sync, slices, self._net()))
        # a rank's micro-batch is shares/m here (batch/V/m with V), batch/(ranks*m_i) in the part's own estimate
        mb = [s / m for s in shares] if vw is None else [batch / vw / m] * len(shares)
        grow_by: list[float] = []
        for e, b, r in zip(subs, mb, ranks, strict=True):
            assert e.plan is not None  # the parts' estimates are feasible (_dp_parts)
            grow_by.append(max(1.0, b / (batch / (r * e.plan.micro_batches))))
        grow = tuple(grow_by)
        return _Split(tuple(shares), m, units, step, grow)

    def _price(self, job: JobRequest, cell: Cell, shard: bool) -> Estimate:
        vw = job.virtual_workers
        got = self._dp_parts(job, cell, shard)
        if isinstance(got, Estimate):
            return got
        subs, parts = got
        tp = subs[0].plan.tp if subs[0].plan is not None else 1
        batch = job.global_batch
        ranks = [p.ranks for p in parts]
        if vw is not None and (batch % vw or vw < sum(ranks)):
            why = "do not divide the global batch" if batch % vw else f"are fewer than the {sum(ranks)} dp ranks"
            return self.none(cell, f"V={vw} virtual workers {why}")
        costs = self.costs
        limits = [costs.mem_limit_gb(t) if costs is not None else math.inf for t, _ in cell.parts]
        src = "+".join(sorted({e.source for e in subs}))
        replicated_ok = all(e.plan is not None and e.plan.state_shares == () for e in subs)
        plain: Estimate | None = None
        sharded: Estimate | None = None
        least: tuple[float, list[float]] | None = None  # the least memory of a replicated split (for the note)
        seen: set[int] = set()
        for cap in self._micro_options(job, subs):  # fewer micro-batches: less fixed cost, more memory
            split = self._split(job, subs, parts, None, cap)
            if split is None or split.m in seen:
                continue
            seen.add(split.m)
            mems = self._runtime_mems(job, tp, sum(ranks), split, self._memory(job, subs))
            worst = max(need / lim for need, lim in zip(mems, limits, strict=True))
            if least is None or worst < least[0]:
                least = (worst, mems)
            if worst <= 1.0 and replicated_ok and (plain is None or split.step.time_s < plain.iter_time_s):
                plain = Estimate(
                    cell,
                    ParallelPlan(1, sum(ranks), tp, split.m, split.shares),
                    split.step.time_s,
                    max(mems),
                    EstimateSource.MIXED,
                    f"parts {src}; {split.note(vw)}",
                    max(e.state_gb for e in subs),
                )
            if shard:
                cand = self._sharded_dp(job, cell, subs, parts, limits, split)
                if cand is not None and (sharded is None or cand.iter_time_s < sharded.iter_time_s):
                    sharded = cand
        if least is None:
            why = (
                f"global batch {batch} < {sum(ranks)} dp ranks"
                if vw is None
                else f"V={vw} virtual workers do not split into whole ones per rank over {'+'.join(map(str, ranks))}"
                " ranks"
            )
            return self.none(cell, why)
        pick = self.pick(plain, sharded)
        if pick is not None:
            return pick
        mems = least[1]
        worst_part = max(range(len(mems)), key=lambda i: mems[i] / limits[i])
        return self.none(cell, f"OOM: {mems[worst_part]:.1f} GB per {cell.parts[worst_part][0]} GPU", max(mems))

    def _memory(self, job: JobRequest, subs: list[Estimate]) -> list[tuple[float, float]]:
        """Each part's memory per GPU (GB) as (training state, activations):
        the state (parameters, gradients, optimizer) does not grow with the
        micro-batch, the activations do. All of it counts as activations where
        the part's estimate does not say its optimizer state."""
        obpp = self.settings.optimizer_bytes_per_param
        _, state = state_split(job.model.dtype_bytes, obpp)
        out = []
        for e in subs:
            static = min(e.mem_per_gpu_gb, e.state_gb * obpp / state) if state > 0 and e.state_gb > 0 else 0.0
            out.append((static, e.mem_per_gpu_gb - static))
        return out

    def _runtime_mems(
        self, job: JobRequest, tp: int, n_ranks: int, split: _Split, parts: list[tuple[float, float]]
    ) -> list[float]:
        """Each part's peak memory per GPU (GB) of a replicated split as the
        job's runtime holds it (solver.cost.runtime): the state and grown
        activations; exact: also its all-gather buffers over all `n_ranks`;
        FSDP: the state sharded evenly over them, the root unit and the
        largest blocks unsharded."""
        pr = self.pricing(job)
        base = [static + act * f for (static, act), f in zip(parts, split.grow, strict=True)]
        if not pr.own:
            return base
        model = job.model
        if pr.fsdp:
            root = model.vocab * model.hidden * model.dtype_bytes / tp / 1e9
            block = max(0.0, model.params - model.vocab * model.hidden) * model.dtype_bytes / tp / 1e9
            block /= max(1, model.num_layers)
            return [
                static / n_ranks + act * f + 2 * root + 3 * block
                for (static, act), f in zip(parts, split.grow, strict=True)
            ]
        out = []
        for (static, act), f, u in zip(parts, split.grow, split.units, strict=True):
            grads, held = self._held_gb(job, tp, n_ranks, u)
            out.append(max(static + act * f + (u - 1) * grads * (held > 0), static + held))
        return out

    def held_per_param(self, job: JobRequest, dp: int, units: int) -> float:
        """Bytes per parameter the exact runtime's all-gather holds besides
        the state (counted against every stage, with its activations: an
        upper bound for pipelines across types); 0 for other runtimes."""
        pr = self.pricing(job)
        if not pr.own or pr.grad_sync != ALLGATHER:
            return 0.0
        return job.model.dtype_bytes * ((units + 1) if dp <= 1 else (2 * units + 2 * dp * units - 1))

    def _micro_options(self, job: JobRequest, subs: list[Estimate]) -> list[int]:
        """The micro-batch counts to try, most first: the divisors of the most
        the parts' own plans use (memory); with V, those that divide batch / V."""
        top = max(e.plan.micro_batches for e in subs if e.plan is not None)
        vw = job.virtual_workers
        if vw is None:
            return [d for d in range(top, 0, -1) if top % d == 0]
        per = job.global_batch // vw
        return [d for d in range(min(top, per), 0, -1) if per % d == 0]

    def _roomy(self, job: JobRequest, e: Estimate) -> Estimate | None:
        """A part's estimate as if its memory were unlimited: its fastest plan
        and that plan's memory (None: the inner estimator cannot say)."""
        every = self.costs.plans(job, e.cell) if self.costs is not None else None
        if not every:
            return None
        plan, t, mem = min(every, key=lambda x: (x[2], x[1]))  # the least memory: sharding must cover the rest
        obpp = self.settings.optimizer_bytes_per_param
        _, state = state_split(job.model.dtype_bytes, obpp)
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
        parts: list[PartStep],
        limits: list[float],
        split: _Split,
    ) -> Estimate | None:
        """The data-parallel mixed plan with its state sharded by free memory
        (module doc), from the replicated plan's `split`: with V the shares
        are split again for the sharded step (its gathers grow with the most
        virtual workers a rank holds); without, they stay."""
        d = job.model.dtype_bytes
        obpp = self.settings.optimizer_bytes_per_param
        _, state = state_split(d, obpp)
        if state <= 0 or not all(e.state_gb > 0 for e in subs):
            return None
        # per GPU: what stays replicated, and the whole state with the runtime's slice copy
        reps = [
            static - e.state_gb + act * f
            for e, (static, act), f in zip(subs, self._memory(job, subs), split.grow, strict=True)
        ]
        full = max(e.state_gb for e in subs) * (state + d) / state
        free = [lim - r for lim, r in zip(limits, reps, strict=True)]
        if min(free) <= 0 or not all(math.isfinite(x) for x in free):
            return None
        total = sum(p.ranks * f for p, f in zip(parts, free, strict=True))
        if full > total:
            return None
        fractions = tuple(f / total for f in free)  # of the parameters, the slice a rank of each part owns
        mems = [r + full * x for r, x in zip(reps, fractions, strict=True)]
        pr = self.pricing(job)
        if pr.own and pr.grad_sync == ALLGATHER:  # the owners gather every unit's slices (launch.sharding)
            grads = job.model.params * d / parts[0].tp / 1e9
            gather = (5 * max(split.units) - 1) * grads
            mems = [
                max(mem, static - e.state_gb + full * x + gather)
                for mem, e, (static, _), x in zip(mems, subs, self._memory(job, subs), fractions, strict=True)
            ]
        if job.virtual_workers is not None:  # the micro-batch, and so the memory, is the same for any split
            again = self._split(job, subs, parts, fractions, split.m)
            if again is None:
                return None
            split = again
        else:
            sync = Sync(max(split.units), self.grad_sync(job), fractions, self._net())
            step = dp_step(parts, split.shares, [split.m * u for u in split.units], sync)
            split = dataclasses.replace(split, step=step)
        plan = ParallelPlan(
            1, sum(p.ranks for p in parts), parts[0].tp, split.m, split.shares, state_shares=tuple(free)
        )
        return Estimate(
            cell,
            plan,
            split.step.time_s,
            max(mems),
            EstimateSource.MIXED,
            f"state sharded by free memory ({', '.join(f'{x:.3g}' for x in free)} GB per rank);"
            f" {split.note(job.virtual_workers, 'gathers')}",
            max(full * x for x in fractions),
        )

    def pick(self, plain: Estimate | None, sharded: Estimate | None) -> Estimate | None:
        if sharded is None:
            return plain
        if plain is None or sharded.iter_time_s < plain.iter_time_s * (1.0 - self.shard_min_gain):
            return sharded
        return plain
