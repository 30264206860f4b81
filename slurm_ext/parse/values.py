"""Small value decoders shared by the JSON and text parsers."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from slurm_ext.errors import CellschedError

#: Slurm's "not set" sentinels for 16/32/64-bit numbers
NO_VAL = {0xFFFE, 0xFFFF, 0xFFFFFFFE, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFE, 0xFFFFFFFFFFFFFFFF}
_NULLS = {"", "(null)", "N/A", "None", "Unknown", "n/a", "n/s"}


class ParseError(ValueError, CellschedError):
    """Slurm output that does not have the expected shape."""


def number(value: Any) -> int | float | None:
    """A Slurm number: plain, or the data_parser {"set", "infinite", "number"}
    object (v0.0.39+). Unset, infinite and NO_VAL values -> None."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = value.strip()
        if value in _NULLS or value.upper() in ("UNLIMITED", "INFINITE", "NONE"):
            return None
        try:
            value = float(value) if "." in value else int(value)
        except ValueError as exc:
            raise ParseError(f"not a number: {value!r}") from exc
    if isinstance(value, (int, float)) and value in NO_VAL:
        return None
    return value


def integer(value: Any) -> int | None:
    n = number(value)
    return None if n is None else int(n)


def epoch(value: Any) -> float | None:
    """Epoch seconds from a number (0 = unset) or an ISO text time."""
    if isinstance(value, str) and "T" in value:
        return text_time(value)
    n = number(value)
    return float(n) if n else None


def text_time(value: str | None) -> float | None:
    """``2026-11-21T03:48:12`` (local time, as scontrol prints it) -> epoch."""
    if value is None or value.strip() in _NULLS:
        return None
    try:
        return datetime.fromisoformat(value.strip()).timestamp()
    except ValueError as exc:
        raise ParseError(f"not a time: {value!r}") from exc


def text(value: Any) -> str:
    """A string field; Slurm's "(null)" and None -> ""."""
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    s = str(value).strip()
    return "" if s == "(null)" else s


def words(value: Any) -> tuple[str, ...]:
    """A comma separated string or a list -> tuple of non-empty items."""
    if value is None:
        return ()
    items = value if isinstance(value, list) else str(value).split(",")
    return tuple(t for t in (str(i).strip() for i in items) if t and t != "(null)")


def minutes(value: Any) -> int | None:
    """A time limit in minutes: a number, or text like ``UNLIMITED``,
    ``30``, ``1:00:00``, ``2-00:00:00``. Unlimited / unset -> None."""
    if isinstance(value, str) and (":" in value or "-" in value.strip("-")):
        s = value.strip()
        days = 0
        if "-" in s:
            d, s = s.split("-", 1)
            days = int(d)
        parts = [int(p) for p in s.split(":")]
        while len(parts) < 3:
            parts.insert(0, 0)
        h, m, sec = parts
        return days * 1440 + h * 60 + m + (1 if sec else 0)
    n = integer(value)
    return None if n is None or n < 0 else n


def exit_status(value: Any) -> int | None:
    """Decode an exit code to the shell convention (status, or 128+signal).

    Accepts a raw wait status (22.05 JSON), "code:signal" text (scontrol),
    or the v0.0.40 {"status", "return_code", "signal"} object.
    """
    if value is None:
        return None
    if isinstance(value, dict):
        sig = integer((value.get("signal") or {}).get("id"))
        if sig:
            return 128 + sig
        return integer(value.get("return_code"))
    if isinstance(value, str):
        s = value.strip()
        if ":" in s:
            code, sig = (int(p) for p in s.split(":", 1))
            return 128 + sig if sig else code
        value = integer(s)
        if value is None:
            return None
    raw = int(value)
    if raw & 0x7F:  # WIFSIGNALED
        return 128 + (raw & 0x7F)
    return (raw >> 8) & 0xFF


_STATE_WORD = re.compile(r"[A-Za-z_]+")


def job_state(value: Any) -> tuple[str, tuple[str, ...]]:
    """Job state -> (base state, flags). "RUNNING", ["PENDING","REQUEUED"]
    (v0.0.40+) or "COMPLETING+" style text."""
    items = value if isinstance(value, list) else _STATE_WORD.findall(str(value or ""))
    items = [str(i).upper() for i in items if str(i).strip()]
    if not items:
        raise ParseError(f"empty job state {value!r}")
    return items[0], tuple(items[1:])


def node_state(value: Any, flags: Any = None) -> tuple[str, tuple[str, ...]]:
    """Node state -> (lower-case base state, upper-case flags).

    Accepts "mixed" + state_flags ["DRAIN"] (22.05 JSON), ["IDLE", "DRAIN"]
    (v0.0.40+), "IDLE+DRAIN" (scontrol), "idle*" / "drain" (sinfo).
    """
    if isinstance(value, list):
        items = [str(v).upper() for v in value]
    else:
        s = str(value or "").strip()
        parts = [p for p in s.split("+") if p]
        items = [p.rstrip("*~#!%$@^-").upper() for p in parts]
        if any(p.endswith("*") for p in parts):
            items.append("NOT_RESPONDING")
    if not items:
        raise ParseError(f"empty node state {value!r}")
    extra = [str(f).upper() for f in (flags or [])]
    base = items[0]
    out_flags = list(dict.fromkeys(items[1:] + extra))
    # sinfo-style compound words for drained nodes
    if base in ("DRAIN", "DRAINED", "DRAINING"):
        out_flags.insert(0, "DRAIN")
        base = "ALLOCATED" if base == "DRAINING" else "IDLE"
    alias = {"ALLOC": "ALLOCATED", "MIX": "MIXED", "COMP": "COMPLETING"}
    return alias.get(base, base).lower(), tuple(dict.fromkeys(out_flags))


_GRES_ITEM = re.compile(r"^(?:gres[:/])?gpu(?::([^:(=]+))?[:=](\d+)(?:\(.*\))?$")


def gpu_gres(value: Any) -> tuple[str | None, int]:
    """GPU type and count from a GRES string, summed over its gpu items.

    ``gpu:a100:4``, ``gpu:a100:3(IDX:0-2)``, ``gres:gpu:2``, ``gres/gpu:a40:1``,
    ``gres/gpu=2``, ``gpu:0(IDX:N/A)`` ... -> (type or None, count). Non-gpu
    items are ignored; "" / "(null)" / "N/A" -> (None, 0).
    """
    s = text(value)
    if not s or s in _NULLS:
        return None, 0
    gtype: str | None = None
    total = 0
    for item in _split_gres(s):
        m = _GRES_ITEM.match(item.strip())
        if not m:
            continue
        t, n = m.group(1), int(m.group(2))
        if t and t != "gpu":
            gtype = gtype or t
        total += n
    return gtype, total


def _split_gres(s: str) -> list[str]:
    """Split a GRES list on commas outside parentheses (IDX:0,2 lists)."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in s:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out
