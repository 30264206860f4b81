"""Policies: cellsched (elastic and static), FCFS, Gavel, Sia."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from solver.contract.models import ModelSpec
from solver.estimator import EstimatorBase
from solver.placement import validate_plan
from solver.policies import get_policy
from solver.site import parse_reason
from solver.types import Cell, ClusterView, Estimate, JobRequest, NodeView, ParallelPlan, Placement, ScheduleRequest

MODEL = ModelSpec("tiny", "gpt", 4, 256, 4, 128, 1000, 1e7)


class TableEstimator(EstimatorBase):
    """Iteration times from a table {(job_id, cell key): seconds}; missing = infeasible."""

    def __init__(self, table: dict[tuple[str, str], float]) -> None:
        self.table = table

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        t = self.table.get((job.job_id, cell.key()))
        if t is None:
            return Estimate(cell, None, float("inf"), 0.0, "table", "no entry")
        return Estimate(cell, ParallelPlan(cell.pp, cell.num_gpus // cell.pp, 1), t, 1.0, "table")


def table_for(jobs, cluster, speed: dict[tuple[str, str], float], scaling: float = 0.9) -> TableEstimator:
    """Every cell up to 16 GPUs: base time / speed / GPUs ** scaling (x1.1 per extra stage, x1.1 off-node)."""
    table = {}
    for j in jobs:
        for t in cluster.gpu_types():
            if (j.job_id, t) not in speed:
                continue
            size = max(n.gpus_total for n in cluster.nodes_of(t))
            for gpus in (1, 2, 4, 8, 16):
                for per in (1, 2, 4, 8, 16):
                    if per > size or gpus % per or per > gpus:
                        continue
                    for pp in (1, 2, 4):
                        if gpus % pp == 0 and pp <= 4:
                            cell = Cell(t, gpus // per, per, pp)
                            table[(j.job_id, cell.key())] = (
                                10.0
                                / speed[(j.job_id, t)]
                                / gpus**scaling
                                * 1.1 ** (pp - 1)
                                * (1.1 if gpus > per else 1.0)
                            )
    return TableEstimator(table)


def job(jid: str, **kw) -> JobRequest:
    kw.setdefault("iterations", 1000)
    return JobRequest(jid, MODEL, 32, **{"runtime": "adaptive", **kw})


def running(j: JobRequest, cell: Cell, nodes, t: float, **kw) -> JobRequest:
    return replace(j, current=Placement(j.job_id, cell, tuple(nodes), ParallelPlan(1, cell.num_gpus, 1), t), **kw)


# ---------- cellsched ----------

TWO_TYPES = ClusterView((NodeView("a100-0", "a100", 1, 1), NodeView("a10-0", "a10", 1, 1)))


def move_case(fast: float, **jobkw):
    """One 1-GPU job running on the A10; the A100 is `fast` times faster."""
    j = job("j", max_gpus=1, **jobkw)
    est = table_for([j], TWO_TYPES, {("j", "a100"): fast, ("j", "a10"): 1.0})
    cell = Cell("a10", 1, 1)
    j = running(j, cell, [("a10-0", 1)], est.table[("j", cell.key())])
    return j, est


#: SolverConfig fields of the move cases: a move keeps 80% of its value
MOVE = dict(
    fairness_p=1.0,
    w_short_jobs=0.0,
    w_age=0.0,
    restart_penalty=1.0,
    default_restart_cost_s=60.0,
    horizon_s=300.0,
    horizon_remaining=False,
)


@pytest.mark.parametrize("fast,moves", [(1.1, False), (2.0, True)])
def test_elastic_job_moves_only_when_gain_pays_restart(fast, moves, exact_config):
    j, est = move_case(fast, elastic=True)
    rep = get_policy("cellsched").schedule(ScheduleRequest(TWO_TYPES, (j,), config=exact_config(**MOVE)), est)
    validate_plan(TWO_TYPES, rep.placements)
    assert rep.placements["j"].cell.gpu_type == ("a100" if moves else "a10")
    # stay is worth u(a10) = 1/fast, a move 0.8 * u(a100) = 0.8
    assert rep.objective == pytest.approx(0.8 if moves else 1 / fast, rel=1e-3)


@pytest.mark.parametrize(
    "iterations,running_since,moves",
    [
        (10, None, False),  # 10 s left: the 300 s horizon
        (1_000_000, None, True),  # days left, how long it stayed not known: its remaining time
        (1_000_000, -86_400.0, True),  # days left and a day where it runs
        (1_000_000, -30.0, False),  # days left, but it (re)started 30 s ago: the 300 s horizon
        (1_000_000, -900.0, True),  # 900 s there: the move keeps 1 - 200/900 > 1/2
    ],
)
def test_a_restart_is_weighed_over_how_long_the_move_may_last(iterations, running_since, moves, exact_config):
    """A 200 s restart keeps 1/3 of a move's value over a 300 s horizon, so
    a job twice as fast on the A100 stays. With days of work left the horizon
    is the shorter of the job's remaining time and how long it has stayed in
    its current run: a job moved a moment ago is not moved again for a gain
    a restart does not repay over horizon_s (the thrash of a loaded cluster:
    a long job moved every round, its restart never repaid)."""
    j, est = move_case(2.0, elastic=True, restart_cost_s=200.0, iterations=iterations)
    j = replace(j, running_since=running_since)
    cfg = exact_config(**{**MOVE, "horizon_remaining": True})
    rep = get_policy("cellsched").schedule(ScheduleRequest(TWO_TYPES, (j,), config=cfg, now=0.0), est)
    assert rep.placements["j"].cell.gpu_type == ("a100" if moves else "a10")


def test_measured_restart_cost_overrides_default(exact_config):
    j, est = move_case(2.0, elastic=True, restart_cost_s=200.0)  # a move keeps 1/3 < 1/2
    rep = get_policy("cellsched").schedule(ScheduleRequest(TWO_TYPES, (j,), config=exact_config(**MOVE)), est)
    assert rep.placements["j"].cell.gpu_type == "a10"


@pytest.mark.parametrize(
    "policy,elastic,extra",
    [("cellsched", False, {}), ("cellsched-static", True, {}), ("cellsched", True, {"allow_resize": False})],
)
def test_running_job_keeps_placement(policy, elastic, extra, exact_config):
    j, est = move_case(10.0, elastic=elastic)
    rep = get_policy(policy).schedule(ScheduleRequest(TWO_TYPES, (j,), config=exact_config(**MOVE, **extra)), est)
    assert rep.placements["j"] == j.current


@pytest.mark.parametrize(
    "runtime,waited,extra,placed",
    [
        ("ddp", 0.0, {"settle_wait": True}, None),  # keeps its first cell: waits for the A100
        ("ddp", 7_499.0, {"settle_wait": True}, None),  # the A10 would add 7,500 s to its run
        ("ddp", 7_501.0, {"settle_wait": True}, "a10"),  # it has waited longer than that
        ("ddp", 0.0, {}, "a10"),  # off by default
        ("sharded", 0.0, {"settle_wait": True}, "a10"),  # answers the checkpoint signal: may move later
    ],
)
def test_a_job_that_keeps_its_first_cell_waits_as_long_as_a_slower_one_costs(
    runtime, waited, extra, placed, exact_config
):
    """The A100 is busy and 4x faster (2.5 s against 10 s an iteration, 1,000
    iterations); a ddp job that has not registered its checkpoint hook will
    not move once started, so it takes the free A10 only once it has waited
    the 7,500 s the A10 adds to its run (JobRequest.settles)."""
    busy = job("busy", max_gpus=1)
    j = job("j", max_gpus=1, runtime=runtime, submit_time=-waited)
    est = table_for([busy, j], TWO_TYPES, {("busy", "a100"): 1.0, ("j", "a100"): 4.0, ("j", "a10"): 1.0})
    assert (est.table[("j", "a100:1x1:pp1")], est.table[("j", "a10:1x1:pp1")]) == (2.5, 10.0)
    busy = running(busy, Cell("a100", 1, 1), [("a100-0", 1)], 10.0)
    cfg = exact_config(**MOVE, **extra)
    rep = get_policy("cellsched").schedule(ScheduleRequest(TWO_TYPES, (busy, j), config=cfg, now=0.0), est)
    assert rep.placements["busy"] == busy.current
    if placed is None:
        assert "j" not in rep.placements
        assert parse_reason(rep.reasons["j"]) == ("settling", {"waited": f"{waited:.0f}", "cell": "a100:1x1:pp1"})
    else:
        assert rep.placements["j"].cell.gpu_type == placed


def test_a_job_that_keeps_its_first_cell_is_not_made_to_hold_out_for_more_gpus(exact_config):
    """How many GPUs it gets stays the objective's choice: with one GPU type
    free, a fresh ddp job gets the same cell whether it settles or not."""
    cluster = ClusterView((NodeView("a100-0", "a100", 4, 4), NodeView("a100-1", "a100", 4, 4)))
    j = job("j", max_gpus=8, runtime="ddp", submit_time=0.0)
    others = [job(f"o{k}", max_gpus=8, runtime="sharded", submit_time=0.0) for k in range(3)]
    est = table_for([j, *others], cluster, {(x.job_id, "a100"): 1.0 for x in (j, *others)}, scaling=0.5)
    cells = {}
    for wait in (True, False):
        cfg = exact_config(settle_wait=wait)
        rep = get_policy("cellsched").schedule(ScheduleRequest(cluster, (j, *others), config=cfg, now=0.0), est)
        cells[wait] = {k: p.cell for k, p in rep.placements.items()}
    assert cells[True] == cells[False] and cells[True]["j"].num_gpus < 8


def test_non_elastic_running_jobs_are_never_stopped_for_pending_ones(exact_config):
    cluster = ClusterView((NodeView("a100-0", "a100", 4, 4),))
    r = job("r", max_gpus=4)
    p = job("p", max_gpus=4, submit_time=-1e6)  # old and waiting
    est = table_for([r, p], cluster, {("r", "a100"): 1.0, ("p", "a100"): 5.0})
    cell = Cell("a100", 1, 4)
    r = running(r, cell, [("a100-0", 4)], est.table[("r", cell.key())])
    rep = get_policy("cellsched").schedule(ScheduleRequest(cluster, (r, p), config=exact_config(**MOVE), now=0.0), est)
    assert rep.placements["r"] == r.current and "p" not in rep.placements and rep.reasons["p"]


def random_cluster_and_jobs(seed: int, n_jobs: int = 12):
    rng = random.Random(seed)
    nodes = [NodeView(f"a100-{i}", "a100", 4, rng.choice([4, 4, 3])) for i in range(3)]
    nodes += [NodeView(f"v100-{i}", "v100", 8, 8) for i in range(2)]
    nodes += [NodeView(f"a10-{i}", "a10", 2, 2) for i in range(4)]
    cluster = ClusterView(tuple(nodes))
    jobs = [
        job(
            f"j{i}",
            elastic=True,
            submit_time=float(i),
            iterations=rng.randint(100, 5000),
            requested_gpus=rng.choice([1, 2, 4]),
            requested_gpu_type=rng.choice(["a100", "v100", "a10"]),
        )
        for i in range(n_jobs)
    ]
    speed = {
        (j.job_id, t): s * rng.uniform(0.7, 1.3) for j in jobs for t, s in (("a100", 3), ("v100", 1.5), ("a10", 1))
    }
    return cluster, jobs, table_for(jobs, cluster, speed)


@pytest.mark.parametrize("name", ["cellsched", "cellsched-static", "fcfs", "fcfs-backfill", "gavel", "sia"])
def test_every_policy_gives_a_placeable_deterministic_plan(name, exact_config):
    cluster, jobs, est = random_cluster_and_jobs(1)
    req = ScheduleRequest(cluster, tuple(jobs), config=exact_config(seed=3), now=100.0)
    a = get_policy(name).schedule(req, est)
    b = get_policy(name).schedule(req, est)
    validate_plan(cluster, a.placements)
    assert a.placements == b.placements and a.status == b.status
    assert a.placements, f"{name} placed nothing"
    assert all(j.job_id in a.placements or a.reasons.get(j.job_id) for j in jobs)


def test_a_pickled_cellsched_drops_its_memos_and_plans_the_same(exact_config):
    """A simulation checkpoint pickles the policy: its memos are caches, left out
    (and rebuilt on use), so the copy plans as the original would have."""
    import pickle

    cluster, jobs, est = random_cluster_and_jobs(1)
    req = ScheduleRequest(cluster, tuple(jobs), config=exact_config(seed=3), now=100.0)
    pol = get_policy("cellsched-static")
    first = pol.schedule(req, est)
    assert pol._memo and pol._base
    copy = pickle.loads(pickle.dumps(pol))
    assert (copy.elastic, copy.name, copy._memo, copy._base) == (False, "cellsched-static", {}, {})
    assert copy.schedule(req, est).placements == pol.schedule(req, est).placements == first.placements


class ByType(EstimatorBase):
    """The same estimate for every job: seconds per iteration by GPU type."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        t = self.seconds.get(cell.gpu_type)
        if t is None or cell.num_gpus != 1:
            return Estimate(cell, None, float("inf"), 0.0, "table", "no entry")
        return Estimate(cell, ParallelPlan(1, 1, 1), t, 1.0, "table")


