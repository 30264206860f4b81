"""Mixed-type cells in the simulator: the policies decide with
MixedEstimator, the truth of a mixed cell is composed from the truth of its
parts (at the plan's batch shares), each run is counted by its kind of cell,
and the policy options that turn mixed cells off reach the simulated policy."""

from __future__ import annotations

import dataclasses
import json

import pytest

from slurm_ext.cli.simulate_cmd import SimulateError, parse_policies
from slurm_ext.sim.accounting import run_kinds
from slurm_ext.sim.conditions import Conditions, TableTruth, estimator_speed, mixed_time, table_speed
from slurm_ext.sim.engine import SimOptions, Simulator
from slurm_ext.sim.report import kinds_table, summaries, write_report
from slurm_ext.sim.types import (
    MIXED_DP,
    MIXED_PIPELINE,
    SINGLE,
    STATE_SHARDED,
    ClusterSpec,
    JobOutcome,
    KindUse,
    NodeGroup,
    SimRun,
    TraceJob,
)
from solver.contract.jobspec import JobSpec
from solver.contract.models import get_model
from solver.contract.plan import JobPlan
from solver.contract.profiles.records import NET_GBPS
from solver.contract.profiles.seed import open_store
from solver.estimator import CostSettings, Estimator, EstimatorBase
from solver.mixed import NET_LATENCY_S, MixedEstimator, mixed_cell
from solver.mixed.dp import PartStep, part_step
from solver.types import Cell, JobRequest, SolverConfig

MODEL, BATCH = "bert__760M", 64
#: one A40 node and one A10 node, two GPUs each: a 4-GPU job needs both
PAIR = ClusterSpec((NodeGroup("a40", 1, 2), NodeGroup("a10", 1, 2)))
CELL = mixed_cell((("a40", 1), ("a10", 1)), 2)


class Table(EstimatorBase):
    """Truth (and belief) by (GPU type, nodes, GPUs per node): seconds per
    iteration with the whole global batch; absent: no truth (infeasible)."""

    def __init__(self, times: dict[tuple[str, int, int], float]) -> None:
        self.times = times

    def iter_time(self, model, batch, gpu_type, num_nodes, gpus_per_node):
        return self.times.get((gpu_type, num_nodes, gpus_per_node))

    def estimate(self, job, cell):
        return TableTruth(self).estimate(job, cell)


TABLE = Table({("a40", 1, 2): 1.0, ("a10", 1, 2): 3.0})


def sync_s() -> float:
    """MixedEstimator's gradient sync over CELL's 4 dp ranks (solver.mixed.dp): a ring all-reduce of the
    gradients on the network (the datasheet's, as a truth table has no links)."""
    m = get_model(MODEL)
    return 2 * 3 * NET_LATENCY_S + 2 * 3 / 4 * m.params * m.dtype_bytes / (NET_GBPS * 1e9)


def table_parts(table: Table = TABLE) -> dict[str, PartStep]:
    """Each part of CELL (one node of a type running the whole batch) taken apart (solver.mixed.dp)."""
    inner, job = TableTruth(table), JobRequest("j", get_model(MODEL), BATCH, 10, runtime="adaptive")
    settings = CostSettings()  # a truth table has no cost model: the defaults
    return {t: part_step(None, settings, job, inner.estimate(job, Cell(t, 1, 2, 1))) for t in ("a40", "a10")}


def composed(a40: float, a10: float, m: int = 1) -> float:
    """The composed step over TABLE with a40 / a10 samples per rank in m micro-batches: the slower part's
    compute, one gradient sync over the 4 ranks, the slower part's update."""
    p = table_parts()
    compute = max(p["a40"].compute_s(a40, m), p["a10"].compute_s(a10, m))
    return compute + sync_s() + max(x.update_s for x in p.values())


def plan(shares: tuple[float, ...] | None, nodes: tuple[str, ...] = ("a40-1", "a10-1")) -> JobPlan:
    return JobPlan(pp=1, dp=4, tp=1, nodes=nodes, gpus_per_node=2, batch_shares=shares, cell=CELL.key())


SPEC = JobSpec(model=MODEL, global_batch=BATCH, iterations=10)


