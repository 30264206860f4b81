"""A pipeline whose stages run on different GPU types (solver.mixed).

Every stage holds dp*tp ranks on nodes of ONE GPU type; the stages of a
type are consecutive, in the order the caller gives the types (a mixed
cell's parts). Ranks are laid out as in ``solver.cost.pipeline`` (stage
major, tp fastest, nodes filled in order), so boundaries, dp groups and
their links follow the same rules.

The trainer's layers (blocks) are split over the stages by
``stage_layers_for``: each stage's weight is its type's speed (blocks per
second at this micro-batch), its cap the most blocks its GPUs hold in
memory when the stage is the first one (the most micro-batches in flight)
and also holds the profile's other records (embedding, head). A type's
block is the mean of its profile's blocks; the records before the first
block ride on the first stage, the rest after the last block on the last.

With those layers the iteration is the formula of solver.cost.pipeline,
each stage priced on its own type: stage k takes
``s_k = L_k x block_k(b) (+ extras)`` per micro-batch (TP all-reduces on
its intra-node link included), a boundary sends the activation and its
gradient once per micro-batch (over the network between types or nodes),
and::

    time = units x ((m - 1) max_k s_k + sum_k s_k + sum_k c_k) + max_k sync_k + max_k update_k

where sync_k is stage k's dp gradient sync on its link and update_k its
weight update at its memory bandwidth; with sharded state (ZeRO-1) the
sync and update are those of ``sharded_step_time`` (per-owner gathers, the
largest slice's update, the all-gather of the slices). Stage k's memory,
``params_k x bytes per parameter + act_k(b) x min(m, pp - k)``, must fit its
type's limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from solver.cost.comm import NET, Links
from solver.cost.layers import LayerCosts, stage_layers_for
from solver.cost.pipeline import ALLGATHER, boundary_crosses_nodes, sharded_sync_time, stage_spans_nodes, state_split


@dataclass(frozen=True)
class TypeSide:
    """One GPU type's side of a typed pipeline: its per-layer costs at the
    plan's tp (per sample, as solver.cost.layers), links, memory limit
    (bytes per GPU) and memory bandwidth (GB/s)."""

    gpu_type: str
    costs: LayerCosts
    links: Links
    mem_limit_bytes: float
    mem_bw_gbps: float


@dataclass(frozen=True)
class _Block:
    """A type's mean block and the extra records at the ends, at micro-batch b."""

    time: float
    act: float
    params: float
    out: float
    lead: tuple[float, float, float]  # (time, act, param bytes) before the first block
    trail: tuple[float, float, float]  # after the last block


def _block(side: TypeSide, b: float, tp: int) -> _Block | None:
    c = side.costs
    flags = c.is_block or (True,) * c.num_layers
    idx = [i for i, f in enumerate(flags) if f]
    if not idx:
        return None

    def cost(i: int) -> float:
        t = c.time_per_sample[i] * b + c.time_fixed[i]
        if tp > 1 and c.tp_allreduces[i]:
            t += c.tp_allreduces[i] * side.links.allreduce(side.links.intra, c.out_per_sample[i] * b, tp)
        return t

    def ends(sel: list[int]) -> tuple[float, float, float]:
        return (
            sum(cost(i) for i in sel),
            sum(c.act_per_sample[i] * b for i in sel),
            sum(c.param_bytes[i] for i in sel),
        )

    n = len(idx)
    return _Block(
        time=sum(cost(i) for i in idx) / n,
        act=sum(c.act_per_sample[i] for i in idx) * b / n,
        params=sum(c.param_bytes[i] for i in idx) / n,
        out=c.out_per_sample[idx[-1]] * b,
        lead=ends(list(range(idx[0]))),
        # after the last block, and any record between blocks that is not one (it rides on the last stage)
        trail=ends([i for i in range(idx[0] + 1, c.num_layers) if not flags[i]]),
    )


@dataclass(frozen=True)
class TypedPlan:
    """The plan's degrees: dp x tp ranks per stage on nodes of `gpus_per_node`
    GPUs, m micro-batches of b samples, `units` gradients per rank (virtual
    workers), the optimizer state `sharded` over dp or not."""

    dp: int
    tp: int
    m: int
    b: float
    gpus_per_node: int
    units: int = 1
    sharded: bool = False


@dataclass(frozen=True)
class TypedPlanCost:
    """A typed pipeline plan: layers per stage, time (s), the peak memory
    over the stages as a fraction of their type's limit, the most memory of
    a stage (bytes) and its optimizer state (bytes)."""

    stage_layers: tuple[int, ...]
    time_s: float
    mem_ratio: float
    mem_bytes: float
    state_bytes: float


