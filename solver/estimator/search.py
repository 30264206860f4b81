"""The plan search inside a single-type cell (pp fixed): every tp, dp and
micro-batch count the cell and the job's runtime allow, priced by the
model source the profiles offer (``solver.estimator``'s module doc).

Which plans a runtime may run is asked of ``solver.contract.runtimes.refusal``
(the one rule), per tp and per micro-batch count; how each is priced, of
``solver.cost`` (time) and `Memory` (bytes).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from solver.contract.models import ModelSpec
from solver.contract.runtimes import refusal
from solver.cost.layers import StageCosts
from solver.cost.pipeline import (
    ALLGATHER,
    Ranks,
    dp_sync_time,
    pipeline_cost,
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
    sweep_time,
    zero1_allreduce_time,
)
from solver.estimator.candidates import Cand, Found
from solver.estimator.memory import Memory
from solver.estimator.profiles import GB, ModelData, Profiles
from solver.types import Cell, EstimateSource


class StepAt(NamedTuple):
    """Where a step's end is priced: its `ranks`, `k` gradient units per
    rank and the GPU's memory bandwidth."""

    ranks: Ranks
    k: int
    mem_bw: float


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


@functools.lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    """The divisors of n, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(small + [n // d for d in reversed(small) if d * d != n])


def busiest_factor(virtual_workers: int, dp: int) -> float:
    """k x dp / V: the busiest of dp ranks runs k = ceil(V / dp) of V
    virtual workers, this many times an even share (1 when dp divides V)."""
    return -(-virtual_workers // dp) * dp / virtual_workers


class PlanSearch:
    """A cell's candidate plans, priced and memoised per model (module doc)."""

    def __init__(self, profiles: Profiles) -> None:
        self.profiles = profiles
        self.settings = profiles.settings
        self.memory = Memory(profiles)
        self._pricing: dict[str, Pricing] = {}

    def pricing(self, runtime: str) -> Pricing:
        """How plans of `runtime` are priced (solver.cost.runtime): its own
        gradient sync, state layout and buffers; ``adaptive`` the settings'
        own (`grad_sync`, ZeRO-1 where it may shard)."""
        pr = self._pricing.get(runtime)
        if pr is None:  # UnknownRuntime naming the known ones
            pr = self._pricing[runtime] = pricing_of(runtime, self.settings.grad_sync)
        return pr

    @staticmethod
    def tp_ok(model: ModelSpec, tp: int, gpus_per_node: int) -> bool:
        width = model.heads if model.heads > 1 else model.hidden
        return gpus_per_node % tp == 0 and width % tp == 0

    def tp_options(self, model: ModelSpec, cell: Cell) -> list[int]:
        """The tp degrees a cell allows (before any source or runtime narrows them)."""
        pp, g = cell.pp, cell.gpus_per_node
        if pp > model.num_layers:
            return []
        return [tp for tp in divisors(g) if self.tp_ok(model, tp, g) and cell.num_gpus % (pp * tp) == 0]

    def stage_counts(self, model: ModelSpec, num_gpus: int) -> list[int]:
        """The pipeline depths a measured layout of `num_gpus` may have had (up to max_pp)."""
        return [p for p in divisors(num_gpus) if p <= min(self.settings.max_pp, model.num_layers)]

    def found(
        self,
        md: ModelData,
        batch: int,
        cell: Cell,
        rt: str,
        source: EstimateSource | None = None,
        every: bool = False,
        vw: int | None = None,
        shard: bool = False,
    ) -> Found:
        """Candidate plans of the cell for runtime `rt` under `source` (None:
        the best available) for V = `vw` virtual workers (None: one per dp
        rank); with `shard`, also each plan of dp > 1 with its optimizer
        state sharded evenly (after all the others; see Found).

        The analytic search stops raising m once past the fastest plan that
        fits (its time is unimodal in m); `every` lists all candidates."""
        if shard:
            skey = (batch, cell, source or "", every, vw, rt)
            found = md.found_sharded.get(skey)
            if found is None:
                found = md.found_sharded[skey] = self._with_sharded(md, batch, cell, rt, source, every, vw)
            return found
        key = (batch, cell, source or "", every, vw, rt)
        found = md.found.get(key)
        if found is not None:
            return found
        model, pp, g = md.model, cell.pp, cell.gpus_per_node
        pr = self.pricing(rt)
        layers = model.num_layers
        # the runtime's plans only (dp <= V, or dp = V without virtual workers; whole samples per virtual worker)
        tps = [
            tp
            for tp in self.tp_options(model, cell)
            if refusal(rt, layers, batch, vw, pp=pp, tp=tp, dp=cell.num_gpus // (pp * tp)) is None
        ]
        profiles = self.profiles
        if source is None:
            chosen, tps = profiles.source(md, cell, tps)
        else:  # analytic on purpose (calibration)
            chosen, tps = (
                (EstimateSource.ANALYTIC, tps) if cell.gpu_type in profiles.gpus else (EstimateSource.NONE, [])
            )
        plans: list[Cand] = []
        prune_m = chosen == EstimateSource.ANALYTIC and not every
        links = profiles.links_of(cell.gpu_type)
        spec = profiles.gpus.get(cell.gpu_type)
        mem_bw = spec.mem_bw_gbps if spec is not None else 0.0
        limit = self.memory.limit(cell.gpu_type)
        best = fastest = None
        for tp in tps:
            dp = cell.num_gpus // (pp * tp)
            if vw is None:
                if batch % dp:
                    continue
                per_worker, k = batch // dp, 1
            else:  # the busiest rank runs k virtual workers of batch / V samples in turn
                per_worker, k = batch // vw, -(-vw // dp)
            at = Ranks(dp, tp, g, links, model.dtype_bytes)
            prev, last_st, sync, accumulate = math.inf, None, 0.0, 0.0
            for m in divisors(per_worker):
                if pp > 1 and refusal(rt, layers, batch, vw, pp=pp, tp=tp, dp=dp, micro_batches=m):
                    continue
                b = per_worker // m
                ltype = profiles.layer_type(md, chosen, cell.gpu_type, tp, pr)
                if pr.runtime.uneven_stages:
                    st = profiles.stages(md, chosen, ltype, tp, b, pp, pr.own)
                else:
                    even = profiles.even_stages(md, chosen, ltype, tp, b, pp, pr.own)
                    if even is None:
                        continue
                    st = even
                if st is not last_st:  # gradient sync and weight update: once per iteration
                    sync = self.sync_and_update(st, StepAt(at, k, mem_bw), pr)
                    # the runtimes' autograd adds each micro-batch's gradients into the step's (the
                    # simulator's runtime: only at the settings' accumulate_bytes_per_param)
                    acc = ADD_SWEEP * model.dtype_bytes if pr.own else self.settings.accumulate_bytes_per_param
                    accumulate = update_time(
                        st, dtype_bytes=model.dtype_bytes, update_bytes_per_param=acc, mem_bw_gbps=mem_bw
                    )
                    if pr.grad_sync == ALLGATHER and not pr.own:  # the dp x k gathered gradients added in rank order
                        sync += (dp * k - 1) * accumulate
                    last_st = st
                t, mem = pipeline_cost(
                    st, at, m=m, b=b, optimizer_bytes_per_param=self.settings.optimizer_bytes_per_param
                )
                t += (m - 1) * accumulate  # the largest stage adds m - 1 micro-batches into its gradients
                t = (t if k == 1 else k * t) + sync
                if pr.own and pr.fsdp:  # FSDP's parameter all-gathers and gradient reduce-scatters, every micro-batch
                    t += fsdp_sync_time(st, at, m=m)
                mem = self.memory.replicated(pr, st, model, dp=dp, tp=tp, m=m, b=b, k=k, base=mem)
                i = len(plans)
                plans.append(Cand(dp, tp, m, t, mem, st.blocks, -1, -1.0))
                if fastest is None or t < plans[fastest].time_s:
                    fastest = i
                fits = mem <= limit
                if fits and (best is None or t < plans[best].time_s):
                    best = i
                if prune_m and fits and t > prev:
                    break  # past the optimum: time is unimodal in m, memory only falls
                prev = t
        found = md.found[key] = Found(chosen, tuple(plans), best, fastest)
        return found

    def sync_and_update(self, st: StageCosts, at: StepAt, pr: Pricing | None = None) -> float:
        """The replicated step's end: the dp gradient sync (of `k` units per
        rank) and the weight update, as the runtime priced by `pr` does them
        (None: the settings' own; FSDP: the update of 1/dp of the state, its
        communication is per micro-batch, see `found`)."""
        d, dp, mem_bw = at.ranks.dtype_bytes, at.ranks.dp, at.mem_bw
        upd = update_time(st, dtype_bytes=d, update_bytes_per_param=self.settings.update_bytes, mem_bw_gbps=mem_bw)
        if pr is not None and pr.fsdp:
            return upd / dp
        collective = self.settings.grad_sync if pr is None else pr.grad_sync
        sync = dp_sync_time(st, at.ranks, collective=collective, units=at.k)
        if pr is not None and pr.own and pr.grad_sync == ALLGATHER:  # its copies and the ordered sum's adds
            upd += sweep_time(st, dtype_bytes=d, bytes_per_param=exact_copy_bytes(d, dp, at.k), mem_bw_gbps=mem_bw)
        return sync + upd

    def _with_sharded(
        self, md: ModelData, batch: int, cell: Cell, rt: str, source: EstimateSource | None, every: bool, vw: int | None
    ) -> Found:
        """The plans of `found` followed by each of dp > 1 with its optimizer
        state sharded evenly (solver.cost.pipeline: ZeRO-1 memory and the
        sharded step; the runtime's own, solver.cost.runtime); `best` by
        `pick_sharded`."""
        plain = self.found(md, batch, cell, rt, source, every, vw)
        pr = self.pricing(rt)
        model, pp, g = md.model, cell.pp, cell.gpus_per_node
        settings = self.settings
        _, state = state_split(model.dtype_bytes, settings.optimizer_bytes_per_param)
        if state <= 0:
            return plain
        links = self.profiles.links_of(cell.gpu_type)
        spec = self.profiles.gpus.get(cell.gpu_type)
        mem_bw = spec.mem_bw_gbps if spec is not None else 0.0
        limit = self.memory.limit(cell.gpu_type)
        steps = md.shard_deltas

        def delta(st: StageCosts, dp: int, tp: int, k: int) -> float:
            key = (cell.gpu_type, id(st), dp, k, g, rt)
            if key not in steps:
                at = StepAt(Ranks(dp, tp, g, links, model.dtype_bytes), k, mem_bw)
                if pr.own:
                    steps[key] = self._zero1_step(st, at, pr) - self.sync_and_update(st, at, pr)
                    return steps[key]
                plain_step = self.sync_and_update(st, at)
                steps[key] = self._sharded_step(st, at) - plain_step
            return steps[key]

        twins: list[tuple[int, StageCosts, int, int]] = []  # (replicated plan, its stages, b, k)
        for i, c in enumerate(plain.plans):
            if c.dp < 2:
                continue
            per_worker, k = (batch // c.dp, 1) if vw is None else (batch // vw, -(-vw // c.dp))
            b = per_worker // c.m
            twins.append((i, self.profiles.plan_stages(md, plain.source, cell.gpu_type, c.tp, b, pp, pr), b, k))
        always = pr.always_shards_optimizer  # its replicated plans of dp > 1 are no choice, sharding no option
        min_gain = 0.0 if always else settings.shard_min_gain
        if plain.best is not None and not every and not always:  # no sharded plan can win by shard_min_gain: none
            bar = plain.plans[plain.best].time_s * (1.0 - min_gain)
            if all(
                plain.plans[i].time_s + delta(st, plain.plans[i].dp, plain.plans[i].tp, k) >= bar
                for i, st, _, k in twins
            ):
                return plain
        plans = list(plain.plans)
        best_s = None
        for i, st, b, k in twins:
            c = plain.plans[i]
            mem, st_bytes = self.memory.sharded(pr, st, model, dp=c.dp, m=c.m, b=b, k=k)
            t = c.time_s + delta(st, c.dp, c.tp, k)
            j = len(plans)
            plans.append(Cand(c.dp, c.tp, c.m, t, mem, c.layers, i, st_bytes))
            if mem <= limit and (best_s is None or t < plans[best_s].time_s):
                best_s = j
        plain_best = None if plain.best is None else (plain.plans[plain.best].time_s, plain.best)
        if always:  # the best replicated plan of one dp rank
            plain_best = min(
                ((c.time_s, i) for i, c in enumerate(plain.plans) if pr.runs_replicated(c.dp) and c.mem_bytes <= limit),
                default=None,
            )
        sharded_best = None if best_s is None else (plans[best_s].time_s, best_s)
        pick = pick_sharded(plain_best, sharded_best, min_gain)
        return Found(plain.source, tuple(plans), None if pick is None else pick[1], plain.fastest)

    def _zero1_step(self, st: StageCosts, at: StepAt, pr: Pricing) -> float:
        """The step's end with the optimizer state sharded, as runtime `pr`
        does it: the exact runtime's gathers to the owners and its copies
        (``launch.sharding``), else a reduce-scatter and an all-gather
        (Megatron's distributed optimizer); the update of 1/dp."""
        upd, dp, k, d, mem_bw = self.settings.update_bytes, at.ranks.dp, at.k, at.ranks.dtype_bytes, at.mem_bw
        if pr.grad_sync == ALLGATHER:
            extra = 2 * COPY_SWEEP * d + max(0, dp * k - 1) * ADD_SWEEP * d / dp  # flatten, stack; the slice's adds
            return self._sharded_step(st, at) + sweep_time(st, dtype_bytes=d, bytes_per_param=extra, mem_bw_gbps=mem_bw)
        comm = zero1_allreduce_time(st, at.ranks)
        return comm + update_time(st, dtype_bytes=d, update_bytes_per_param=upd, mem_bw_gbps=mem_bw) / dp

    def _sharded_step(self, st: StageCosts, at: StepAt) -> float:
        """The sharded step (solver.cost.pipeline.sharded_step_time): the slices of 1/dp each."""
        return sharded_step_time(
            st,
            at.ranks,
            units=at.k,
            fraction=1.0 / at.ranks.dp,
            update_bytes_per_param=self.settings.update_bytes,
            mem_bw_gbps=at.mem_bw,
        )

    def state_gb(self, md: ModelData, batch: int, cell: Cell, found: Found, i: int, rt: str, vw: int | None) -> float:
        """The optimizer state (GB per GPU, at the stage of peak memory) of
        candidate i (FSDP runtimes: the dp-th each rank holds)."""
        c = found.plans[i]
        if c.state_bytes >= 0:
            return c.state_bytes / GB
        pr = self.pricing(rt)
        per_worker = batch // c.dp if vw is None else batch // vw
        b = per_worker // c.m
        st = self.profiles.plan_stages(md, found.source, cell.gpu_type, c.tp, b, cell.pp, pr)
        return self.memory.state_gb(pr, st, md.model, dp=c.dp, m=c.m, b=b)
