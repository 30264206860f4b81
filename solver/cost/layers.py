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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from solver.models import ModelSpec
from solver.profiles.records import GpuSpec, LayerRecord

#: TP all-reduces per micro-batch (forward + backward) of one layer, by
#: kind; any other kind is a whole transformer block: 2 forward, 2 backward.
TP_ALLREDUCES_BY_KIND = {
    "embed": 0,
    "embedding": 0,
    "head": 0,
    "lm_head": 0,
    "loss": 0,
    "pool": 0,
    "stem": 0,
    "attention": 2,
    "attn": 2,
    "mlp": 2,
    "ffn": 2,
}
TP_ALLREDUCES_PER_BLOCK = 4

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

    @property
    def num_layers(self) -> int:
        return len(self.time_per_sample)


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


def split_stages(costs: LayerCosts, pp: int, ref_batch: float = 1.0) -> StageCosts:
    """Split layers into pp contiguous stages balanced by time at micro-batch `ref_batch`."""
    if costs.uniform:
        sizes = uniform_sizes(costs.num_layers, pp)
    else:
        w = [a * ref_batch + c for a, c in zip(costs.time_per_sample, costs.time_fixed)]
        sizes = balanced_sizes(w, pp)
    cols: dict[str, list] = {k: [] for k in ("tps", "fix", "act", "out", "par", "tpar")}
    start = 0
    for size in sizes:
        sl = slice(start, start + size)
        cols["tps"].append(sum(costs.time_per_sample[sl]))
        cols["fix"].append(sum(costs.time_fixed[sl]))
        cols["act"].append(sum(costs.act_per_sample[sl]))
        cols["par"].append(sum(costs.param_bytes[sl]))
        cols["out"].append(costs.out_per_sample[start + size - 1])
        groups: dict[float, int] = {}
        for nbytes, count in zip(costs.out_per_sample[sl], costs.tp_allreduces[sl]):
            if count:
                groups[nbytes] = groups.get(nbytes, 0) + count
        cols["tpar"].append(tuple(sorted(groups.items())))
        start += size
    return StageCosts(
        sizes,
        tuple(cols["tps"]),
        tuple(cols["fix"]),
        tuple(cols["act"]),
        tuple(cols["out"]),
        tuple(cols["par"]),
        tuple(cols["tpar"]),
    )
