"""What a runtime (``solver.contract.runtimes``) adds to a plan's time and memory.

The pipeline model (``solver.cost.pipeline``) prices compute, tensor- and
pipeline-parallel communication, the optimizer's state and the activations.
How the dp ranks sum their gradients, and what that costs in memory, is the
runtime's: `Pricing` says which runtime a plan is priced for, and the
functions here add its own sync and buffers, per stage, with G_k the stage's
gradient bytes per GPU (= its parameter bytes, ``StageCosts.param_bytes``),
P_k its parameters, o the optimizer bytes per parameter (parameters,
gradients and the optimizer's state together), a_k its activations in
flight (``act_per_sample x b x min(m, pp - k)``), k the units (virtual
workers) of the busiest rank and d the dtype bytes:

- ``adaptive`` (the simulator's trace jobs): the estimator's own settings
  (its ``grad_sync``, ZeRO-1 where it may shard), nothing added: the pricing
  every simulation result was made with.
- ``exact`` (``launch.elastic.ordered_sum``, the reference trainer): each
  unit's gradient is flattened and kept (k G), sent in one buffer (k G) and
  all ranks' received (dp k G), then added in rank order. The process
  group's all-gather into a list of tensors fills one flat buffer of the
  same dp k G first and copies it out (gloo and NCCL alike), so that is held
  twice::

      sync  = allgather(k G_k, dp) + (dp k - 1) adds + copies
      mem_k = max(P_k o + a_k + (k - 1) G_k,                  # backward
                  P_k o + G_k (k + 1)                  dp = 1  # sum, copied back
                  P_k o + G_k (2 k + 2 dp k - 1)       dp > 1) # the all-gather

  (at the all-gather no parameter holds a gradient: the gradient slot of o
  is free).

  an add or a copy sweeps 3 d or 2 d bytes per parameter at the GPU's memory
  bandwidth (the copies: flatten, the send buffer (dp > 1), the sum's clone,
  the copy back into the parameters: ``EXACT_COPY_BYTES`` per d). With the
  optimizer state sharded (ZeRO-1, ``launch.sharding``) the sync is
  ``sharded_step_time``'s and the memory the ZeRO-1 state plus, while the
  owners gather, the flat unit gradients, their stack, the received slices
  (and the gather's flat buffer of them) and their concatenation:
  ``(5 k - 1) G_k`` (the gradient slot of o is free).
- ``ddp`` (torch DDP): a ring all-reduce of G_k, replicated state, and DDP's
  gradient buckets, a flat copy of the gradients: ``mem_k = P_k o + G_k + a_k``.
- ``megatron``: its distributed optimizer (ZeRO-1) in every plan of dp > 1
  (``State.ZERO1``: the launcher's adapter always asks for it, so no plan of
  dp > 1 is priced with replicated state): a reduce-scatter of the gradients
  and an all-gather of the updated parameters, together the all-reduce's
  volume, and the update of 1/dp.
- ``sharded`` and ``torchtitan`` (FSDP2, ``launch.sharded``: ``fully_shard``
  per transformer block, then the stage as the root unit): parameters,
  gradients and optimizer state sharded evenly over dp (mixed cells too:
  FSDP2 shards every parameter evenly, so each rank holds 1/dp whatever its
  memory); every block's parameters all-gathered in each micro-batch's
  forward and again in its backward, its gradients reduce-scattered after
  each micro-batch's backward (pp = 1: nothing accumulates unsharded) or
  once per step (pp > 1: the pipeline schedule defers the reduce-scatter to
  the last micro-batch, so the stage's unsharded gradients are held)::

      sync  = u (2 m allgather(G_k / u dp, dp) + r reduce_scatter(G_k / u, dp))    r = m (pp 1), 1 (pp > 1)
      mem_k = P_k o / dp + a_k + 2 R_k + 3 L_k                           pp = 1
      mem_k = P_k o / dp + a_k + R_k + 2 L_k + G_k                       pp > 1

  (dp = 1 too: FSDP2 over one rank still gathers into unsharded buffers).

  with u the stage's FSDP units (its blocks and the stage, one collective
  each), L_k the stage's largest block (its gathered parameters, the next
  one's prefetched, its unsharded gradient), R_k the root unit's records
  that are not blocks (embedding, head: FSDP2 keeps the root's parameters
  gathered from forward to backward, and its gradient), and the update of
  1/dp of the state. A unit's gather and reduce are priced from the
  profile's curves of FSDP2's own (``Links.fsdp_unshard``,
  ``Links.fsdp_reduce``: the collective with FSDP's copies into and out of
  its buffers, which a one-rank profile of the layers cannot see), else as
  the all-gather of G_k / u dp per rank and the reduce-scatter of G_k / u
  (the ring's (dp - 1)/dp of the buffer, unless the profile has the
  backend's own reduce-scatter curve, ``Links.reduce_scatter``).

Pipelines of ``exact``, ``sharded`` and ``torchtitan`` run torch's
``Schedule1F1B`` (``torch.distributed.pipelining``), which needs m >= pp
and holds, per stage, a receive buffer per micro-batch for the activation
from the stage before and one for the gradient from the stage after, and on
the last stage every micro-batch's output: ``m b (out_{k-1} + out_k)``
(``out_k`` the stage's output per sample; the last stage's is its output).
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.contract.runtimes import GradSync, Runtime, State, get_runtime
from solver.cost.comm import NET
from solver.cost.layers import StageCosts
from solver.cost.pipeline import ALLGATHER, ALLREDUCE, Ranks, stage_spans_nodes

#: FSDP: parameters all-gathered, gradients reduce-scattered
REDUCE_SCATTER = str(GradSync.REDUCE_SCATTER)
#: the exact runtime's copies of the gradient per step: flattened, into the
#: send buffer (dp > 1 only), the sum cloned, cloned back per parameter
EXACT_COPIES = 4
#: bytes per dtype byte of one copy (read + write) and of one add (two reads, a write)
COPY_SWEEP, ADD_SWEEP = 2, 3


@dataclass(frozen=True)
class Pricing:
    """How one runtime's plans are priced (module doc): `runtime` is the
    runtime itself (what it may run: solver.contract.runtimes), the rest how
    its step is priced."""

    runtime: Runtime
    grad_sync: str  #: ALLREDUCE, ALLGATHER or REDUCE_SCATTER
    state: str  #: solver.contract.runtimes.State: replicated, optimizer (ZeRO-1 may shard), full (FSDP)
    #: the runtime's own memory and copies are added (False: `adaptive`, the estimator's settings alone)
    own: bool = True

    @property
    def name(self) -> str:
        return self.runtime.name

    @property
    def fsdp(self) -> bool:
        return self.state == State.FULL

    @property
    def may_shard_optimizer(self) -> bool:
        return self.state in (State.OPTIMIZER, State.ZERO1)

    @property
    def always_shards_optimizer(self) -> bool:
        """Every plan of dp > 1 runs with its optimizer state sharded (State.ZERO1), whatever the job says."""
        return self.state == State.ZERO1

    def runs_replicated(self, dp: int) -> bool:
        """Whether a plan of `dp` ranks may keep its optimizer state replicated (dp = 1, or not ZERO1)."""
        return dp == 1 or not self.always_shards_optimizer

    def shards_optimizer(self, allowed: bool) -> bool:
        """Whether plans are priced with sharded optimizer state too: always
        where the runtime always shards, else where it may and `allowed` (the
        job's and the estimator's state_sharding) says so."""
        return self.always_shards_optimizer or (allowed and self.may_shard_optimizer)


def pricing_of(name: str, grad_sync: str = ALLREDUCE) -> Pricing:
    """The pricing of runtime NAME; ``adaptive`` takes the estimator's `grad_sync` and adds nothing."""
    rt = get_runtime(name)
    if name == "adaptive":
        return Pricing(rt, grad_sync, str(State.OPTIMIZER), own=False)
    return Pricing(rt, str(rt.grad_sync), str(rt.state))


