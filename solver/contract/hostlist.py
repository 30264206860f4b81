"""Slurm's host-list syntax (``n[1-3,5],gpu-[08-10]``), expanded and
compressed. Stdlib only: the controller side (slurm_ext) and the in-job
launcher (launch) both read Slurm's node lists, and this is the one place
both may import."""

from __future__ import annotations

import re

from solver.contract.errors import SolverError

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class HostlistError(ValueError, SolverError):
    """Malformed host-list text; the message says what is wrong with it."""


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError("unmatched ']'")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError("unmatched '['")
    parts.append(text[start:])
    return parts


def _width(digits: str) -> int:
    return len(digits) if digits.startswith("0") and len(digits) > 1 else 0


def _expand_ranges(body: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise HostlistError(f"bad range {item!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise HostlistError(f"descending range {item!r}")
        out.extend(str(i).zfill(_width(lo)) for i in range(int(lo), int(hi) + 1))
    return out


def _expand_one(pattern: str) -> list[str]:
    """Expand one host pattern; several bracket groups multiply out."""
    open_at = pattern.find("[")
    if open_at < 0:
        return [pattern]
    close_at = pattern.find("]", open_at)
    head, body, tail = pattern[:open_at], pattern[open_at + 1 : close_at], pattern[close_at + 1 :]
    return [head + mid + rest for mid in _expand_ranges(body) for rest in _expand_one(tail)]


def expand_hostlist(text: str) -> tuple[str, ...]:
    """``"n[1-3,5],gpu-[08-10]"`` -> (n1, n2, n3, n5, gpu-08, gpu-09, gpu-10);
    zero padding and several bracket groups (``r[1-2]n[1-2]``) too."""
    hosts: list[str] = []
    for part in _split_top_level(text.strip()):
        if not part.strip():
            raise HostlistError("empty entry")
        hosts.extend(_expand_one(part.strip()))
    return tuple(hosts)


_TRAILING_NUM = re.compile(r"^(.*?)(\d+)$")


def _ranges(nums: list[int], width: int) -> str:
    """[1, 2, 3, 5] -> "1-3,5" (zero-padded to width)."""
    out, lo = [], nums[0]
    for prev, cur in zip(nums, nums[1:] + [-1], strict=True):
        if cur != prev + 1:
            a, b = str(lo).zfill(width), str(prev).zfill(width)
            out.append(a if lo == prev else f"{a}-{b}")
            lo = cur
    return ",".join(out)


def compress_hostlist(names: list[str] | tuple[str, ...]) -> str:
    """Inverse of expand_hostlist for a trailing number: (n1, n2, n3, n5) ->
    ``n[1-3,5]``. Prefixes keep their order of first appearance; numbers are
    sorted and de-duplicated; zero padding is kept (gpu08, gpu10 -> gpu[08,10])."""
    groups: dict[str, list[str]] = {}
    order: list[tuple[str, bool]] = []
    for name in names:
        m = _TRAILING_NUM.match(name)
        if not m:
            if (name, False) not in order:
                order.append((name, False))
            continue
        prefix, digits = m.group(1), m.group(2)
        if prefix not in groups:
            groups[prefix] = []
            order.append((prefix, True))
        groups[prefix].append(digits)
    parts: list[str] = []
    for key, numbered in order:
        if not numbered:
            parts.append(key)
            continue
        digits = groups[key]
        padded = {_width(d) for d in digits} - {0}
        if len(padded) > 1 or (padded and any(len(d) < max(padded) for d in digits)):
            by_width: dict[int, set[int]] = {}  # mixed paddings: one group each
            for d in digits:
                by_width.setdefault(_width(d), set()).add(int(d))
            buckets = list(by_width.items())
        else:
            buckets = [(max(padded) if padded else 0, {int(d) for d in digits})]
        for width, nums in buckets:
            ordered = sorted(nums)
            body = _ranges(ordered, width)
            parts.append(f"{key}{body}" if len(ordered) == 1 else f"{key}[{body}]")
    return ",".join(parts)
