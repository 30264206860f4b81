"""Model specs: what a job trains, by preset name or spec file.

(The presets table, spec-file loading and validation are filled in by the
solver issue; the dataclass and its cost helpers below are the shared shape
that the estimator relies on.)
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class ModelSpec:
    """A model's shape, enough to estimate compute, memory and traffic.

    `family` is one of gpt, bert, moe, wide_resnet (or "custom").
    `params` is the total parameter count. `name` is the preset name or the
    Arena trace name (e.g. ``moe__2.4B``) when it came from one.
    For non-transformer families (wide_resnet) `flops_per_sample_override`
    and `act_bytes_per_sample_override` give the per-layer costs directly.
    """

    name: str
    family: str
    num_layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    params: float
    dtype: str = "fp16"
    num_experts: int = 1
    flops_per_sample_override: float | None = None
    act_bytes_per_sample_override: float | None = None

    @property
    def signature(self) -> str:
        """Stable key for caches and profile lookups."""
        return (
            f"{self.name}|{self.family}|L{self.num_layers}|H{self.hidden}|A{self.heads}|"
            f"S{self.seq_len}|V{self.vocab}|E{self.num_experts}|{self.dtype}"
        )

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def params_per_layer(self) -> float:
        """Parameters of one repeated block (embeddings excluded)."""
        embed = self.vocab * self.hidden if self.family in ("gpt", "bert", "moe", "custom") else 0.0
        return max(self.params - embed, 0.0) / self.num_layers

    def train_flops_per_sample_per_layer(self) -> float:
        """Forward + backward FLOPs of one block for one sample (3x forward)."""
        if self.flops_per_sample_override is not None:
            return self.flops_per_sample_override / self.num_layers
        dense = self.params_per_layer / max(self.num_experts, 1) if self.family == "moe" else self.params_per_layer
        fwd = 2.0 * dense * self.seq_len + 4.0 * self.seq_len * self.seq_len * self.hidden
        return 3.0 * fwd

    def act_bytes_per_sample_per_layer(self) -> float:
        """Activation memory one block keeps for backward, per sample (fp16)."""
        if self.act_bytes_per_sample_override is not None:
            return self.act_bytes_per_sample_override / self.num_layers
        s, h, a = self.seq_len, self.hidden, max(self.heads, 1)
        return s * h * (34.0 + 5.0 * a * s / h)

    def boundary_bytes_per_sample(self) -> float:
        """Size of the activation sent between pipeline stages, per sample."""
        if self.family == "wide_resnet" and self.act_bytes_per_sample_override is not None:
            return self.act_bytes_per_sample_override / self.num_layers / 8.0
        return float(self.seq_len * self.hidden * self.dtype_bytes)
