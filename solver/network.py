"""The network between nodes and how jobs that share it slow each other.

A node has one network card (NIC) of `nic_gbps` gigabits per second; nodes
may sit in racks whose uplink (`uplink_gbps`) is shared by every job that
spans racks. A job on one node never touches the network. A multi-node job's
iteration is compute plus communication phases (Wang et al., 2020): `net_s`
seconds of each iteration go over its nodes' NICs when it is alone there.

Contention, time-averaged. When jobs share a link, the communication of one
overlaps that of another for the fraction of time the other communicates (its
duty, net / iteration, phases being independent), and overlapping transfers
share the link's bandwidth. So on a link of capacity C, a job sending at rate
r sees its transfers slowed by

    s = max(1, (r + sum_others duty_j * r_j) / C)

and its iteration takes ``(iter_s - net_s) + net_s * max over its links of
s``. On a NIC every job sends at the NIC's rate, so s = 1 + sum of the
others' duties (two jobs that always communicate take twice as long; one that
rarely does costs the other little). A job that spans racks sends one NIC's
rate over each rack uplink it crosses (a ring enters and leaves a rack once).
Slower transfers raise every duty, so the slowdowns are iterated to their
fixed point (they only grow, and are bounded). The error of this average
against a phase-by-phase simulation of the same jobs is measured in
benchmarks/contention_model.py and stated in docs/benchmarks.md.

Units: Gb/s (gigabits) for links, as networks are sold; GpuSpec's
inter_bw_gbps is in GB/s (gigabytes), hence `gbits`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: A node's NIC when neither the node nor its GPU type says: 100 Gb/s, the
#: network the GPU specs' inter_bw_gbps (12.5 GB/s) assume.
DEFAULT_NIC_GBPS = 100.0

#: Per GPU type, where no NIC is given: what nodes of that type usually carry
#: (all at the specs' 100 Gb/s today, so estimates and truth agree on a lone job).
NIC_GBPS_BY_TYPE: Mapping[str, float] = {
    "a100": 100.0,
    "v100": 100.0,
    "a40": 100.0,
    "a10": 100.0,
    "h100": 100.0,
    "h200": 100.0,
    "cpu": 100.0,
}

#: Fixed-point iterations of `slowdowns` (each pass is one sweep over the links).
_PASSES = 50
_TOL = 1e-9


def gbits(gbytes_per_s: float) -> float:
    """GB/s -> Gb/s."""
    return gbytes_per_s * 8.0


def default_nic_gbps(gpu_type: str) -> float:
    """The NIC of a node of `gpu_type` when its spec gives none."""
    return NIC_GBPS_BY_TYPE.get(gpu_type, DEFAULT_NIC_GBPS)


@dataclass(frozen=True)
class Network:
    """NIC per node (Gb/s), rack per node, uplink per rack (Gb/s).

    A node missing from `nic_gbps` has no NIC we know of: jobs on it are not
    slowed (nothing is modelled). A rack missing from `uplink_gbps` is not
    oversubscribed (its uplink never limits)."""

    nic_gbps: Mapping[str, float] = field(default_factory=dict)
    rack_of: Mapping[str, str] = field(default_factory=dict)
    uplink_gbps: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for what, table in (("nic_gbps", self.nic_gbps), ("uplink_gbps", self.uplink_gbps)):
            for k, v in table.items():
                if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0):
                    raise ValueError(f"network: {what}[{k!r}] must be a positive number of Gb/s, got {v!r}")

    @property
    def modelled(self) -> bool:
        return bool(self.nic_gbps)

    def nic(self, node: str) -> float | None:
        return self.nic_gbps.get(node)

    def slowest_nic(self, nodes: Iterable[str]) -> float | None:
        """The narrowest NIC among `nodes` (None: none known)."""
        known = [v for v in (self.nic_gbps.get(n) for n in nodes) if v is not None]
        return min(known) if known else None

    def links(self, nodes: Iterable[str]) -> tuple[tuple[str, float], ...]:
        """The links a job on these nodes communicates over, with the rate
        (Gb/s) it sends on each: every node's NIC, and each crossed rack's
        uplink. Empty for a one-node job."""
        names = list(dict.fromkeys(nodes))
        if len(names) < 2:
            return ()
        out = [(f"nic:{n}", self.nic_gbps[n]) for n in names if n in self.nic_gbps]
        racks: dict[str, list[str]] = {}
        for n in names:
            racks.setdefault(self.rack_of.get(n, ""), []).append(n)
        if len(racks) > 1:
            for rack, members in racks.items():
                if rack in self.uplink_gbps:
                    rate = self.slowest_nic(members)
                    out.append((f"uplink:{rack}", rate if rate is not None else self.uplink_gbps[rack]))
        return tuple(out)

    def capacity(self, link: str) -> float:
        kind, _, name = link.partition(":")
        return self.nic_gbps[name] if kind == "nic" else self.uplink_gbps[name]


@dataclass(frozen=True)
class CommLoad:
    """One job's use of the network: its nodes, its iteration time alone
    (s) and the part of it on the network alone (s, at these nodes' NICs)."""

    job_id: str
    nodes: tuple[str, ...]
    iter_s: float
    net_s: float

    def __post_init__(self) -> None:
        if not (self.iter_s > 0 and 0 <= self.net_s <= self.iter_s):
            raise ValueError(f"job {self.job_id}: need 0 <= net_s <= iter_s and iter_s > 0")

    @property
    def duty(self) -> float:
        return self.net_s / self.iter_s


def at_nic(net_s: float, nominal_gbps: float, nic_gbps: float | None) -> float:
    """Network seconds priced at `nominal_gbps`, carried to a NIC of `nic_gbps`
    (unknown: unchanged)."""
    if nic_gbps is None or nic_gbps <= 0 or nominal_gbps <= 0:
        return net_s
    return net_s * nominal_gbps / nic_gbps


def slowdowns(loads: Iterable[CommLoad], network: Network) -> dict[str, float]:
    """job id -> the factor (>= 1) on each job's network seconds when all of
    `loads` run together (the time-averaged model of the module doc)."""
    jobs = [c for c in loads if c.net_s > 0]
    links_of = {c.job_id: network.links(c.nodes) for c in jobs}
    users: dict[str, list[tuple[CommLoad, float]]] = {}
    for c in jobs:
        for link, rate in links_of[c.job_id]:
            users.setdefault(link, []).append((c, rate))
    factor = {c.job_id: 1.0 for c in jobs}
    shared = {link: us for link, us in users.items() if len(us) > 1 or us[0][1] > network.capacity(link)}
    if not shared:
        return factor
    for _ in range(_PASSES):
        duty = {c.job_id: c.net_s * factor[c.job_id] / (c.iter_s + c.net_s * (factor[c.job_id] - 1)) for c in jobs}
        new = dict.fromkeys(factor, 1.0)
        for link, us in shared.items():
            cap = network.capacity(link)
            offered = sum(duty[c.job_id] * r for c, r in us)
            for c, r in us:
                s = (r + offered - duty[c.job_id] * r) / cap
                if s > new[c.job_id]:
                    new[c.job_id] = s
        moved = max(abs(new[k] - factor[k]) for k in factor)
        factor = new
        if moved < _TOL:
            break
    return factor


def iteration_times(loads: Iterable[CommLoad], network: Network) -> dict[str, float]:
    """job id -> its iteration time (s) with every job of `loads` running."""
    loads = list(loads)
    f = slowdowns(loads, network)
    return {c.job_id: c.iter_s + c.net_s * (f.get(c.job_id, 1.0) - 1.0) for c in loads}


def nic_share(loads: Iterable[CommLoad], network: Network) -> dict[str, float]:
    """node -> the summed duty of the multi-node jobs on its NIC (kappa weighted
    by how much each job communicates): what a new job there contends with."""
    out: dict[str, float] = {}
    for c in loads:
        if len(set(c.nodes)) > 1:
            for n in set(c.nodes):
                out[n] = out.get(n, 0.0) + c.duty
    return out
