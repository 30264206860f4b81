"""Iteration time and peak memory of one parallel plan in a node layout.

Ranks are laid out stage-major with tp fastest (rank = stage*dp*tp + d*tp + t),
filling nodes in order, so a tp group stays inside a node (tp divides the
GPUs per node) and a stage's dp*tp ranks are consecutive.

With m micro-batches of b samples, stage times s_k (compute + TP all-reduces
on the intra-node link) and per-boundary p2p times c_k (the activation
forward and its gradient back, one micro-batch)::

    time = (m - 1) * max_k s_k + sum_k s_k + sum_k c_k + max_k allreduce_dp(grads_k)

(1F1B / GPipe; with the ALLGATHER sync, ``allgather_dp(units x grads_k)``
instead: every rank's gradients gathered, then added in rank order), plus
the weight update (the stages update in parallel)::

    + max_k params_k * update_bytes_per_param / mem_bw

a memory-bound sweep over the parameters, gradients and optimizer state
(``update_bytes_per_param``: by default every byte of the state read and
written once, 2 x optimizer_bytes_per_param). On CPU the profiler measures
the bandwidth an optimizer step achieves (``launch.profiler.profile_update``).
The gradient all-reduce of a stage runs on the intra-node
link when the stage's ranks share a node, else on the network. A node's
network card is shared: a stage's tp all-reduce rings cross it together
(bytes x tp), and its min(dp*tp, gpus/node) p2p senders each send 1/tp of
the activation (bytes x min(dp*tp, gpus/node) / tp).

Peak memory per GPU (1F1B: stage k holds min(m, pp - k) micro-batches)::

    max_k  params_k * optimizer_bytes_per_param + act_k(b) * min(m, pp - k)

where params_k = the stage's parameter bytes / dtype bytes, per GPU.

Sharded optimizer state (ZeRO-1, ``launch.sharding.ShardedOptimizer``):
parameters and gradients stay replicated on every dp rank (``state_split``:
2 x dtype bytes per parameter, at most optimizer_bytes_per_param), only the
optimizer's state (the rest of optimizer_bytes_per_param) is split, and each
rank also keeps a flat copy of its slice of the parameters (the tensor its
optimizer steps: dtype bytes per parameter of the slice). With rank r owning
the fraction f_r of each stage's parameters::

    mem_r = params_k * (replicated + (state + dtype_bytes) * f_r) + act_k

The sharded step (``sharded_step_time``) is the runtime's: every rank's unit
gradients of slice r go to its owner (one gather per owner: together what an
all-gather of the units' gradients moves), the owner updates its slice only
(the largest slice sets the time), then the updated slices are all-gathered,
padded to the largest slice.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.cost.comm import NET, Links
from solver.cost.layers import StageCosts

#: How a stage's gradients are summed over its dp ranks: a ring all-reduce
#: (DDP, Megatron), or an all-gather of every rank's gradients added in rank
#: order, bitwise the same for any dp (``launch.elastic.ordered_sum``).
ALLREDUCE, ALLGATHER = "allreduce", "allgather"
GRAD_SYNCS = (ALLREDUCE, ALLGATHER)


@dataclass(frozen=True)
class Ranks:
    """Where a plan's stages run: `dp` x `tp` ranks per stage, laid out in
    order on nodes of `gpus_per_node` GPUs that talk over `links`, training
    a model of `dtype_bytes` per parameter."""

    dp: int
    tp: int
    gpus_per_node: int
    links: Links
    dtype_bytes: int


@dataclass(frozen=True)
class PlanCost:
    """Iteration time (s) and peak per-GPU memory (bytes) of one plan."""

    time_s: float
    mem_bytes: float


def boundary_crosses_nodes(stage: int, ranks_per_stage: int, gpus_per_node: int) -> bool:
    """Whether some rank of `stage` sends to a rank of stage+1 on another node."""
    s, g = ranks_per_stage, gpus_per_node
    if s >= g:
        return True
    return (stage * s) % g + s - 1 >= g - s


def stage_spans_nodes(stage: int, ranks_per_stage: int, gpus_per_node: int) -> bool:
    """Whether the ranks of `stage` (and so its dp groups) sit on more than one node."""
    first = stage * ranks_per_stage
    return first // gpus_per_node != (first + ranks_per_stage - 1) // gpus_per_node


def dp_sync_time(st: StageCosts, at: Ranks, *, collective: str = ALLREDUCE, units: int = 1) -> float:
    """Gradient sync of the slowest stage (stages sync in parallel): a ring
    all-reduce of its gradient, or (ALLGATHER) an all-gather of the `units`
    gradients each rank holds, summed locally in rank order."""
    if collective not in GRAD_SYNCS:
        raise ValueError(f"gradient sync must be one of {GRAD_SYNCS}, got {collective!r}")
    dp, tp, gpus_per_node, links = at.dp, at.tp, at.gpus_per_node, at.links
    if dp <= 1:
        return 0.0
    s, sync = dp * tp, 0.0
    for k in range(st.pp):
        link, nbytes = links.intra, st.param_bytes[k]
        if stage_spans_nodes(k, s, gpus_per_node):  # the stage's tp rings share the network card
            link, nbytes = NET, nbytes * tp
        if collective == ALLGATHER:
            t = links.allgather(link, nbytes * units, dp)
        else:
            t = links.allreduce(link, nbytes, dp)
        sync = max(sync, t)
    return sync


def update_time(st: StageCosts, *, dtype_bytes: int, update_bytes_per_param: float, mem_bw_gbps: float) -> float:
    """Weight update of the slowest stage: its state swept at memory bandwidth."""
    if mem_bw_gbps <= 0 or update_bytes_per_param <= 0:
        return 0.0
    return max(st.param_bytes) / dtype_bytes * update_bytes_per_param / (mem_bw_gbps * 1e9)


def pipeline_cost(
    st: StageCosts, at: Ranks, *, m: int, b: float, optimizer_bytes_per_param: float
) -> tuple[float, float]:
    """(time without the gradient sync, peak memory) of a plan; see plan_cost."""
    tp, links, dtype_bytes = at.tp, at.links, at.dtype_bytes
    pp, s, g = st.pp, at.dp * tp, at.gpus_per_node
    intra = links.intra
    slowest = total = p2p = peak = 0.0
    for k in range(pp):
        t = st.time_per_sample[k] * b + st.time_fixed[k]
        if tp > 1:
            for nbytes, count in st.tp_allreduces[k]:
                t += count * links.allreduce(intra, nbytes * b, tp)
        total += t
        if t > slowest:
            slowest = t
        if k < pp - 1:
            size = st.out_per_sample[k] * b
            if boundary_crosses_nodes(k, s, g):
                p2p += 2 * links.p2p(NET, size * max(1, min(s, g) // tp))
            else:
                p2p += 2 * links.p2p(intra, size)
        mem = st.param_bytes[k] / dtype_bytes * optimizer_bytes_per_param + st.act_per_sample[k] * b * (
            m if m < pp - k else pp - k
        )
        if mem > peak:
            peak = mem
    return (m - 1) * slowest + total + p2p, peak


def plan_cost(
    st: StageCosts,
    at: Ranks,
    *,
    m: int,
    b: float,
    optimizer_bytes_per_param: float,
    mem_bw_gbps: float = 0.0,
    update_bytes_per_param: float | None = None,
) -> PlanCost:
    """Time and memory of plan (st.pp, at.dp, at.tp) with m micro-batches of b samples
    (the update is priced when `mem_bw_gbps` is given)."""
    t, mem = pipeline_cost(st, at, m=m, b=b, optimizer_bytes_per_param=optimizer_bytes_per_param)
    upd = 2 * optimizer_bytes_per_param if update_bytes_per_param is None else update_bytes_per_param
    t += update_time(st, dtype_bytes=at.dtype_bytes, update_bytes_per_param=upd, mem_bw_gbps=mem_bw_gbps)
    return PlanCost(t + dp_sync_time(st, at), mem)


def state_split(dtype_bytes: int, optimizer_bytes_per_param: float) -> tuple[float, float]:
    """(replicated, optimizer state) bytes per parameter of a GPU's training
    state: parameters and gradients (2 x dtype bytes) stay on every dp rank,
    the optimizer's state is what sharding splits."""
    rep = min(float(optimizer_bytes_per_param), 2.0 * dtype_bytes)
    return rep, float(optimizer_bytes_per_param) - rep


