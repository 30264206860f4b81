"""The contention model (solver.network) against jobs sharing real links.

On this machine, as root: network namespaces joined by veth pairs, each a
"node" whose NIC is rate-limited with `tc` (tbf, both directions: the node's
egress on its side, its ingress on the switch's side) to a set Mbit/s. The
nodes hang off a bridge ("rack") in a namespace of its own; in the rack cases
two rack bridges meet at a spine bridge over uplinks limited the same way.
Only private addresses inside namespaces this script creates; every name
starts with `cscr-`, leftovers of a run are removed before the next, and
everything is removed on exit and on SIGINT/SIGTERM/SIGHUP.

A job is a set of gloo ranks (torch.distributed, one process per node, a TCP
store on its first node's address, GLOO_SOCKET_IFNAME the node's interface)
repeating an iteration of compute (a sleep, as the model's compute phase
needs no CPU) and communication: a ring all-reduce of a message (data
parallel), or pipeline point-to-point (activations forward, gradients back,
one micro-batch). Per case, each job runs alone (the others idle), then all
run together for the same wall time; a job's iteration time is the mean over
the iterations that fall wholly inside the window where every job runs.

The model gets what the simulator gives it: each job's iteration alone and
the part of it on the network alone (measured: iteration minus the compute
on its critical path), its nodes, the NICs' and uplinks' rates, the racks.
`model_slowdown` = model's loaded / model's alone iteration - 1, from
solver.network.iteration_times; `measured_slowdown` = loaded / alone - 1.
Where an uplink is narrower than a NIC, a job alone is already slowed by
it: the model's input is then the job alone with that uplink opened (the
NIC-priced iteration), and both slowdowns are against the job alone on the
narrow uplink.

`maxmin_slowdown` is a variant these measurements suggest, not what
cellsched prices with: each job sends at its bottleneck rate and jobs on a
link share it max-min fairly (`maxmin_times`); it is solver.network's model
wherever all rates are equal.

Prints one JSON line per job of each case (`case`, `job`,
`measured_slowdown`, `model_slowdown`, `maxmin_slowdown`, the seconds
behind them, the link rates and message bytes) and a summary line: mean
|model - measured| slowdown, mean and max relative error of the loaded
iteration time, mean relative error of the slowdown where it is at least 5%
(the same for the variant, `maxmin_`), and the run's provenance. `--quick` is
a smoke run (two cases, short windows, about half a minute). `--cc` sets the
nodes' TCP congestion control (per route; default: the namespace's own).

    python benchmarks/contention_real.py [--cases all] [--repeats 1] [--out FILE] [--quick] [--cc cubic]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import itertools
import json
import math
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

PREFIX = "cscr-"
SWITCH = PREFIX + "sw"
SUBNET = "10.231.7"  # a /24 that exists only inside the namespaces made here
IFNAME = "eth0"  # each node's NIC, in its own namespace
LOCK = Path("/tmp/cellsched-contention-real.lock")
BASE_PORT = 29710
#: Bytes on the wire per byte of payload: 1448-byte TCP segments (MTU 1500,
#: timestamps) in 1514-byte Ethernet frames, as tbf counts them.
WIRE = 1514 / 1448
#: What "open" means for an uplink in the calibration phase (Mbit/s).
OPEN_MBIT = 10_000.0
EXIT_BUSY = 3  # another run holds the lock
EXIT_NO_NETNS = 4  # namespaces cannot be made here (not root, no iproute2)


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Job:
    """Ranks on `nodes` (rank i on nodes[i]). allreduce: every rank computes
    `compute_s` then all-reduces `mbytes` MB (a ring). pipeline: stage i on
    nodes[i] computes a third of `compute_s` forward and two thirds backward,
    sending `mbytes` MB of activations forward and of gradients back."""

    name: str
    nodes: tuple[str, ...]
    kind: str
    mbytes: float
    compute_s: float

    @property
    def nbytes(self) -> int:
        return int(self.mbytes * 1e6) // 4 * 4


@dataclass(frozen=True)
class Case:
    name: str
    about: str
    nic_mbit: dict[str, float]
    jobs: tuple[Job, ...]
    rack_of: dict[str, str] = field(default_factory=dict)
    uplink_mbit: dict[str, float] = field(default_factory=dict)

    @property
    def nodes(self) -> list[str]:
        return list(self.nic_mbit)

    def narrow_uplink(self) -> bool:
        """Some uplink is slower than a NIC behind it (a job alone is slowed)."""
        return any(self.uplink_mbit[r] < self.nic_mbit[n] for n, r in self.rack_of.items() if r in self.uplink_mbit)


def _nics(n: int, mbit: float = 100.0) -> dict[str, float]:
    return {f"n{i}": mbit for i in range(n)}


def _ar(name: str, nodes: str, mbytes: float, compute_s: float) -> Job:
    return Job(name, tuple(f"n{c}" for c in nodes), "allreduce", mbytes, compute_s)


def _pp(name: str, nodes: str, mbytes: float, compute_s: float) -> Job:
    return Job(name, tuple(f"n{c}" for c in nodes), "pipeline", mbytes, compute_s)


CASES: dict[str, Case] = {
    c.name: c
    for c in (
        Case(
            "two-busy",
            "two jobs on the same two nodes, both nearly always communicating",
            _nics(2),
            (_ar("a", "01", 2, 0.02), _ar("b", "01", 2, 0.02)),
        ),
        Case(
            "two-half",
            "two jobs on the same two nodes, each communicating about half its iteration",
            _nics(2),
            (_ar("a", "01", 2, 0.17), _ar("b", "01", 2, 0.17)),
        ),
        Case(
            "three-busy",
            "three jobs on the same two nodes, all nearly always communicating",
            _nics(2),
            (_ar("a", "01", 2, 0.02), _ar("b", "01", 2, 0.02), _ar("c", "01", 2, 0.02)),
        ),
        Case(
            "three-star",
            "three jobs meeting only on node n0's NIC, each with a compute phase",
            _nics(4),
            (_ar("a", "01", 2, 0.1), _ar("b", "02", 2, 0.1), _ar("c", "03", 2, 0.1)),
        ),
        Case(
            "unequal-msg",
            "a 4 MB job that communicates most of the time and a 0.5 MB one that rarely does",
            _nics(2),
            (_ar("big", "01", 4, 0.1), _ar("small", "01", 0.5, 0.2)),
        ),
        Case(
            "ring3",
            "a ring all-reduce over three nodes and a two-node job on two of them",
            _nics(3),
            (_ar("ring", "012", 3, 0.05), _ar("pair", "12", 2, 0.1)),
        ),
        Case(
            "ring4",
            "a ring all-reduce over four nodes and two two-node jobs, one on each half of it",
            _nics(4),
            (_ar("ring", "0123", 3, 0.05), _ar("left", "01", 2, 0.1), _ar("right", "23", 2, 0.3)),
        ),
        Case(
            "pipeline",
            "a two-stage pipeline (point-to-point) and an all-reduce job on the same two nodes",
            _nics(2),
            (_pp("pipe", "01", 2, 0.15), _ar("dp", "01", 2, 0.1)),
        ),
        Case(
            "uplink-2to1",
            "two racks of two nodes, uplinks of one NIC (2:1 oversubscribed), two jobs across them",
            _nics(4),
            (_ar("a", "02", 2, 0.05), _ar("b", "13", 2, 0.05)),
            rack_of={"n0": "r0", "n1": "r0", "n2": "r1", "n3": "r1"},
            uplink_mbit={"r0": 100.0, "r1": 100.0},
        ),
        Case(
            "uplink-4to1",
            "two racks of two nodes, uplinks of half a NIC (4:1): a job alone is slowed, two more",
            _nics(4),
            (_ar("a", "02", 2, 0.1), _ar("b", "13", 2, 0.3)),
            rack_of={"n0": "r0", "n1": "r0", "n2": "r1", "n3": "r1"},
            uplink_mbit={"r0": 50.0, "r1": 50.0},
        ),
        Case(
            "ring4-racks",
            "a four-node ring across two racks and a pair across them on other nodes, sharing only the uplinks",
            _nics(6),
            (_ar("ring", "0123", 3, 0.05), _ar("pair", "45", 2, 0.1)),
            rack_of={"n0": "r0", "n1": "r0", "n4": "r0", "n2": "r1", "n3": "r1", "n5": "r1"},
            uplink_mbit={"r0": 100.0, "r1": 100.0},
        ),
        Case(
            "unequal-nics",
            "a job between two 100 Mbit/s NICs and one from the same node to a 25 Mbit/s NIC",
            {"n0": 100.0, "n1": 100.0, "n2": 25.0},
            (_ar("fast", "01", 2, 0.05), _ar("slow", "02", 0.5, 0.05)),
        ),
    )
}
QUICK_CASES = ("two-busy", "unequal-msg")


def hop_mbit(case: Case, a: str, b: str) -> float:
    """The narrowest link on the path a -> b: a's NIC, b's NIC, and the two
    racks' uplinks when they differ."""
    rates = [case.nic_mbit[a], case.nic_mbit[b]]
    ra, rb = case.rack_of.get(a, ""), case.rack_of.get(b, "")
    if ra != rb:
        rates += [case.uplink_mbit[r] for r in (ra, rb) if r in case.uplink_mbit]
    return min(rates)


