"""--model: a preset of solver.contract.models (any case, aliases) or a small spec file."""

from __future__ import annotations

import difflib
import os
import pathlib
import stat

from slurm_ext.wrapper.options import Setting, WrapperError
from slurm_ext.wrapper.values import field_name, one_line
from solver.contract.models import ModelSpec, ModelSpecError, aliases, get_model, list_presets, load_spec_file

MAX_MODEL_FILE_BYTES = 64 << 10


def _preset_names() -> dict[str, str]:
    """lower-case name or alias -> preset name."""
    return {a.lower(): p for p in list_presets() for a in aliases(p)}


def load_model(s: Setting, cwd: pathlib.Path) -> tuple[str, dict | None, ModelSpec]:
    """(name for the spec, inline definition or None, ModelSpec) of --model:
    a preset (any case, aliases), else a spec file, read only when it is a
    small regular file."""
    name = one_line("model", s)
    assert name is not None
    presets = _preset_names()
    if name.strip().lower() in presets:
        return presets[name.strip().lower()], None, get_model(presets[name.strip().lower()])
    field = field_name("model", s)
    path = pathlib.Path(name).expanduser()
    path = path if path.is_absolute() else cwd / path
    if not os.path.lexists(path):
        if "/" in name or path.suffix.lower() in (".json", ".toml"):
            raise WrapperError(field, f"no such spec file {name!r}")
        close = difflib.get_close_matches(name.strip().lower(), list(presets), n=4, cutoff=0.6)
        hint = f"; did you mean {', '.join(dict.fromkeys(presets[c] for c in close))}?" if close else ""
        raise WrapperError(
            field,
            f"unknown model {name!r}{hint} (presets: {', '.join(list_presets())}; or give a .json/.toml spec file)",
        )
    try:
        st = path.stat()
    except OSError as exc:
        raise WrapperError(field, f"cannot read spec file {name!r} ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise WrapperError(field, f"spec file {name!r} is not a regular file")
    if st.st_size > MAX_MODEL_FILE_BYTES:
        raise WrapperError(field, f"spec file {name!r} is {st.st_size} bytes, more than {MAX_MODEL_FILE_BYTES}")
    try:
        spec = load_spec_file(path)
    except ModelSpecError as exc:
        raise WrapperError(field, str(exc)) from None
    return path.name, definition_of(spec), spec


def definition_of(spec: ModelSpec) -> dict:
    """The inline definition of a model that is no preset (JobSpec.model_def): every field of SPEC."""
    return {
        "name": spec.name,
        "family": spec.family,
        "num_layers": spec.num_layers,
        "hidden": spec.hidden,
        "heads": spec.heads,
        "seq_len": spec.seq_len,
        "vocab": spec.vocab,
        "params": spec.params,
        "dtype": spec.dtype,
        "num_experts": spec.num_experts,
        "moe_top_k": spec.moe_top_k,
    }
