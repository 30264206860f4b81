"""Per-layer costs of a model on one GPU type at one tensor-parallel degree,
and their split into pipeline stages.

Costs are per GPU and affine in the micro-batch size b (samples):
``time(b) = time_per_sample * b + time_fixed`` (forward + backward),
activations kept for backward ``act_per_sample * b``, the tensor a layer
sends on ``out_per_sample * b``; parameter bytes do not depend on b.

* From layer profiles (composed): a profile at micro-batch b' gives
  ``time_per_sample = (fwd + bwd) / b'`` (and likewise for the bytes), so it
  is exact at b = b' and scales per sample elsewhere.
* Analytic: uniform blocks; compute at ``peak x efficiency`` (x FP32_SPEED
  for fp32 models) plus a fixed per-layer overhead (kernel launches),
  activations and parameters from the ModelSpec cost helpers, divided by tp.

Layers as the trainer counts them: a profile (``launch.profiler``) holds an
"embed" record, one "block" per ModelSpec.num_layers and a "head" record;
the reference trainer (``contrib/examples/minigpt``) counts only the blocks
(``GPTConfig.layers`` = ModelSpec.num_layers; the embedding rides with the
first stage, the head with the last) and ``launch.layout.split_layers``
checks that a plan's ``stage_layers`` add up to them. So a split carries
``StageCosts.blocks``: the blocks (records whose kind is not in
NON_BLOCK_KINDS) of each stage, mapped to `num_layers` when a profile's
blocks are not that many (largest remainder). A time-balanced split that
would leave a stage without a block is split again with every other record
joined to its neighbouring block (so the priced split is the one the
trainer can run).

``stage_layers_for`` is the layer split of a pipeline whose stages run on
different GPU types (solver.mixed), shared by the estimator and the
controller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from solver.contract.models import ModelSpec
from solver.contract.plan import largest_remainder
from solver.contract.profiles.records import (
    NON_BLOCK_KINDS,
    TP_ALLREDUCES_BY_KIND,
    TP_ALLREDUCES_PER_BLOCK,
    GpuSpec,
    LayerRecord,
)

#: GpuSpec.peak_tflops is the fp16/bf16 tensor-core peak; fp32 models run at
#: this fraction of it (TF32 is 1/2, plain FP32 1/4 to 1/16 on the datasheets).
FP32_SPEED = 0.125


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer costs (see the module doc); `uniform` when all layers are alike."""

    time_per_sample: tuple[float, ...]
    time_fixed: tuple[float, ...]
    act_per_sample: tuple[float, ...]
    out_per_sample: tuple[float, ...]
    param_bytes: tuple[float, ...]
    tp_allreduces: tuple[int, ...]
    uniform: bool = False
    #: which records are the trainer's layers (blocks); empty: all of them
    is_block: tuple[bool, ...] = ()

    @property
    def num_layers(self) -> int:
        return len(self.time_per_sample)

    @property
    def num_blocks(self) -> int:
        return sum(self.is_block) if self.is_block else self.num_layers


@dataclass(frozen=True)
class StageCosts:
    """Per-stage sums of LayerCosts for one contiguous split into pp stages.

    `out_per_sample` is what the stage's last layer sends to the next stage;
    `tp_allreduces` lists (bytes per sample, count) of the stage's TP all-reduces.
    """

    layers: tuple[int, ...]
    time_per_sample: tuple[float, ...]
    time_fixed: tuple[float, ...]
    act_per_sample: tuple[float, ...]
    out_per_sample: tuple[float, ...]
    param_bytes: tuple[float, ...]
    tp_allreduces: tuple[tuple[tuple[float, int], ...], ...]
    #: the trainer's layers (blocks) of each stage: a plan's stage_layers (see the module doc)
    blocks: tuple[int, ...] = ()
    #: the parameter bytes of each stage's largest block (what FSDP gathers at once)
    max_layer_bytes: tuple[float, ...] = ()
    #: the parameter bytes of each stage's records that are not blocks (embedding, head: FSDP's root unit)
    other_bytes: tuple[float, ...] = ()

    @property
    def pp(self) -> int:
        return len(self.layers)


