"""Model specs: what a job trains, by preset name or spec file.

Presets
-------
* Arena's models, named as its trace names them (``bert__760M``, ``moe__2.4B``,
  ``wide_resnet__1B``; aliases ``bert-760m``, ``moe-2.4b``, ``wide-resnet-1b``).
  Arena trains Alpa's benchmark models: ``bert`` sizes use Alpa's GPT/BERT
  benchmark shapes (seq 1024, vocab 51200), ``moe`` sizes Alpa's MoE shapes
  (seq 1024, vocab 32000, every block a top-2 MoE block).
* GPT-3 paper shapes ``gpt-125m`` ... ``gpt-13b`` (seq 2048, vocab 50257; 1.3B
  uses 16 heads and 13B hidden 5120 so that heads divide hidden).
* ``gpt-tiny``: 4 blocks, hidden 64, 4 heads, seq 32, vocab 256, fp32, about
  0.2M parameters -- for CPU tests and the reference trainer.

``num_layers`` is the number of repeated blocks the model is split into for
pipelining: transformer blocks for gpt/bert/moe, bottleneck blocks for
wide_resnet (16, the ResNet-50 layout 3+4+6+3).

Transformer parameters are counted as ``L * block + vocab * hidden`` with a
block of ``12 h^2 + 13 h`` (MoE: ``4 h^2 + 5 h`` attention plus
``experts * (8 h^2 + 5 h)`` FFN experts and an ``h * experts`` gate).

wide_resnet costs: a ResNet-50 widened uniformly keeps its ratio of ~165
multiply-adds per parameter at 224x224 (ResNet-50 4.1 G / 25.6 M, WRN-50-2
11.4 G / 68.9 M), so training FLOPs per sample = 3 x 2 x 165 x params; its
stored activations (~28 M values per sample for ResNet-50) grow with the
channel width, i.e. with sqrt(params / 25.6 M). Alpa's wide-ResNet benchmark
trains in fp32, so those presets are fp32.
"""

from __future__ import annotations

import difflib
import math
import pathlib
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from solver.contract.datafile import read_json_or_toml
from solver.contract.errors import SolverError

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
FAMILIES = ("gpt", "bert", "moe", "wide_resnet", "custom")
TRANSFORMER_FAMILIES = ("gpt", "bert", "moe", "custom")

#: Upper bounds beyond which a spec is surely a typo.
LIMITS = {
    "num_layers": 10_000,
    "hidden": 1_000_000,
    "heads": 10_000,
    "seq_len": 10_000_000,
    "vocab": 10_000_000,
    "num_experts": 10_000,
    "params": 1e14,
}


class ModelSpecError(ValueError, SolverError):
    """A model name or spec is not usable (the message names the field)."""


