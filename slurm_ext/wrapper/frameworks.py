"""The model a framework job trains, as its own command says (``--runtime
megatron`` or ``torchtitan``): so that the model priced is the model trained.

`job_model` reads the commands the batch script runs under
``cellsched-launch`` (`slurm_ext.wrapper.launched`: the script's text and
arguments, nothing run, no variable expanded):

- megatron: ``--num-layers``, ``--hidden-size``, ``--num-attention-heads``,
  ``--seq-length`` and the vocabulary, ``--padded-vocab-size`` (what the model
  has) else ``--vocab-size``; ``--bf16`` / ``--fp16`` (else fp32). A model
  derived from them is counted as the presets are (solver.contract.models).
- torchtitan: ``--module M --config C`` names one of torchtitan's config
  functions, whose model shape is in `TORCHTITAN_MODELS` (the installed
  torchtitan's own numbers: a test compares them), and ``--training.seq_len``
  overrides its sequence length.

Without ``--model`` the job's spec carries the model so derived (inline, as a
spec file's); with one, every field the command states must agree with it
(`JobModel.contradictions`). An option whose value holds a shell expansion
states nothing.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from slurm_ext.wrapper.launched import Word, has_flag, option_value
from slurm_ext.wrapper.options import PROG, WrapperError
from solver.contract.models import ModelSpec, ModelSpecError, spec_from_dict

#: the ModelSpec fields a command can state, as an error names them
LABELS = {
    "num_layers": "layers",
    "hidden": "hidden size",
    "heads": "attention heads",
    "seq_len": "sequence length",
    "vocab": "vocabulary",
}
#: Megatron-LM's options for each field (megatron/training/arguments.py and
#: megatron.core's TransformerConfig at core_v0.16.1); for the vocabulary the
#: padded size, when given, is what the model has
MEGATRON_OPTIONS = {
    "num_layers": ("--num-layers",),
    "hidden": ("--hidden-size",),
    "heads": ("--num-attention-heads",),
    "seq_len": ("--seq-length",),
    "vocab": ("--padded-vocab-size", "--vocab-size"),
}
TITAN_SEQ_LEN = "--training.seq_len"


@dataclass(frozen=True)
class TitanModel:
    """One torchtitan config's model: its shape, its training sequence length and its parameter count."""

    num_layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    params: int


#: (--module, --config) -> the model of that config function of torchtitan 0.3.0
#: (``torchtitan.models.<module>.config_registry``: its model_spec.model's
#: layers, dim, attention heads and vocab_size, training.seq_len, and the
#: parameters of the built model; tests/slurm_ext/wrapper/test_framework_models.py
#: reads them from the installed torchtitan)
TORCHTITAN_MODELS: dict[tuple[str, str], TitanModel] = {
    ("llama3", "llama3_debugmodel"): TitanModel(6, 256, 16, 2048, 2048, 6_163_712),
    ("llama3", "llama3_8b"): TitanModel(32, 4096, 32, 8192, 128256, 8_030_261_248),
    ("llama3", "llama3_70b"): TitanModel(80, 8192, 64, 8192, 128256, 70_553_706_496),
    ("qwen3", "qwen3_debugmodel"): TitanModel(8, 256, 16, 2048, 2048, 31_987_968),
    ("qwen3", "qwen3_0_6b"): TitanModel(28, 1024, 16, 4096, 151936, 596_049_920),
    ("qwen3", "qwen3_1_7b"): TitanModel(28, 2048, 16, 4096, 151936, 1_720_574_976),
    ("qwen3", "qwen3_14b"): TitanModel(40, 5120, 40, 4096, 151936, 14_768_307_200),
    ("qwen3", "qwen3_32b"): TitanModel(64, 5120, 64, 4096, 151936, 32_762_123_264),
}
_WHOLE = re.compile(r"^[0-9]{1,12}$")


@dataclass(frozen=True)
class Stated:
    """A field's value as the job's command states it, and where."""

    value: int
    source: str  #: e.g. "--num-layers on script line 5"