def layers_from_records(recs: Sequence[LayerRecord]) -> LayerCosts:
    """LayerCosts from one (model, gpu type, tp, micro-batch) profile, ordered by layer."""
    if not recs:
        raise ValueError("no layer records")
    b = float(recs[0].micro_batch)
    return LayerCosts(
        time_per_sample=tuple((r.fwd_s + r.bwd_s) / b for r in recs),
        time_fixed=(0.0,) * len(recs),
        act_per_sample=tuple(r.act_bytes / b for r in recs),
        out_per_sample=tuple(r.out_bytes / b for r in recs),
        param_bytes=tuple(float(r.param_bytes) for r in recs),
        tp_allreduces=tuple(TP_ALLREDUCES_BY_KIND.get(r.kind.lower(), TP_ALLREDUCES_PER_BLOCK) for r in recs),
        is_block=tuple(r.kind.lower() not in NON_BLOCK_KINDS for r in recs),
    )


def affine_layers(lo: LayerCosts, hi: LayerCosts, b_lo: int, b_hi: int, *, memory_of: bool = True) -> LayerCosts:
    """Each layer's time as the line through its times at micro-batch sizes
    `b_lo` < `b_hi` (profiles `lo` and `hi`, whose time is all per sample):
    ``time(b) = time_per_sample * b + time_fixed``, neither part below 0;
    memory per sample from `hi` (`memory_of`) or `lo`."""
    if not b_lo < b_hi:
        raise ValueError(f"need b_lo < b_hi, got {b_lo} and {b_hi}")
    slopes, fixed = [], []
    for a_lo, a_hi in zip(lo.time_per_sample, hi.time_per_sample, strict=True):
        t_lo, t_hi = a_lo * b_lo, a_hi * b_hi
        slope = max(0.0, (t_hi - t_lo) / (b_hi - b_lo))
        c = t_lo - slope * b_lo
        if c < 0:  # faster per sample at the smaller size: no fixed part, the larger size's rate
            slope, c = a_hi, 0.0
        slopes.append(slope)
        fixed.append(c)
    mem = hi if memory_of else lo
    return LayerCosts(
        time_per_sample=tuple(slopes),
        time_fixed=tuple(fixed),
        act_per_sample=mem.act_per_sample,
        out_per_sample=mem.out_per_sample,
        param_bytes=mem.param_bytes,
        tp_allreduces=mem.tp_allreduces,
        uniform=mem.uniform,
        is_block=mem.is_block,
    )


def analytic_layers(
    model: ModelSpec, spec: GpuSpec, tp: int, *, efficiency: float, layer_overhead_s: float
) -> LayerCosts:
    """Uniform LayerCosts from the model's cost helpers and the GPU's datasheet."""
    n = model.num_layers
    flops_per_s = spec.peak_tflops * 1e12 * efficiency * (FP32_SPEED if model.dtype == "fp32" else 1.0)
    return LayerCosts(
        time_per_sample=(model.train_flops_per_sample_per_layer() / tp / flops_per_s,) * n,
        time_fixed=(layer_overhead_s,) * n,
        act_per_sample=(model.act_bytes_per_sample_per_layer() / tp,) * n,
        out_per_sample=(model.boundary_bytes_per_sample(),) * n,
        param_bytes=(model.params / n / tp * model.dtype_bytes,) * n,
        tp_allreduces=(TP_ALLREDUCES_PER_BLOCK,) * n,
        uniform=True,
    )


