"""The simulator's event engine on hand-computed cases: the real controller
and FCFS policy on the simulated backend, with a constant-speed profile
table as both truth and estimate."""

from __future__ import annotations

import gc
import math

import pytest

from slurm_ext.sim.engine import SIM_GC_THRESHOLD, SimError, SimOptions, Simulator, restart_cost_for
from slurm_ext.sim.types import ClusterSpec, NodeGroup, TraceJob
from solver.estimator import EstimatorBase
from solver.types import Estimate, ParallelPlan

ONE_NODE = ClusterSpec((NodeGroup("a100", 1, 8),))


class Table(EstimatorBase):
    """Seconds per iteration by (GPU type, GPUs): truth and estimate alike."""

    def __init__(self, times: dict[tuple[str, int], float]) -> None:
        self.times = times

    def iter_time(self, gpu_type: str, gpus: int) -> float | None:
        return self.times.get((gpu_type, gpus))

    def speed(self, spec, gpu_type, num_nodes, gpus_per_node, plan):
        return self.iter_time(gpu_type, num_nodes * gpus_per_node)

    def estimate(self, job, cell):
        t = self.iter_time(cell.gpu_type, cell.num_gpus) if cell.pp == 1 else None
        if t is None:
            return Estimate(cell, None, math.inf, 0.0, "none")
        return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), t, 1.0, "measured")


TABLE = Table({("a100", 1): 2.0, ("a100", 2): 1.0, ("a100", 4): 1.0, ("a100", 8): 1.0})


def job(job_id: str, submit: float, iterations: int, gpus: int) -> TraceJob:
    return TraceJob(job_id, submit, "bert__760M", 64, iterations, gpus, "a100")


def run(trace, *, cluster=ONE_NODE, policy="fcfs", **opts):
    opts.setdefault("restart_per_gpu_s", 0.0)
    opts.setdefault("restart_max_s", 0.0)
    sim = Simulator(trace, cluster, policy, speed=TABLE.speed, estimator=TABLE, options=SimOptions(**opts))
    result = sim.run()
    return result, {j.job_id: j for j in result.jobs}


def test_one_job_alone_runs_from_its_arrival():
    result, jobs = run([job("a", 100.0, 50, 4)])
    a = jobs["a"]
    assert (a.submit_time, a.first_start, a.end_time, a.jct) == (100.0, 100.0, 150.0, 50.0)
    assert (a.finished, a.restarts, a.cells, a.gpu_seconds) == (True, 0, ("a100:1x4",), 200.0)
    assert result.rounds[0].time == 100.0 and result.policy == "fcfs"
    assert result.samples[0].running == 1 and result.samples[0].throughput == pytest.approx(64.0)
    assert result.samples[-1].running == 0 and result.meta["infeasible_starts"] == 0
    assert result.meta["controller_warnings"] == {}


def test_a_run_makes_full_garbage_collections_rare_and_gives_the_thresholds_back():
    before = gc.get_threshold()
    seen = []
    sim = Simulator([job("a", 0.0, 50, 4)], ONE_NODE, "fcfs", speed=TABLE.speed, estimator=TABLE)
    sim.run(lambda _: seen.append(gc.get_threshold()))
    assert seen and set(seen) == {SIM_GC_THRESHOLD} and SIM_GC_THRESHOLD[2] >= 100 * before[2] > 0
    assert gc.get_threshold() == before


def test_two_jobs_queue_for_the_same_gpus():
    # b arrives while a holds all 8 GPUs; a's end triggers an early round
    result, jobs = run([job("a", 0.0, 100, 8), job("b", 10.0, 30, 8)])
    assert (jobs["a"].first_start, jobs["a"].end_time) == (0.0, 100.0)
    assert (jobs["b"].first_start, jobs["b"].end_time, jobs["b"].jct) == (100.0, 130.0, 120.0)
    assert [s.queued for s in result.samples if s.time == 10.0] == [1]


def test_without_early_rounds_a_job_waits_for_the_interval():
    _, jobs = run([job("a", 0.0, 100, 8), job("b", 10.0, 30, 8)], early_rounds=False, interval_s=60.0)
    assert (jobs["b"].first_start, jobs["b"].end_time) == (120.0, 150.0)


def _shrink_run(*late_arrivals: float):
    """a alone on the node's 8 GPUs; b arrives at 100: cellsched halves a (a
    move: checkpoint, requeue) for b; c jobs arrive at `late_arrivals`."""
    table = Table({("a100", g): 8.0 / g for g in (1, 2, 4, 8)})
    trace = [
        TraceJob("a", 0.0, "bert__760M", 64, 4000, 1, "a100"),
        TraceJob("b", 100.0, "bert__760M", 64, 400, 1, "a100"),
    ]
    trace += [TraceJob(f"c{i}", t, "bert__760M", 64, 100, 1, "a100") for i, t in enumerate(late_arrivals)]
    opts = SimOptions(interval_s=1e6, elastic=True, min_gpus=1, max_gpus=8, restart_per_gpu_s=0.0, restart_max_s=0.0)
    result = Simulator(trace, ONE_NODE, "cellsched", speed=table.speed, estimator=table, options=opts).run()
    return result, {j.job_id: j for j in result.jobs}


