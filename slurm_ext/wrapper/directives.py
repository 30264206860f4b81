"""#CELLSCHED and #SBATCH lines of a batch script's leading block of comments."""

from __future__ import annotations

import shlex

from slurm_ext.wrapper.argv import check_text, parse_options
from slurm_ext.wrapper.options import BY_LONG, DIRECTIVE_KEYS, Setting, WrapperError

_TRUE, _FALSE = frozenset({"true", "yes", "1", "on"}), frozenset({"false", "no", "0", "off"})
_MALFORMED = "malformed directive: write '#CELLSCHED key=value'"


def parse_directives(text: str) -> tuple[dict[str, Setting], dict[str, Setting]]:
    """(#CELLSCHED settings, #SBATCH settings) of a script's leading block."""
    cellsched: dict[str, Setting] = {}
    sbatch: dict[str, Setting] = {}
    in_header = True
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"script line {number}"
        stripped = line.strip()
        is_cs = line.startswith("#CELLSCHED")
        if not in_header:
            if is_cs:
                raise WrapperError(
                    where, "#CELLSCHED after the first command is not read; move it to the top of the script"
                )
            continue
        if stripped and not stripped.startswith("#"):
            in_header = False
            continue
        if is_cs:
            body = line[len("#CELLSCHED") :]
            if not body[:1].isspace():
                raise WrapperError(where, _MALFORMED)
            key, eq, value = body.strip().partition("=")
            key, value = key.strip(), value.strip()
            if not eq or not key or not value:
                raise WrapperError(where, _MALFORMED)
            if key not in DIRECTIVE_KEYS:
                raise WrapperError(where, f"unknown key {key!r}; known: {', '.join(DIRECTIVE_KEYS)}")
            if key in cellsched:
                raise WrapperError(where, f"{key!r} is already set on {cellsched[key].origin}")
            check_text(where, value)
            if BY_LONG[key].kind == "flag":
                low = value.lower()
                if low not in _TRUE | _FALSE:
                    raise WrapperError(where, f"{key} must be true or false, got {value!r}")
                cellsched[key] = Setting(low in _TRUE, where)
            else:
                cellsched[key] = Setting(value, where)
        elif line.startswith("#SBATCH"):
            try:
                tokens = shlex.split(line[len("#SBATCH") :], comments=True)
            except ValueError as exc:
                raise WrapperError(where, f"malformed #SBATCH line ({exc})") from None
            found, _, _ = parse_options(tokens, where, stop_at_script=False, sbatch_line=True)
            sbatch.update(found)
    return cellsched, sbatch
