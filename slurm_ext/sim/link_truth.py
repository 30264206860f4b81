"""The simulator's truth of jobs sharing network links, fitted to real links.

Not the scheduler's model: nothing here comes from solver.network,
solver.contention or solver.cost.share (tests/slurm_ext/sim/
test_link_truth.py holds that). It is fitted to what
benchmarks/contention_real.py measured on rate-limited veth links with FIFO
(tbf) queues (benchmarks/results/contention_real.jsonl; the fit and its
leave-one-case-out error: benchmarks/link_truth_fit.py,
benchmarks/results/link_truth_fit.md).

**A job's traffic.** A multi-node job is a ring over its distinct nodes (its
gradient all-reduce; two nodes: both directions), one *flow* per hop. A flow
crosses the sender's NIC out, the receiver's NIC in, and, between racks, the
sender rack's uplink up and the receiver rack's down (each direction a link
of its own, as on a full-duplex card). Alone, every flow of the job moves at
its bottleneck: the narrowest link any of its flows crosses (split among its
own flows there); the job's network seconds, given at its slowest NIC,
stretch by that NIC over the bottleneck.

**Sharing a link** (weighted max-min, water-filling): the flows on a link at
one instant get the capacity in proportion to their weights, none more than
its job's bottleneck rate. A flow's weight is ``k ** -GAMMA`` where k counts
the distinct sets of other jobs' flows it meets on its path (a "parking
lot": a flow that meets different competitors on its way out and its way in
gets less than an equal share, as TCP gives it), times its ring's hop count
to the power BETA (measured: a two-node job beside a ring loses more than
the ring).

**When flows overlap.** Another job's flow is on the link with probability
``a * max(0, 1 - KAPPA (1 - D_i)(1 - D_j))``: a, the fraction of time that
flow sends, D_i and D_j the two jobs' network duties. With KAPPA = 0 the
phases are independent; measured, jobs that both compute part of their
iteration interleave their transfers (two jobs communicating half of their
iteration slow each other by 0.10-0.20, not the 0.31 of independent phases).

A flow's stretch is its expected (bottleneck rate / share) on its worst
link, over the sets of other flows there; a job's is its slowest flow's (a
ring moves at its slowest hop). Stretched transfers raise the duties and the
flows' activity, so stretches are iterated to their fixed point. The loaded
iteration is compute + network seconds x stretch.

**A job's network seconds** come from the bytes its plan puts on its NICs
(`wire_bytes`), priced at the GPU type's datasheet network (the one the
truth tables' times stand on) and carried to the NICs the job has; the
compute is the rest of the truth's iteration.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

#: Fitted to benchmarks/results/contention_real.jsonl by benchmarks/link_truth_fit.py
#: (grid search, mean relative error of the loaded iteration; its output names these).
GAMMA = 0.75
BETA = 0.25
KAPPA = 1.5

#: Competing flows on one link beyond which the expectation over their
#: on/off sets is replaced by their mean load (2^12 sets at most).
_ENUMERATE = 12
_PASSES = 200
_TOL = 1e-9
#: At most this part of a truth-table iteration is taken to be its network
#: (a plan whose bytes at the datasheet rate exceed the measured iteration
#: overlapped them with compute).
MAX_NOMINAL_SHARE = 0.95


class LinkRates(Protocol):
    """The cluster's links: NIC per node and uplink per rack (Gb/s), rack per node."""

    @property
    def nic_gbps(self) -> Mapping[str, float]: ...

    @property
    def rack_of(self) -> Mapping[str, str]: ...

    @property
    def uplink_gbps(self) -> Mapping[str, float]: ...


@dataclass(frozen=True)
class Links:
    """A plain LinkRates."""

    nic_gbps: Mapping[str, float]
    rack_of: Mapping[str, str]
    uplink_gbps: Mapping[str, float]


@dataclass(frozen=True)
class Params:
    gamma: float = GAMMA
    beta: float = BETA
    kappa: float = KAPPA


@dataclass(frozen=True)
class Talk:
    """One job's network use alone: its nodes (in ring order), its iteration
    alone (s, at its NICs) and the seconds of it on the network."""

    nodes: tuple[str, ...]
    alone_s: float
    net_s: float


Link = tuple[str, str]  # ("out"|"in", node) or ("up"|"down", rack)