def _stage_link(st: StageCosts, k: int, at: Ranks) -> tuple[str, float]:
    """The link a stage's dp sync runs on and its bytes per rank (a node's tp rings share its card)."""
    if stage_spans_nodes(k, at.dp * at.tp, at.gpus_per_node):
        return NET, st.param_bytes[k] * at.tp
    return at.links.intra, st.param_bytes[k]


def fsdp_sync_time(st: StageCosts, at: Ranks, *, m: int) -> float:
    """FSDP's communication of the slowest stage (module doc): 2 m parameter
    all-gathers and m gradient reduce-scatters (one with pp > 1)."""
    dp, links = at.dp, at.links
    if dp <= 1:
        return 0.0
    out, scatters = 0.0, m if st.pp == 1 else 1
    for k in range(st.pp):
        link, nbytes = _stage_link(st, k, at)
        # one collective per FSDP unit: the stage's blocks and the stage itself (the root)
        units = (st.blocks[k] if st.blocks else st.layers[k]) + 1
        per = nbytes / units
        t = units * (2 * m * links.fsdp_unshard(link, per, dp) + scatters * links.fsdp_reduce(link, per, dp))
        out = max(out, t)
    return out


def zero1_allreduce_time(st: StageCosts, at: Ranks) -> float:
    """Megatron's distributed optimizer: reduce-scatter of the gradients and all-gather of the parameters."""
    dp, links = at.dp, at.links
    if dp <= 1:
        return 0.0
    out = 0.0
    for k in range(st.pp):
        link, nbytes = _stage_link(st, k, at)
        out = max(out, links.reduce_scatter(link, nbytes, dp) + links.allgather(link, nbytes / dp, dp))
    return out


