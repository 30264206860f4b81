"""What part of a job's iteration goes over the network (its NICs).

Load-aware estimation (Arena) and contention (Wang et al.) need to know how
much of an iteration a job spends sending between nodes: ``network_share``
is that fraction, at the GPU spec's network bandwidth (inter_bw_gbps),
from the datasheet (analytic) cost model of ``solver.cost``: the plan's time
with the network priced, against the same plan with a free network. It is a
property of the model, the cell and the plan, not of where the iteration
time came from, so the scheduler (over any estimate) and the simulator (over
any truth) take the same share. A cell on one node has none.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

from solver.contract.models import ModelSpec
from solver.contract.profiles.gpus import default_gpu_specs
from solver.contract.profiles.records import GpuSpec
from solver.cost.comm import Links
from solver.cost.layers import StageCosts, analytic_layers, split_stages
from solver.cost.pipeline import Ranks, boundary_crosses_nodes, dp_sync_time, pipeline_cost
from solver.types import Cell, ParallelPlan

#: the analytic model's assumptions (as the estimator's defaults)
_EFFICIENCY = 0.4
_LAYER_OVERHEAD_S = 2e-4
#: a network so fast that its transfers cost only their latency
_FREE_GBPS = 1e12


@functools.cache
def _specs() -> dict[str, GpuSpec]:
    return default_gpu_specs()


def nominal_nic_gbps(gpu_type: str) -> float:
    """The network bandwidth (Gb/s) a share is priced at for `gpu_type`."""
    spec = _specs().get(gpu_type.split("+")[0])
    return (spec.inter_bw_gbps if spec is not None else GpuSpec("x", 1.0, 1.0, 1.0).inter_bw_gbps) * 8.0


def network_share(model: ModelSpec, global_batch: int, cell: Cell, plan: ParallelPlan | None) -> float:
    """The fraction of an iteration (0 <= share < 1) spent on the network,
    for `plan` in `cell` (None: pure data parallelism over the cell)."""
    if cell.num_nodes < 2:
        return 0.0
    if plan is None or plan.num_gpus != cell.num_gpus:
        plan = ParallelPlan(cell.pp, cell.num_gpus // cell.pp, 1)
    gpu_type = cell.by_type()[0][0]
    return _share(model, global_batch, gpu_type, cell.gpus_per_node, plan)


@functools.lru_cache(maxsize=65536)
def _share(model: ModelSpec, batch: int, gpu_type: str, gpus_per_node: int, plan: ParallelPlan) -> float:
    spec = _spec(gpu_type)
    per_rank = max(1.0, batch / plan.dp)
    m = max(1, min(plan.micro_batches, int(per_rank)))
    b = per_rank / m
    tp = _tp(model, plan)
    if plan.pp > model.num_layers:
        return 0.0
    st = _stages(model, spec, tp, plan.pp)

    def time_with(links: Links) -> float:
        at = Ranks(plan.dp, tp, gpus_per_node, links, model.dtype_bytes)
        t, _ = pipeline_cost(st, at, m=m, b=b, optimizer_bytes_per_param=2.0 * model.dtype_bytes)
        return t + dp_sync_time(st, at)

    full = time_with(Links(spec, {}))
    free = time_with(Links(replace(spec, inter_bw_gbps=_FREE_GBPS), {}))
    if not (full > 0 and math.isfinite(full)):
        return 0.0
    return min(0.99, max(0.0, (full - free) / full))


@functools.lru_cache(maxsize=65536)
def boundary_bytes(model: ModelSpec, global_batch: int, cell: Cell, plan: ParallelPlan | None) -> float:
    """Bytes one network card sends per iteration (and receives as many) over
    the pipeline's stage boundaries between nodes, every micro-batch's: the
    activations forward and their gradients back of the dp ranks on a node
    (the most any one boundary carries)."""
    if cell.num_nodes < 2 or plan is None or not 2 <= plan.pp <= model.num_layers or plan.num_gpus != cell.num_gpus:
        return 0.0
    tp = _tp(model, plan)
    st = _stages(model, _spec(cell.by_type()[0][0]), tp, plan.pp)
    ranks, g = plan.dp * tp, cell.gpus_per_node
    per_rank = max(1.0, global_batch / plan.dp)
    crossing = [st.out_per_sample[k] for k in range(plan.pp - 1) if boundary_crosses_nodes(k, ranks, g)]
    return 2.0 * per_rank * max(crossing, default=0.0) * max(1, min(ranks, g) // tp)


def _spec(gpu_type: str) -> GpuSpec:
    return _specs().get(gpu_type) or GpuSpec(gpu_type, mem_gb=math.inf, peak_tflops=100.0, mem_bw_gbps=1000.0)


def _tp(model: ModelSpec, plan: ParallelPlan) -> int:
    return plan.tp if model.num_layers and plan.tp >= 1 else 1


def _stages(model: ModelSpec, spec: GpuSpec, tp: int, pp: int) -> StageCosts:
    """The analytic stage costs shares are priced with."""
    return split_stages(
        analytic_layers(model, spec, tp, efficiency=_EFFICIENCY, layer_overhead_s=_LAYER_OVERHEAD_S), pp
    )
