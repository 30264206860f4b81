"""Model specs: what a job trains, by preset name or spec file.

(The presets table, spec-file loading and validation are filled in by the
solver issue; the dataclass below is the shared shape.)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    """A model's shape, enough to estimate compute, memory and traffic.

    `family` is one of gpt, bert, moe, wide_resnet (or "custom").
    `params` is the total parameter count. `name` is the preset name or the
    Arena trace name (e.g. ``moe__2.4B``) when it came from one.
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

    @property
    def signature(self) -> str:
        """Stable key for caches and profile lookups."""
        return f"{self.name}|{self.family}|L{self.num_layers}|H{self.hidden}|A{self.heads}|S{self.seq_len}|V{self.vocab}|E{self.num_experts}|{self.dtype}"
