"""Truth apart from the estimate: noise on the truth, the restart model,
Arena's profiler estimates, and the controller calibrating against what the
simulated jobs reach."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from slurm_ext.sim.clusterspec import load_cluster_spec
from slurm_ext.sim.conditions import Conditions, ConditionsError, RestartModel
from slurm_ext.sim.engine import SimOptions, Simulator
from slurm_ext.sim.traces import read_arena_trace
from slurm_ext.sim.types import ClusterSpec, NodeGroup, TraceJob
from slurm_ext.state import StateStore
from solver.arena.estimates import ArenaEstimates
from solver.contract.jobspec import JobSpec
from solver.contract.models import get_model
from solver.contract.profiles.arena import ESTIMATED_FILE, shipped_path
from solver.estimator import EstimatorBase
from solver.types import Cell, Estimate, EstimateSource, JobRequest, ParallelPlan, SolverConfig

DATA = Path(__file__).parent / "data"


def test_noise_is_seeded_per_job_and_type_with_median_one():
    c = Conditions(noise=0.1, seed=3)
    assert c.speed_factor("j1", "a100") == Conditions(noise=0.1, seed=3).speed_factor("j1", "a100")
    assert (
        c.speed_factor("j1", "a100")
        != c.speed_factor("j2", "a100")
        != Conditions(noise=0.1, seed=4).speed_factor("j2", "a100")
    )
    logs = [math.log(c.speed_factor(f"j{i}", "a40")) for i in range(2000)]
    # exp(0.1 z + 0.05 z'): log mean 0, log sd sqrt(0.1^2 + 0.05^2)
    assert abs(statistics.mean(logs)) < 0.01 and statistics.pstdev(logs) == pytest.approx(0.1118, rel=0.08)
    mixed = c.speed_factor("j1", "a100+a40")
    assert mixed == max(c.speed_factor("j1", "a100"), c.speed_factor("j1", "a40"))
    assert Conditions().speed_factor("j1", "a100") == 1.0


def test_the_restart_model_is_start_up_plus_the_state_written_and_read():
    spec = JobSpec(model="gpt-1.3b", global_batch=64, iterations=10)
    params = get_model("gpt-1.3b").params
    m = RestartModel.parse("model")
    assert m.cost(spec, 8, first_start=True) == m.startup_s
    assert m.cost(spec, 8, first_start=False) == pytest.approx(m.startup_s + 2 * 12 * params / 2e9)
    assert RestartModel.parse("30").cost(spec, 8, False) == 30.0 == RestartModel.parse("30").cost(spec, 1, True)
    for bad in ("fast", "-1", "nan"):
        with pytest.raises(ConditionsError, match="--restart-cost"):
            RestartModel.parse(bad)


def test_bad_conditions_name_their_option(tmp_path):
    with pytest.raises(ConditionsError, match="--estimates"):
        Conditions(estimates="oracle")
    with pytest.raises(ConditionsError, match="--noise"):
        Conditions(noise=-0.1)
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(ConditionsError, match="--truth"):
        Conditions(truth=str(tmp_path / "x.txt"))
    r = Conditions.realistic(noise=0.2)
    assert (r.estimates, r.noise, r.restart) == ("arena-estimated", 0.2, RestartModel())


def test_arena_estimates_take_the_best_plan_and_ours_where_arena_has_none():
    records = json.loads(shipped_path(ESTIMATED_FILE).read_text())["records"]
    plans = [
        r["iter_time_s"]
        for r in records
        if (r["trace_model_name"], r["batch_size"], r["gpu_type"], r["num_nodes"], r["gpus_per_node"])
        == ("moe__2.4B", 512, "a100", 1, 2)
        and r["comm_profile_prefix"] == 1
        and r["status"] == "ok"
    ]
    est = ArenaEstimates()
    job = JobRequest("1", get_model("moe__2.4B"), 512, 10, runtime="adaptive")
    got = est.estimate(job, Cell("a100", 1, 2, 1))
    assert len(plans) > 1 and got.iter_time_s == pytest.approx(min(plans), abs=1e-3)
    assert got.source == EstimateSource.ARENA_TABLE
    v100 = est.estimate(job, Cell("v100", 1, 2, 1))  # Arena never estimated V100
    assert v100.feasible and v100.source in (EstimateSource.ANALYTIC, EstimateSource.ANALYTIC_CALIBRATED)
    assert not est.estimate(job, Cell("a100", 1, 2, 2)).feasible  # a best-plan time has no stage dimension


def _run(tmp_path: Path, solver: SolverConfig, noise: float = 0.3) -> tuple[Simulator, list]:
    trace = read_arena_trace(DATA / "small_trace.csv", iteration_scale=5)
    sim = Simulator(
        trace,
        load_cluster_spec(DATA / "small_cluster.toml"),
        "cellsched",
        conditions=Conditions(noise=noise, seed=1),
        options=SimOptions(solver=solver),
        state_dir=tmp_path,
        label="cellsched:x",
    )
    run = sim.run()
    with StateStore(tmp_path / "state-cellsched_x.sqlite") as st:
        return sim, run, st.speeds()


def test_the_controller_learns_the_noisy_truth(tmp_path):
    """With the truth's own table as the estimate, a job's observed / estimated
    is exactly its noise factor, and the calibrated estimate is what it reaches."""
    sim, run, speeds = _run(tmp_path / "on", SolverConfig())
    assert run.policy == "cellsched:x" and all(o.finished for o in run.jobs)
    assert speeds and {s.job_id for s in speeds} <= set(sim.trace_ids)
    for s in speeds:
        noise = sim.conditions.speed_factor(sim.trace_ids[s.job_id], s.gpu_type)
        assert s.observed_s == pytest.approx(s.estimated_s * noise, rel=1e-6)
        assert s.ratio == pytest.approx(noise, rel=1e-6) and s.calibrated_s == pytest.approx(s.observed_s, rel=1e-6)
    _, off, none = _run(tmp_path / "off", SolverConfig(calibrate=False))
    assert none == [] and all(o.finished for o in off.jobs)


class _Times(EstimatorBase):
    """Seconds per iteration by (model, GPU type, GPUs); None: infeasible."""

    def __init__(self, times: dict[tuple[str, str, int], float]) -> None:
        self.times = times

    def speed(self, spec, gpu_type, num_nodes, gpus_per_node, plan):
        return self.times.get((spec.model, gpu_type, num_nodes * gpus_per_node))

    def estimate(self, job, cell):
        t = self.times.get((job.model.name, cell.gpu_type, cell.num_gpus)) if cell.pp == 1 else None
        if t is None:
            return Estimate(cell, None, math.inf, 0.0, EstimateSource.NONE)
        return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), t, 1.0, EstimateSource.MEASURED)


def test_a_job_that_fails_where_it_was_estimated_to_fit_waits_held_and_runs_elsewhere():
    """The estimate says job j fits on the free A10s; it does not (it fails
    before its first step, twice, and the size is excluded). The A40s are
    busy, so it is requeued held with no placement: the controller's own
    hold, not an operator's. When the A40s free up it runs there."""
    truth = _Times({("bert__760M", "a40", 2): 1.0, ("moe__2.4B", "a40", 2): 1.0})
    believed = _Times({**truth.times, ("moe__2.4B", "a10", 2): 0.5})
    trace = [TraceJob("b", 0.0, "bert__760M", 64, 1000, 2, "a40"), TraceJob("j", 10.0, "moe__2.4B", 64, 100, 2, "a40")]
    cluster = ClusterSpec((NodeGroup("a40", 1, 2), NodeGroup("a10", 1, 2)))
    sim = Simulator(trace, cluster, "cellsched", speed=truth.speed, estimator=believed, options=SimOptions())
    jobs = {j.job_id: j for j in sim.run().jobs}
    assert jobs["b"].finished and jobs["b"].cells == ("a40:1x2",)
    j = jobs["j"]
    assert j.finished and j.first_start == 10.0, j
    # a10 first (believed fastest), a40 last; in between at most mixed cells
    # with an A10 part (believed to pay, failing as the A10s do)
    assert j.cells[0] == "a10:1x2" and j.cells[-1] == "a40:1x2", j.cells
    assert all("+" in c and "a10" in c for c in j.cells[1:-1]), j.cells
    assert j.end_time > jobs["b"].end_time + 100.0  # ran its 100 iterations after b freed the A40s


