"""Splitting a global batch over the dp ranks of a mixed cell's parts (see solver.mixed)."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def split_batch(
    batch: int,
    ranks: Sequence[int],
    sec_per_sample: Sequence[float],
    micro_batches: int,
    virtual_workers: int | None = None,
    sec_per_micro_batch: Sequence[float] | None = None,
    sync_s: Callable[[int], float] | None = None,
) -> tuple[tuple[int, ...], int] | None:
    """(samples per rank of each part, micro-batches) for parts with
    `ranks` dp ranks whose ranks take `sec_per_sample` s per sample (and
    `sec_per_micro_batch` s per micro-batch they run, default none): whole
    multiples of the micro-batch count adding up to `batch`, slowest part
    as fast as possible; the micro-batch count is lowered (to a divisor)
    until that is possible. None when not even one sample per rank works.

    With V = `virtual_workers`: whole virtual workers of batch / V samples per
    rank (at least one each, V in all; each runs all the micro-batches),
    slowest part as fast as possible; the micro-batches per virtual worker
    are the largest divisor of batch / V not above `micro_batches`. None when
    V does not divide the batch or no such split exists. `sync_s(u)`: the
    gradient sync's time when the busiest rank holds u virtual workers (their
    gradients are gathered one by one, padded to the most): the split
    minimises the slowest part's time plus that."""
    ranks, cost = tuple(ranks), tuple(sec_per_sample)
    fixed = tuple(sec_per_micro_batch) if sec_per_micro_batch is not None else (0.0,) * len(ranks)
    if virtual_workers is not None:
        if batch % virtual_workers:
            return None
        per = batch // virtual_workers
        m = max(d for d in range(1, min(micro_batches, per) + 1) if per % d == 0)
        u = _split_units(
            virtual_workers, ranks, tuple(c * per + f * m for c, f in zip(cost, fixed, strict=True)), None, sync_s
        )
        if u is None:
            return None
        return tuple(x * per for x in u), m
    for m in (d for d in range(micro_batches, 0, -1) if micro_batches % d == 0):
        if batch % m:
            continue
        u = _split_units(batch // m, ranks, tuple(c * m for c in cost), tuple(f * m for f in fixed))
        if u is not None:
            return tuple(x * m for x in u), m
    return None


def _split_units(
    units: int,
    ranks: tuple[int, ...],
    cost: tuple[float, ...],
    offset: tuple[float, ...] | None = None,
    most_s: Callable[[int], float] | None = None,
) -> tuple[int, ...] | None:
    """u_i >= 1 with sum_i r_i u_i = units and the least max_i (u_i c_i + o_i)
    (+ most_s(max_i u_i) when given)."""
    off = offset if offset is not None else (0.0,) * len(ranks)
    if len(ranks) == 2:
        return _split_two(units, (ranks[0], ranks[1]), (cost[0], cost[1]), (off[0], off[1]), most_s)
    base = _split_many(units, ranks, cost, off)
    if base is None or most_s is None:
        return base

    def slowest(u: tuple[int, ...]) -> float:
        return max(x * c + o for x, c, o in zip(u, cost, off, strict=True))

    floor = slowest(base)  # no split with a lower cap is faster than this
    best = (floor + most_s(max(base)), base)
    for cap in range(-(-units // sum(ranks)), max(base)):  # fewer units on the busiest rank: less to gather
        if floor + most_s(cap) >= best[0]:
            break
        u = _split_many(units, ranks, cost, off, cap)
        if u is not None and slowest(u) + most_s(max(u)) < best[0]:
            best = (slowest(u) + most_s(max(u)), u)
    return best[1]


def _split_two(
    units: int,
    ranks: tuple[int, int],
    cost: tuple[float, float],
    offset: tuple[float, float] = (0.0, 0.0),
    most_s: Callable[[int], float] | None = None,
) -> tuple[int, int] | None:
    (r0, r1), (c0, c1), (o0, o1) = ranks, cost, offset
    best = None
    for u0 in range(1, units // r0 + 1):
        rest = units - r0 * u0
        if rest < r1 or rest % r1:
            continue
        u1 = rest // r1
        worst = max(u0 * c0 + o0, u1 * c1 + o1) + (most_s(max(u0, u1)) if most_s is not None else 0.0)
        if best is None or worst < best[0]:
            best = (worst, u0, u1)
    return None if best is None else best[1:]


def _split_many(
    units: int, ranks: tuple[int, ...], cost: tuple[float, ...], offset: tuple[float, ...], cap: int | None = None
) -> tuple[int, ...] | None:
    """_split_units for any number of parts (at most `cap` units each): the
    least bound T (among the values u c_i + o_i) under which
    u_i <= (T - o_i) / c_i still reaches `units` exactly (reachable sums as
    bit sets), then a split under it."""
    k = len(ranks)
    tops = [units // r if cap is None else min(cap, units // r) for r in ranks]
    if min(tops) < 1:
        return None

    def most(i: int, bound: float) -> int:
        """The most units part i takes within `bound`."""
        if cost[i] <= 0:
            return tops[i] if bound >= offset[i] else 0
        return min(tops[i], int((bound - offset[i]) / cost[i] * (1 + 1e-12) + 1e-9))

    def reach(bound: float) -> list[int] | None:
        his = [most(i, bound) for i in range(k)]
        if min(his) < 1:
            return None
        sets = [1]  # bit s of sets[i]: sum s reachable with the first i parts
        mask = (1 << (units + 1)) - 1
        for i in range(k):
            cur, prev = 0, sets[-1]
            for u in range(1, his[i] + 1):
                cur |= prev << (ranks[i] * u)
            sets.append(cur & mask)
        return sets if sets[-1] >> units & 1 else None

    values = sorted({u * cost[i] + offset[i] for i in range(k) for u in range(1, tops[i] + 1)})
    lo, hi = 0, len(values) - 1
    if reach(values[hi]) is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if reach(values[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    bound = values[lo]
    sets = reach(bound)
    assert sets is not None
    out, left = [0] * k, units
    for i in range(k - 1, -1, -1):  # back from the last part: the smallest u that leaves a reachable rest
        hi_i = most(i, bound)
        for u in range(1, hi_i + 1):
            rest = left - ranks[i] * u
            if rest >= 0 and sets[i] >> rest & 1:
                out[i], left = u, rest
                break
    return tuple(out)