def hops(nodes: Sequence[str]) -> list[tuple[str, str]]:
    """The ring's hops over the distinct nodes (two nodes: both ways)."""
    ring = list(dict.fromkeys(nodes))
    if len(ring) < 2:
        return []
    return [(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))]


def path(net: LinkRates, a: str, b: str) -> tuple[Link, ...]:
    """The links a flow from node a to node b crosses (those of known rate)."""
    out: list[Link] = []
    if a in net.nic_gbps:
        out.append(("out", a))
    ra, rb = net.rack_of.get(a, ""), net.rack_of.get(b, "")
    if ra != rb:
        if ra in net.uplink_gbps:
            out.append(("up", ra))
        if rb in net.uplink_gbps:
            out.append(("down", rb))
    if b in net.nic_gbps:
        out.append(("in", b))
    return tuple(out)


def capacity(net: LinkRates, link: Link) -> float:
    kind, name = link
    return float(net.nic_gbps[name] if kind in ("out", "in") else net.uplink_gbps[name])


def weighted_maxmin(cap: float, demand: Mapping[int, float], weight: Mapping[int, float]) -> dict[int, float]:
    """Weighted max-min shares of `cap` (water-filling): each gets cap in
    proportion to its weight, none more than its demand, the rest refilled."""
    share: dict[int, float] = {}
    left, c = dict(demand), cap
    while left:
        unit = c / sum(weight[k] for k in left)
        small = {k: v for k, v in left.items() if v <= unit * weight[k]}
        if not small:
            share.update({k: unit * weight[k] for k in left})
            break
        for k, v in small.items():
            share[k] = v
            c -= v
            del left[k]
    return share


@dataclass
class _Flow:
    job: str
    links: tuple[Link, ...]
    weight: float = 1.0
    stretch: float = 1.0


def loaded_times(talks: Mapping[str, Talk], net: LinkRates, params: Params | None = None) -> dict[str, float]:
    """job id -> iteration time (s) with all of `talks` running together
    (module doc); a job alone gets its time on its own links."""
    p = params or Params()
    flows: list[_Flow] = []
    nominal: dict[str, float] = {}
    for j, t in talks.items():
        if t.net_s <= 0:
            continue
        known = [net.nic_gbps[n] for n in dict.fromkeys(t.nodes) if n in net.nic_gbps]
        fl = [_Flow(j, path(net, a, b)) for a, b in hops(t.nodes)]
        fl = [f for f in fl if f.links]
        if known and fl:
            nominal[j] = float(min(known))
            flows.extend(fl)
    own: dict[tuple[str, Link], int] = {}
    on: dict[Link, list[int]] = {}
    for i, f in enumerate(flows):
        for link in f.links:
            own[f.job, link] = own.get((f.job, link), 0) + 1
            on.setdefault(link, []).append(i)
    rate = {j: min(capacity(net, lk) / own[j, lk] for f in flows if f.job == j for lk in f.links) for j in nominal}
    ring = {j: len(hops(talks[j].nodes)) if len(set(talks[j].nodes)) > 2 else 1 for j in nominal}
    for f in flows:
        met = {frozenset(k for k in on[lk] if flows[k].job != f.job) for lk in f.links}
        k = len([m for m in met if m]) or 1
        f.weight = k**-p.gamma * ring[f.job] ** p.beta
    # alone on its own links: nominal NIC / bottleneck
    base = {j: talks[j].net_s * nominal[j] / rate[j] for j in nominal}
    job_stretch = dict.fromkeys(nominal, 1.0)
    for _ in range(_PASSES):
        duty = {j: base[j] * job_stretch[j] / _time(talks[j], base[j], job_stretch[j]) for j in nominal}
        active = [duty[f.job] * f.stretch / job_stretch[f.job] for f in flows]
        moved = 0.0
        new_stretch: list[float] = []
        for i, f in enumerate(flows):
            worst = 1.0
            for lk in f.links:
                others = [k for k in on[lk] if flows[k].job != f.job]
                if not others and own[f.job, lk] == 1:
                    continue
                q = [active[k] * max(0.0, 1.0 - p.kappa * (1 - duty[f.job]) * (1 - duty[flows[k].job])) for k in others]
                worst = max(worst, _expected(capacity(net, lk) / own[f.job, lk], i, others, q, flows, rate))
            new_stretch.append(worst)
        for f, s in zip(flows, new_stretch, strict=True):
            moved = max(moved, abs(s - f.stretch))
            f.stretch = s
        job_stretch = {j: max(f.stretch for f in flows if f.job == j) for j in nominal}
        if moved < _TOL:
            break
    out = {j: t.alone_s for j, t in talks.items()}
    for j in nominal:
        out[j] = _time(talks[j], base[j], job_stretch[j])
    return out


