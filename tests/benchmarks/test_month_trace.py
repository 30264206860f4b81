"""benchmarks/month_trace.py on a small cut: the files it writes are read by the
simulator's own readers (the sacct trace, the cluster, the site's files), and the
recorded run it makes is checked by a sweep of its own: no GPU type over its
GPUs at any instant, every start at the job's submit or at an end of its type
(a conservative backfill starts nothing elsewhere), the offered load as asked,
and the same seed giving the same files."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import month_trace  # benchmarks/ is on the path (conftest.py)
import pytest

from slurm_ext.sim.clusterspec import load_cluster_spec
from slurm_ext.sim.sitefiles import load_site_files
from slurm_ext.sim.traces import load_sacct

ARENA = Path(month_trace.ARENA)


def generate(out: Path, seed: int = 1) -> None:
    argv = ["--out", str(out), "--jobs", "400", "--days", "2", "--gpus", "256", "--load", "0.9", "--seed", str(seed)]
    assert month_trace.main([*argv, "--arena", str(ARENA)]) == 0


pytestmark = pytest.mark.skipif(not (ARENA / "profiles_optimal.json").exists(), reason="Arena's data not here")


def test_month_files_read_and_replay_fits(tmp_path: Path) -> None:
    generate(tmp_path)
    cluster = load_cluster_spec(tmp_path / "cluster.toml")
    capacity = cluster.gpus_by_type()
    assert sum(capacity.values()) == 256
    trace = load_sacct(tmp_path / "sacct.txt")
    assert len(trace.jobs) == 400 and not trace.skipped
    # every job's spec rode in its Comment: the trace's model and cell, not the default
    assert all(j.iterations is not None and j.requested_gpu_type in capacity for j in trace.jobs)
    events: dict[str, list[tuple[float, int]]] = defaultdict(list)
    ends: dict[str, set[float]] = defaultdict(set)
    asked = 0.0
    for j in trace.jobs:
        assert j.recorded_start is not None and j.duration_s is not None
        assert j.recorded_start >= j.submit_time
        kind = j.requested_gpu_type
        assert kind is not None
        events[kind] += [(j.recorded_start, j.requested_gpus), (j.recorded_start + j.duration_s, -j.requested_gpus)]
        ends[kind].add(j.recorded_start + j.duration_s)
        asked += j.requested_gpus * j.duration_s
    for kind, evs in events.items():
        held = 0
        for _, delta in sorted(evs, key=lambda e: (e[0], e[1])):  # ends before starts at one instant
            held += delta
            assert held <= capacity[kind], kind
    for j in trace.jobs:
        assert j.recorded_start == j.submit_time or j.recorded_start in ends[j.requested_gpu_type or ""]
    # the offered load over the two days, to the rounding of iterations and whole seconds
    assert asked / (256 * 2 * 86400) == pytest.approx(0.9, rel=0.03)
    site = load_site_files(
        cluster,
        str(tmp_path / "sacctmgr_dump.txt"),
        str(tmp_path / "scontrol_show_partition.txt"),
        str(tmp_path / "sacctmgr_show_qos.txt"),
    ).site
    accounts = {a.name: a for a in site.accounts}
    assert set(accounts) == set(month_trace.ACCOUNTS)
    assert accounts["nlp"].parent == "research" and accounts["nlp"].gpus == 768
    assert {j.account for j in trace.jobs} <= set(accounts) - {"research", "production"}


def test_month_same_seed_same_files(tmp_path: Path) -> None:
    generate(tmp_path / "a")
    generate(tmp_path / "b")
    generate(tmp_path / "c", seed=2)
    a, b, c = ((tmp_path / d / "sacct.txt").read_text() for d in "abc")
    assert a == b and a != c
