"""Mixed-GPU-type cells: one job as data-parallel groups on two GPU types.

A mixed cell (``Cell.parts``) holds, per GPU type, a number of nodes that
each give the same gpus_per_node; its pipeline depth is 1 and its tensor
parallel degree the same on every part. Each data-parallel rank takes a
batch share by the speed of its GPU type (Cephalo), so the gradient step is
the same as on an even split (the launcher weighs each rank's gradient by its
share), and the slow ranks do not hold the fast ones back.

Enumeration (`mixed_cells`) is bounded on purpose: only pairs of types, and
only for a job whose minimum GPU count no single allowed type can hold (the
GPU counts are those of solver.cells in [min_gpus, the pair's capacity]),
at most ``config.max_mixed_cells`` per job, fewest GPUs then nodes first. Everything a single
type can serve stays single-type, so the placement model barely grows.

Pricing (`MixedEstimator`, a wrapper over any EstimatorLike): each part is
estimated by the inner estimator as a single-type cell (pp 1) running the
whole global batch B in T_i seconds; a rank of part i then takes B /
(R_i T_i) samples/s (R_i = its dp ranks). The shares s_i (samples per rank)
are whole multiples of the micro-batch count m with sum_i R_i s_i = B,
chosen to minimise the slowest part's time s_i R_i T_i / B; m starts at the
largest of the parts' own counts (memory) and is lowered to the first
divisor that allows such shares. The iteration
time is that time plus a ring all-reduce of the gradients (params x dtype
bytes / tp) over all nodes on the slowest network of the parts (the parts'
own syncs are already inside T_i, so this errs on the slow side). Memory is
each part's own estimate, scaled up where its ranks' micro-batch grows, and
must fit that part's GPUs.

With virtual workers (``JobRequest.virtual_workers`` = V) the unit that
moves between ranks is a virtual worker of B / V samples: per-rank counts
u_i >= 1 with sum_i R_i u_i = V minimise the slowest part u_i (B / V) c_i
(c_i: part i's seconds per sample, from its estimate without V, as above),
the shares are u_i B / V (so ``largest_remainder(V, shares per rank)`` and
``virtual_worker_counts`` give back u_i), and m counts micro-batches per
virtual worker: the largest divisor of B / V not above the parts' own
counts. V not dividing B, V below the cell's dp ranks, or no whole split
makes the cell infeasible with a note.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence

from solver.profiles.records import NET_GBPS
from solver.types import Cell, Estimate, EstimateSource, EstimatorLike, JobRequest, ParallelPlan, SolverConfig

#: per-message latency (s) on the network; its bandwidth is NET_GBPS when the inner estimator knows no GPU spec
NET_LATENCY_S = 2.5e-5


def mixed_cell(parts: Sequence[tuple[str, int]], gpus_per_node: int) -> Cell:
    """The mixed cell of these (GPU type, nodes) parts, pp 1."""
    parts = tuple((t, n) for t, n in parts)
    return Cell("+".join(t for t, _ in parts), sum(n for _, n in parts), gpus_per_node, 1, parts)


def parse_key(key: str) -> Cell | None:
    """The cell of a key such as ``a40x2+a10x1:3x2:pp1`` (mixed keys only)."""
    try:
        name, layout, pp = key.split(":")
        nodes, per_node = (int(v) for v in layout.split("x"))
        parts = tuple((t, int(n)) for t, n in (p.rsplit("x", 1) for p in name.split("+")))
        cell = mixed_cell(parts, per_node)
        return cell if cell.num_nodes == nodes and pp == "pp1" else None
    except ValueError:
        return None


def mixed_cells(job: JobRequest, sizes_of: Mapping[str, Sequence[int]], config: SolverConfig) -> list[Cell]:
    """Mixed cells of two types for GPU counts no single type can hold.

    `sizes_of`: GPUs per node of each allowed type's nodes (what
    solver.cells.enumerate_cells gathered). See the module doc.
    """
    if not config.mixed_cells or len(sizes_of) < 2 or config.max_mixed_cells < 1:
        return []
    caps = {t: sum(s) for t, s in sizes_of.items()}
    single = max(caps.values())
    if job.min_gpus <= single:
        return []
    out: list[Cell] = []
    for t1, t2 in itertools.combinations(sorted(sizes_of), 2):
        hi = caps[t1] + caps[t2] if job.max_gpus is None else min(job.max_gpus, caps[t1] + caps[t2])
        counts = {1 << i for i in range(hi.bit_length())} | {job.min_gpus}
        if job.requested_gpus is not None:
            counts.add(job.requested_gpus)
        for count in sorted(c for c in counts if job.min_gpus <= c <= hi):
            for nodes in range(2, count + 1):
                if count % nodes:
                    continue
                g = count // nodes
                a1 = sum(1 for s in sizes_of[t1] if s >= g)
                a2 = sum(1 for s in sizes_of[t2] if s >= g)
                for n1 in range(max(1, nodes - a2), min(a1, nodes - 1) + 1):
                    cell = mixed_cell(((t1, n1), (t2, nodes - n1)), g)
                    if not job.excludes(cell):
                        out.append(cell)
    out.sort(key=lambda c: (c.num_gpus, c.num_nodes, c.parts))
    return out[: config.max_mixed_cells]


def split_batch(
    batch: int,
    ranks: Sequence[int],
    sec_per_sample: Sequence[float],
    micro_batches: int,
    virtual_workers: int | None = None,
) -> tuple[tuple[int, ...], int] | None:
    """(samples per rank of each part, micro-batches) for two parts with
    `ranks` dp ranks whose ranks take `sec_per_sample` s per sample: whole
    multiples of the micro-batch count adding up to `batch`, slowest part
    as fast as possible; the micro-batch count is lowered (to a divisor)
    until that is possible. None when not even one sample per rank works.

    With V = `virtual_workers`: whole virtual workers of batch / V samples per
    rank (at least one each, V in all), slowest part as fast as possible;
    the micro-batches per virtual worker are the largest divisor of batch / V
    not above `micro_batches`. None when V does not divide the batch or no
    such split exists."""
    (r0, r1), (c0, c1) = ranks, sec_per_sample
    if virtual_workers is not None:
        if batch % virtual_workers:
            return None
        per = batch // virtual_workers
        u = _split_units(virtual_workers, (r0, r1), (c0, c1))
        if u is None:
            return None
        m = max(d for d in range(1, min(micro_batches, per) + 1) if per % d == 0)
        return (u[0] * per, u[1] * per), m
    for m in (d for d in range(micro_batches, 0, -1) if micro_batches % d == 0):
        if batch % m:
            continue
        u = _split_units(batch // m, (r0, r1), (c0, c1))
        if u is not None:
            return (u[0] * m, u[1] * m), m
    return None


def _split_units(units: int, ranks: tuple[int, int], cost: tuple[float, float]) -> tuple[int, int] | None:
    """(u0, u1), each >= 1, with r0 u0 + r1 u1 = units and the least max(u0 c0, u1 c1)."""
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


class MixedEstimator:
    """EstimatorLike: mixed cells priced here, every other cell by `inner`."""

    def __init__(self, inner: EstimatorLike, net_gbps: float | None = None) -> None:
        self.inner = inner
        self.net_gbps = net_gbps
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
        key = (job.model.signature, job.global_batch, cell, job.virtual_workers)
        est = self._cache.get(key)
        if est is None:
            est = self._cache[key] = self._price(job, cell)
        return est

    def _price(self, job: JobRequest, cell: Cell) -> Estimate:
        if len(cell.parts) != 2 or cell.pp != 1:
            return Estimate(cell, None, math.inf, math.inf, EstimateSource.NONE, "mixed cells hold two types, pp 1")
        vw = job.virtual_workers
        part_job = job if vw is None else dataclasses.replace(job, virtual_workers=None)  # speeds per sample
        subs = [self.inner.estimate(part_job, Cell(t, n, cell.gpus_per_node, 1)) for t, n in cell.parts]
        bad = [e for e in subs if not e.feasible]
        if bad:
            return Estimate(
                cell,
                None,
                math.inf,
                min(e.mem_per_gpu_gb for e in bad),
                EstimateSource.NONE,
                f"part {bad[0].cell.key()} infeasible: {bad[0].note}",
            )
        tps = {e.plan.tp for e in subs}
        if len(tps) != 1:
            return Estimate(
                cell, None, math.inf, math.inf, EstimateSource.NONE, f"parts want different tp {sorted(tps)}"
            )
        tp = tps.pop()
        batch = job.global_batch
        ranks = [e.cell.num_gpus // tp for e in subs]
        per_sample = [e.iter_time_s * r / batch for e, r in zip(subs, ranks)]
        if vw is not None and (batch % vw or vw < sum(ranks)):
            why = "do not divide the global batch" if batch % vw else f"are fewer than the {sum(ranks)} dp ranks"
            return Estimate(cell, None, math.inf, math.inf, EstimateSource.NONE, f"V={vw} virtual workers {why}")
        split = split_batch(batch, ranks, per_sample, max(e.plan.micro_batches for e in subs), vw)
        if split is None:
            why = (
                f"global batch {batch} < {sum(ranks)} dp ranks"
                if vw is None
                else f"V={vw} virtual workers do not split into whole ones per rank over {ranks[0]}+{ranks[1]} ranks"
            )
            return Estimate(cell, None, math.inf, math.inf, EstimateSource.NONE, why)
        shares, m = split
        compute = max(s * c for s, c in zip(shares, per_sample))
        grad_bytes = job.model.params * job.model.dtype_bytes / tp
        n = cell.num_nodes
        sync = 2 * (n - 1) * NET_LATENCY_S + 2.0 * (n - 1) / n * grad_bytes / self._net_bps([t for t, _ in cell.parts])
        # a rank's micro-batch is shares/m here (batch/V/m with V), batch/(ranks*m_i) in the part's own estimate
        mb = [s / m for s in shares] if vw is None else [batch / vw / m] * 2
        mems = [
            e.mem_per_gpu_gb * max(1.0, b / (batch / (r * e.plan.micro_batches))) for e, b, r in zip(subs, mb, ranks)
        ]
        mem = max(mems)
        limit = getattr(self.inner, "mem_limit_gb", None)
        for (t, _), need in zip(cell.parts, mems):
            if limit is not None and need > limit(t):
                return Estimate(cell, None, math.inf, mem, EstimateSource.NONE, f"OOM: {need:.1f} GB per {t} GPU")
        plan = ParallelPlan(1, sum(ranks), tp, m, shares)
        parts = "+".join(sorted({e.source for e in subs}))
        vws = "" if vw is None else f" ({shares[0] * vw // batch}, {shares[1] * vw // batch} of V={vw})"
        return Estimate(
            cell,
            plan,
            compute + sync,
            mem,
            EstimateSource.MIXED,
            f"parts {parts}; shares {shares} per rank{vws}; sync {sync:.4f} s",
        )
