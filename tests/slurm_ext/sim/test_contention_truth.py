"""Contention as the simulator's truth (slurm_ext.sim.network): multi-node
jobs on shared network cards slow each other, and their completions move
when the set of communicating jobs changes."""

from __future__ import annotations

import pytest

from slurm_ext.sim.clusterspec import load_cluster_spec
from slurm_ext.sim.engine import SimError, SimOptions, network_config, sim_network
from slurm_ext.sim.link_truth import KAPPA
from slurm_ext.sim.network import NetworkTruth, cluster_network
from slurm_ext.sim.types import ClusterSpec, NodeGroup
from solver.network import Network
from tests.slurm_ext.sim.test_backend import CLUSTER, place, sim, spec, speed, submit

PAIR = ("a100-1", "a100-2")


def truth(nic: float = 10.0) -> NetworkTruth:
    return NetworkTruth(Network(dict.fromkeys(("a100-1", "a100-2", "v100-1", "v100-2"), nic)))


def _two_equal_jobs(alone: float, net: float) -> float:
    """Two equal jobs on the same two cards (slurm_ext.sim.link_truth's doc):
    each sends half the card while the other sends, which it does with
    probability D (1 - KAPPA (1 - D)^2), D its network duty at that stretch;
    the stretch solved by bisection."""

    def gap(s: float) -> float:
        d = net * s / (alone - net + net * s)
        return 1 + d * max(0.0, 1 - KAPPA * (1 - d) ** 2) - s

    lo, hi = 1.0, 2.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) > 0 else (lo, mid)
    return alone - net + net * lo


def test_a_multi_node_job_is_slower_on_slow_cards_and_a_one_node_job_never_is():
    s = spec()
    fast, slow = truth(100.0).alone(s, "a100", PAIR, 4, None, 1.0), truth(10.0).alone(s, "a100", PAIR, 4, None, 1.0)
    assert fast.alone_s == pytest.approx(1.0) and 0 < fast.net_s < 1.0  # the truth's own (nominal) network
    assert slow.alone_s > 2.0 and slow.net_s == pytest.approx(slow.alone_s - (1.0 - fast.net_s))
    assert truth(10.0).alone(s, "a100", ("a100-1",), 4, None, 1.0).net_s == 0.0


def test_two_jobs_on_the_same_cards_slow_each_other_and_the_survivor_speeds_up_when_one_ends():
    w, b, acct = sim(network=truth())
    a = submit(b, spec(iterations=200))
    place(b, a, PAIR, 2, now=True)
    alone = w.running[a].iter_time
    assert alone > speed(None, "a100", 2, 2, None)  # carried to 10 Gb/s cards
    w.advance(10.0)
    short = submit(b, spec(iterations=5))
    place(b, short, PAIR, 2, now=True)
    ja, js = w.running[a], w.running[short]
    assert (ja.comm, ja.nodes) == (js.comm, js.nodes)
    together = {a: _two_equal_jobs(ja.comm.alone_s, ja.comm.net_s)}
    assert ja.iter_time == pytest.approx(together[a]) and ja.iter_time > alone * 1.2
    t2 = 10.0 + 5 * js.iter_time
    w.advance(t2 + 1e-6)
    assert b.observe().job(short).state == "COMPLETED"
    assert w.running[a].iter_time == pytest.approx(alone)  # alone again
    done_at_t2 = 10.0 / alone + (t2 - 10.0) / together[a]
    end = t2 + (200 - done_at_t2) * alone
    w.advance(end - 1e-3)
    assert b.observe().job(a).state == "RUNNING"
    w.advance(end + 1e-3)
    assert b.observe().job(a).state == "COMPLETED"
    # the seconds lost to the shared cards: each ran its shared stretch at `together` instead of `alone`
    lost = {j: acct.outcome(j, j, 0.0).contended_s for j in (a, short)}
    assert lost[short] == pytest.approx(5 * (together[a] - alone))
    assert lost[a] == pytest.approx((t2 - 10.0) * (1 - alone / together[a]))


def test_one_node_jobs_and_jobs_on_other_cards_are_untouched():
    w, b, _ = sim(network=truth())
    a = submit(b, spec(iterations=50))
    place(b, a, PAIR, 2, now=True)
    alone = w.running[a].iter_time
    other = submit(b, spec(iterations=50))
    place(b, other, ("v100-1", "v100-2"), 2, now=True)
    single = submit(b, spec(iterations=50))
    place(b, single, ("a100-1",), 2, now=True)
    assert w.running[a].iter_time == pytest.approx(alone)
    assert w.running[single].iter_time == pytest.approx(speed(None, "a100", 1, 2, None))
    w.advance(30.0)
    assert [w.all_jobs[j].contended_s for j in (a, other, single)] == [0.0, 0.0, 0.0]


def test_contention_is_on_where_the_cluster_gives_nics_and_never_in_arena_compat_mode():
    wang = load_cluster_spec("etc/sim-64-10g.toml")
    assert wang.has_network and wang.total_gpus == 64 and not CLUSTER.has_network
    net = sim_network(wang)
    assert len(net.nic_gbps) == 16 and set(net.nic_gbps.values()) == {10.0}
    assert network_config(net).nic_of("v100-07", "v100") == 10.0
    assert not network_config(None).modelled
    assert set(sim_network(CLUSTER).nic_gbps.values()) == {100.0}  # --contention without NICs: the default
    with pytest.raises(SimError, match="arena-compat"):
        SimOptions(contention=True, arena_compat=True)
    racked = ClusterSpec((NodeGroup("a100", 2, 4, nic_gbps=25.0, rack="r1"), NodeGroup("a40", 2, 2)), "", {"r1": 50.0})
    net = cluster_network(racked)
    assert net.nic_gbps == {"a100-1": 25.0, "a100-2": 25.0} and net.rack_of["a100-2"] == "r1"
    assert net.uplink_gbps == {"r1": 50.0}
