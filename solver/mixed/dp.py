"""Data-parallel mixed cells: what a rank of each part spends its step on,
and the cell's step composed from them (see solver.mixed).

A part's single-type estimate (its nodes running the whole global batch B)
holds costs that do not grow with its samples: its own gradient sync, the
weight update and the fixed cost of every micro-batch. `part_step` takes
them apart with the inner estimator's cost model (``solver.cost``: its
per-layer costs, links and GPU spec; the datasheet's, as in
``solver.cost.share``, for an estimator that has none, such as a plain
truth table; Arena's tables offer ours, solver.arena.estimates)
for the part's plan, and scales every piece by the estimate's time over
that model's, so the pieces add up to the estimate::

    T_i = m_i (a_i b_i + f_i) + own sync_i + update_i

(a_i: a rank's forward and backward per sample, f_i: per micro-batch,
b_i = B / (R_i m_i)). `dp_step` then prices the mixed cell's step from the
parts' compute only::

    max_i (a_i s_i + f_i n_i) + ONE gradient sync over all its dp ranks + update

(s_i samples and n_i micro-batches of the busiest rank of part i). The sync
is the inner estimator's (``grad_sync``: a ring all-reduce, or an all-gather
of every rank's unit gradients as the reference trainer sums them), on the
network of the part whose network is slowest, with the bytes of
``solver.cost.pipeline.dp_sync_time`` (a node's tp rings share its card); the
update is the slowest part's. With the optimizer state sharded (ZeRO-1,
``launch.sharding.ShardedOptimizer``) the step is the one
``solver.cost.pipeline.sharded_step_time`` prices for single-type cells:
``sharded_sync_time`` (every rank's unit gradients gathered slice by slice
to the owners, then the updated slices all-gathered, padded to the largest)
plus the update of each rank's slice only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from solver.contract.profiles.gpus import default_gpu_specs
from solver.contract.profiles.records import GpuSpec
from solver.cost.comm import NET, Links
from solver.cost.layers import analytic_layers, split_stages
from solver.cost.pipeline import (
    ALLGATHER,
    ALLREDUCE,
    Ranks,
    dp_sync_time,
    pipeline_cost,
    sharded_sync_time,
    update_time,
)
from solver.cost.runtime import REDUCE_SCATTER
from solver.estimator.protocol import CostModel, CostSettings
from solver.types import Estimate, JobRequest


@functools.cache
def _specs() -> dict[str, GpuSpec]:
    return default_gpu_specs()


@dataclass(frozen=True)
class PartStep:
    """A rank of one part of a data-parallel mixed cell, on the scale of the
    part's single-type estimate (module doc): compute per sample and per
    micro-batch, the weight update of its whole replica, its gradient bytes
    per GPU and its links (the network it syncs on)."""

    gpu_type: str
    ranks: int
    tp: int
    per_sample_s: float
    per_micro_batch_s: float
    update_s: float
    grad_bytes: float
    links: Links

    def compute_s(self, samples: float, micro_batches: float) -> float:
        """Forward and backward of `samples` in `micro_batches` micro-batches."""
        return samples * self.per_sample_s + micro_batches * self.per_micro_batch_s


@dataclass(frozen=True)
class DpStep:
    """A data-parallel mixed cell's iteration: the slowest part's compute,
    the gradient sync (sharded: the gathers of ``sharded_sync_time``) and
    the update (sharded: of each rank's slice), seconds."""

    compute_s: float
    sync_s: float
    update_s: float

    @property
    def time_s(self) -> float:
        return self.compute_s + self.sync_s + self.update_s


def part_step(costs: CostModel | None, settings: CostSettings, job: JobRequest, est: Estimate) -> PartStep:
    """Part `est` (a feasible single-type pp-1 estimate of `job`'s whole
    batch) taken apart by the inner estimator's cost model `costs` (module
    doc; None: the datasheet's, with `settings`)."""
    assert est.plan is not None
    cell, plan, model = est.cell, est.plan, job.model
    t, tp, ranks, m = cell.gpu_type, plan.tp, plan.dp, plan.micro_batches
    b = job.global_batch / (ranks * m)
    spec = (costs.gpu_spec(t) if costs is not None else None) or _specs().get(t)
    links = costs.links_of(t) if costs is not None else Links(spec or GpuSpec(t, math.inf, 1.0, 1.0), {})
    grad_bytes = model.params * model.dtype_bytes / tp
    whole = est.iter_time_s * ranks / job.global_batch  # all of it per sample: where no model takes it apart
    plain = PartStep(t, ranks, tp, whole, 0.0, 0.0, grad_bytes, links)
    layers = costs.layer_costs(model, t, tp, max(1, round(b))) if costs is not None else None
    if layers is None:
        if spec is None:
            return plain
        layers = analytic_layers(
            model, spec, tp, efficiency=settings.efficiency, layer_overhead_s=settings.layer_overhead_s
        )
    st = split_stages(layers, 1, b, model.num_layers)
    obpp = settings.optimizer_bytes_per_param
    g = cell.gpus_per_node

    def one(size: float) -> float:  # one micro-batch of `size` samples on one rank
        return pipeline_cost(
            st, Ranks(1, tp, g, links, model.dtype_bytes), m=1, b=size, optimizer_bytes_per_param=obpp
        )[0]

    per_sample = max(0.0, (one(2 * b) - one(b)) / b)
    per_micro = max(0.0, one(b) - per_sample * b)
    sync = dp_sync_time(st, Ranks(ranks, tp, g, links, model.dtype_bytes), collective=settings.grad_sync)
    upd = update_time(
        st,
        dtype_bytes=model.dtype_bytes,
        update_bytes_per_param=settings.update_bytes,
        mem_bw_gbps=spec.mem_bw_gbps if spec is not None else 0.0,
    )
    modelled = m * (per_sample * b + per_micro) + sync + upd
    if not (modelled > 0 and math.isfinite(modelled) and math.isfinite(est.iter_time_s)):
        return plain
    scale = est.iter_time_s / modelled
    return PartStep(t, ranks, tp, per_sample * scale, per_micro * scale, upd * scale, st.param_bytes[0], links)


@dataclass(frozen=True)
class Sync:
    """How a data-parallel mixed cell's step syncs: `units` the most unit
    gradients a rank holds (its virtual workers; 1 without), `grad_sync` the
    runtime's collective, `slices` with the state sharded the fraction of
    the parameters whose state a rank of part i owns (None: replicated),
    `net` the network to sync on (None: the slowest of the parts')."""

    units: int = 1
    grad_sync: str = ALLREDUCE
    slices: Sequence[float] | None = None
    net: Links | None = None


def sync_time(parts: Sequence[PartStep], sync: Sync) -> float:
    """The gradient sync of a data-parallel mixed cell's step (`dp_step`): one
    over all its dp ranks on the slowest network; sharded, the gathers of
    ``sharded_sync_time``."""
    units, grad_sync, slices, net = sync.units, sync.grad_sync, sync.slices, sync.net
    n_ranks = sum(p.ranks for p in parts)
    nbytes = max(p.grad_bytes * p.tp for p in parts)  # a node's tp rings cross its card together
    nets = [net] if net is not None else [p.links for p in parts]
    if grad_sync == REDUCE_SCATTER:  # FSDP (solver.cost.runtime): `units` micro-batches, 2 gathers + a scatter each
        return max(units * 3 * x.allgather(NET, nbytes / n_ranks, n_ranks) for x in nets)
    if slices is not None:
        return max(sharded_sync_time(x, NET, nbytes, n_ranks, units, max(slices)) for x in nets)
    if grad_sync == ALLGATHER:
        return max(x.allgather(NET, nbytes * units, n_ranks) for x in nets)
    return max(x.allreduce(NET, nbytes, n_ranks) for x in nets)


def dp_step(parts: Sequence[PartStep], samples: Sequence[float], micro_batches: Sequence[float], sync: Sync) -> DpStep:
    """The step of a data-parallel mixed cell whose busiest rank of part i
    runs samples[i] in micro_batches[i] micro-batches (module doc), synced by `sync`."""
    compute = max(p.compute_s(s, n) for p, s, n in zip(parts, samples, micro_batches, strict=True))
    if sync.slices is not None:
        update = max(p.update_s * f for p, f in zip(parts, sync.slices, strict=True))
    else:
        update = max(p.update_s for p in parts)
    return DpStep(compute, sync_time(parts, sync), update)
