"""PriorityCalcPeriod in the simulated site: the fair share the policies see is the
usage as of slurmctld's last calculation, not the usage of the moment."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slurm_ext.sim.clusterspec import ClusterSpecError, load_cluster_spec
from slurm_ext.sim.site import SiteUsage
from slurm_ext.sim.types import AccountSpec, SiteSpec, TraceJob

NODES = '[[nodes]]\ngpu_type = "a100"\ncount = 1\ngpus_per_node = 8\n[site.accounts.a]\n'


def usage_seen(period: float) -> list[dict[str, float]]:
    """a holds 4 GPUs from 0, b 4 from 70 (half-life long: no decay to speak of);
    the normalized usage the policies see at 30, 65 and 100."""
    site = SiteSpec((AccountSpec("a"), AccountSpec("b")), decay_half_life_s=1e8, calc_period_s=period)
    clock = SimpleNamespace(t=0.0)
    usage = SiteUsage(site, 8, lambda: clock.t, 0.0)
    for sid, account in (("1", "a"), ("2", "b")):
        usage.register(sid, TraceJob(sid, 0.0, "bert__760M", 64, 10, 4, "a100", account=account, user="u"))
    seen = []
    usage.started(SimpleNamespace(job_id="1", gpus=4), "a100:1x4")
    for t in (30.0, 65.0, 70.0, 100.0):
        clock.t = t
        if t == 70.0:
            usage.started(SimpleNamespace(job_id="2", gpus=4), "a100:1x4")
        else:
            seen.append(usage.normalized_usage())
    return seen


def test_usage_is_seen_as_of_the_last_calculation():
    # continuous: a alone until 70; at 100 a has 400 GPU-s, b 120
    now = usage_seen(0.0)
    assert now[:2] == [{"a": 1.0}, {"a": 1.0}]
    assert now[2] == pytest.approx({"a": 400 / 520, "b": 120 / 520}, rel=1e-6)
    # every 60 s: nothing before the first tick, then a's alone (as of 60) until the tick at 120
    assert usage_seen(60.0) == [{}, {"a": 1.0}, {"a": 1.0}]


def test_a_bad_calc_period_names_the_field(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(NODES.replace("[site.accounts.a]", "[site]\ncalc_period_s = -1\n[site.accounts.a]"))
    with pytest.raises(ClusterSpecError, match="field 'calc_period_s' must be a number of seconds >= 0"):
        load_cluster_spec(path)
    path.write_text(NODES.replace("[site.accounts.a]", "[site]\ncalc_period_s = 60\n[site.accounts.a]"))
    assert load_cluster_spec(path).site.calc_period_s == 60.0