def test_the_filled_truth_is_arenas_measured_table_and_ours_only_where_it_has_no_entry():
    truth = ArenaEstimates.filled_truth()
    assert truth.iter_time("bert__6.7B", 128, "a100", 2, 4) == pytest.approx(6.242, abs=1e-3)  # measured
    assert truth.iter_time("bert__6.7B", 128, "a100", 2, 2) is None  # measured out of memory: stays so
    filled = truth.estimate(
        JobRequest("1", get_model("bert__6.7B"), 128, 10, runtime="adaptive"), Cell("a100", 4, 4, 1)
    )
    assert filled.feasible and filled.source != EstimateSource.ARENA_TABLE  # 16 A100s: never run by Arena
    speed, believed = Conditions.realistic().speed_and_estimator()
    spec = JobSpec(model="bert__6.7B", global_batch=128, iterations=10)
    assert speed(spec, "a100", 2, 4, None) == pytest.approx(6.242, abs=1e-3) and isinstance(believed, ArenaEstimates)


def test_a_measured_restart_is_the_stall_not_the_first_step(tmp_path):
    """Job j runs on the slow A10s until the A40s free up, then moves: its
    restart is measured from the signal as its checkpoint (5 s) and the
    stall (30 s, every restart here), without the first 10-s step on the new
    GPUs that ends it."""
    times = _Times({("bert__760M", "a40", 2): 1.0, ("moe__2.4B", "a40", 2): 10.0, ("moe__2.4B", "a10", 2): 100.0})
    trace = [
        TraceJob("b", 0.0, "bert__760M", 64, 1000, 2, "a40"),
        TraceJob("j", 10.0, "moe__2.4B", 64, 200, 2, "a40"),
        TraceJob("late", 1500.0, "moe__690M", 64, 10, 2, "a40"),  # runs nowhere: its arrival brings a round
    ]
    cluster = ClusterSpec((NodeGroup("a40", 1, 2), NodeGroup("a10", 1, 2)))
    sim = Simulator(
        trace,
        cluster,
        "cellsched",
        speed=times.speed,
        estimator=times,
        conditions=Conditions(restart=RestartModel(constant_s=30.0)),
        options=SimOptions(),
        state_dir=tmp_path,
    )
    jobs = {j.job_id: j for j in sim.run().jobs}
    assert jobs["j"].finished and jobs["j"].cells == ("a10:1x2", "a40:1x2")
    with StateStore(tmp_path / "state-cellsched.sqlite") as st:
        history = st.history(sim.slurm_ids["j"])
    resumed = [e["value"] for e in history if e["event"] == "resumed"]
    assert resumed == [pytest.approx(SimOptions().checkpoint_s + 30.0)]
    # each cell it trained in, once (they can never be excluded for it: round.excluded_cells)
    assert [e["cell"] for e in history if e["event"] == "trained"] == ["a10:1x2:pp1", "a40:1x2:pp1"]