def _time(t: Talk, base_net: float, stretch: float) -> float:
    return t.alone_s - t.net_s + base_net * stretch


def _expected(
    cap: float, i: int, others: list[int], q: list[float], flows: list[_Flow], rate: Mapping[str, float]
) -> float:
    """Expected (rate / share) of flow i on a link of capacity `cap` (after its
    own other flows there) over which of `others` send (each with q)."""
    r = rate[flows[i].job]
    if len(others) > _ENUMERATE:  # their mean load
        load = r + sum(qk * rate[flows[k].job] for k, qk in zip(others, q, strict=True))
        return max(1.0, load / cap)
    e = 0.0
    for bits in itertools.product((False, True), repeat=len(others)):
        pr = math.prod(qk if b else 1 - qk for qk, b in zip(q, bits, strict=True))
        if pr == 0.0:
            continue
        act = [i, *(k for k, b in zip(others, bits, strict=True) if b)]
        share = weighted_maxmin(cap, {k: rate[flows[k].job] for k in act}, {k: flows[k].weight for k in act})[i]
        e += pr * r / min(r, share)
    return max(1.0, e)


# --------------------------------------------------------------------------- a job's bytes on the wire


@functools.cache
def _nominal_gbps() -> dict[str, float]:
    from solver.contract.profiles.gpus import default_gpu_specs  # datasheets: data, not a model of contention

    return {name: s.inter_bw_gbps * 8.0 for name, s in default_gpu_specs().items()}


def nominal_gbps(gpu_type: str) -> float:
    """The network (Gb/s) the truth tables' iteration times stand on for `gpu_type`."""
    return _nominal_gbps().get(gpu_type.split("+")[0], 100.0)


def wire_bytes(
    params: float,
    dtype_bytes: int,
    act_bytes_per_sample: float,
    global_batch: int,
    nodes: int,
    gpus_per_node: int,
    pp: int = 1,
    tp: int = 1,
) -> float:
    """Bytes one NIC sends per iteration (and receives as many): the stages
    laid out over consecutive nodes, each stage's gradients (params x
    dtype / pp, all of a node's tp shards) ring all-reduced across the nodes
    of the stage (2 (k-1)/k of them per node), and, where a stage boundary
    falls between nodes, the activations forward and their gradients back
    of the samples of the dp replicas on the node."""
    if nodes < 2:
        return 0.0
    gpus = nodes * gpus_per_node
    pp = pp if pp >= 1 and gpus % pp == 0 else 1
    k = max(1, nodes // pp)  # nodes per stage
    grads = params * dtype_bytes / pp
    out = 2.0 * (k - 1) / k * grads if k > 1 else 0.0
    if pp > 1 and nodes > 1:
        dp = max(1, gpus // (pp * max(1, tp)))
        replicas_on_node = max(1, gpus_per_node // max(1, tp)) if k >= 1 else 1
        out += 2.0 * global_batch / dp * act_bytes_per_sample * min(dp, replicas_on_node)
    return out


def alone_comm(t: float, bytes_per_nic: float, gpu_type: str, nic_gbps: float | None) -> tuple[float, float]:
    """(iteration alone at the job's NICs, its network seconds) for a job
    whose truth-table iteration is `t` at the datasheet network and whose
    NICs each carry `bytes_per_nic` per iteration (network and compute in
    turn, not overlapped)."""
    if bytes_per_nic <= 0 or not nic_gbps or nic_gbps <= 0:
        return t, 0.0
    nominal = min(bytes_per_nic * 8 / (nominal_gbps(gpu_type) * 1e9), MAX_NOMINAL_SHARE * t)
    net = nominal * nominal_gbps(gpu_type) / nic_gbps
    return t - nominal + net, net
