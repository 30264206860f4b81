"""Option tokens into settings: the command line (which stops at the script)
and the tokens of one #SBATCH line."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from slurm_ext.wrapper.options import BY_LONG, BY_SHORT, PROG, REFUSED_BY_NAME, Setting, WrapperError, supported_text

MAX_ARG_CHARS = 4096
_OPTION_TOKEN = re.compile(r"^-{1,2}[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class Invocation:
    """The command line split into option settings, the script and its arguments."""

    settings: Mapping[str, Setting]
    script: str | None
    script_args: tuple[str, ...]
    help: bool = False


def check_text(field: str, value: str) -> None:
    """WrapperError(field, ...) for a NUL byte or more than MAX_ARG_CHARS characters."""
    if "\x00" in value:
        raise WrapperError(field, "contains a NUL byte")
    if len(value) > MAX_ARG_CHARS:
        raise WrapperError(field, f"is {len(value)} characters, more than {MAX_ARG_CHARS}")


def _unknown_option(token: str, where: str) -> WrapperError:
    shown = token.split("=", 1)[0]
    name = shown.lstrip("-")
    if not _OPTION_TOKEN.match(shown):
        return WrapperError("option", f"{shown[:80]!r} is not an option ({where}); {supported_text()}")
    if name in REFUSED_BY_NAME:
        return WrapperError(shown, f"not accepted by {PROG} ({where}): {REFUSED_BY_NAME[name]}")
    return WrapperError(shown, f"unknown option ({where}); {supported_text()}")


def parse_options(
    tokens: list[str], origin: str, *, stop_at_script: bool, sbatch_line: bool = False
) -> tuple[dict[str, Setting], list[str], bool]:
    """Options from `tokens`; returns (settings, the rest from the script on, help asked).

    `sbatch_line`: the tokens of an #SBATCH line, where only pass-through options are known."""
    settings: dict[str, Setting] = {}
    i, help_asked = 0, False
    while i < len(tokens):
        tok = tokens[i]
        if tok == "--" and stop_at_script:
            return settings, tokens[i + 1 :], help_asked
        if not tok.startswith("-") or tok == "-":
            if stop_at_script:
                return settings, tokens[i:], help_asked
            raise WrapperError(origin, f"unexpected argument {tok!r}")
        if tok in ("-h", "--help") and not sbatch_line and origin == "command line":
            help_asked, i = True, i + 1
            continue
        if tok.startswith("--"):
            name, eq, inline = tok[2:].partition("=")
            negated = name.startswith("no-") and name[3:] in BY_LONG and BY_LONG[name[3:]].negatable
            opt = BY_LONG.get(name[3:] if negated else name)
        else:
            name, inline, eq = tok[1:2], tok[2:], ""
            if inline.startswith("="):
                inline = inline[1:]
            eq = "=" if inline else ""
            negated = False
            opt = BY_SHORT.get(name)
        if opt is None or (sbatch_line and not opt.passthrough):
            raise _unknown_option(tok, origin)
        if opt.kind in ("flag", "switch"):
            if eq:
                raise WrapperError(f"--{opt.name}", f"takes no value ({origin}), got {inline!r}")
            value: str | bool = not negated
            i += 1
        elif eq:
            value, i = inline, i + 1
        else:
            if i + 1 >= len(tokens):
                raise WrapperError(f"--{opt.name}", f"needs a value ({origin})")
            value, i = tokens[i + 1], i + 2
        if isinstance(value, str):
            check_text(f"--{opt.name}", value)
        settings[opt.name] = Setting(value, origin)
    return settings, [], help_asked


def parse_argv(argv: Iterable[str]) -> Invocation:
    """Split the command line; the script and its arguments end option parsing."""
    args = list(argv)
    for a in args:
        if not isinstance(a, str):
            raise WrapperError("arguments", f"must be strings, got {a!r}")
        check_text("arguments", a)
    settings, rest, help_asked = parse_options(args, "command line", stop_at_script=True)
    script = rest[0] if rest else None
    return Invocation(settings, script, tuple(rest[1:]), help_asked)
