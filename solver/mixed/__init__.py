"""Mixed-GPU-type cells: one job on nodes of several GPU types.

A mixed cell (``Cell.parts``) holds, per GPU type, a number of nodes that
each give the same gpus_per_node, in the order of its parts (types sorted
by name). Two shapes:

* **data parallel** (pp 1): every part is a group of dp ranks with one tp
  degree; each rank takes a batch share by the speed of its GPU type
  (Cephalo), so the gradient step is the same as on an even split (the
  launcher weighs each rank's gradient by its share), and the slow ranks
  do not hold the fast ones back.
* **pipeline across types** (pp > 1): every stage lies on nodes of one type
  (a part holds whole stages: its GPUs are a multiple of GPUs / pp, and its
  stages are consecutive, in part order); the layers are split by the
  types' speed and memory (``stage_layers_for``) and priced stage by stage
  (``solver.cost.typed_pipeline``); dp and tp are the same in every stage.

Enumeration (`mixed_cells`), over combinations of 2 to
``config.max_mixed_types`` of the job's allowed types:

* *needed*: for a job whose minimum GPU count no single allowed type can
  hold: GPU counts as in solver.cells in [min_gpus, the combination's
  capacity], every node layout and split between the types (pp 1), the
  fewest GPUs first, at most ``config.max_mixed_cells`` (as before: two
  types, the split the only freedom);
* *when they pay* (every other job): per combination and GPU count, the
  layout with the fewest nodes, the nodes split by the types' capacity (and,
  for two types, the most of either), pp 1 and every pp whose stages each
  fit one type; spread over the GPU counts, at most 4 x max_mixed_cells. The
  policy estimates them once per job shape, keeps the max_mixed_cells best
  (``solver.cells.prune_dominated``) and offers one in a round only when it
  is estimated faster than the best single-type cell the job could get now
  (the GPUs free now plus those it holds: solver.policies.cellsched).

Pricing (`MixedEstimator`, a wrapper over any EstimatorLike):

* data parallel: each part is estimated by the inner estimator as a
  single-type cell (pp 1, replicated state) running the whole global batch
  B in T_i seconds. T_i also holds what does not grow with the part's
  samples (its own gradient sync, the weight update, the fixed cost of each
  micro-batch), so it is taken apart (``solver.mixed.dp.part_step``, by the
  inner estimator's cost model scaled to T_i): a rank of part i computes in
  a_i s per sample and f_i s per micro-batch (R_i = its dp ranks). The
  shares s_i (samples per rank) are whole multiples of the micro-batch count
  m with sum_i R_i s_i = B, chosen to minimise the slowest part's compute
  a_i s_i + f_i m; every m dividing the largest of the parts' own counts
  (memory) is tried, and the fastest that fits wins. The iteration time
  (``solver.mixed.dp.dp_step``) is that compute plus ONE gradient sync over
  all the cell's dp ranks on the slowest network of the parts (the inner
  estimator's ``grad_sync``: a ring all-reduce, or the all-gather of every
  rank's unit gradients) plus the slowest part's update. Memory is each
  part's own estimate with its activations scaled up where its ranks'
  micro-batch grows, and must fit that part's GPUs.
* Sharded state (Cephalo's memory side, ZeRO-1 as ``launch.sharding``: the
  optimizer state only; parameters and gradients stay on every rank), where
  the replicated state does not fit (or the sharded plan is clearly faster,
  ``solver.estimator.pick_sharded``): each rank keeps its part's replicated
  memory (parameters, gradients, activations) and owns a slice of the state
  (plus the runtime's copy of the slice's parameters) in proportion to its
  GPU's free memory, ``state_shares[i] = limit_i - replicated_i`` (GB): the
  cell fits when the state fits the summed free memory. The step is the one
  single-type cells are priced with (``solver.cost.pipeline.sharded_sync_time``,
  the runtime's ``ShardedOptimizer.step``): every rank's unit gradients
  gathered to the slices' owners, each rank's update of its slice, the
  updated slices all-gathered, padded to the largest.
* pipelines across types: the inner estimator must offer per-layer costs
  (``Estimator.layer_costs``, links and GPU specs); every tp (dividing the
  GPUs per node and the heads) and micro-batch count is priced by
  ``typed_pipeline_cost``, replicated and (dp > 1) sharded, and the best
  that fits wins (sharded as above). The plan's stage_layers are in stage
  order (parts in order); the controller writes them for the task order of
  the chosen nodes (``stage_layers_in_order``).

With virtual workers (``JobRequest.virtual_workers`` = V) the unit that
moves between ranks of a data-parallel cell is a virtual worker of B / V
samples: per-rank counts u_i >= 1 with sum_i R_i u_i = V minimise the slowest
part u_i (a_i B / V + f_i m) (a_i, f_i from its estimate without V, as
above), plus, where the step gathers every virtual worker's gradients (state
sharded, or the all-gather sync), that gather for the most u_i; the shares
are u_i B / V (so ``largest_remainder(V, shares per rank)`` and
``virtual_worker_counts`` give back u_i), and m counts micro-batches per
virtual worker: a divisor of B / V not above the parts' own counts. V not
dividing B, V below the cell's dp ranks, or no whole split makes the cell
infeasible with a note. A pipeline with V runs its
busiest rank's ceil(V / dp) virtual workers one after the other.
"""

from __future__ import annotations

from solver.cost.layers import stage_layers_for
from solver.mixed.cells import (
    OPTIONAL_PER_CELL,
    mixed_cell,
    mixed_cells,
    needs_mixed,
    parse_key,
    stage_layers_in_order,
    stages_per_part,
    task_stage_types,
)
from solver.mixed.estimator import NET_LATENCY_S, MixedEstimator
from solver.mixed.split import split_batch

__all__ = [
    "NET_LATENCY_S",
    "OPTIONAL_PER_CELL",
    "MixedEstimator",
    "mixed_cell",
    "mixed_cells",
    "needs_mixed",
    "parse_key",
    "split_batch",
    "stage_layers_for",
    "stage_layers_in_order",
    "stages_per_part",
    "task_stage_types",
]