def test_cellsched_follows_a_jobs_calibration_from_round_to_round(exact_config):
    """cellsched memoises a job shape's cells and estimates; a job's
    calibration, new this round, still reaches them: x, seen 4x slower than
    estimated on the a100, moves its choice to the a10 (where its own
    deviation makes it 1.8x slower: 5.4 s against 8 s)."""
    from solver.calibration import CalibratedEstimator, Calibration, Observation

    cluster = ClusterView((NodeView("a100-0", "a100", 1, 1), NodeView("a10-0", "a10", 1, 1)))
    x = job("x", requested_gpus=1, max_gpus=1)
    policy, est = get_policy("cellsched"), CalibratedEstimator(ByType({"a100": 2.0, "a10": 3.0}))
    first = policy.schedule(ScheduleRequest(cluster, (x,), config=exact_config()), est)
    assert first.placements["x"].cell.gpu_type == "a100"
    est.calibration = Calibration([Observation("x", "u", MODEL.name, "a100", 4.0, samples=3)])
    second = policy.schedule(ScheduleRequest(cluster, (x,), config=exact_config()), est)
    assert second.placements["x"].cell.gpu_type == "a10"


class CountingByType(ByType):
    """ByType that counts its estimates."""

    def __init__(self, seconds: dict[str, float]) -> None:
        super().__init__(seconds)
        self.calls = 0

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        self.calls += 1
        return super().estimate(job, cell)