def balanced_sizes(weights: Sequence[float], pp: int) -> tuple[int, ...]:
    """Layers per stage of the contiguous split into `pp` non-empty stages
    that minimises the heaviest stage (bisection on the bound + greedy fill)."""
    n = len(weights)
    if not 1 <= pp <= n:
        raise ValueError(f"cannot split {n} layers into {pp} stages")
    if pp == 1:
        return (n,)

    def fill(bound: float) -> list[int]:
        sizes, load = [0], 0.0
        for w in weights:
            if sizes[-1] and load + w > bound:
                sizes.append(0)
                load = 0.0
            sizes[-1] += 1
            load += w
        return sizes

    lo, hi = max(weights), float(sum(weights))
    for _ in range(60):
        if hi - lo <= 1e-12 * max(hi, 1e-30):
            break
        mid = (lo + hi) / 2
        if len(fill(mid)) <= pp:
            hi = mid
        else:
            lo = mid
    sizes = fill(hi)
    while len(sizes) < pp:  # fewer stages than asked: split the longest (never raises the max)
        i = max(range(len(sizes)), key=lambda j: (sizes[j], -j))
        sizes[i : i + 1] = [sizes[i] - sizes[i] // 2, sizes[i] // 2]
    return tuple(sizes)


def uniform_sizes(n: int, pp: int) -> tuple[int, ...]:
    """Even split; the extra layers go to the last stages (the first stage
    holds the most in-flight activations)."""
    if not 1 <= pp <= n:
        raise ValueError(f"cannot split {n} layers into {pp} stages")
    q, r = divmod(n, pp)
    return tuple(q + (1 if k >= pp - r else 0) for k in range(pp))


def _block_units(is_block: Sequence[bool]) -> list[int]:
    """Records per unit when every non-block record joins a neighbouring
    block: the ones before the first block join it, the others the block
    before them."""
    units: list[int] = []
    lead = 0
    for blk in is_block:
        if blk:
            units.append(1 + lead)
            lead = 0
        elif units:
            units[-1] += 1
        else:
            lead += 1
    if lead and units:
        units[-1] += lead
    return units


def _blocks_per_stage(is_block: Sequence[bool], sizes: Sequence[int]) -> list[int]:
    out, start = [], 0
    for size in sizes:
        out.append(sum(is_block[start : start + size]))
        start += size
    return out


def trainer_layers(blocks: Sequence[int], num_layers: int) -> tuple[int, ...]:
    """Blocks per stage carried to a model of `num_layers` trainer layers:
    unchanged when they add up to it, else in proportion (largest
    remainder), each stage at least one."""
    if sum(blocks) == num_layers or not blocks:
        return tuple(blocks)
    if num_layers < len(blocks):
        raise ValueError(f"cannot split {num_layers} layers into {len(blocks)} stages")
    rest = largest_remainder(num_layers - len(blocks), [max(b, 1e-9) for b in blocks])
    return tuple(1 + r for r in rest)


def split_stages(costs: LayerCosts, pp: int, ref_batch: float = 1.0, num_layers: int | None = None) -> StageCosts:
    """Split layers into pp contiguous stages balanced by time at micro-batch
    `ref_batch`; `num_layers`: the trainer's layer count the stages' blocks
    are carried to (default: the profile's blocks)."""
    blocks: list[int] | None = None
    if costs.uniform:
        sizes = uniform_sizes(costs.num_layers, pp)
    else:
        w = [a * ref_batch + c for a, c in zip(costs.time_per_sample, costs.time_fixed, strict=True)]
        sizes = balanced_sizes(w, pp)
        if costs.is_block and costs.num_blocks >= pp:
            blocks = _blocks_per_stage(costs.is_block, sizes)
            if min(blocks) < 1:  # a stage without a block: split whole blocks (with their neighbours)
                units = _block_units(costs.is_block)
                starts = [sum(units[:i]) for i in range(len(units))]
                uw = [sum(w[s : s + u]) for s, u in zip(starts, units, strict=True)]
                per_stage = balanced_sizes(uw, pp)
                merged: list[int] = []
                i = 0
                for n in per_stage:
                    merged.append(sum(units[i : i + n]))
                    i += n
                sizes = tuple(merged)
                blocks = list(per_stage)
    if blocks is None:
        blocks = _blocks_per_stage(costs.is_block, sizes) if costs.is_block else list(sizes)
    return _stage_costs(costs, sizes, blocks, num_layers)


def even_block_sizes(costs: LayerCosts, pp: int) -> tuple[int, ...] | None:
    """Records per stage of the split that gives every stage the same number
    of blocks (the records that are not blocks ride with their neighbouring
    block, as in `split_stages`); None when the blocks do not divide by pp."""
    if costs.uniform or not costs.is_block:
        n = costs.num_layers
        return uniform_sizes(n, pp) if n % pp == 0 else None
    units = _block_units(costs.is_block)
    if len(units) % pp:
        return None
    q = len(units) // pp
    return tuple(sum(units[i * q : (i + 1) * q]) for i in range(pp))


def split_even(costs: LayerCosts, pp: int, num_layers: int | None = None) -> StageCosts | None:
    """The split into pp stages of equal block counts (runtimes that cannot
    split layers unevenly: solver.contract.runtimes); None when the trainer's layers
    (`num_layers`, default the profile's blocks) or the profile's blocks do
    not divide by pp."""
    if num_layers is not None and num_layers % pp:
        return None
    sizes = even_block_sizes(costs, pp)
    if sizes is None:
        return None
    blocks = _blocks_per_stage(costs.is_block, sizes) if costs.is_block and not costs.uniform else list(sizes)
    return _stage_costs(costs, sizes, blocks, num_layers)


def _stage_costs(costs: LayerCosts, sizes: Sequence[int], blocks: Sequence[int], num_layers: int | None) -> StageCosts:
    """The StageCosts of the contiguous split `sizes` (records per stage)."""
    tps: list[float] = []
    fix: list[float] = []
    act: list[float] = []
    out: list[float] = []
    par: list[float] = []
    big: list[float] = []
    other: list[float] = []
    tpar: list[tuple[tuple[float, int], ...]] = []
    start = 0
    for size in sizes:
        sl = slice(start, start + size)
        tps.append(sum(costs.time_per_sample[sl]))
        fix.append(sum(costs.time_fixed[sl]))
        act.append(sum(costs.act_per_sample[sl]))
        par.append(sum(costs.param_bytes[sl]))
        flags = costs.is_block[sl] if costs.is_block else (True,) * size
        pbytes = costs.param_bytes[sl]
        big.append(max((p for p, f in zip(pbytes, flags, strict=True) if f), default=0.0))
        other.append(sum(p for p, f in zip(pbytes, flags, strict=True) if not f))
        out.append(costs.out_per_sample[start + size - 1])
        groups: dict[float, int] = {}
        for nbytes, count in zip(costs.out_per_sample[sl], costs.tp_allreduces[sl], strict=True):
            if count:
                groups[nbytes] = groups.get(nbytes, 0) + count
        tpar.append(tuple(sorted(groups.items())))
        start += size
    return StageCosts(
        tuple(sizes),
        tuple(tps),
        tuple(fix),
        tuple(act),
        tuple(out),
        tuple(par),
        tuple(tpar),
        trainer_layers(blocks, num_layers) if num_layers is not None else tuple(blocks),
        tuple(big),
        tuple(other),
    )


def stage_layers_for(num_layers: int, stage_weights: Sequence[float], stage_caps: Sequence[int]) -> tuple[int, ...]:
    """Layers per pipeline stage for stages of unlike speed and memory: in
    proportion to `stage_weights` (each stage's speed per layer: layers per
    second of its GPUs), no stage above its cap in `stage_caps` (the most
    layers its GPUs' memory holds), every stage at least one, adding up to
    `num_layers`.

    Water filling: a stage whose quota passes its cap is fixed at the cap,
    then one whose quota is below one layer at one, and the rest share what
    is left again; the last ones by largest remainder (solver.contract.plan). Raises
    ValueError when no split exists (fewer layers than stages, or more than
    the caps hold)."""
    n = len(stage_weights)
    if n < 1 or len(stage_caps) != n:
        raise ValueError(f"need one weight and one cap per stage, got {len(stage_weights)} and {len(stage_caps)}")
    if any(not w > 0 for w in stage_weights):
        raise ValueError(f"stage weights must be > 0, got {list(stage_weights)}")
    caps = [min(int(c), num_layers - (n - 1)) for c in stage_caps]
    if num_layers < n or min(caps) < 1 or sum(caps) < num_layers:
        raise ValueError(
            f"{num_layers} layers do not split into {n} stages of at least one layer within caps {list(stage_caps)}"
        )
    fixed: list[int | None] = [None] * n
    while True:
        free = [i for i in range(n) if fixed[i] is None]
        if not free:
            break
        left = num_layers - sum(f for f in fixed if f is not None)
        total = sum(stage_weights[i] for i in free)
        quota = {i: left * stage_weights[i] / total for i in free}
        over = [i for i in free if quota[i] > caps[i]]
        under = [] if over else [i for i in free if quota[i] < 1]
        if not over and not under:
            break
        for i in over or under:
            fixed[i] = caps[i] if over else 1
    free = [i for i in range(n) if fixed[i] is None]
    out = [f or 0 for f in fixed]
    left = num_layers - sum(out)
    if free and left >= len(free):  # every quota is >= 1 here, so every part too
        for i, k in zip(free, largest_remainder(left, [stage_weights[i] for i in free]), strict=True):
            out[i] = k
    for i in free:  # fixing took too much (rare): at least one layer each, the repair below evens out
        out[i] = max(out[i], 1)
    # repair (rare): keep every stage within [1, cap] and the total exact
    while sum(out) > num_layers:
        i = max((j for j in range(n) if out[j] > 1), key=lambda j: (out[j] / stage_weights[j], -j))
        out[i] -= 1
    while sum(out) < num_layers:
        i = min((j for j in range(n) if out[j] < caps[j]), key=lambda j: ((out[j] + 1) / stage_weights[j], j))
        out[i] += 1
    for i in range(n):
        while out[i] > caps[i]:
            j = min((j for j in range(n) if out[j] < caps[j]), key=lambda j: ((out[j] + 1) / stage_weights[j], j))
            out[i] -= 1
            out[j] += 1
    return tuple(out)
