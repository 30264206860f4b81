"""Mixed cells: their keys, stage layouts and enumeration (see solver.mixed)."""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Mapping, Sequence

from solver.contract.plan import largest_remainder
from solver.contract.runtimes import refusal
from solver.cost.layers import stage_layers_for
from solver.types import Cell, JobRequest, ParallelPlan, SolverConfig

#: "when they pay" candidates generated per job, per max_mixed_cells (the policy keeps max_mixed_cells of them)
OPTIONAL_PER_CELL = 8


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
    for (t, _), n in zip(cell.parts, per_part, strict=True):
        by_type[t] = list(priced[k : k + n])
        k += n
    if sorted(stage_types) != sorted(t for (t, _), n in zip(cell.parts, per_part, strict=True) for _ in range(n)):
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
    solver.cells.enumerate_cells gathered). See the module doc. None for a
    job whose runtime runs on one GPU type only (solver.contract.runtimes).
    """
    if not config.mixed_cells or len(sizes_of) < 2 or config.max_mixed_cells < 1:
        return []
    types = sorted(sizes_of)
    if refusal(job.runtime, job.model.num_layers, job.global_batch, gpu_types=types):
        return []
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
                    cell = mixed_cell(tuple(zip(combo, split, strict=True)), g)
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
        if all(1 <= n <= a for n, a in zip(c, avail, strict=True)) and sum(c) == nodes and c not in out:
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
        _deepest(job, min(config.max_pp, job.model.num_layers)),
        job.virtual_workers,
        budget + len(job.excluded_cells),
    )
    return [c for c in cells if not job.excludes(c)][:budget]


def _deepest(job: JobRequest, most: int) -> int:
    """The deepest pipeline, up to `most` stages, the job's runtime may run."""
    shape = (job.runtime, job.model.num_layers, job.global_batch)
    return max(p for p in range(1, most + 1) if p == 1 or refusal(*shape, pp=p) is None)


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
    groups: dict[tuple[int, int], list[Cell]] = {}  # (GPU count, combination) -> its cells, pp 1 first

    def at_least(t: str, g: int) -> int:
        return len(ordered[t]) - bisect.bisect_left(ordered[t], g)

    for k, combo in enumerate(combos):
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
                flat: list[Cell] = []
                deep: list[Cell] = []
                for split in splits:
                    common = math.gcd(*(n * g for n in split))  # a stage's GPUs must divide every part's
                    pps = sorted({count // d for d in _divisors(common) if count // d <= max_pp})
                    for pp in [1] + [p for p in pps if p > 1]:
                        if vw is not None and count > vw * pp * g:
                            continue
                        (flat if pp == 1 else deep).append(mixed_cell(tuple(zip(combo, split, strict=True)), g, pp))
                groups[(count, k)] = flat + sorted(deep, key=lambda c: -c.pp)  # the deepest pipelines first
                break
    # round robin over (GPU count, combination): each gets its first cell before any gets a second,
    # so the budget is not spent on the first combinations' pipelines (their order is alphabetical)
    out: list[Cell] = []
    lists = [groups[key] for key in sorted(groups)]
    for row in itertools.zip_longest(*lists):
        for cell in row:
            if cell is not None and len(out) < budget:
                out.append(cell)
    return tuple(out)
