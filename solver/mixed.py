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
  B in T_i seconds; a rank of part i then takes B / (R_i T_i) samples/s
  (R_i = its dp ranks). The shares s_i (samples per rank) are whole multiples
  of the micro-batch count m with sum_i R_i s_i = B, chosen to minimise the
  slowest part's time s_i R_i T_i / B; m starts at the largest of the parts'
  own counts (memory) and is lowered to the first divisor that allows such
  shares. The iteration time is that time plus a ring all-reduce of the
  gradients (params x dtype bytes / tp) over all nodes on the slowest
  network of the parts (the parts' own syncs are already inside T_i, so this
  errs on the slow side). Memory is each part's own estimate, scaled up where
  its ranks' micro-batch grows, and must fit that part's GPUs.
* Sharded state (Cephalo's memory side, ZeRO-1 as ``launch.sharding``: the
  optimizer state only; parameters and gradients stay on every rank), where
  the replicated state does not fit (or the sharded plan is clearly faster,
  ``solver.estimator.pick_sharded``): each rank keeps its part's replicated
  memory (parameters, gradients, activations) and owns a slice of the state
  (plus the runtime's copy of the slice's parameters) in proportion to its
  GPU's free memory, ``state_shares[i] = limit_i - replicated_i`` (GB): the
  cell fits when the state fits the summed free memory. The step adds the
  all-gather of the updated slices, padded to the largest, over the network.
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
part u_i (B / V) c_i (c_i: part i's seconds per sample, from its estimate
without V, as above), the shares are u_i B / V (so ``largest_remainder(V,
shares per rank)`` and ``virtual_worker_counts`` give back u_i), and m counts
micro-batches per virtual worker: the largest divisor of B / V not above the
parts' own counts. V not dividing B, V below the cell's dp ranks, or no whole
split makes the cell infeasible with a note. A pipeline with V runs its
busiest rank's ceil(V / dp) virtual workers one after the other.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
from collections.abc import Mapping, Sequence

from solver.cost.layers import stage_layers_for
from solver.cost.pipeline import ALLREDUCE, state_split
from solver.cost.typed_pipeline import TypeSide, typed_pipeline_cost
from solver.plan import largest_remainder
from solver.profiles.records import NET_GBPS
from solver.types import Cell, Estimate, EstimateSource, EstimatorLike, JobRequest, ParallelPlan, SolverConfig

#: per-message latency (s) on the network; its bandwidth is NET_GBPS when the inner estimator knows no GPU spec
NET_LATENCY_S = 2.5e-5
#: "when they pay" candidates generated per job, per max_mixed_cells (the policy keeps max_mixed_cells of them)
OPTIONAL_PER_CELL = 4

