"""Slurm's own view of the cluster as typed records, and hostlist helpers.

These are richer than the solver's capacity view (solver.types.ClusterView);
slurm_ext.view maps them onto it in one place. Every parser and backend
produces these records, whatever Slurm version or interface it reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: node base states / flags under which no new work can start on a node
UNAVAILABLE_STATES = frozenset({"down", "inval", "fail", "future", "unknown"})
UNAVAILABLE_FLAGS = frozenset({"DRAIN", "DRAINED", "DRAINING", "NOT_RESPONDING", "FAIL", "INVALID", "INVALID_REG", "POWERED_DOWN", "POWERING_DOWN", "MAINTENANCE", "REBOOT_ISSUED"})

#: job states in which a job holds its nodes' resources
HOLDS_RESOURCES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"})
#: job states after which a job will not run again (unless requeued)
FINISHED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"})


@dataclass(frozen=True)
class SlurmNode:
    """One node. `state` is the lower-case base state ("idle", "mixed",
    "allocated", "down", ...); `flags` the upper-case state flags ("DRAIN",
    "NOT_RESPONDING", ...). GPU counts come from the typed gpu GRES."""

    name: str
    address: str = ""
    port: int | None = None
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    gpu_type: str | None = None
    gpus_total: int = 0
    gpus_alloc: int = 0
    cpus_total: int = 0
    cpus_alloc: int = 0
    memory_mb: int = 0
    state: str = "unknown"
    flags: tuple[str, ...] = ()
    reason: str = ""

    @property
    def available(self) -> bool:
        """True when new work may start here (not down, drained, failed,
        not responding or invalid)."""
        return self.state not in UNAVAILABLE_STATES and not (set(self.flags) & UNAVAILABLE_FLAGS)

    @property
    def gpus_free(self) -> int:
        return max(0, self.gpus_total - self.gpus_alloc)


@dataclass(frozen=True)
class SlurmPartition:
    """One partition; `max_time` in minutes, None = unlimited."""

    name: str
    nodes: tuple[str, ...] = ()
    state: str = "UP"
    default: bool = False
    max_time: int | None = None


@dataclass(frozen=True)
class SlurmJob:
    """One job as Slurm reports it.

    `state` is the upper-case base state ("PENDING", "RUNNING", ...);
    `gpus_per_node` / `gpu_type` are what the job requests per node
    (gpu_type None = an untyped request); `nodes` the expanded allocation.
    Times are epoch seconds (None = not set / unknown); `end_time` of a job
    that has not finished is Slurm's expected end (None when unlimited).
    `exit_code` is the process exit status, 128+N when killed by signal N,
    and None until the job has finished. `time_limit` in minutes (None =
    unlimited). `num_tasks` / `tasks_per_node` are the requested task counts
    (None = not set); `work_dir` the job's working directory.
    """

    job_id: str
    name: str = ""
    user: str = ""
    state: str = "PENDING"
    reason: str = ""
    partition: str = ""
    nodes: tuple[str, ...] = ()
    num_nodes: int = 0
    gpus_per_node: int | None = None
    gpu_type: str | None = None
    held: bool = False
    features: str = ""
    required_nodes: tuple[str, ...] = ()
    excluded_nodes: tuple[str, ...] = ()
    comment: str = ""
    admin_comment: str = ""
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    time_limit: int | None = None
    batch_host: str = ""
    num_tasks: int | None = None
    tasks_per_node: int | None = None
    work_dir: str = ""

    @property
    def holds_resources(self) -> bool:
        return self.state in HOLDS_RESOURCES

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"


@dataclass(frozen=True)
class ClusterSnapshot:
    """Nodes, partitions and jobs observed at `taken_at` (epoch seconds)."""

    nodes: tuple[SlurmNode, ...]
    partitions: tuple[SlurmPartition, ...]
    jobs: tuple[SlurmJob, ...]
    taken_at: float

    def node(self, name: str) -> SlurmNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def job(self, job_id: str) -> SlurmJob:
        for j in self.jobs:
            if j.job_id == job_id:
                return j
        raise KeyError(job_id)

    def partition(self, name: str) -> SlurmPartition:
        for p in self.partitions:
            if p.name == name:
                return p
        raise KeyError(name)


# --- hostlists -----------------------------------------------------------

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"hostlist {text!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ValueError(f"hostlist {text!r}: unbalanced '['")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _expand_one(pattern: str, whole: str) -> list[str]:
    start = pattern.find("[")
    if start < 0:
        return [pattern]
    end = pattern.index("]", start)
    prefix, body, rest = pattern[:start], pattern[start + 1 : end], pattern[end + 1 :]
    values: list[str] = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise ValueError(f"hostlist {whole!r}: bad range {item!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"hostlist {whole!r}: descending range {item!r}")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        values.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    tails = _expand_one(rest, whole)
    return [f"{prefix}{v}{t}" for v in values for t in tails]


def expand_hostlist(text: str | None) -> tuple[str, ...]:
    """``n[1-3,5]`` -> (n1, n2, n3, n5); zero-padded ranges (``gpu[08-10]``)
    and several bracket groups (``r[1-2]n[1-2]``) too. "" / "(null)" -> ()."""
    if not text or text.strip() in ("(null)", "None", "N/A"):
        return ()
    out: list[str] = []
    for part in _split_top(text.strip()):
        out.extend(_expand_one(part, text))
    return tuple(out)


_TRAILING_NUM = re.compile(r"^(.*?)(\d+)$")


def _width(digits: str) -> int:
    return len(digits) if digits.startswith("0") and len(digits) > 1 else 0


def _ranges(nums: list[int], width: int) -> str:
    """[1, 2, 3, 5] -> "1-3,5" (zero-padded to width)."""
    out, lo = [], nums[0]
    for prev, cur in zip(nums, nums[1:] + [-1]):
        if cur != prev + 1:
            a, b = str(lo).zfill(width), str(prev).zfill(width)
            out.append(a if lo == prev else f"{a}-{b}")
            lo = cur
    return ",".join(out)


def compress_hostlist(names: "list[str] | tuple[str, ...]") -> str:
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