def physics_comm_s(case: Case, job: Job) -> float:
    """Seconds on the wire per iteration alone, from bytes and rates only: a
    ring all-reduce sends 2(n-1)/n of the message from each rank to the next
    (all hops at once, so the slowest paces it); a pipeline sends its
    activations then its gradients over each stage boundary in turn."""
    n = len(job.nodes)
    bits = job.nbytes * WIRE * 8
    if job.kind == "allreduce":
        slowest = min(hop_mbit(case, job.nodes[i], job.nodes[(i + 1) % n]) for i in range(n))
        return 2 * (n - 1) / n * bits / (slowest * 1e6)
    return sum(
        bits / (hop_mbit(case, job.nodes[i], job.nodes[i + 1]) * 1e6)
        + bits / (hop_mbit(case, job.nodes[i + 1], job.nodes[i]) * 1e6)
        for i in range(n - 1)
    )


# --------------------------------------------------------------------------- the model


def network_of(case: Case) -> Any:
    from solver.network import Network

    return Network(
        {n: r / 1000 for n, r in case.nic_mbit.items()},
        dict(case.rack_of),
        {r: v / 1000 for r, v in case.uplink_mbit.items()},
    )


def model_times(case: Case, inputs: dict[str, tuple[float, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """(alone, loaded) iteration seconds per job from solver.network, given
    each job's NIC-priced (iteration, network seconds) alone."""
    from solver.network import CommLoad, iteration_times

    net = network_of(case)
    loads = [CommLoad(j.name, j.nodes, *inputs[j.name]) for j in case.jobs]
    alone = {c.job_id: iteration_times([c], net)[c.job_id] for c in loads}
    return alone, iteration_times(loads, net)


def _maxmin(cap: float, demand: dict[str, float]) -> dict[str, float]:
    """Max-min fair shares of `cap` among `demand` (water-filling)."""
    share: dict[str, float] = {}
    left, c = dict(demand), cap
    while left:
        fair = c / len(left)
        small = {k: v for k, v in left.items() if v <= fair}
        if not small:
            share.update(dict.fromkeys(left, fair))
            break
        for k, v in small.items():
            share[k] = v
            c -= v
            del left[k]
    return share


def maxmin_times(case: Case, inputs: dict[str, tuple[float, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """The same as `model_times` under a variant these measurements suggest
    (not what cellsched prices with): a job sends at its bottleneck rate (its
    slowest NIC or crossed uplink: a ring moves at its slowest hop's pace), and
    the jobs on a link at one instant share it max-min fairly. A job's network
    seconds, priced at its slowest NIC, stretch on each link by the expected
    (slowest NIC / its share) over the others being there independently with
    their duties; as in solver.network, its most shared link counts and the
    duties are iterated to their fixed point. With equal rates it is
    solver.network's model."""
    net = network_of(case)
    jobs = {j.name: j for j in case.jobs}
    links = {n: [link for link, _ in net.links(j.nodes)] for n, j in jobs.items()}
    nominal = {n: net.slowest_nic(j.nodes) for n, j in jobs.items()}
    rate = {n: min([nominal[n], *(net.capacity(link) for link in links[n])]) for n in jobs}

    def times(names: list[str]) -> dict[str, float]:
        f = dict.fromkeys(names, 1.0)
        for _ in range(200):
            duty = {n: inputs[n][1] * f[n] / (inputs[n][0] + inputs[n][1] * (f[n] - 1)) for n in names}
            new = dict.fromkeys(names, 1.0)
            for n in names:
                for link in links[n]:
                    others = [o for o in names if o != n and link in links[o]]
                    e = 0.0
                    for on in itertools.product((False, True), repeat=len(others)):
                        p = math.prod(duty[o] if x else 1 - duty[o] for o, x in zip(others, on, strict=True))
                        active = [n, *(o for o, x in zip(others, on, strict=True) if x)]
                        e += p * nominal[n] / _maxmin(net.capacity(link), {a: rate[a] for a in active})[n]
                    new[n] = max(new[n], e)
            moved = max(abs(new[k] - f[k]) for k in f)
            f = new
            if moved < 1e-9:
                break
        return {n: inputs[n][0] + inputs[n][1] * (f[n] - 1) for n in names}

    return {n: times([n])[n] for n in jobs}, times(list(jobs))


# --------------------------------------------------------------------------- the network


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out


def _tc(ns: str, dev: str, mbit: float) -> None:
    """tbf at `mbit` on `dev`'s egress in namespace `ns` (replacing any), its
    queue a FIFO of 20 ms at line rate (this kernel has no fair queueing)."""
    burst = max(16_000, int(mbit * 1e6 / 8 * 0.002))  # 2 ms at line rate, at least ten frames
    argv = ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf"]
    argv += ["rate", f"{mbit}mbit", "burst", str(burst), "latency", "20ms"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {out.stderr.strip()}")


def ours() -> list[str]:
    out = _ip("netns", "list", check=False)
    return [line.split()[0] for line in out.stdout.splitlines() if line.startswith(PREFIX)]


def remove_namespaces() -> None:
    """Remove every namespace of ours, killing what still runs in it (only a
    run of this script puts processes there)."""
    for ns in ours():
        pids = _ip("netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", ns, check=False)


def node_ns(node: str) -> str:
    return PREFIX + node


def address(case: Case, node: str) -> str:
    return f"{SUBNET}.{case.nodes.index(node) + 1}"


def build(case: Case, cc: str | None = None) -> None:
    """The case's nodes, racks and links, each NIC and uplink limited both ways;
    `cc` the nodes' TCP congestion control (None: the namespace's default)."""
    _ip("netns", "add", SWITCH)
    racks = sorted(set(case.rack_of.values())) or ["r0"]
    for r in racks:
        _ip("-n", SWITCH, "link", "add", f"br-{r}", "type", "bridge")
        _ip("-n", SWITCH, "link", "set", f"br-{r}", "up")
    if case.rack_of:
        _ip("-n", SWITCH, "link", "add", "spine", "type", "bridge")
        _ip("-n", SWITCH, "link", "set", "spine", "up")
        for r in racks:
            up, down = f"up-{r}", f"dn-{r}"  # up: rack -> spine (egress of the rack's end), down: spine -> rack
            _ip("-n", SWITCH, "link", "add", up, "type", "veth", "peer", "name", down)
            _ip("-n", SWITCH, "link", "set", up, "master", f"br-{r}", "up")
            _ip("-n", SWITCH, "link", "set", down, "master", "spine", "up")
            if r in case.uplink_mbit:
                _tc(SWITCH, up, case.uplink_mbit[r])
                _tc(SWITCH, down, case.uplink_mbit[r])
    for node in case.nodes:
        ns, port = node_ns(node), f"p-{node}"
        _ip("netns", "add", ns)
        _ip("-n", SWITCH, "link", "add", port, "type", "veth", "peer", "name", IFNAME, "netns", ns)
        _ip("-n", SWITCH, "link", "set", port, "master", f"br-{case.rack_of.get(node, 'r0')}", "up")
        _ip("-n", ns, "addr", "add", f"{address(case, node)}/24", "dev", IFNAME)
        _ip("-n", ns, "link", "set", IFNAME, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        if cc:  # per route: a namespace's default may only be one the host allows
            route = [f"{SUBNET}.0/24", "dev", IFNAME, "proto", "kernel", "scope", "link", "src", address(case, node)]
            _ip("-n", ns, "route", "replace", *route, "congctl", cc)
        _tc(ns, IFNAME, case.nic_mbit[node])  # the node sends
        _tc(SWITCH, port, case.nic_mbit[node])  # the node receives


def set_uplinks(case: Case, open_: bool) -> None:
    for r, mbit in case.uplink_mbit.items():
        for dev in (f"up-{r}", f"dn-{r}"):
            _tc(SWITCH, dev, OPEN_MBIT if open_ else mbit)


def tx_bytes(node: str) -> int:
    out = _ip("-n", node_ns(node), "-j", "-s", "link", "show", "dev", IFNAME)
    return int(json.loads(out.stdout)[0]["stats64"]["tx"]["bytes"])


# --------------------------------------------------------------------------- ranks


class Rank:
    """One rank process in its node's namespace, spoken to over its stdin/stdout."""

    def __init__(self, case: Case, job: Job, index: int, port: int) -> None:
        self.job, self.index = job, index
        argv = [sys.executable, str(Path(__file__).resolve()), "--worker"]
        argv += ["--kind", job.kind, "--rank", str(index), "--world", str(len(job.nodes))]
        argv += ["--master", f"{address(case, job.nodes[0])}:{port}", "--nbytes", str(job.nbytes)]
        argv += ["--compute", str(job.compute_s)]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "GLOO_", "TORCH_"))}
        env.update(GLOO_SOCKET_IFNAME=IFNAME, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", node_ns(job.nodes[index]), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # its own process group, killed whole
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line)
            del self.err[:-20]

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def expect(self, deadline: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise RuntimeError(f"job {self.job.name} rank {self.index}: no answer in time") from None
        if line is None:
            raise RuntimeError(f"job {self.job.name} rank {self.index} exited:\n{''.join(self.err)}")
        return json.loads(line)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def worker(a: argparse.Namespace) -> None:
    """A rank: join the job's gloo group, then on each `run` command iterate
    until rank 0 sees the deadline and says so inside the iteration's own
    message (so every rank stops after the same iteration), and answer with
    (start, compute seconds, end) of each iteration."""
    signal.alarm(a.max_life)  # never outlive a lost parent
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://{a.master}", rank=a.rank, world_size=a.world, timeout=timedelta(seconds=60)
    )
    buf = torch.zeros(a.nbytes // 4)
    grad = torch.zeros(a.nbytes // 4)
    last = a.world - 1
    print(json.dumps({"ready": True}), flush=True)

    def compute(s: float) -> float:
        t = time.time()
        if s > 0:
            time.sleep(s)
        return time.time() - t

    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] != "run":
            break
        until, recs = float(cmd["until"]), []
        while True:
            t0 = time.time()
            flag = 1.0 if a.rank == 0 and t0 >= until else 0.0
            if a.kind == "allreduce":
                c = compute(a.compute)
                buf.zero_()
                buf[0] = flag
                dist.all_reduce(buf)
                stop = buf[0].item() > 0
            else:  # pipeline, one micro-batch
                if a.rank > 0:
                    dist.recv(buf, a.rank - 1)
                    flag = buf[0].item()
                c = compute(a.compute / 3)
                if a.rank < last:
                    buf[0] = flag
                    dist.send(buf, a.rank + 1)
                    dist.recv(grad, a.rank + 1)
                c += compute(a.compute * 2 / 3)
                if a.rank > 0:
                    grad[0] = flag
                    dist.send(grad, a.rank - 1)
                stop = flag > 0
            recs.append((t0, c, time.time()))
            if stop:
                break
        print(json.dumps({"recs": recs}), flush=True)
    dist.destroy_process_group()


# --------------------------------------------------------------------------- measuring


@dataclass
class Phase:
    """Iteration seconds (rank 0's) and critical-path compute seconds of the
    iterations inside a window, pooled over repeats."""

    iters: list[float] = field(default_factory=list)
    compute: list[float] = field(default_factory=list)
    tx_per_iter: list[float] = field(default_factory=list)

    @property
    def iter_s(self) -> float:
        return statistics.mean(self.iters)

    @property
    def net_s(self) -> float:
        return max(0.0, self.iter_s - statistics.mean(self.compute))


def window(job: Job, answers: list[dict[str, Any]], lo: float, hi: float, into: Phase) -> int:
    """Add the iterations of `job` that start after `lo` and end before `hi`
    (rank 0's clock; ranks share the machine's) to `into`; their count."""
    recs = [a["recs"] for a in answers]
    n = min(len(r) for r in recs)
    count = 0
    for k in range(1, n):
        start, end = recs[0][k - 1][2], recs[0][k][2]  # back to back: an iteration starts where the last ended
        if start < lo or end > hi:
            continue
        per_rank = [r[k][1] for r in recs]
        into.iters.append(end - start)
        into.compute.append(max(per_rank) if job.kind == "allreduce" else sum(per_rank))
        count += 1
    return count


def run_phase(ranks: dict[str, list[Rank]], jobs: list[Job], seconds: float, warm: float, timeout: float) -> dict:
    """Run `jobs` together for `seconds`; per job its answers and the window."""
    go = time.time()
    until = go + seconds
    for j in jobs:
        for r in ranks[j.name]:
            r.send({"cmd": "run", "until": until})
    deadline = time.monotonic() + seconds + timeout
    answers = {j.name: [r.expect(deadline) for r in ranks[j.name]] for j in jobs}
    return {j.name: (answers[j.name], go + warm, until) for j in jobs}


def measure(
    case: Case, repeats: int, alone_s: float, loaded_s: float, warm: float, timeout: float, cc: str | None = None
) -> list[dict]:
    ranks: dict[str, list[Rank]] = {}
    try:
        build(case, cc)
        for k, job in enumerate(case.jobs):
            ranks[job.name] = [Rank(case, job, i, BASE_PORT + k) for i in range(len(job.nodes))]
        deadline = time.monotonic() + timeout
        for rs in ranks.values():
            for r in rs:
                r.expect(deadline)
        calib = {j.name: Phase() for j in case.jobs}
        alone = {j.name: Phase() for j in case.jobs}
        loaded = {j.name: Phase() for j in case.jobs}
        jobs = list(case.jobs)
        for _ in range(repeats):
            phases = [(True, calib), (False, alone)] if case.narrow_uplink() else [(False, alone)]
            for open_, into in phases:
                if case.uplink_mbit:
                    set_uplinks(case, open_)
                for job in jobs:
                    before = tx_bytes(job.nodes[0])
                    got = run_phase(ranks, [job], alone_s, warm, timeout)
                    answers, lo, hi = got[job.name]
                    window(job, answers, lo, hi, into[job.name])
                    into[job.name].tx_per_iter.append((tx_bytes(job.nodes[0]) - before) / len(answers[0]["recs"]))
            for name, (answers, lo, hi) in run_phase(ranks, jobs, loaded_s, warm, timeout).items():
                job = next(j for j in jobs if j.name == name)
                window(job, answers, lo, hi, loaded[name])
        for rs in ranks.values():
            for r in rs:
                with contextlib.suppress(OSError):
                    r.send({"cmd": "quit"})
    finally:
        with held_signals():
            for rs in ranks.values():
                for r in rs:
                    r.kill()
            remove_namespaces()
    for name, ph in [*alone.items(), *loaded.items()]:
        if len(ph.iters) < 3:
            raise RuntimeError(f"{case.name}/{name}: only {len(ph.iters)} iterations in a window; lengthen it")
    inputs = calib if case.narrow_uplink() else alone
    given = {n: (p.iter_s, p.net_s) for n, p in inputs.items()}
    m_alone, m_loaded = model_times(case, given)
    v_alone, v_loaded = maxmin_times(case, given)
    rows = []
    for job in case.jobs:
        a, lo = alone[job.name], loaded[job.name]
        measured = lo.iter_s / a.iter_s - 1
        model = m_loaded[job.name] / m_alone[job.name] - 1
        rows.append(
            {
                "case": case.name,
                "job": job.name,
                "measured_slowdown": round(measured, 4),
                "model_slowdown": round(model, 4),
                "maxmin_slowdown": round(v_loaded[job.name] / v_alone[job.name] - 1, 4),
                "alone_s": round(a.iter_s, 4),
                "loaded_s": round(lo.iter_s, 4),
                "model_alone_s": round(m_alone[job.name], 4),
                "model_loaded_s": round(m_loaded[job.name], 4),
                "alone_net_s": round(a.net_s, 4),
                "model_input_s": round(inputs[job.name].iter_s, 4),
                "model_input_net_s": round(inputs[job.name].net_s, 4),
                "physics_net_s": round(physics_comm_s(case, job), 4),
                "duty_alone": round(a.net_s / a.iter_s, 3),
                "kind": job.kind,
                "nodes": list(job.nodes),
                "message_bytes": job.nbytes,
                "compute_s": job.compute_s,
                "tx_bytes_per_iter": round(statistics.mean(a.tx_per_iter)),
                "nic_mbit": {n: case.nic_mbit[n] for n in job.nodes},
                "uplink_mbit": dict(case.uplink_mbit),
                "iterations": [len(a.iters), len(lo.iters)],
                "repeats": repeats,
            }
        )
    return rows


def errors(rows: list[dict], key: str, prefix: str = "") -> dict[str, Any]:
    """How far `key` (a predicted slowdown) is from the measured one: mean
    |difference|; mean and max relative error of the loaded iteration (alone x
    (1 + slowdown), so |difference| / (1 + measured)); mean relative error of
    the slowdown itself where it is at least 5%."""
    diff = [abs(r[key] - r["measured_slowdown"]) for r in rows]
    iter_err = [d / (1 + r["measured_slowdown"]) for d, r in zip(diff, rows, strict=True)]
    rel = [d / r["measured_slowdown"] for d, r in zip(diff, rows, strict=True) if r["measured_slowdown"] >= 0.05]
    return {
        f"{prefix}slowdown_mean_abs_err": round(statistics.mean(diff), 4),
        f"{prefix}loaded_iter_mean_rel_err": round(statistics.mean(iter_err), 4),
        f"{prefix}loaded_iter_max_rel_err": round(max(iter_err), 4),
        f"{prefix}slowdown_mean_rel_err": round(statistics.mean(rel), 4) if rel else None,
    }


def summary(rows: list[dict]) -> dict[str, Any]:
    return {
        "summary": True,
        "cases": len({r["case"] for r in rows}),
        "jobs": len(rows),
        "slowed_jobs": sum(r["measured_slowdown"] >= 0.05 for r in rows),
        **errors(rows, "model_slowdown"),
        **errors(rows, "maxmin_slowdown", "maxmin_"),
    }


# --------------------------------------------------------------------------- driver


@contextlib.contextmanager
def exclusive(wait_s: float) -> Iterator[None]:
    """One run at a time on this machine (they would share the namespace names)."""
    with open(LOCK, "w") as f:
        end = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > end:
                    print("another contention_real.py run holds " + str(LOCK), file=sys.stderr)
                    raise SystemExit(EXIT_BUSY) from None
                time.sleep(1)
        yield


def probe() -> tuple[str | None, str]:
    """(why namespaces cannot be made here or None, the TCP congestion
    control a new namespace gets)."""
    if os.geteuid() != 0:
        return "needs root (ip netns, tc)", ""
    ns = PREFIX + "probe"
    try:
        out = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        return "iproute2's ip is not installed", ""
    if out.returncode != 0:
        return f"ip netns add is not permitted: {out.stderr.strip()}", ""
    cc = _ip("netns", "exec", ns, "cat", "/proc/sys/net/ipv4/tcp_congestion_control", check=False).stdout.strip()
    _ip("netns", "del", ns, check=False)
    return None, cc


def provenance(tcp_cc: str) -> dict[str, Any]:
    git = ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(git, capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    status = ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"]
    if commit and subprocess.run(status, capture_output=True, text=True, timeout=30, check=False).stdout.strip():
        commit += "+changes"
    return {
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit or None,
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "tcp_congestion_control": tcp_cc,
        "queue": "tbf, FIFO of 20 ms at line rate, both ways",
    }


STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM)
_held: dict[str, Any] = {"depth": 0, "pending": []}


def _on_signal(signum: int, _frame: object) -> None:
    if _held["depth"]:
        _held["pending"].append(signum)
        return
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """Clean-up is not interrupted: a stop signal that comes meanwhile takes
    effect when it is done."""
    _held["depth"] += 1
    try:
        yield
    finally:
        _held["depth"] -= 1
        if not _held["depth"] and _held["pending"]:
            raise SystemExit(128 + _held["pending"].pop(0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="all", help=f"comma-separated, or all: {','.join(CASES)}")
    ap.add_argument("--repeats", type=int, default=1, help="alone-then-together measurements per case (pooled)")
    ap.add_argument("--alone-s", type=float, default=8.0, help="seconds each job runs alone per repeat")
    ap.add_argument("--loaded-s", type=float, default=18.0, help="seconds the jobs run together per repeat")
    ap.add_argument("--out", type=Path, help="also write the JSON lines here")
    ap.add_argument("--quick", action="store_true", help=f"smoke run: {','.join(QUICK_CASES)}, short windows")
    ap.add_argument("--timeout", type=float, default=1500.0, help="the whole run's limit in seconds")
    ap.add_argument("--cc", help="TCP congestion control in the nodes (default: what a new namespace gets)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for opt, typ in (("--kind", str), ("--rank", int), ("--world", int), ("--master", str), ("--nbytes", int)):
        ap.add_argument(opt, type=typ, help=argparse.SUPPRESS)
    ap.add_argument("--compute", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--max-life", type=int, default=900, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return
    names = list(QUICK_CASES) if a.quick and a.cases == "all" else list(CASES) if a.cases == "all" else []
    names = names or [c.strip() for c in a.cases.split(",") if c.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    alone_s, loaded_s, warm = (3.0, 5.0, 1.0) if a.quick else (a.alone_s, a.loaded_s, 1.5)
    if os.geteuid() != 0:
        print("contention_real.py: needs root (ip netns, tc)", file=sys.stderr)
        raise SystemExit(EXIT_NO_NETNS)
    for s in STOPS:
        signal.signal(s, _on_signal)
    signal.alarm(int(a.timeout))
    rows: list[dict] = []
    out = open(a.out, "w") if a.out else None  # noqa: SIM115 (closed below)
    try:
        with exclusive(60):  # from here on the cscr- names are ours to make and remove
            try:
                why, tcp_cc = probe()
                if why:
                    print(f"contention_real.py: {why}", file=sys.stderr)
                    raise SystemExit(EXIT_NO_NETNS)
                remove_namespaces()  # a previous run's leftovers
                for name in names:
                    for row in measure(CASES[name], a.repeats, alone_s, loaded_s, warm, 180, a.cc):
                        rows.append(row)
                        emit(row, out)
                emit({**summary(rows), **provenance(a.cc or tcp_cc)}, out)
            finally:
                signal.alarm(0)
                with held_signals():
                    remove_namespaces()
    finally:
        if out:
            out.close()


def emit(row: dict[str, Any], out: Any) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if out:
        print(line, file=out, flush=True)


if __name__ == "__main__":
    main()