def test_cellsched_recalibrates_a_shape_without_estimating_it_again(exact_config):
    """A new calibration each round costs a factor per cell, not a fresh estimate: the inner
    estimator is asked once per cell of a shape, and the estimates cellsched then values are
    the calibrated estimator's own, factor and note included."""
    from solver.calibration import CalibratedEstimator, Calibration, Observation

    cluster = ClusterView((NodeView("a100-0", "a100", 1, 1), NodeView("a10-0", "a10", 1, 1)))
    x = job("x", requested_gpus=1, max_gpus=1)
    inner = CountingByType({"a100": 2.0, "a10": 3.0})
    policy, est = get_policy("cellsched"), CalibratedEstimator(inner)
    config = exact_config()
    policy.schedule(ScheduleRequest(cluster, (x,), config=config), est)
    asked = inner.calls
    assert asked > 0
    for ratio in (4.0, 1.5, 0.5):
        est.calibration = Calibration([Observation("x", "u", MODEL.name, "a100", ratio, samples=3)])
        policy.schedule(ScheduleRequest(cluster, (x,), config=config), est)
        _, kept, *_ = policy._cells(x, cluster, est, config)
        assert kept == [est.estimate(x, e.cell) for e in kept]  # the calibrated estimator's own
        assert any("calibrated" in e.note for e in kept)
    assert inner.calls == asked + 3 * len(kept)  # only the checks above asked it again


