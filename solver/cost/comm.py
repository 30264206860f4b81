"""Communication time vs message size, per link and collective.

A `CommCurve` goes piecewise-linearly through profiled (bytes, seconds)
points; above the largest it extrapolates at the bandwidth achieved there,
below the smallest it scales down towards that point's time (the latency),
never below the proportional share.

`Links` answers "how long does this op take on this link" for one GPU type:
from the profiled curves when the store has them, else from the GpuSpec
bandwidths with a fixed per-message latency. All-reduces are rings:
``2 (n-1)/n * bytes / bw`` plus ``2 (n-1)`` latencies; a curve profiled
among n' ranks serves n ranks by scaling the bytes by the ring factor ratio.
All-gathers (each rank contributes `bytes`) are rings too: ``(n-1) * bytes /
bw`` plus ``n-1`` latencies, a curve of n' ranks scaled by (n-1)/(n'-1).
A reduce-scatter of a `bytes` buffer is taken from its own curve when one is
profiled (scaled between rank counts by the ring's (n-1)/n): backends differ
(gloo all-reduces the whole buffer, then keeps its chunk; NCCL runs a ring);
else it is the ring's, the all-gather of bytes / n per rank.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from solver.contract.profiles.records import FSDP_REDUCE, FSDP_UNSHARD, CommRecord, GpuSpec

#: Per-message latency (s) when no curve is profiled: inside a node, between nodes.
INTRA_LATENCY_S = 1e-5
NET_LATENCY_S = 2.5e-5
NET = "net"


def ring_factor(n: int) -> float:
    """Bytes each rank moves in a ring all-reduce, per byte of the buffer."""
    return 2.0 * (n - 1) / n


def gather_factor(n: int) -> float:
    """Bytes each rank receives in an all-gather, per byte it contributes."""
    return float(n - 1)


def scatter_factor(n: int) -> float:
    """Bytes each rank moves in a ring reduce-scatter, per byte of the buffer."""
    return (n - 1) / n


@dataclass(frozen=True)
class CommCurve:
    """Profiled time of one op among a fixed number of ranks, by bytes."""

    nbytes: tuple[float, ...]
    times: tuple[float, ...]

    @classmethod
    def of(cls, recs: Iterable[CommRecord]) -> CommCurve:
        pts = sorted((float(r.nbytes), float(r.time_s)) for r in recs)
        if not pts:
            raise ValueError("a comm curve needs at least one point")
        return cls(tuple(p[0] for p in pts), tuple(p[1] for p in pts))

    def time(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        xs, ys = self.nbytes, self.times
        if nbytes >= xs[-1]:
            return ys[-1] * nbytes / xs[-1] if xs[-1] > 0 else ys[-1]
        i = bisect.bisect_right(xs, nbytes)
        if i == 0:  # below the smallest point: between proportional and the point's time
            if len(xs) > 1 and xs[1] > xs[0]:
                line = ys[0] + (nbytes - xs[0]) * (ys[1] - ys[0]) / (xs[1] - xs[0])
            else:
                line = ys[0]
            return min(ys[0], max(line, ys[0] * nbytes / xs[0]))
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (nbytes - x0) * (y1 - y0) / (x1 - x0)


class Links:
    """Communication costs of one GPU type: its intra-node link and the network."""

    def __init__(self, spec: GpuSpec, curves: dict[tuple[str, str], dict[int, CommCurve]]) -> None:
        self.intra = spec.intra_link
        self._bw = {self.intra: spec.intra_bw_gbps * 1e9, NET: spec.inter_bw_gbps * 1e9}
        self._lat = {self.intra: INTRA_LATENCY_S, NET: NET_LATENCY_S}
        self._curves = curves

    def link(self, crosses_nodes: bool) -> str:
        return NET if crosses_nodes else self.intra

    def p2p(self, link: str, nbytes: float) -> float:
        """One point-to-point send of `nbytes`."""
        if nbytes <= 0:
            return 0.0
        by_n = self._curves.get((link, "p2p"))
        if by_n:
            return by_n[2 if 2 in by_n else min(by_n)].time(nbytes)
        return self._lat[link] + nbytes / self._bw[link]

    def allreduce(self, link: str, nbytes: float, n: int) -> float:
        """A ring all-reduce of an `nbytes` buffer among `n` ranks."""
        return self._collective(link, "allreduce", nbytes, n, ring_factor, 2)

    def allgather(self, link: str, nbytes: float, n: int) -> float:
        """An all-gather among `n` ranks, each contributing `nbytes`."""
        return self._collective(link, "allgather", nbytes, n, gather_factor, 1)

    def reduce_scatter(self, link: str, nbytes: float, n: int) -> float:
        """A reduce-scatter of an `nbytes` buffer among `n` ranks (each keeps
        nbytes / n of the sum): its profiled curve where the store has one
        (a backend may not run a ring: gloo all-reduces the whole buffer and
        keeps a chunk), else the ring's, the all-gather of nbytes / n per rank."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        if (link, "reducescatter") in self._curves:
            return self._collective(link, "reducescatter", nbytes, n, scatter_factor, 1)
        return self.allgather(link, nbytes / n, n)

    def fsdp_unshard(self, link: str, unit_bytes: float, n: int) -> float:
        """FSDP2 gathering a unit of `unit_bytes` of parameters among `n`
        ranks: its profiled curve (the all-gather with FSDP's copies; each
        rank receives (n - 1) / n of the unit, so other rank counts scale
        as a reduce-scatter's bytes do), else the all-gather of
        unit_bytes / n per rank."""
        if (link, FSDP_UNSHARD) in self._curves:
            return self._collective(link, FSDP_UNSHARD, unit_bytes, n, scatter_factor, 1)
        return self.allgather(link, unit_bytes / n, n)

    def fsdp_reduce(self, link: str, unit_bytes: float, n: int) -> float:
        """FSDP2 reducing a unit's gradients of `unit_bytes` among `n` ranks:
        its profiled curve (the reduce-scatter with FSDP's copies), else the
        reduce-scatter's."""
        if (link, FSDP_REDUCE) in self._curves:
            return self._collective(link, FSDP_REDUCE, unit_bytes, n, scatter_factor, 1)
        return self.reduce_scatter(link, unit_bytes, n)

    def _collective(
        self, link: str, op: str, nbytes: float, n: int, factor: Callable[[int], float], steps_per_rank: int
    ) -> float:
        """`op` among `n` ranks: its curve for n ranks, else the nearest
        curve's time scaled by factor(n) / factor(m), else the link's latency
        per step (steps_per_rank x (n - 1) steps) and bandwidth."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        by_n = self._curves.get((link, op))
        if by_n:
            if n in by_n:
                return by_n[n].time(nbytes)
            m = min(by_n, key=lambda k: (abs(k - n), -k))
            if m > 1:
                return by_n[m].time(nbytes * factor(n) / factor(m))
        return steps_per_rank * (n - 1) * self._lat[link] + factor(n) * nbytes / self._bw[link]


def load_curves(records: Iterable[CommRecord]) -> dict[tuple[str, str], dict[int, CommCurve]]:
    """Group comm records into curves: (link, op) -> nranks -> curve."""
    groups: dict[tuple[str, str, int], list[CommRecord]] = {}
    for r in records:
        groups.setdefault((r.link, r.op, r.nranks), []).append(r)
    out: dict[tuple[str, str], dict[int, CommCurve]] = {}
    for (link, op, n), recs in groups.items():
        out.setdefault((link, op), {})[n] = CommCurve.of(recs)
    return out
