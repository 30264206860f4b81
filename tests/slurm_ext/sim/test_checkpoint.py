"""A simulation stopped part-way and continued from its checkpoint ends as
the same run uninterrupted does: the real controller, cellsched's CP-SAT
policy and Sia on realistic conditions (noise, restart model, contention)."""

from __future__ import annotations

import dataclasses
import pickle
import threading
import time

import pytest

from slurm_ext.cli.simulate_cmd import load_cluster, load_trace, parse_policies
from slurm_ext.sim import checkpoint
from slurm_ext.sim.conditions import Conditions
from slurm_ext.sim.engine import SimOptions, Simulator

JOBS = 24


class Stop(Exception):
    """Stands for the run being killed."""


@pytest.fixture(scope="module")
def setting():
    trace = load_trace(None, "arena", None, JOBS, 88 / 1280 * 2)
    return trace, load_cluster("etc/sim-mixed-88.toml"), Conditions.realistic(seed=0)


def simulator(setting, policy: str, tmp_path) -> Simulator:
    trace, cluster, conditions = setting
    opts = SimOptions(interval_s=60.0, seed=0)
    ((label, name, cfg),) = parse_policies([policy], opts.solver)
    return Simulator(
        trace, cluster, name, conditions=conditions, options=dataclasses.replace(opts, solver=cfg), label=label
    )


def outcomes(run):
    return [dataclasses.astuple(j) for j in run.jobs], [dataclasses.astuple(r)[:1] for r in run.rounds]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["cellsched", "sia"])
def test_a_run_continued_from_its_checkpoint_ends_as_one_never_stopped(setting, policy, tmp_path):
    whole = simulator(setting, policy, tmp_path).run()
    assert all(j.finished for j in whole.jobs) and len(whole.rounds) > 20

    ckpt = tmp_path / "run.ckpt"
    calls = []

    def kill_after_some_rounds(progress):
        calls.append(progress.rounds)
        if progress.rounds >= len(whole.rounds) // 2:
            raise Stop

    with pytest.raises(Stop):
        simulator(setting, policy, tmp_path).run(kill_after_some_rounds, checkpoint=ckpt, checkpoint_every_s=0.0)
    assert ckpt.exists() and (tmp_path / "run.ckpt.state").is_dir()
    saved_sim, _, wall_s = checkpoint.load(ckpt, simulator(setting, policy, tmp_path).run_key())
    assert 0 < len(saved_sim.rounds) < len(whole.rounds)  # stopped half-way, not at the start or the end
    assert wall_s > 0  # the time spent before the stop counts in the run's wall time

    t0 = time.perf_counter()
    resumed = simulator(setting, policy, tmp_path).run(checkpoint=ckpt)
    second_sitting_s = time.perf_counter() - t0
    assert outcomes(resumed) == outcomes(whole)
    assert resumed.meta["rounds_run"] == whole.meta["rounds_run"]
    assert resumed.wall_s > second_sitting_s  # the first sitting's wall time counts too
    assert not ckpt.exists() and not (tmp_path / "run.ckpt.state").exists()  # over: nothing left to go on from


def test_a_checkpoint_of_another_run_is_refused(setting, tmp_path):
    ckpt = tmp_path / "run.ckpt"
    with pytest.raises(Stop):
        simulator(setting, "sia", tmp_path).run(_stop_at_once, checkpoint=ckpt, checkpoint_every_s=0.0)
    other = simulator(setting, "cellsched", tmp_path)
    with pytest.raises(checkpoint.CheckpointError, match="holds another run"):
        other.run(checkpoint=ckpt)
    assert ckpt.exists()  # left for the run it belongs to


def test_a_file_that_is_no_checkpoint_is_refused(tmp_path):
    bad = tmp_path / "x.ckpt"
    bad.write_bytes(b"not a pickle")
    with pytest.raises(checkpoint.CheckpointError, match="not a simulation checkpoint"):
        checkpoint.load(bad, "k")
    bad.write_bytes(pickle.dumps({"version": 0}))
    with pytest.raises(checkpoint.CheckpointError, match=f"version-{checkpoint.VERSION}"):
        checkpoint.load(bad, "k")
    bad.write_bytes(pickle.dumps({"version": 2, "key": "k", "payload": None}))  # as the simulator before version 3
    with pytest.raises(checkpoint.CheckpointError, match="it is version 2, of another cellsched: remove it"):
        checkpoint.load(bad, "k")


def test_locks_and_events_come_back_fresh(tmp_path):
    set_event, unset_event = threading.Event(), threading.Event()
    set_event.set()
    lock = threading.Lock()
    checkpoint.save(tmp_path / "c", "k", {"locks": [lock, lock, threading.RLock()], "events": [set_event, unset_event]})
    back = checkpoint.load(tmp_path / "c", "k")
    a, b, r = back["locks"]
    assert a is b and a.acquire(blocking=False) and r.acquire(blocking=False)
    assert [e.is_set() for e in back["events"]] == [True, False]


def _stop_at_once(progress):
    if progress.rounds >= 3:
        raise Stop


@pytest.mark.parametrize("policy", ["fcfs", pytest.param("sia", marks=pytest.mark.slow)])
def test_a_run_stopped_before_its_first_checkpoint_starts_over_clean(setting, policy, tmp_path):
    """Killed before it saved anything, a run leaves only its state DB; run again, it must not take
    that DB's jobs for its own (it did: Sia then never started the jobs the stopped run had seen)."""
    whole = simulator(setting, policy, tmp_path / "whole").run()
    assert all(j.finished for j in whole.jobs)
    ckpt = tmp_path / "run.ckpt"
    with pytest.raises(Stop):
        simulator(setting, policy, tmp_path).run(_stop_at_once, checkpoint=ckpt, checkpoint_every_s=1e9)
    assert not ckpt.exists() and list((tmp_path / "run.ckpt.state").glob("state-*.sqlite"))
    again = simulator(setting, policy, tmp_path).run(checkpoint=ckpt)
    assert outcomes(again) == outcomes(whole)
