"""Preemption to zero GPUs with the real controller and policy on the
simulated Slurm (slurm_ext.sim): an urgent job arrives while jobs of a
normal QOS hold every GPU; with preemption = "priority" it starts within
three rounds, its victim checkpoints, is requeued held and completes
later; a job younger than min_run_s is never a victim; with preemption
off the urgent job waits for a job to end. The state DB's history is the
oracle for who was preempted when ("yielded" events), the simulated
world's accounting for starts and ends."""

from __future__ import annotations

import dataclasses

import pytest
from support import UnitSpeed

from slurm_ext.sim.engine import SimOptions, Simulator
from slurm_ext.sim.types import AccountSpec, ClusterSpec, NodeGroup, QosSpec, SiteSpec, TraceJob
from slurm_ext.state import HistoryEvent, StateStore
from solver.site import parse_reason
from solver.types import SolverConfig

#: one node of 4 A100s; one account; QOS normal (priority 0, the default) and urgent (priority 100)
SITE = SiteSpec((AccountSpec("a"),), (QosSpec("normal"), QosSpec("urgent", priority=100)), "normal")
CLUSTER = ClusterSpec((NodeGroup("a100", 1, 4),), site=SITE)
MIN_RUN_S = 600.0


def trace_job(job_id: str, at: float, iterations: int, qos: str = "") -> TraceJob:
    return TraceJob(job_id, at, "bert__760M", 64, iterations, 2, "a100", qos=qos)


def simulate(trace, tmp_path, preemption: str, checkpoint_s: float = 5.0) -> tuple[Simulator, object, StateStore]:
    """The run of cellsched (every job exactly 2 GPUs) and its state DB."""
    solver = SolverConfig(time_limit_s=60.0, preemption=preemption, min_run_s=MIN_RUN_S)
    options = SimOptions(
        min_gpus=2, max_gpus=2, restart_per_gpu_s=0.0, restart_max_s=0.0, checkpoint_s=checkpoint_s, solver=solver
    )
    sim = Simulator(
        trace, CLUSTER, "cellsched", speed=UnitSpeed().speed, estimator=UnitSpeed(), options=options, state_dir=tmp_path
    )
    run = sim.run()
    return sim, run, StateStore(tmp_path / "state-cellsched.sqlite", readonly=True)


def yielded(sim: Simulator, state: StateStore) -> list[tuple[str, float, str]]:
    """(trace job, when, for which trace job) of every preemption, from the state DB."""
    out = []
    for slurm_id, trace_id in sim.trace_ids.items():
        for e in state.history(slurm_id):
            if e["event"] == HistoryEvent.YIELDED:
                out.append((trace_id, e["time"], sim.trace_ids[e["cell"]]))
    return sorted(out, key=lambda x: x[1])


def rounds_between(sim: Simulator, t0: float, t1: float) -> int:
    """Controller rounds that began in [t0, t1]."""
    return sum(1 for r in sim.rounds if t0 <= r.time <= t1)


@pytest.mark.parametrize("checkpoint_s", [5.0, 200.0])  # within the round's wait (60 s), or past it
def test_an_urgent_job_preempts_an_old_enough_job_and_the_victim_completes_later(tmp_path, checkpoint_s):
    """a (normal) runs from 0 and b (normal) from 1000 on 2 GPUs each, all 4
    GPUs; u (urgent) arrives at 1300: b is younger than min_run_s (600 s),
    so a is the victim; u starts within 3 rounds; a and b complete."""
    trace = [trace_job("a", 0.0, 4000), trace_job("b", 1000.0, 4000), trace_job("u", 1300.0, 500, qos="urgent")]
    sim, run, state = simulate(trace, tmp_path, "priority", checkpoint_s)
    out = {j.job_id: j for j in run.jobs}
    assert all(j.finished for j in run.jobs)  # every job, the victim too, completes
    [(victim, when, preemptor)] = yielded(sim, state)
    assert (victim, preemptor) == ("a", "u")
    assert when >= 1300.0 and when - out["a"].first_start >= MIN_RUN_S  # a had run long enough; b had not
    u = out["u"]
    assert u.first_start is not None and rounds_between(sim, 1300.0, u.first_start) <= 3
    assert u.first_start - 1300.0 <= checkpoint_s + 61.0  # the victim's checkpoint, at most a round's wait
    assert out["a"].restarts == 1 and out["b"].restarts == 0  # a ran again after u, from its checkpoint
    assert out["a"].end_time > u.end_time  # a finished after the urgent job ...
    assert out["a"].end_time - out["a"].submit_time >= 4000.0 + 500.0  # ... and lost no iteration: 4000 done once
    state.close()