def test_cellsched_round_trip_with_running_jobs_is_stable(exact_config):
    cluster, jobs, est = random_cluster_and_jobs(2)
    pol = get_policy("cellsched")
    req = ScheduleRequest(cluster, tuple(jobs), config=exact_config(), now=100.0)
    first = pol.schedule(req, est)
    now_running = tuple(replace(j, current=first.placements.get(j.job_id)) for j in jobs)
    second = pol.schedule(replace(req, jobs=now_running, previous=first.placements), est)
    validate_plan(cluster, second.placements)
    assert second.placements == first.placements  # nothing changed, so nothing pays a restart


def test_cellsched_uses_all_gpus_when_jobs_can_grow(exact_config):
    cluster, jobs, est = random_cluster_and_jobs(3, n_jobs=3)
    rep = get_policy("cellsched").schedule(ScheduleRequest(cluster, tuple(jobs), config=exact_config()), est)
    assert len(rep.placements) == 3 and rep.status == "OPTIMAL"
    assert sum(p.cell.num_gpus for p in rep.placements.values()) > 3


# ---------- FCFS ----------

FCFS_CLUSTER = ClusterView(
    tuple(NodeView(f"a100-{i}", "a100", 4, 4) for i in range(2)) + (NodeView("v100-0", "v100", 4, 4),)
)