def sharded_memory(
    st: StageCosts, *, m: int, b: float, dtype_bytes: int, optimizer_bytes_per_param: float, fraction: float
) -> tuple[float, float]:
    """(peak memory, its optimizer state) per GPU (bytes) when this rank owns
    `fraction` of each stage's optimizer state (module doc, ZeRO-1)."""
    rep, state = state_split(dtype_bytes, optimizer_bytes_per_param)
    per_param = rep + (state + dtype_bytes) * fraction
    pp, peak, peak_state = st.pp, 0.0, 0.0
    for k in range(pp):
        params = st.param_bytes[k] / dtype_bytes
        mem = params * per_param + st.act_per_sample[k] * b * (m if m < pp - k else pp - k)
        if mem > peak:
            peak, peak_state = mem, params * (state + dtype_bytes) * fraction
    return peak, peak_state


def replicated_state(st: StageCosts, *, m: int, b: float, dtype_bytes: int, optimizer_bytes_per_param: float) -> float:
    """The optimizer state (bytes per GPU) at the stage of peak memory, replicated."""
    _, state = state_split(dtype_bytes, optimizer_bytes_per_param)
    pp, peak, out = st.pp, -1.0, 0.0
    for k in range(pp):
        params = st.param_bytes[k] / dtype_bytes
        mem = params * optimizer_bytes_per_param + st.act_per_sample[k] * b * (m if m < pp - k else pp - k)
        if mem > peak:
            peak, out = mem, params * state
    return out


