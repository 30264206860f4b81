"""Typed values of settings: whole numbers, comma-separated names, one-line
text; each error names the option and where it was set."""

from __future__ import annotations

import re
from typing import overload

from slurm_ext.wrapper.options import Setting, WrapperError

#: a Slurm name (job, account, QOS, partition)
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_INT = re.compile(r"^[0-9]{1,12}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def field_name(name: str, s: Setting) -> str:
    """The option's name for an error, with the script line it came from."""
    return name if s.origin == "command line" else f"{name} ({s.origin})"


@overload
def whole_number(name: str, s: Setting, lo: int = 1, hi: int = 10**12) -> int: ...
@overload
def whole_number(name: str, s: Setting | None, lo: int = 1, hi: int = 10**12) -> int | None: ...
def whole_number(name: str, s: Setting | None, lo: int = 1, hi: int = 10**12) -> int | None:
    """The setting as an int in [lo, hi]; None when not set."""
    if s is None:
        return None
    text = str(s.value).strip()
    if not _INT.match(text):
        raise WrapperError(field_name(name, s), f"must be a whole number, got {s.value!r}")
    value = int(text)
    if not lo <= value <= hi:
        raise WrapperError(field_name(name, s), f"must be between {lo} and {hi}, got {value}")
    return value


def name_list(name: str, s: Setting, pattern: re.Pattern[str], what: str) -> tuple[str, ...]:
    """A comma-separated list, each item matching `pattern`, duplicates dropped."""
    items = tuple(x.strip() for x in str(s.value).split(","))
    for x in items:
        if not pattern.match(x):
            raise WrapperError(field_name(name, s), f"{x!r} is not a {what}")
    return tuple(dict.fromkeys(items))


def one_line(name: str, s: Setting | None, pattern: re.Pattern[str] | None = None, what: str = "") -> str | None:
    """Non-empty text without control characters, matching `pattern` (described
    as `what`) when given; None when not set."""
    if s is None:
        return None
    value = str(s.value)
    if _CONTROL.search(value):
        raise WrapperError(field_name(name, s), "must not contain control characters (newlines, tabs, ...)")
    if not value.strip():
        raise WrapperError(field_name(name, s), "must not be empty")
    if pattern is not None and not pattern.match(value):
        raise WrapperError(field_name(name, s), f"{value!r} is not {what}")
    return value