def fcfs_jobs():
    spec = [("j1", "a100", 4), ("j2", "a100", 8), ("j3", "a100", 2), ("j4", "v100", 2)]
    jobs = [job(j, requested_gpu_type=t, requested_gpus=n, submit_time=float(i)) for i, (j, t, n) in enumerate(spec)]
    running_j1 = None
    return jobs, table_for(jobs, FCFS_CLUSTER, {(j.job_id, t): 1.0 for j in jobs for t in ("a100", "v100")}), running_j1


def test_fcfs_is_strict_per_gpu_type():
    jobs, est, _ = fcfs_jobs()
    rep = get_policy("fcfs").schedule(ScheduleRequest(FCFS_CLUSTER, tuple(jobs)), est)
    validate_plan(FCFS_CLUSTER, rep.placements)
    assert set(rep.placements) == {"j1", "j4"}  # j2 (8 x A100) cannot start; j3 waits behind it
    assert "FCFS" in rep.reasons["j3"]
    assert rep.placements["j1"].cell == Cell("a100", 1, 4)  # best locality


def test_fcfs_backfill_starts_later_jobs_that_fit():
    jobs, est, _ = fcfs_jobs()
    rep = get_policy("fcfs-backfill").schedule(ScheduleRequest(FCFS_CLUSTER, tuple(jobs)), est)
    assert set(rep.placements) == {"j1", "j3", "j4"}


def test_fcfs_relaxes_locality_and_keeps_running_jobs():
    cluster = ClusterView(tuple(NodeView(f"a100-{i}", "a100", 4, 4) for i in range(4)))
    r = job("r", requested_gpu_type="a100", requested_gpus=6)
    p = job("p", requested_gpu_type="a100", requested_gpus=8, submit_time=1.0)
    est = table_for([r, p], cluster, {("r", "a100"): 1.0, ("p", "a100"): 1.0})
    r = running(r, Cell("a100", 3, 2), [(f"a100-{i}", 2) for i in range(3)], 1.0)  # free GPUs: 2, 2, 2, 4
    rep = get_policy("fcfs").schedule(ScheduleRequest(cluster, (r, p)), est)
    validate_plan(cluster, rep.placements)
    assert rep.placements["r"] == r.current
    assert rep.placements["p"].cell == Cell("a100", 4, 2)  # 2x4 does not fit any more, 4x2 does


def test_fcfs_feasible_rule_is_respected():
    jobs, est, _ = fcfs_jobs()

    def never_v100(j, c):
        return c.gpu_type != "v100"

    rep = get_policy("fcfs", feasible=never_v100).schedule(ScheduleRequest(FCFS_CLUSTER, tuple(jobs)), est)
    assert "j4" not in rep.placements and "feasible" in rep.reasons["j4"]


# ---------- Gavel and Sia ----------


def hetero_case():
    cluster = ClusterView((NodeView("a100-0", "a100", 1, 1), NodeView("a10-0", "a10", 1, 1)))
    x = job("x", requested_gpus=1, max_gpus=1)
    y = job("y", requested_gpus=1, max_gpus=1)
    speed = {("x", "a100"): 10.0, ("x", "a10"): 1.0, ("y", "a100"): 1.2, ("y", "a10"): 1.0}
    return cluster, (x, y), table_for([x, y], cluster, speed)


@pytest.mark.parametrize("name", ["gavel", "sia"])
def test_baselines_prefer_the_faster_gpu_type(name, exact_config):
    cluster, jobs, est = hetero_case()
    rep = get_policy(name).schedule(ScheduleRequest(cluster, jobs, config=exact_config()), est)
    validate_plan(cluster, rep.placements)
    assert rep.placements["x"].cell.gpu_type == "a100"  # x gains 10x there, y only 1.2x
    assert rep.placements["y"].cell.gpu_type == "a10"
    assert all(p.plan.pp == 1 and p.plan.tp == 1 for p in rep.placements.values())