@dataclass(frozen=True)
class JobModel:
    """What a framework job's command says about its model."""

    runtime: str
    name: str
    stated: dict[str, Stated] = field(default_factory=dict)
    #: what keeps the command from stating a field (an unknown torchtitan config, a shell variable)
    unread: dict[str, str] = field(default_factory=dict)
    params: float | None = None
    dtype: str = "fp32"
    how: str = ""  #: how the command states the model (for an error)

    def contradictions(self, model: ModelSpec) -> list[str]:
        """Each field the command states that MODEL (the job's --model) has otherwise, in words."""
        return [
            f"{LABELS[k]} {getattr(model, k)} in {model.name}, {s.value} in the job's command ({s.source})"
            for k, s in self.stated.items()
            if getattr(model, k) != s.value
        ]

    def spec(self) -> ModelSpec:
        """The model the command trains; WrapperError("model", ...) naming what it does not state."""
        missing = [k for k in LABELS if k not in self.stated]
        if missing:
            why = "; ".join(dict.fromkeys(self.unread[k] for k in missing if k in self.unread))
            raise WrapperError(
                "model",
                f"is required (--model or '#CELLSCHED model=...'): the job's {self.runtime} command does not "
                f"state its {', '.join(LABELS[k] for k in missing)} ({why or self.how})",
            )
        data: dict[str, object] = {k: s.value for k, s in self.stated.items()}
        data.update(name=self.name, family="gpt", dtype=self.dtype)
        if self.params is not None:
            data["params"] = self.params
        try:
            return spec_from_dict(data, f"the model of the job's {self.runtime} command")
        except ModelSpecError as exc:
            raise WrapperError("model", str(exc)) from None


def _whole(option: str, word: Word) -> Stated | str:
    """The option's value as a Stated, or why it states nothing (a shell expansion)."""
    source = f"{option} on {word.where}"
    if not word.readable:
        return f"{source} is {word.text!r}, which {PROG} does not expand"
    if not _WHOLE.match(word.text):
        raise WrapperError("script", f"{source}: {word.text!r} is not a whole number")
    return Stated(int(word.text), source)


def _megatron(cmd: Sequence[Word]) -> JobModel:
    stated: dict[str, Stated] = {}
    unread: dict[str, str] = {}
    for key, names in MEGATRON_OPTIONS.items():
        found = next((f for f in (option_value(cmd, n) for n in names) if f is not None), None)
        if found is not None:
            got = _whole(*found)
            if isinstance(got, Stated):
                stated[key] = got
            else:
                unread[key] = got
    dtype = "bf16" if has_flag(cmd, "--bf16") else "fp16" if has_flag(cmd, "--fp16") else "fp32"
    how = "write " + ", ".join(" or ".join(names) for names in MEGATRON_OPTIONS.values()) + " after cellsched-launch"
    return JobModel("megatron", "megatron-gpt", stated, unread, dtype=dtype, how=how)


def _torchtitan(cmd: Sequence[Word]) -> JobModel:
    module, config = option_value(cmd, "--module"), option_value(cmd, "--config")
    stated: dict[str, Stated] = {}
    unread: dict[str, str] = {}
    name, params = "torchtitan", None
    if module is not None and config is not None:
        key = (module[1].text, config[1].text)
        known = TORCHTITAN_MODELS.get(key)
        if known is not None:
            source = f"--config {key[1]} on {config[1].where}"
            stated = {k: Stated(getattr(known, k), source) for k in LABELS}
            name, params = key[1], float(known.params)
        else:
            unread = dict.fromkeys(LABELS, f"torchtitan config {key[0]}/{key[1]} is not one whose model it knows")
    how = "its --module and --config name no model it knows: " + ", ".join(
        f"--module {m} --config {c}" for m, c in TORCHTITAN_MODELS
    )
    seq = option_value(cmd, TITAN_SEQ_LEN)
    if seq is not None:
        got = _whole(*seq)
        if isinstance(got, Stated):
            stated["seq_len"] = got
        else:
            unread["seq_len"] = got
    return JobModel("torchtitan", name, stated, unread, params, "bf16", how)


READERS = {"megatron": _megatron, "torchtitan": _torchtitan}


def job_model(runtime: str, commands: Sequence[Sequence[Word]]) -> JobModel | None:
    """What the launched COMMANDS say about the model under RUNTIME (None: a
    runtime whose command names no model, or no command). Two commands that
    state a field differently: WrapperError("script", ...)."""
    read = READERS.get(runtime)
    if read is None or not commands:
        return None
    first, *others = [read(cmd) for cmd in commands]
    stated = dict(first.stated)
    for other in others:
        for k, s in other.stated.items():
            seen = stated.setdefault(k, s)
            if seen.value != s.value:
                raise WrapperError(
                    "script",
                    f"its commands train different models: {LABELS[k]} {seen.value} ({seen.source}) "
                    f"and {s.value} ({s.source})",
                )
    return dataclasses.replace(first, stated=stated)