def test_a_rounds_own_moves_bring_no_early_round():
    """As the daemon's watcher counts (slurm_ext.controller.watcher): the
    round at 100 checkpoints and requeues a itself; that is no change to
    look at again. b starts at 105 (a's 5-s checkpoint) on 4 GPUs, 400
    iterations at 2 s: it ends at 905, and that round grows a back."""
    result, jobs = _shrink_run()
    assert jobs["a"].cells == ("a100:1x8", "a100:1x4", "a100:1x8") and jobs["a"].restarts == 2
    assert (jobs["b"].first_start, jobs["b"].end_time) == (105.0, 905.0)
    assert [r.time for r in result.rounds] == [0.0, 100.0, 905.0, jobs["a"].end_time]


def test_an_arrival_while_a_round_waits_brings_a_round_after_it():
    """c arrives at 102, while the round of 100 waits for a's checkpoint: a
    round looks at it as soon as that round is over (at 105); no GPU is free
    for c until b ends."""
    result, jobs = _shrink_run(102.0)
    assert [r.time for r in result.rounds][:4] == [0.0, 100.0, 105.0, 905.0]
    assert jobs["c0"].first_start == 905.0


def test_the_restart_cost_delays_progress():
    # min(10 s x 4 GPUs, 25 s) = 25 s before the first iteration
    result, jobs = run([job("a", 0.0, 50, 4)], restart_per_gpu_s=10.0, restart_max_s=25.0)
    assert (jobs["a"].first_start, jobs["a"].end_time) == (0.0, 75.0)
    assert [(s.time, s.throughput) for s in result.samples[:2]] == [(0.0, 0.0), (25.0, 64.0)]


def test_idle_rounds_are_skipped():
    result, _ = run([job("a", 0.0, 1000, 8)], interval_s=60.0)
    # rounds at 0 (arrival) and 1000 (the end); none of the 16 in between ran
    assert [r.time for r in result.rounds] == [0.0, 1000.0]
    assert result.meta["rounds_skipped"] == 2  # at 60 and at 1060


def test_arena_compat_quantizes_arrivals_and_sees_completions_at_round_boundaries():
    # a: 1 GPU, 200 iterations x 2 s = 400 s of work, done at 1400, seen at 1600.
    # b: arrives at 1450 -> submitted at 1300; 4 GPUs: a baseline's charge
    #    min(150 x 4, 600) = 600 s > 300 s costs it one round: 0 s in
    #    [1300, 1600), 300 s by 1900, 600 s by 2200 >= 400 s -> ends at 2200.
    trace = [job("a", 1000.0, 200, 1), job("b", 1450.0, 400, 4)]
    sim = Simulator(trace, ONE_NODE, "fcfs", speed=TABLE.speed, estimator=TABLE, options=SimOptions(arena_compat=True))
    result = sim.run()
    jobs = {j.job_id: j for j in result.jobs}
    assert (jobs["a"].submit_time, jobs["a"].first_start, jobs["a"].end_time, jobs["a"].jct) == (
        1000.0,
        1000.0,
        1600.0,
        600.0,
    )
    assert (jobs["b"].submit_time, jobs["b"].first_start, jobs["b"].end_time, jobs["b"].jct) == (
        1300.0,
        1300.0,
        2200.0,
        900.0,
    )
    # one sample per round; a's 150 s charge halves its share of the first round
    thr = {s.time: s.throughput for s in result.samples}
    assert thr[1000.0] == pytest.approx(32.0 * 0.5)
    assert thr[1300.0] == pytest.approx(32.0)  # b is charged the whole round
    assert thr[1600.0] == pytest.approx(64.0)
    assert all(r.time in (1000.0, 1300.0, 1600.0, 1900.0, 2200.0) for r in result.rounds)


def test_arena_restart_charges_depend_on_the_policy():
    compat = SimOptions(arena_compat=True).effective()
    assert restart_cost_for("cellsched", compat)(None, 8, True) == 40.0
    assert restart_cost_for("cellsched", compat)(None, 2, True) == 20.0
    assert restart_cost_for("gavel", compat)(None, 2, True) == 300.0
    assert restart_cost_for("gavel", compat)(None, 8, True) == 600.0
    assert restart_cost_for("gavel", SimOptions())(None, 8, True) == 40.0


def test_bad_options_and_empty_traces_are_refused():
    with pytest.raises(SimError, match="interval_s"):
        SimOptions(interval_s=0)
    with pytest.raises(SimError, match="no jobs"):
        Simulator([], ONE_NODE, "fcfs", speed=TABLE.speed, estimator=TABLE)
    with pytest.raises(SimError, match="unknown policy"):
        Simulator([job("a", 0.0, 1, 1)], ONE_NODE, "nope", speed=TABLE.speed, estimator=TABLE)