def sharded_sync_time(links: Links, link: str, nbytes: float, dp: int, units: int, fraction: float) -> float:
    """The communication of the sharded step (``launch.sharding.ShardedOptimizer.step``)
    for gradients of `nbytes` per rank on `link` among `dp` ranks: every
    rank's `units` unit gradients go slice by slice to the slices' owners
    (one gather per owner, in turn: together what an all-gather of the
    units' gradients takes), then the updated slices are all-gathered,
    padded to the largest (`fraction` of the parameters)."""
    if dp <= 1:
        return 0.0
    return links.allgather(link, nbytes * units, dp) + links.allgather(link, nbytes * fraction, dp)


def sharded_step_time(
    st: StageCosts, at: Ranks, *, units: int, fraction: float, update_bytes_per_param: float, mem_bw_gbps: float
) -> float:
    """Gradient reduce, slice update and all-gather of the slowest stage with
    sharded state (module doc); `fraction`: the largest slice's share of a
    stage's parameters, `units` the gradients each rank holds."""
    dp, tp, links, dtype_bytes = at.dp, at.tp, at.links, at.dtype_bytes
    if dp <= 1:
        return update_time(
            st, dtype_bytes=dtype_bytes, update_bytes_per_param=update_bytes_per_param, mem_bw_gbps=mem_bw_gbps
        )
    s, comm = dp * tp, 0.0
    for k in range(st.pp):
        link, nbytes = links.intra, st.param_bytes[k]
        if stage_spans_nodes(k, s, at.gpus_per_node):
            link, nbytes = NET, nbytes * tp
        comm = max(comm, sharded_sync_time(links, link, nbytes, dp, units, fraction))
    upd = 0.0
    if mem_bw_gbps > 0 and update_bytes_per_param > 0:
        upd = max(st.param_bytes) / dtype_bytes * fraction * update_bytes_per_param / (mem_bw_gbps * 1e9)
    return comm + upd