def test_a_mixed_cells_truth_is_composed_from_its_parts_at_the_plans_shares():
    """The table's A40 node runs the batch in 1 s, its A10 node in 3 s: taken apart, an A40 rank computes
    a sample faster; the truth's best shares are the least composed step over every whole split, and
    the job runs the shares of its plan."""
    p = table_parts()
    assert p["a40"].per_sample_s < p["a10"].per_sample_s
    assert p["a40"].compute_s(BATCH / 2, 1) + p["a40"].update_s < 1.0 < 3.0  # the table's time holds a sync too
    speed = table_speed(TABLE, mixed=True)
    best = MixedEstimator(TableTruth(TABLE)).estimate(
        JobRequest("j", get_model(MODEL), BATCH, 10, runtime="adaptive"), CELL
    )
    splits = {(a, (BATCH - 2 * a) // 2) for a in range(1, BATCH // 2)}
    want = min(splits, key=lambda s: composed(*s))
    assert best.plan.shares == want and want[0] > want[1]
    assert best.iter_time_s == pytest.approx(composed(*want), rel=1e-12)
    assert speed(SPEC, "a40+a10", 2, 2, plan((float(want[0]),) * 2 + (float(want[1]),) * 2)) == pytest.approx(
        composed(*want), rel=1e-12
    )
    # even shares (none in the plan, or equal ones): 16 samples per rank
    assert speed(SPEC, "a40+a10", 2, 2, plan(None)) == pytest.approx(composed(16, 16), rel=1e-12)
    assert speed(SPEC, "a40+a10", 2, 2, plan((1.0,) * 4)) == pytest.approx(composed(16, 16), rel=1e-12)
    # the nodes in the other order: the A10 ranks come first
    swapped = plan((8.0, 8.0, 24.0, 24.0), nodes=("a10-1", "a40-1"))
    assert speed(SPEC, "a10+a40", 2, 2, swapped) == pytest.approx(composed(24, 8), rel=1e-12)
    # the A40s overloaded: 28 samples per A40 rank, 4 per A10 rank; and in 4 micro-batches
    assert speed(SPEC, "a40+a10", 2, 2, plan((28.0, 28.0, 4.0, 4.0))) == pytest.approx(composed(28, 4), rel=1e-12)
    four = dataclasses.replace(plan((28.0, 28.0, 4.0, 4.0)), micro_batches=4)
    assert speed(SPEC, "a40+a10", 2, 2, four) == pytest.approx(composed(28, 4, 4), rel=1e-12)
    assert composed(*want) < composed(16, 16)


def _plan_of(est, cell, vw: int | None = None) -> JobPlan:
    """The plan the controller writes for `est` (reconcile.mixed_layout,
    state_fields): nodes in the cluster's order, each dp rank's share of its
    part, and where the state is sharded each rank's weight (4 decimals); a
    pipeline: its stage_layers."""
    nodes = tuple(f"{t}-{i + 1}" for t, n in cell.parts for i in range(n))
    if est.plan.pp > 1:
        p = est.plan
        return JobPlan(pp=p.pp, dp=p.dp, tp=p.tp, nodes=nodes, stage_layers=p.stage_layers, cell=cell.key())
    per_node = cell.gpus_per_node // est.plan.tp

    def per_rank(values):
        return tuple(float(v) for (_, n), v in zip(cell.parts, values, strict=True) for _ in range(n * per_node))

    sharded = est.plan.sharded
    return JobPlan(
        pp=1,
        dp=est.plan.dp,
        tp=est.plan.tp,
        micro_batches=est.plan.micro_batches,
        nodes=nodes,
        batch_shares=per_rank(est.plan.shares),
        state_sharding="memory" if sharded else None,
        state_shares=per_rank(round(w, 4) for w in est.plan.state_shares) if sharded else None,
        virtual_workers=vw,
        cell=cell.key(),
    )


@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("truth", ["arena-filled", "store"])
def test_with_the_truth_as_estimates_a_mixed_cell_runs_as_estimated(truth, pp):
    """The policies' MixedEstimator over the truth's own table (or the truth
    store's estimator) and the composed truth agree exactly on a mixed cell
    run with the plan the estimate gives: one composition, data parallel or
    a pipeline across types (a table's layers: ours on its scale)."""
    if truth == "arena-filled":
        speed, believed = Conditions(truth="arena-filled", estimates="truth").speed_and_estimator()
        model, batch = "bert__2.6B", 128
    else:
        believed = Estimator(open_store(None))
        speed = estimator_speed(believed, mixed=True)
        model, batch = "bert__760M", 64
    cell = mixed_cell((("a40", 2), ("a10", 2)), 2, pp)
    est = MixedEstimator(believed).estimate(JobRequest("j", get_model(model), batch, 10, runtime="adaptive"), cell)
    assert est.feasible, est.note
    assert (est.plan.pp, len(est.plan.stage_layers)) == ((1, 0) if pp == 1 else (pp, pp))
    spec = JobSpec(model=model, global_batch=batch, iterations=10)
    assert speed(spec, "a40+a10", 4, 2, _plan_of(est, cell)) == pytest.approx(est.iter_time_s, rel=1e-9)


def test_a_tables_pipeline_across_types_follows_the_table_type_by_type():
    """Arena's tables have no layers: a pipeline across types is priced from
    ours, each type's put on the table's scale (layer_scale). The same table
    with every time doubled: the same plan in twice the time; the estimates
    and the filled truth both price it, from their own tables."""
    from solver.arena.estimates import ArenaEstimates, best_plan_records

    job = JobRequest("j", get_model("moe__2.4B"), 256, 10, runtime="adaptive")
    cell = mixed_cell((("a10", 4), ("a40", 4)), 2, 4)
    recs = best_plan_records()
    twice = [dataclasses.replace(r, iter_time_s=r.iter_time_s and 2 * r.iter_time_s) for r in recs]
    one = MixedEstimator(ArenaEstimates(records=recs)).estimate(job, cell)
    two = MixedEstimator(ArenaEstimates(records=twice)).estimate(job, cell)
    assert one.feasible and sum(one.plan.stage_layers) == get_model("moe__2.4B").num_layers, one.note
    assert two.plan == one.plan and two.iter_time_s == pytest.approx(2 * one.iter_time_s, rel=1e-9)
    speed, believed = Conditions.realistic().speed_and_estimator()
    assert isinstance(believed, ArenaEstimates) and MixedEstimator(believed).estimate(job, cell).feasible
    spec = JobSpec(model="moe__2.4B", global_batch=256, iterations=10)
    truth = speed(spec, "a10+a40", 8, 2, _plan_of(one, cell))
    assert truth is not None and truth > 0


@pytest.mark.parametrize("vw", [None, 24])
def test_a_sharded_plan_with_virtual_workers_runs_as_estimated(vw):
    """gpt-2.7b on one a10 node and two a40 nodes fits only with its state sharded: the truth (the same
    store's estimator) times the plan's shares, micro-batches per virtual worker, virtual workers per
    rank and state slices as the estimate did; the same plan with its state replicated is timed
    without the slices' gathers."""
    believed = Estimator(open_store(":memory:"))
    speed = estimator_speed(believed, mixed=True)
    cell = mixed_cell((("a10", 1), ("a40", 2)), 2)
    est = MixedEstimator(believed).estimate(
        JobRequest("j", get_model("gpt-2.7b"), 24, 10, virtual_workers=vw, runtime="adaptive"), cell
    )
    assert est.feasible and est.plan.sharded, est.note
    spec = JobSpec(model="gpt-2.7b", global_batch=24, iterations=10)
    sharded = _plan_of(est, cell, vw)
    assert speed(spec, "a10+a40", 3, 2, sharded) == pytest.approx(est.iter_time_s, rel=1e-6)
    replicated = dataclasses.replace(sharded, state_sharding=None, state_shares=None)
    assert speed(spec, "a10+a40", 3, 2, replicated) < est.iter_time_s


def test_a_mixed_cell_without_a_truth_for_a_part_has_none():
    """Like a single-type cell the truth does not know: no time (the job fails at start)."""
    speed = table_speed(Table({("a40", 1, 2): 1.0}), mixed=True)
    assert speed(SPEC, "a40+a10", 2, 2, plan(None)) is None
    assert speed(SPEC, "a10", 1, 2, None) is None
    # without a plan naming the cell it ran in, or with another cell's key, none either
    full = table_speed(TABLE, mixed=True)
    assert full(SPEC, "a40+a10", 2, 2, None) is None
    assert full(SPEC, "a40+a10", 2, 2, dataclasses.replace(plan(None), cell="a40:1x2:pp1")) is None
    assert full(SPEC, "a40+a100", 2, 2, plan(None)) is None
    # not composed (arena-compat): the table's own answer for the joined type
    assert table_speed(TABLE)(SPEC, "a40+a10", 2, 2, plan(None)) is None
    truth = MixedEstimator(TableTruth(TABLE))
    assert mixed_time(truth, SPEC, "a40+a10", 2, 2, plan(None)) == pytest.approx(composed(16, 16), rel=1e-12)


def simulate(
    solver: SolverConfig | None = None, times: Table = TABLE, elastic: bool = False
) -> tuple[Simulator, SimRun]:
    """One cellsched job of 4 GPUs (only the mixed cell holds it) on PAIR.
    Not elastic: no virtual workers, so its batch shares are free; elastic,
    it gets V = 4 virtual workers (the cluster's GPUs), one per dp rank."""
    options = SimOptions(
        restart_per_gpu_s=0.0,
        restart_max_s=0.0,
        min_gpus=4,
        max_gpus=4,
        elastic=elastic,
        solver=solver or SolverConfig(),
    )
    trace = [TraceJob("j", 0.0, MODEL, BATCH, 100, 4, "a40")]
    sim = Simulator(trace, PAIR, "cellsched", speed=table_speed(times, mixed=True), estimator=times, options=options)
    return sim, sim.run()


def test_the_sims_policies_place_mixed_cells_and_the_job_runs_at_the_composed_truth():
    sim, run = simulate()
    assert isinstance(sim.estimator, MixedEstimator)
    (j,) = run.jobs
    assert j.finished and j.cells == ("a10+a40:2x2",) and run.meta["infeasible_starts"] == 0
    # the belief is the truth: its best shares
    best = MixedEstimator(TableTruth(TABLE)).estimate(
        JobRequest("j", get_model(MODEL), BATCH, 10, runtime="adaptive"), CELL
    )
    assert j.jct == pytest.approx(100 * composed(*best.plan.shares), rel=1e-6)
    assert j.kinds == {MIXED_DP: KindUse(1, pytest.approx(j.jct), pytest.approx(4 * j.jct))}
    (summary,) = summaries([run])
    assert summary.cell_kinds[MIXED_DP] == {
        "placements": 1,
        "jobs": 1,
        "job_hours": pytest.approx(j.jct / 3600),
        "gpu_hours": pytest.approx(4 * j.jct / 3600),
    }
    assert summary.cell_kinds[SINGLE]["placements"] == 0 == summary.cell_kinds[STATE_SHARDED]["placements"]


def test_with_one_virtual_worker_per_rank_the_shares_are_even_in_belief_and_truth():
    """V = 4 over 4 dp ranks: one virtual worker each, so the plan's shares
    are even and every rank takes 16 samples, as estimated."""
    sim, run = simulate(elastic=True)
    (j,) = run.jobs
    assert j.finished and j.jct == pytest.approx(100 * composed(16, 16), rel=1e-6)


def test_a_mixed_cell_without_truth_fails_at_start_and_the_job_is_kept():
    """The belief offers the mixed cell, the truth has no A10 time: the run
    fails at start (an infeasible start, as in an unknown single-type cell),
    and the job is requeued held, not lost: it stays in the queue unfinished."""
    believed = TABLE
    truth = Table({("a40", 1, 2): 1.0})
    options = SimOptions(restart_per_gpu_s=0.0, restart_max_s=0.0, min_gpus=4, max_gpus=4, elastic=False)
    trace = [TraceJob("j", 0.0, MODEL, BATCH, 100, 4, "a40")]
    sim = Simulator(trace, PAIR, "cellsched", speed=table_speed(truth, mixed=True), estimator=believed, options=options)
    run = sim.run()
    (j,) = run.jobs
    assert run.meta["infeasible_starts"] >= 1 and j.cells[0] == "a10+a40:2x2"
    assert not j.finished and j.kinds == {}  # a failed start is no placement
    sid = sim.slurm_ids["j"]
    assert sim.world.all_jobs[sid].state == "PENDING"  # requeued (held): kept, never cancelled


def test_mixed_cells_false_reaches_the_sims_policy():
    ((label, name, cfg),) = parse_policies(["cellsched:mixed_cells=false"], SimOptions().solver)
    assert (label, name, cfg.mixed_cells) == ("cellsched:mixed_cells=false", "cellsched", False)
    sim, run = simulate(cfg)
    (j,) = run.jobs
    assert not j.finished and j.cells == () and j.kinds == {}  # nothing else holds 4 GPUs
    assert run.meta["solver"]["mixed_cells"] is False


def test_state_sharding_is_a_policy_option_when_the_solver_has_it():
    fields = {f.name for f in dataclasses.fields(SolverConfig)}
    text = "cellsched:mixed_cells=false,state_sharding=false"
    if "state_sharding" in fields:
        ((_, _, cfg),) = parse_policies([text], SolverConfig())
        assert (cfg.mixed_cells, cfg.state_sharding) == (False, False)
    else:
        with pytest.raises(SimulateError, match="unknown solver key 'state_sharding'"):
            parse_policies([text], SolverConfig())


def test_arena_compat_keeps_the_estimator_unwrapped():
    trace = [TraceJob("j", 0.0, MODEL, BATCH, 100, 2, "a40")]
    sim = Simulator(trace, PAIR, "fcfs", options=SimOptions(arena_compat=True))
    assert not isinstance(sim.estimator, MixedEstimator)
    event = Simulator(trace, PAIR, "fcfs", speed=table_speed(TABLE, mixed=True), estimator=TABLE)
    assert isinstance(event.estimator, MixedEstimator) and event.estimator.inner is TABLE


def test_run_kinds_from_the_nodes_types_and_the_plan():
    one, two = ("a40",), ("a40", "a10")
    assert run_kinds(one, None) == (SINGLE,)
    assert run_kinds(one, JobPlan(pp=2, dp=2)) == (SINGLE,)
    assert run_kinds(two, JobPlan(dp=4)) == (MIXED_DP,)
    assert run_kinds(two, JobPlan(pp=2, dp=2)) == (MIXED_PIPELINE,)
    assert run_kinds(one, JobPlan(dp=2, state_sharding="even")) == (SINGLE, STATE_SHARDED)
    assert run_kinds(two, JobPlan(dp=2, state_shares=(2.0, 1.0))) == (MIXED_DP, STATE_SHARDED)
    assert run_kinds(two, JobPlan(dp=2, state_sharding="memory", state_shares=(2.0, 1.0))) == (MIXED_DP, STATE_SHARDED)
    assert run_kinds(two, JobPlan(dp=2, state_sharding="none")) == (MIXED_DP,)


def test_the_kinds_are_counted_in_results_json_and_the_text_report(tmp_path):
    hour = 3600.0
    jobs = (
        JobOutcome("A", 0.0, 0.0, 2 * hour, True, kinds={SINGLE: KindUse(2, 2 * hour, 8 * hour)}),
        JobOutcome(
            "B",
            0.0,
            0.0,
            hour,
            True,
            kinds={MIXED_DP: KindUse(1, hour, 6 * hour), STATE_SHARDED: KindUse(1, hour, 6 * hour)},
        ),
        JobOutcome("C", 0.0, 0.0, None, False, kinds={MIXED_PIPELINE: KindUse(1, 0.5 * hour, 4 * hour)}),
    )
    run = SimRun("cellsched", jobs, (), (), {"a40": 8, "a10": 8})
    (r,) = summaries([run])
    assert r.cell_kinds == {
        SINGLE: {"placements": 2, "jobs": 1, "job_hours": 2.0, "gpu_hours": 8.0},
        MIXED_DP: {"placements": 1, "jobs": 1, "job_hours": 1.0, "gpu_hours": 6.0},
        MIXED_PIPELINE: {"placements": 1, "jobs": 1, "job_hours": 0.5, "gpu_hours": 4.0},
        STATE_SHARDED: {"placements": 1, "jobs": 1, "job_hours": 1.0, "gpu_hours": 6.0},
    }
    write_report([run], tmp_path, plots=False)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["summary"]["cellsched"]["cell_kinds"][MIXED_PIPELINE]["job_hours"] == 0.5
    b = next(j for j in doc["runs"]["cellsched"]["jobs"] if j["job_id"] == "B")
    assert b["kinds"][MIXED_DP] == {"placements": 1, "seconds": hour, "gpu_seconds": 6 * hour}
    table = kinds_table([r])
    assert "| cellsched | 2 / 1 / 2.0 | 1 / 1 / 1.0 | 1 / 1 / 0.5 | 1 / 1 / 1.0 |" in table
    assert table in (tmp_path / "results.md").read_text()