__all__ = [
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


def mixed_cell(parts: Sequence[tuple[str, int]], gpus_per_node: int, pp: int = 1) -> Cell:
    """The mixed cell of these (GPU type, nodes) parts."""
    parts = tuple((t, n) for t, n in parts)
    return Cell("+".join(t for t, _ in parts), sum(n for _, n in parts), gpus_per_node, pp, parts)


def parse_key(key: str) -> Cell | None:
    """The cell of a mixed key such as ``a40x2+a10x1:3x2:pp1`` or
    ``a100x1+a10x1:2x1:pp2`` (mixed keys only; None otherwise)."""
    try:
        name, layout, pp_text = key.split(":")
        nodes, per_node = (int(v) for v in layout.split("x"))
        if not pp_text.startswith("pp"):
            return None
        pp = int(pp_text[2:])
        parts = tuple((t, int(n)) for t, n in (p.rsplit("x", 1) for p in name.split("+")))
        cell = mixed_cell(parts, per_node, pp)
        return cell if cell.num_nodes == nodes and cell.key() == key else None
    except ValueError:
        return None


def stages_per_part(cell: Cell) -> tuple[int, ...] | None:
    """Pipeline stages on each part of a mixed cell with pp > 1 (each part
    holds whole stages of GPUs / pp GPUs); None when a part does not."""
    if not cell.mixed or cell.pp < 2:
        return None
    per_stage = cell.num_gpus // cell.pp
    out = []
    for _, n in cell.parts:
        gpus = n * cell.gpus_per_node
        if gpus % per_stage:
            return None
        out.append(gpus // per_stage)
    return tuple(out)


def stage_layers_in_order(
    cell: Cell, priced: Sequence[int], stage_types: Sequence[str], num_layers: int | None = None
) -> tuple[int, ...]:
    """A typed pipeline's layers per stage for the stages' GPU types in task
    order (`stage_types`), from the split it was priced with (`priced`, stages
    in part order): ``stage_layers_for`` with each stage weighted by the
    layers its type's stage of the same rank got in pricing (and capped
    there), so every type keeps its stages' layers, the iteration time and
    memory stay as priced. ValueError when the types do not match the cell."""
    per_part = stages_per_part(cell)
    if per_part is None or len(priced) != cell.pp or len(stage_types) != cell.pp:
        raise ValueError(f"{cell.key()}: not a pipeline across types of {cell.pp} stages")
    by_type: dict[str, list[int]] = {}
    k = 0
    for (t, _), n in zip(cell.parts, per_part):
        by_type[t] = list(priced[k : k + n])
        k += n
    if sorted(stage_types) != sorted(t for (t, _), n in zip(cell.parts, per_part) for _ in range(n)):
        raise ValueError(f"{cell.key()}: stage types {list(stage_types)} do not match the cell's parts")
    taken: dict[str, int] = {}
    weights = []
    for t in stage_types:
        weights.append(by_type[t][taken.get(t, 0)])
        taken[t] = taken.get(t, 0) + 1
    total = sum(priced) if num_layers is None else num_layers
    return stage_layers_for(total, weights, weights)


def task_stage_types(cell: Cell, plan: ParallelPlan, node_types: Sequence[str]) -> tuple[str, ...] | None:
    """The GPU type of each pipeline stage when the job's tasks lie node by
    node in this order (`node_types`: each node's type, gpus_per_node tasks
    each; ranks in Megatron order, stage s = ranks [s dp tp, (s+1) dp tp));
    None when a stage would span types or the nodes do not hold the plan."""
    per_stage = plan.dp * plan.tp
    ranks = [t for t in node_types for _ in range(cell.gpus_per_node)]
    if len(ranks) != plan.pp * per_stage:
        return None
    out = []
    for s in range(plan.pp):
        kinds = set(ranks[s * per_stage : (s + 1) * per_stage])
        if len(kinds) != 1:
            return None
        out.append(kinds.pop())
    return tuple(out)


def needs_mixed(job: JobRequest, sizes_of: Mapping[str, Sequence[int]]) -> bool:
    """True when no single allowed type can hold the job's minimum GPU count."""
    return bool(sizes_of) and job.min_gpus > max(sum(s) for s in sizes_of.values())


def _counts(job: JobRequest, hi: int) -> list[int]:
    return _counts_of(job.min_gpus, job.requested_gpus, hi)


def _counts_of(min_gpus: int, requested: int | None, hi: int) -> list[int]:
    counts = {1 << i for i in range(hi.bit_length())} | {min_gpus}
    if requested is not None:
        counts.add(requested)
    return sorted(c for c in counts if min_gpus <= c <= hi)


def mixed_cells(job: JobRequest, sizes_of: Mapping[str, Sequence[int]], config: SolverConfig) -> list[Cell]:
    """Mixed cells of the job: those it needs, else those that may pay.

    `sizes_of`: GPUs per node of each allowed type's nodes (what
    solver.cells.enumerate_cells gathered). See the module doc.
    """
    if not config.mixed_cells or len(sizes_of) < 2 or config.max_mixed_cells < 1:
        return []
    types = sorted(sizes_of)
    combos = [
        c for k in range(2, min(config.max_mixed_types, len(types)) + 1) for c in itertools.combinations(types, k)
    ]
    if needs_mixed(job, sizes_of):
        return _needed(job, sizes_of, combos, config)
    return _optional(job, sizes_of, combos, config)


def _needed(
    job: JobRequest, sizes_of: Mapping[str, Sequence[int]], combos: list[tuple[str, ...]], config: SolverConfig
) -> list[Cell]:
    caps = {t: sum(s) for t, s in sizes_of.items()}
    out: list[Cell] = []
    for combo in combos:
        total = sum(caps[t] for t in combo)
        hi = total if job.max_gpus is None else min(job.max_gpus, total)
        for count in _counts(job, hi):
            for nodes in range(len(combo), count + 1):
                if count % nodes:
                    continue
                g = count // nodes
                avail = [sum(1 for s in sizes_of[t] if s >= g) for t in combo]
                for split in _splits(nodes, avail):
                    cell = mixed_cell(tuple(zip(combo, split)), g)
                    if not job.excludes(cell):
                        out.append(cell)
    out.sort(key=lambda c: (c.num_gpus, c.num_nodes, c.parts))
    return out[: config.max_mixed_cells]


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _splits(nodes: int, avail: Sequence[int]) -> list[tuple[int, ...]]:
    """Every split of `nodes` over the types, each at least one and at most its available nodes."""
    if len(avail) == 1:
        return [(nodes,)] if 1 <= nodes <= avail[0] else []
    rest_max = sum(avail[1:])
    out = []
    for n0 in range(max(1, nodes - rest_max), min(avail[0], nodes - (len(avail) - 1)) + 1):
        out += [(n0, *tail) for tail in _splits(nodes - n0, avail[1:])]
    return out


def _few_splits(nodes: int, avail: Sequence[int]) -> list[tuple[int, ...]]:
    """A few splits of `nodes` over the types: by their available nodes
    (largest remainder, each at least one) and, for two types, the most of
    either; only those the available nodes allow."""
    k = len(avail)
    if nodes < k or sum(avail) < nodes or min(avail) < 1:
        return []
    cands = [tuple(1 + x for x in largest_remainder(nodes - k, [max(a - 1, 1e-9) for a in avail]))]
    if k == 2:
        cands += [(min(avail[0], nodes - 1), nodes - min(avail[0], nodes - 1))]
        cands += [(nodes - min(avail[1], nodes - 1), min(avail[1], nodes - 1))]
    out = []
    for c in cands:
        if all(1 <= n <= a for n, a in zip(c, avail)) and sum(c) == nodes and c not in out:
            out.append(c)
    return out


def _optional(
    job: JobRequest, sizes_of: Mapping[str, Sequence[int]], combos: list[tuple[str, ...]], config: SolverConfig
) -> list[Cell]:
    sizes = tuple(sorted((t, tuple(sorted(v))) for t, v in sizes_of.items()))
    budget = OPTIONAL_PER_CELL * config.max_mixed_cells
    cells = _optional_of(
        sizes,
        tuple(combos),
        job.min_gpus,
        job.max_gpus,
        job.requested_gpus,
        min(config.max_pp, job.model.num_layers),
        job.virtual_workers,
        budget + len(job.excluded_cells),
    )
    return [c for c in cells if not job.excludes(c)][:budget]


@functools.lru_cache(maxsize=1024)
def _optional_of(
    sizes: tuple[tuple[str, tuple[int, ...]], ...],
    combos: tuple[tuple[str, ...], ...],
    min_gpus: int,
    max_gpus: int | None,
    requested: int | None,
    max_pp: int,
    vw: int | None,
    budget: int,
) -> tuple[Cell, ...]:
    """The "when they pay" candidates of a job of this shape (a pure function of the arguments: cached)."""
    ordered = dict(sizes)
    caps = {t: sum(s) for t, s in ordered.items()}
    by_count: dict[int, list[Cell]] = {}

    def at_least(t: str, g: int) -> int:
        return len(ordered[t]) - bisect.bisect_left(ordered[t], g)

    for combo in combos:
        total = sum(caps[t] for t in combo)
        hi = total if max_gpus is None else min(max_gpus, total)
        most = max(max(ordered[t]) for t in combo)
        for count in _counts_of(min_gpus, requested, hi):
            for nodes in _divisors(count):  # the fewest nodes first: the first layout that fits
                if nodes < len(combo) or count // nodes > most:
                    continue
                g = count // nodes
                splits = _few_splits(nodes, [at_least(t, g) for t in combo])
                if not splits:
                    continue
                for split in splits:
                    common = math.gcd(*(n * g for n in split))  # a stage's GPUs must divide every part's
                    pps = sorted({count // d for d in _divisors(common) if count // d <= max_pp})
                    for pp in [1] + [p for p in pps if p > 1]:
                        if vw is not None and count > vw * pp * g:
                            continue
                        by_count.setdefault(count, []).append(mixed_cell(tuple(zip(combo, split)), g, pp))
                break
    out: list[Cell] = []
    lists = [by_count[c] for c in sorted(by_count)]
    for row in itertools.zip_longest(*lists):  # spread over the GPU counts
        for cell in row:
            if cell is not None and len(out) < budget:
                out.append(cell)
    return tuple(out)


def split_batch(
    batch: int,
    ranks: Sequence[int],
    sec_per_sample: Sequence[float],
    micro_batches: int,
    virtual_workers: int | None = None,
) -> tuple[tuple[int, ...], int] | None:
    """(samples per rank of each part, micro-batches) for parts with
    `ranks` dp ranks whose ranks take `sec_per_sample` s per sample: whole
    multiples of the micro-batch count adding up to `batch`, slowest part
    as fast as possible; the micro-batch count is lowered (to a divisor)
    until that is possible. None when not even one sample per rank works.

    With V = `virtual_workers`: whole virtual workers of batch / V samples per
    rank (at least one each, V in all), slowest part as fast as possible;
    the micro-batches per virtual worker are the largest divisor of batch / V
    not above `micro_batches`. None when V does not divide the batch or no
    such split exists."""
    ranks, cost = tuple(ranks), tuple(sec_per_sample)
    if virtual_workers is not None:
        if batch % virtual_workers:
            return None
        per = batch // virtual_workers
        u = _split_units(virtual_workers, ranks, cost)
        if u is None:
            return None
        m = max(d for d in range(1, min(micro_batches, per) + 1) if per % d == 0)
        return tuple(x * per for x in u), m
    for m in (d for d in range(micro_batches, 0, -1) if micro_batches % d == 0):
        if batch % m:
            continue
        u = _split_units(batch // m, ranks, cost)
        if u is not None:
            return tuple(x * m for x in u), m
    return None


def _split_units(units: int, ranks: tuple[int, ...], cost: tuple[float, ...]) -> tuple[int, ...] | None:
    """u_i >= 1 with sum_i r_i u_i = units and the least max_i u_i c_i."""
    if len(ranks) == 2:
        return _split_two(units, (ranks[0], ranks[1]), (cost[0], cost[1]))
    return _split_many(units, ranks, cost)


def _split_two(units: int, ranks: tuple[int, int], cost: tuple[float, float]) -> tuple[int, int] | None:
    (r0, r1), (c0, c1) = ranks, cost
    best = None
    for u0 in range(1, units // r0 + 1):
        rest = units - r0 * u0
        if rest < r1 or rest % r1:
            continue
        u1 = rest // r1
        worst = max(u0 * c0, u1 * c1)
        if best is None or worst < best[0]:
            best = (worst, u0, u1)
    return None if best is None else best[1:]


def _split_many(units: int, ranks: tuple[int, ...], cost: tuple[float, ...]) -> tuple[int, ...] | None:
    """_split_units for any number of parts: the least bound T (among the
    values u c_i) under which u_i <= T / c_i still reaches `units` exactly
    (reachable sums as bit sets), then a split under it."""
    k = len(ranks)
    tops = [units // r for r in ranks]
    if min(tops) < 1:
        return None

    def reach(bound: float) -> list[int] | None:
        his = [min(tops[i], int(bound / cost[i] * (1 + 1e-12))) for i in range(k)]
        if min(his) < 1:
            return None
        sets = [1]  # bit s of sets[i]: sum s reachable with the first i parts
        mask = (1 << (units + 1)) - 1
        for i in range(k):
            cur, prev = 0, sets[-1]
            for u in range(1, his[i] + 1):
                cur |= prev << (ranks[i] * u)
            sets.append(cur & mask)
        return sets if sets[-1] >> units & 1 else None

    values = sorted({u * cost[i] for i in range(k) for u in range(1, tops[i] + 1)})
    lo, hi = 0, len(values) - 1
    if reach(values[hi]) is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if reach(values[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    bound = values[lo]
    sets = reach(bound)
    assert sets is not None
    out, left = [0] * k, units
    for i in range(k - 1, -1, -1):  # back from the last part: the smallest u that leaves a reachable rest
        hi_i = min(tops[i], int(bound / cost[i] * (1 + 1e-12)))
        for u in range(1, hi_i + 1):
            rest = left - ranks[i] * u
            if rest >= 0 and sets[i] >> rest & 1:
                out[i], left = u, rest
                break
    return tuple(out)


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
        best: tuple[float, ParallelPlan, float, float] | None = None
        best_sharded: tuple[float, ParallelPlan, float, float] | None = None
        for tp in (d for d in range(1, g + 1) if g % d == 0 and width % d == 0 and per_stage % d == 0):
            dp = per_stage // tp
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
                for t, spec, lim in zip(types, specs, limits):
                    costs = layer_costs(model, t, tp, b)
                    if costs is None:
                        break
                    sides.append(TypeSide(t, costs, links_of(t), lim, spec.mem_bw_gbps))
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
                    cand = (c.time_s, plan, c.mem_bytes / 1e9, c.state_bytes / 1e9)
                    if sharded:
                        if best_sharded is None or cand[0] < best_sharded[0]:
                            best_sharded = cand
                    elif best is None or cand[0] < best[0]:
                        best = cand
                    if not sharded:
                        t_plain = c.time_s
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