@dataclass(frozen=True)
class ModelSpec:
    """A model's shape, enough to estimate compute, memory and traffic.

    `family` is one of gpt, bert, moe, wide_resnet (or "custom").
    `params` is the total parameter count. `name` is the preset name or the
    Arena trace name (e.g. ``moe__2.4B``) when it came from one.
    For non-transformer families (wide_resnet) `flops_per_sample_override`
    and `act_bytes_per_sample_override` give the per-layer costs directly
    (as whole-model totals, split evenly over the blocks).
    `moe_top_k` is how many experts each token visits (MoE only).
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
    moe_top_k: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ModelSpecError(f"model: field 'name' must be a non-empty string, got {self.name!r}")
        where = f"model {self.name!r}"
        if self.family not in FAMILIES:
            raise ModelSpecError(f"{where}: field 'family' must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        if self.dtype not in DTYPE_BYTES:
            raise ModelSpecError(f"{where}: field 'dtype' must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        for name in ("num_layers", "hidden", "heads", "seq_len", "vocab", "num_experts", "moe_top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ModelSpecError(f"{where}: field {name!r} must be an integer, got {value!r}")
            if value < 1:
                raise ModelSpecError(f"{where}: field {name!r} must be positive, got {value}")
            if value > LIMITS.get(name, math.inf):
                raise ModelSpecError(f"{where}: field {name!r} = {value} is absurdly large (limit {LIMITS[name]})")
        for name in ("params", "flops_per_sample_override", "act_bytes_per_sample_override"):
            value = getattr(self, name)
            if value is None and name != "params":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ModelSpecError(f"{where}: field {name!r} must be a number, got {value!r}")
            if value <= 0:
                raise ModelSpecError(f"{where}: field {name!r} must be positive, got {value}")
        if self.params > LIMITS["params"]:
            raise ModelSpecError(f"{where}: field 'params' = {self.params:g} is absurdly large")
        if self.hidden % self.heads:
            raise ModelSpecError(f"{where}: field 'hidden' ({self.hidden}) must be divisible by 'heads' ({self.heads})")
        if self.family in TRANSFORMER_FAMILIES and self.params <= self.vocab * self.hidden:
            raise ModelSpecError(
                f"{where}: field 'params' ({self.params:g}) must exceed the embedding "
                f"(vocab x hidden = {self.vocab * self.hidden:g})"
            )

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
        embed = self.vocab * self.hidden if self.family in TRANSFORMER_FAMILIES else 0.0
        return max(self.params - embed, 0.0) / self.num_layers

    def train_flops_per_sample_per_layer(self) -> float:
        """Forward + backward FLOPs of one block for one sample (3x forward).

        MoE blocks count only the experts a token visits (`moe_top_k`)."""
        if self.flops_per_sample_override is not None:
            return self.flops_per_sample_override / self.num_layers
        active = self.params_per_layer
        if self.family == "moe" and self.num_experts > 1:
            idle = self.num_experts - min(self.moe_top_k, self.num_experts)
            active = max(active - idle * _expert_params(self.hidden), active / self.num_experts)
        fwd = 2.0 * active * self.seq_len + 4.0 * self.seq_len * self.seq_len * self.hidden
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


# ---- parameter counts ------------------------------------------------------------


def _expert_params(h: int) -> float:
    return 8.0 * h * h + 5.0 * h


def transformer_params(num_layers: int, hidden: int, vocab: int, num_experts: int = 1) -> float:
    """Parameter count of a transformer of this shape (see the module doc)."""
    h = hidden
    if num_experts > 1:
        block = 4.0 * h * h + 5.0 * h + num_experts * _expert_params(h) + h * num_experts
    else:
        block = 12.0 * h * h + 13.0 * h
    return num_layers * block + vocab * h


_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*$", re.IGNORECASE)


def parse_size(value: Any, field: str = "params") -> float:
    """A count given as a number or a string like ``"1.3B"``, ``"760M"``."""
    if isinstance(value, bool):
        raise ModelSpecError(f"field {field!r} must be a number or a size like '1.3B', got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            return float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    raise ModelSpecError(f"field {field!r} must be a number or a size like '1.3B', got {value!r}")


# ---- presets ----------------------------------------------------------------------

_RESNET50_PARAMS = 25.6e6
_RESNET50_ACTS = 28e6  # stored values per 224x224 sample
_MACS_PER_PARAM = 165.0


def _transformer(
    name: str,
    family: str,
    layers: int,
    hidden: int,
    heads: int,
    seq: int,
    vocab: int,
    experts: int = 1,
    dtype: str = "fp16",
) -> ModelSpec:
    return ModelSpec(
        name,
        family,
        layers,
        hidden,
        heads,
        seq,
        vocab,
        transformer_params(layers, hidden, vocab, experts),
        dtype,
        experts,
    )


def _wide_resnet(name: str, params: float, num_layers: int = 16, dtype: str = "fp32") -> ModelSpec:
    width = math.sqrt(params / _RESNET50_PARAMS)  # channel width relative to ResNet-50
    return ModelSpec(
        name,
        "wide_resnet",
        num_layers=num_layers,
        hidden=max(int(round(64 * width)), 1),
        heads=1,
        seq_len=224,
        vocab=1000,
        params=params,
        dtype=dtype,
        flops_per_sample_override=3.0 * 2.0 * _MACS_PER_PARAM * params,
        act_bytes_per_sample_override=_RESNET50_ACTS * width * DTYPE_BYTES[dtype],
    )


#: Alpa's GPT/BERT benchmark shapes: size -> (layers, hidden, heads).
_BERT = {
    "760M": (24, 1536, 16),
    "1.3B": (24, 2048, 32),
    "2.6B": (32, 2560, 32),
    "6.7B": (32, 4096, 32),
    "15B": (48, 5120, 40),
    "39B": (48, 8192, 64),
}
#: Alpa's MoE benchmark shapes: size -> (layers, hidden, heads, experts).
_MOE = {
    "690M": (8, 768, 16, 16),
    "1.3B": (16, 768, 16, 16),
    "2.4B": (16, 1024, 16, 16),
    "10B": (16, 1536, 16, 32),
    "27B": (16, 2048, 16, 48),
    "70B": (32, 2048, 16, 64),
}
#: GPT-3 paper shapes: name -> (layers, hidden, heads).
_GPT3 = {
    "gpt-125m": (12, 768, 12),
    "gpt-350m": (24, 1024, 16),
    "gpt-760m": (24, 1536, 16),
    "gpt-1.3b": (24, 2048, 16),
    "gpt-2.7b": (32, 2560, 32),
    "gpt-6.7b": (32, 4096, 32),
    "gpt-13b": (40, 5120, 40),
}
_WIDE_RESNET = ("500M", "1B", "2B", "4B", "6.8B", "13B")


def _build_presets() -> dict[str, ModelSpec]:
    out: list[ModelSpec] = []
    out += [_wide_resnet(f"wide_resnet__{size}", parse_size(size)) for size in _WIDE_RESNET]
    out += [_transformer(f"bert__{s}", "bert", *shape, seq=1024, vocab=51200) for s, shape in _BERT.items()]
    out += [
        _transformer(f"moe__{s}", "moe", layers, hidden, heads, 1024, 32000, experts)
        for s, (layers, hidden, heads, experts) in _MOE.items()
    ]
    out += [_transformer(n, "gpt", *shape, seq=2048, vocab=50257) for n, shape in _GPT3.items()]
    out.append(_transformer("gpt-tiny", "gpt", 4, 64, 4, 32, 256, dtype="fp32"))
    return {spec.name: spec for spec in out}


PRESETS: dict[str, ModelSpec] = _build_presets()


def _alias(name: str) -> str:
    """``wide_resnet__1B`` -> ``wide-resnet-1b``."""
    return name.replace("__", "-").replace("_", "-").lower()


#: lower-case name or alias -> preset name
_LOOKUP: dict[str, str] = {**{_alias(n): n for n in PRESETS}, **{n.lower(): n for n in PRESETS}}


def list_presets() -> list[str]:
    """Preset names (Arena trace names and gpt-*), in table order."""
    return list(PRESETS)


def aliases(name: str) -> list[str]:
    """Every name that resolves to preset `name` (itself first)."""
    return [name] + sorted({k for k, v in _LOOKUP.items() if v == name} - {name})


# ---- spec files ---------------------------------------------------------------------

_KEYS = {
    "name",
    "family",
    "layers",
    "num_layers",
    "hidden",
    "heads",
    "seq_len",
    "vocab",
    "params",
    "dtype",
    "num_experts",
    "moe_top_k",
}


def spec_from_dict(data: Any, where: str = "model spec") -> ModelSpec:
    """Build and check a ModelSpec from a spec file's mapping."""
    if not isinstance(data, dict):
        raise ModelSpecError(f"{where}: expected a table/object of fields, got {type(data).__name__}")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ModelSpecError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})")
    if "layers" in data and "num_layers" in data:
        raise ModelSpecError(f"{where}: give 'layers' or 'num_layers', not both")

    def need(key: str, *alts: str) -> Any:
        for k in (key, *alts):
            if k in data:
                return data[k]
        raise ModelSpecError(f"{where}: missing field {key!r}")

    def integer(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelSpecError(f"{where}: field {key!r} must be an integer, got {value!r}")
        if value < 1:
            raise ModelSpecError(f"{where}: field {key!r} must be positive, got {value}")
        return value

    layers_key = "num_layers" if "num_layers" in data else "layers"

    family = need("family")
    if family not in FAMILIES:
        raise ModelSpecError(f"{where}: field 'family' must be one of {', '.join(FAMILIES)}, got {family!r}")
    name = data.get("name", where)
    if not isinstance(name, str) or not name:
        raise ModelSpecError(f"{where}: field 'name' must be a non-empty string, got {name!r}")
    dtype = data.get("dtype", "fp32" if family == "wide_resnet" else "fp16")
    if dtype not in DTYPE_BYTES:
        raise ModelSpecError(f"{where}: field 'dtype' must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    try:
        if family == "wide_resnet":
            params = parse_size(need("params"))
            if not 0 < params <= LIMITS["params"]:
                raise ModelSpecError(
                    f"field 'params' must be positive and at most {LIMITS['params']:g}, got {data['params']!r}"
                )
            return _wide_resnet(name, params, integer(layers_key, need("layers", "num_layers")), dtype)
        layers = integer(layers_key, need("layers", "num_layers"))
        hidden = integer("hidden", need("hidden"))
        heads = integer("heads", need("heads"))
        seq_len = integer("seq_len", need("seq_len"))
        vocab = integer("vocab", need("vocab"))
        experts = integer("num_experts", data.get("num_experts", 1))
        top_k = integer("moe_top_k", data.get("moe_top_k", 2))
        params = parse_size(data["params"]) if "params" in data else transformer_params(layers, hidden, vocab, experts)
        return ModelSpec(name, family, layers, hidden, heads, seq_len, vocab, params, dtype, experts, moe_top_k=top_k)
    except ModelSpecError as exc:
        msg = str(exc)
        raise ModelSpecError(msg if msg.startswith(where) else f"{where}: {msg}") from None


# ---- the shape a job trains ---------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The shape a job's trainer says it trains (``progress.json``'s
    ``"model"``: ``{"layers", "hidden", "heads", "seq_len", "vocab"}``, all
    but ``layers`` optional). The controller prices the job as this model
    from its first report on (`applied_to`), whatever it was submitted as.
    `from_dict` reads it as the job's own word: known keys only, integers
    within LIMITS."""

    layers: int
    hidden: int | None = None
    heads: int | None = None
    seq_len: int | None = None
    vocab: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value, limit = getattr(self, f.name), LIMITS["num_layers" if f.name == "layers" else f.name]
            if value is None and f.name != "layers":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
                raise ModelSpecError(f"model shape: {f.name!r} must be an integer from 1 to {limit}, got {value!r}")

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, data: object) -> ModelShape:
        """The shape a mapping gives; ModelSpecError naming what is wrong."""
        if not isinstance(data, dict):
            raise ModelSpecError(f"model shape: expected an object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise ModelSpecError(f"model shape: unknown field {unknown[0][:40]!r} (known: {', '.join(sorted(known))})")
        if "layers" not in data:
            raise ModelSpecError("model shape: missing field 'layers'")
        return cls(**data)

    def applied_to(self, spec: ModelSpec) -> ModelSpec:
        """SPEC as the job trains it: this shape's fields in place of SPEC's
        (a transformer's parameters counted again), named after SPEC and the
        shape; SPEC itself when nothing differs. ModelSpecError when the
        result is no model (heads that do not divide hidden, ...)."""
        own = (spec.num_layers, spec.hidden, spec.heads, spec.seq_len, spec.vocab)
        trained = (self.layers, self.hidden, self.heads, self.seq_len, self.vocab)
        layers, hidden, heads, seq_len, vocab = (t or o for t, o in zip(trained, own, strict=True))
        if (layers, hidden, heads, seq_len, vocab) == own:
            return spec
        params = (
            transformer_params(layers, hidden, vocab, spec.num_experts)
            if spec.family in TRANSFORMER_FAMILIES
            else spec.params
        )
        name = f"{spec.name} (trained L{layers} H{hidden} A{heads} S{seq_len} V{vocab})"
        return replace(
            spec, name=name, params=params, num_layers=layers, hidden=hidden, heads=heads, seq_len=seq_len, vocab=vocab
        )


def load_spec_file(path: str | pathlib.Path) -> ModelSpec:
    """Read a JSON or TOML model spec file."""
    path = pathlib.Path(path)
    data = read_json_or_toml(path, ModelSpecError, "model spec file ")
    if isinstance(data, dict) and "name" not in data:
        data = {**data, "name": path.stem}
    return spec_from_dict(data, f"model spec file {path}")


def get_model(name_or_path: str | pathlib.Path) -> ModelSpec:
    """A preset by name (case-insensitive, aliases allowed) or a spec file by path."""
    if isinstance(name_or_path, pathlib.Path):
        return load_spec_file(name_or_path)
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ModelSpecError(f"model: expected a preset name or a spec file path, got {name_or_path!r}")
    key = name_or_path.strip()
    if key.lower() in _LOOKUP:
        return PRESETS[_LOOKUP[key.lower()]]
    path = pathlib.Path(key).expanduser()
    if path.suffix.lower() in (".json", ".toml") or path.exists() or "/" in key:
        return load_spec_file(path)
    close = difflib.get_close_matches(key.lower(), list(_LOOKUP), n=4, cutoff=0.6)
    hint = f"; did you mean {', '.join(dict.fromkeys(_LOOKUP[c] for c in close))}?" if close else ""
    raise ModelSpecError(f"model: unknown preset {key!r}{hint} (see list_presets(), or give a .json/.toml spec file)")