def test_a_job_younger_than_min_run_s_is_never_a_victim(tmp_path):
    """a and b start at 0; u arrives at 300, when both are younger than
    min_run_s: u waits until one of them has run 600 s, then preempts it."""
    trace = [trace_job("a", 0.0, 4000), trace_job("b", 0.0, 4000), trace_job("u", 300.0, 500, qos="urgent")]
    sim, run, state = simulate(trace, tmp_path, "priority")
    out = {j.job_id: j for j in run.jobs}
    assert all(j.finished for j in run.jobs)
    [(victim, when, preemptor)] = yielded(sim, state)
    assert preemptor == "u" and victim in ("a", "b")
    assert when - out[victim].first_start >= MIN_RUN_S
    assert MIN_RUN_S <= out["u"].first_start <= MIN_RUN_S + 61.0  # as soon as a round finds a victim old enough
    state.close()


def test_without_preemption_the_urgent_job_waits_for_a_job_to_end(tmp_path):
    trace = [trace_job("a", 0.0, 4000), trace_job("b", 1000.0, 4000), trace_job("u", 1300.0, 500, qos="urgent")]
    sim, run, state = simulate(trace, tmp_path, "off")
    out = {j.job_id: j for j in run.jobs}
    assert yielded(sim, state) == []
    assert out["u"].first_start >= out["a"].end_time  # a's end (at 4000 s) freed its GPUs
    assert all(j.restarts == 0 for j in run.jobs)
    state.close()


def test_status_says_why_a_running_elastic_job_stays(tmp_path):
    """The user's question ("an elastic job with idle GPUs beside it ran on
    unchanged, and --why said no reason recorded"): a (1 to 4 GPUs, as fast
    on any) starts at 0, b arrives at 300. The round at 300 keeps a by the
    governor (ran 300 s of 600); the round the governor wakes at 600 finds no
    cell worth more than a's own, and keeps b (started at 300) by the governor."""
    solver = SolverConfig(time_limit_s=60.0, min_run_s=MIN_RUN_S)
    options = SimOptions(min_gpus=1, max_gpus=4, restart_per_gpu_s=0.0, restart_max_s=0.0, solver=solver)
    options = dataclasses.replace(options, max_time_s=700.0)
    trace = [trace_job("a", 0.0, 4000), trace_job("b", 300.0, 4000)]
    sim = Simulator(
        trace, CLUSTER, "cellsched", speed=UnitSpeed().speed, estimator=UnitSpeed(), options=options, state_dir=tmp_path
    )
    sim.run()
    assert [r.time for r in sim.rounds] == [0.0, 300.0, 600.0]
    with StateStore(tmp_path / "state-cellsched.sqlite", readonly=True) as state:
        rows = {sim.trace_ids[j]: r for j, r in state.jobs().items()}
    assert rows["a"].phase == "running" and rows["b"].phase == "running"
    assert parse_reason(rows["a"].reason) == (
        "stays",
        {"cell": "a100:1x1:pp1", "why": "no cell is worth more than its own"},
    )
    assert rows["b"].reason == "governor: ran 300 s of min_run_s 600 s"