def typed_pipeline_cost(
    sides: Sequence[TypeSide],
    stages_of: Sequence[int],
    num_layers: int,
    plan: TypedPlan,
    *,
    dtype_bytes: int,
    optimizer_bytes_per_param: float,
    update_bytes_per_param: float,
    grad_sync: str,
    held_bytes_per_param: float = 0.0,
) -> TypedPlanCost | None:
    """The `plan` (pp = sum(stages_of)) on `sides[i]` for stages_of[i]
    consecutive stages each (module doc); None when its layers cannot be
    split within the stages' memory.

    `grad_sync` REDUCE_SCATTER (FSDP, solver.cost.runtime) shards the whole
    state over dp and prices ``fsdp_sync_time``'s gathers; `held_bytes_per_param`
    is memory a runtime holds besides the state and activations (the exact
    runtime's all-gather buffers), counted against every stage's memory."""
    dp, tp, m, b, units, sharded = plan.dp, plan.tp, plan.m, plan.b, plan.units, plan.sharded
    fsdp = grad_sync == "reduce_scatter"
    pp = sum(stages_of)
    if pp < 2 or num_layers < pp:
        return None
    maybe_blocks = [_block(s, b, tp) for s in sides]
    blocks = [x for x in maybe_blocks if x is not None]
    if len(blocks) != len(maybe_blocks):
        return None
    rep, state = state_split(dtype_bytes, optimizer_bytes_per_param)
    frac = 1.0 / dp if sharded or fsdp else 1.0
    per_param = rep + (state + dtype_bytes) * frac if sharded else float(optimizer_bytes_per_param)
    if fsdp:
        per_param = optimizer_bytes_per_param * frac
    per_param += held_bytes_per_param
    kinds = [i for i, n in enumerate(stages_of) for _ in range(n)]  # the side of each stage
    weights, caps = [], []
    inflight = min(m, pp)
    for i in kinds:
        blk = blocks[i]
        per_block = blk.params / dtype_bytes * per_param + blk.act * inflight
        extra = (blk.lead[2] + blk.trail[2]) / dtype_bytes * per_param + (blk.lead[1] + blk.trail[1]) * inflight
        room = sides[i].mem_limit_bytes - extra
        weights.append(1.0 / blk.time if blk.time > 0 else 1e30)
        caps.append(int(room // per_block) if per_block > 0 else num_layers)
    try:
        layers = stage_layers_for(num_layers, weights, caps)
    except ValueError:
        return None
    s_ranks, g = dp * tp, plan.gpus_per_node
    times, acts, params = [], [], []
    for k, i in enumerate(kinds):
        blk, n = blocks[i], layers[k]
        t, a, p = n * blk.time, n * blk.act, n * blk.params
        if k == 0:
            t, a, p = t + blk.lead[0], a + blk.lead[1], p + blk.lead[2]
        if k == pp - 1:
            t, a, p = t + blk.trail[0], a + blk.trail[1], p + blk.trail[2]
        times.append(t)
        acts.append(a)
        params.append(p)
    p2p = 0.0
    for k in range(pp - 1):
        here, there = sides[kinds[k]], sides[kinds[k + 1]]
        size = blocks[kinds[k]].out
        if kinds[k] != kinds[k + 1] or boundary_crosses_nodes(k, s_ranks, g):
            nbytes = size * max(1, min(s_ranks, g) // tp)
            p2p += 2 * max(here.links.p2p(NET, nbytes), there.links.p2p(NET, nbytes))
        else:
            p2p += 2 * here.links.p2p(here.links.intra, size)
    compute = (m - 1) * max(times) + sum(times) + p2p
    sync = upd = 0.0
    peak_ratio, peak_mem, peak_state = 0.0, 0.0, 0.0
    for k, i in enumerate(kinds):
        side = sides[i]
        mem = params[k] / dtype_bytes * per_param + acts[k] * min(m, pp - k)
        ratio = mem / side.mem_limit_bytes
        if ratio > peak_ratio:
            peak_ratio, peak_mem = ratio, mem
            peak_state = params[k] / dtype_bytes * (state + dtype_bytes if sharded else state) * frac
        if dp > 1:
            link, nbytes = side.links.intra, params[k]
            if stage_spans_nodes(k, s_ranks, g):
                link, nbytes = NET, nbytes * tp
            if fsdp:  # 2 m parameter all-gathers and a gradient reduce-scatter per micro-batch
                t = (2 * m + 1) * side.links.allgather(link, nbytes / dp, dp)
            elif sharded:
                t = sharded_sync_time(side.links, link, nbytes, dp, units, frac)
            elif grad_sync == ALLGATHER:
                t = side.links.allgather(link, nbytes * units, dp)
            else:
                t = side.links.allreduce(link, nbytes, dp)
            sync = max(sync, t)
        if side.mem_bw_gbps > 0 and update_bytes_per_param > 0:
            upd = max(upd, params[k] / dtype_bytes * frac * update_bytes_per_param / (side.mem_bw_gbps * 1e9))
    if peak_ratio > 1.0:
        return None
    return TypedPlanCost(layers, units * compute + sync + upd, peak_ratio, peak_mem, peak_state)