def sweep_time(st: StageCosts, *, dtype_bytes: int, bytes_per_param: float, mem_bw_gbps: float) -> float:
    """A memory sweep of `bytes_per_param` over the largest stage's parameters."""
    if mem_bw_gbps <= 0 or bytes_per_param <= 0:
        return 0.0
    return max(st.param_bytes) / dtype_bytes * bytes_per_param / (mem_bw_gbps * 1e9)


def exact_copy_bytes(dtype_bytes: int, dp: int, units: int) -> float:
    """Bytes per parameter the exact runtime's step moves besides the update:
    its copies of the gradient and the dp x k - 1 adds of the ordered sum."""
    copies = EXACT_COPIES if dp > 1 else EXACT_COPIES - 1
    return (copies * COPY_SWEEP + max(0, dp * units - 1) * ADD_SWEEP) * dtype_bytes


def _inflight(m: int, pp: int, k: int) -> int:
    return m if m < pp - k else pp - k


def runtime_memory(
    pricing: Pricing,
    st: StageCosts,
    *,
    dp: int,
    m: int,
    b: float,
    units: int,
    dtype_bytes: int,
    optimizer_bytes_per_param: float,
    base: float,
    root_bytes: float = 0.0,
    block_bytes: float = 0.0,
) -> float:
    """Peak memory per GPU (bytes) of a plan with replicated (or, for FSDP,
    fully sharded) state under `pricing`: `base` (the pipeline model's)
    where the runtime adds nothing, else the module doc's per stage.
    `root_bytes` and `block_bytes` (per GPU): the embedding (on the first
    and the last stage) and one block, for stages that do not tell their
    blocks apart (the analytic model's uniform layers)."""
    if not pricing.own:
        return base
    o, peak = optimizer_bytes_per_param, 0.0
    uniform = not st.other_bytes or not any(st.other_bytes)
    for k in range(st.pp):
        grads = st.param_bytes[k]
        params = grads / dtype_bytes
        act = st.act_per_sample[k] * b * _inflight(m, st.pp, k)
        if pricing.fsdp:
            largest = st.max_layer_bytes[k] if st.max_layer_bytes else grads
            root = st.other_bytes[k] if st.other_bytes else 0.0
            if uniform and block_bytes > 0:
                largest, root = block_bytes, root_bytes * ((k == 0) + (k == st.pp - 1 and st.pp > 1))
            if st.pp == 1:
                mem = params * o / dp + act + 2 * root + 3 * largest
            else:
                mem = params * o / dp + act + root + 2 * largest + grads
        elif pricing.grad_sync == ALLGATHER:
            during = params * o + act + (units - 1) * grads
            held = (units + 1) if dp <= 1 else (2 * units + 2 * dp * units - 1)
            mem = max(during, params * o + held * grads)
        elif pricing.name == "ddp":
            mem = params * o + act + (grads if dp > 1 else 0.0)
        else:
            mem = params * o + act
        if pricing.runtime.m_at_least_pp and st.pp > 1:  # 1F1B's receive buffers; the last stage keeps its outputs
            mem += m * b * ((st.out_per_sample[k - 1] if k > 0 else 0.0) + st.out_per_sample[k])
        peak = max(peak, mem)
    return peak


def zero1_gather_bytes(pricing: Pricing, st: StageCosts, *, units: int) -> float:
    """What the exact runtime's ZeRO-1 step holds besides its state (module
    doc), at the largest stage; 0 for other runtimes (their ZeRO-1 step
    reduces in place)."""
    if not pricing.own or pricing.grad_sync != ALLGATHER:
        return 0.0
    return (5 * units - 1) * max(st.param_bytes)