@pytest.mark.parametrize("fast,moves", [(1.4, False), (2.0, True)])
def test_sia_moves_a_running_job_only_when_the_gain_pays_its_restart(fast, moves, exact_config):
    """Sia's move rule: a running job that changes configuration is worth
    utility * (1 - restart cost / horizon). Worked by hand with p = 1/2: on
    its reference cell (the A100, fastest of the 1-GPU cells) the job's
    utility is 1, on the A10 sqrt(1 / fast); a move pays 1 - 60/300 = 0.8.
    So it stays for fast = 1.4 (sqrt(1/1.4) = 0.845 > 0.8) and moves for
    fast = 2 (0.707 < 0.8). Without the restart penalty it would move for any
    fast > 1."""
    j, est = move_case(fast, elastic=True)
    rep = get_policy("sia", p=0.5).schedule(ScheduleRequest(TWO_TYPES, (j,), config=exact_config(**MOVE)), est)
    validate_plan(TWO_TYPES, rep.placements)
    assert rep.placements["j"].cell.gpu_type == ("a100" if moves else "a10")
    stay, move = (1 / fast) ** 0.5, 1.0 - 60.0 / 300.0
    assert rep.objective == pytest.approx(max(stay, move), rel=1e-3)


@pytest.mark.parametrize("name", ["gavel", "sia"])
def test_baselines_respect_the_feasible_rule(name, exact_config):
    cluster, jobs, est = hetero_case()
    rep = get_policy(name, feasible=lambda j, c: not (j.job_id == "x" and c.gpu_type == "a100")).schedule(
        ScheduleRequest(cluster, jobs, config=exact_config()), est
    )
    assert rep.placements["x"].cell.gpu_type == "a10"


def test_gavel_max_min_serves_the_least_served_job_first():
    cluster = ClusterView((NodeView("a100-0", "a100", 1, 1),))
    old = job("old", requested_gpus=1, iterations_done=900.0, submit_time=0.0)
    new = job("new", requested_gpus=1, submit_time=0.0)
    est = table_for([old, new], cluster, {("old", "a100"): 1.0, ("new", "a100"): 1.0})
    rep = get_policy("gavel").schedule(ScheduleRequest(cluster, (old, new), now=1000.0), est)
    assert set(rep.placements) == {"new"}


@pytest.mark.parametrize("name", ["cellsched", "gavel", "sia"])
def test_no_policy_preempts_a_running_job(name, exact_config):
    """`new` would win the only GPU (Gavel: less served; cellsched: shorter
    and older), but the controller never preempts: the running elastic job
    keeps it (and any plan that dropped it would be rejected)."""
    cluster = ClusterView((NodeView("a100-0", "a100", 1, 1),))
    old = job(
        "old", requested_gpus=1, max_gpus=1, elastic=True, iterations_done=900.0, iterations=10**6, submit_time=999.0
    )
    new = job("new", requested_gpus=1, max_gpus=1, submit_time=0.0, iterations=10)
    est = table_for([old, new], cluster, {("old", "a100"): 0.2, ("new", "a100"): 5.0})
    old = running(old, Cell("a100", 1, 1), [("a100-0", 1)], est.estimate(old, Cell("a100", 1, 1)).iter_time_s)
    rep = get_policy(name).schedule(ScheduleRequest(cluster, (old, new), config=exact_config(), now=1000.0), est)
    validate_plan(cluster, rep.placements)
    assert set(rep.placements) == {"old"} and rep.placements["old"].nodes == (("a100-0", 1),)


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown policy"):
        get_policy("nope")


@pytest.mark.parametrize(
    "name",
    ["cellsched", "cellsched-static", "fcfs", "fcfs-backfill", "gavel", "sia", "srsf-avoid", "srsf-accept", "ada-srsf"],
)
def test_each_policy_answers_to_the_name_it_is_registered_under(name):
    # the name is what metrics, the simulator's output and the config use (mutation benchmark: a survivor)
    assert get_policy(name).name == name
