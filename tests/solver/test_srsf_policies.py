"""The SRSF baselines of Wang et al. 2020 (srsf-avoid, srsf-accept,
ada-srsf): their order, their cap on multi-node jobs per network card,
AdaDUAL's admission, and the node_placement option."""

from __future__ import annotations

import math

import pytest

from solver.contention import loaded_times
from solver.contract.models import get_model
from solver.estimator import EstimatorBase
from solver.policies import POLICIES, get_policy
from solver.types import (
    Cell,
    ClusterView,
    Estimate,
    EstimateSource,
    JobRequest,
    NodeView,
    ParallelPlan,
    Placement,
    ScheduleRequest,
    SolverConfig,
)

GPT = get_model("gpt-1.3b")
SRSF = ("srsf-avoid", "srsf-accept", "ada-srsf")


class OneSecond(EstimatorBase):
    """Every cell of up to 16 GPUs takes 1 s an iteration (DP-only); larger ones are infeasible."""

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        if cell.num_gpus > 16:
            return Estimate(cell, None, math.inf, 0.0, EstimateSource.NONE, "too large")
        return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), 1.0, 1.0, EstimateSource.MEASURED)


TIMES = OneSecond()


def cluster(free: dict[str, int] | None = None, nodes: int = 4, nic: float = 10.0) -> ClusterView:
    free = free or {}
    return ClusterView(
        tuple(NodeView(f"n{i}", "v100", 4, free.get(f"n{i}", 4), nic_gbps=nic) for i in range(1, nodes + 1))
    )


def job(jid: str, gpus: int, iterations: int = 1000, **kw) -> JobRequest:
    return JobRequest(
        jid, GPT, 64, iterations, requested_gpus=gpus, requested_gpu_type="v100", **{"runtime": "adaptive", **kw}
    )


def running(jid: str, nodes: tuple[str, ...], per_node: int, iterations: int = 10_000) -> JobRequest:
    cell = Cell("v100", len(nodes), per_node)
    plan = ParallelPlan(1, cell.num_gpus, 1)
    cur = Placement(jid, cell, tuple((n, per_node) for n in nodes), plan, 1.0)
    return job(jid, cell.num_gpus, iterations, current=cur)


def schedule(policy: str, cl: ClusterView, jobs, **cfg):
    req = ScheduleRequest(cl, tuple(jobs), config=SolverConfig(mixed_cells=False, **cfg))
    return get_policy(policy).schedule(req, TIMES)


def multi_per_node(placements) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in placements.values():
        if p.cell.num_nodes > 1:
            for n in p.node_names:
                out[n] = out.get(n, 0) + 1
    return out


def test_the_three_policies_are_registered():
    assert set(SRSF) <= set(POLICIES)
    assert {get_policy(n).name for n in SRSF} == set(SRSF)


@pytest.mark.parametrize("name", SRSF)
def test_the_shorter_job_starts_first_when_only_one_fits(name):
    cl = cluster({"n2": 0, "n3": 0, "n4": 0})  # 4 GPUs free on n1
    jobs = [job("long", 4, 5000, submit_time=0.0), job("short", 4, 100, submit_time=10.0)]
    r = schedule(name, cl, jobs)
    assert set(r.placements) == {"short"} and "long" in r.reasons
    # remaining service counts what is done: a big job nearly done goes first
    jobs = [job("big", 4, 5000, iterations_done=4950.0), job("small", 4, 100)]
    assert set(schedule(name, cl, jobs).placements) == {"big"}


def test_remaining_service_weighs_gpus():
    cl = cluster({"n3": 0, "n4": 0})  # n1, n2 free: 8 GPUs
    # 4 GPUs x 100 it (400) beats 8 GPUs x 60 it (480); both cannot fit
    jobs = [job("wide", 8, 60), job("narrow", 4, 100)]
    assert set(schedule("srsf-avoid", cl, jobs).placements) == {"narrow"}


@pytest.mark.parametrize("how", ["lwf-kappa", "first-fit"])
def test_srsf_avoid_never_puts_two_multi_node_jobs_on_one_card(how):
    cl = cluster({"n1": 2, "n2": 2, "n3": 2, "n4": 2}, nodes=4)  # no 1x4 fits: 4-GPU jobs span nodes
    jobs = [job(f"j{i}", 4, 100 * (i + 1)) for i in range(4)]
    r = schedule("srsf-avoid", cl, jobs, node_placement=how)
    assert max(multi_per_node(r.placements).values()) == 1
    assert len(r.placements) == 2  # 2x2 on n1+n2 and n3+n4; the others wait


def test_srsf_avoid_keeps_off_a_running_job_s_cards():
    cl = cluster({"n3": 0, "n4": 0})
    r = schedule("srsf-avoid", cl, [running("old", ("n1", "n2"), 2), job("new", 4)])
    assert set(r.placements) == {"old"} and "new" in r.reasons


@pytest.mark.parametrize("how", ["lwf-kappa", "first-fit"])
@pytest.mark.parametrize(("name", "kappa"), [("srsf-avoid", 1), ("srsf-accept", 2)])
def test_the_cap_on_multi_node_jobs_per_card_binds_with_gpus_left(name, kappa, how):
    cl = cluster(nodes=3)  # 3 GPUs can only run as 3x1 here: every job spans all three cards
    jobs = [job(f"j{i}", 3, 100 * (i + 1)) for i in range(4)]
    r = schedule(name, cl, jobs, node_placement=how)
    assert multi_per_node(r.placements) == {"n1": kappa, "n2": kappa, "n3": kappa}
    assert set(r.placements) == {f"j{i}" for i in range(kappa)}  # shortest first; 4 - kappa GPUs a node stay free
    assert "at most" in r.reasons["j3"]


def test_srsf_accept_places_more_multi_node_jobs_than_srsf_avoid():
    cl = cluster({"n1": 3, "n2": 3, "n3": 3, "n4": 3})  # 4 GPUs: 2x2 or 4x1
    jobs = [job(f"j{i}", 4, 100 * (i + 1)) for i in range(4)]
    avoid, accept = schedule("srsf-avoid", cl, jobs), schedule("srsf-accept", cl, jobs)
    assert max(multi_per_node(avoid.placements).values()) == 1 and len(avoid.placements) == 2
    assert max(multi_per_node(accept.placements).values()) == 2 and len(accept.placements) == 3


def test_srsf_accept_shares_with_one_running_job_but_not_two():
    cl = cluster({"n3": 0, "n4": 0})
    r = schedule("srsf-accept", cl, [running("old", ("n1", "n2"), 2), job("new", 4)])
    assert sorted(r.placements["new"].node_names) == ["n1", "n2"]
    two = [running("a", ("n1", "n2"), 1), running("b", ("n1", "n2"), 1), job("new", 4)]
    r = schedule("srsf-accept", cl, two)
    assert "new" not in r.placements and "new" in r.reasons


def test_ada_srsf_shares_when_that_finishes_sooner_and_waits_when_not():
    cl = cluster({"n3": 0, "n4": 0}, nic=1.0)  # only a 2x2 on the running job's cards fits; slow cards
    # a short new job next to one with long to go: sharing ends it sooner
    r = schedule("ada-srsf", cl, [running("old", ("n1", "n2"), 2, 10_000), job("new", 4, 100)])
    assert sorted(r.placements["new"].node_names) == ["n1", "n2"]
    # a long new job next to one almost done: waiting for the card ends it sooner
    r = schedule("ada-srsf", cl, [running("old", ("n1", "n2"), 2, 10), job("new", 4, 10_000)])
    assert "new" not in r.placements and "AdaDUAL" in r.reasons["new"]


def test_ada_srsf_admission_matches_the_contention_model():
    """On 1 Gb/s cards (heavy contention) the boundary is where the summed
    completions are equal: R new iterations at s_new, the old job at s_old
    while they share (at 1 s after), against the new job after the old one's
    1,000 s, alone. On 10 Gb/s cards sharing costs so little that even a long
    job is admitted."""
    mild = cluster({"n3": 0, "n4": 0})
    old = running("old", ("n1", "n2"), 2, 1000)
    assert "new" in schedule("ada-srsf", mild, [old, job("new", 4, 100_000)]).placements
    cl = cluster({"n3": 0, "n4": 0}, nic=1.0)
    old = running("old", ("n1", "n2"), 2, 1000)
    probe = job("new", 4, 1)
    cell, plan = Cell("v100", 2, 2), ParallelPlan(1, 4, 1)
    mine = Placement("new", cell, (("n1", 2), ("n2", 2)), plan, 1.0)
    times = loaded_times([(old, old.current, 1.0), (probe, mine, 1.0)], cl)
    s_new, s_old = times["new"], times["old"]
    assert s_new > 1.0 and s_old > 1.0
    # the new job ends first: R s_new + (R s_new + 1000 - R s_new / s_old) < 1000 + R + 1000
    limit = 1000 / (2 * s_new - s_new / s_old - 1.0)
    assert limit * 1.1 * s_new < 1000 * s_old  # within the regime where the new job ends first
    below, above = int(limit * 0.9), int(limit * 1.1) + 1
    assert "new" in schedule("ada-srsf", cl, [old, job("new", 4, below)]).placements
    assert "new" not in schedule("ada-srsf", cl, [old, job("new", 4, above)]).placements


def test_ada_srsf_prefers_free_cards_and_caps_at_two():
    cl = cluster({"n3": 2, "n4": 2})  # every node has 2 GPUs left once the running job has its own
    jobs = [running("old", ("n1", "n2"), 2), job("new", 4, 100)]
    r = schedule("ada-srsf", cl, jobs, node_placement="first-fit")
    assert sorted(r.placements["new"].node_names) == ["n3", "n4"]  # alone on its cards before sharing
    cl = cluster({"n3": 0, "n4": 0})
    two = [running("a", ("n1", "n2"), 1), running("b", ("n1", "n2"), 1), job("new", 4, 1)]
    assert "new" not in schedule("ada-srsf", cl, two).placements


def test_first_fit_and_lwf_kappa_choose_different_nodes():
    jobs = [running("old", ("n1", "n2"), 2), job("new", 4, 100)]
    cl = cluster({"n3": 2, "n4": 2})  # 2 GPUs left on every node: the new job runs 2x2
    lwf = schedule("srsf-accept", cl, jobs, node_placement="lwf-kappa").placements["new"]
    ff = schedule("srsf-accept", cl, jobs, node_placement="first-fit").placements["new"]
    assert sorted(lwf.node_names) == ["n3", "n4"]  # cards without a multi-node job
    assert sorted(ff.node_names) == ["n1", "n2"]  # the first nodes that fit, sharing (kappa 2 allows it)
    one = [job("small", 1, 100)]
    cl = cluster({"n2": 1, "n3": 2})
    assert schedule("srsf-avoid", cl, one, node_placement="first-fit").placements["small"].node_names == ("n1",)
    assert schedule("srsf-avoid", cl, one).placements["small"].node_names == ("n2",)  # one-node jobs pack


def test_a_bad_node_placement_is_refused():
    with pytest.raises(ValueError, match="node_placement"):
        SolverConfig(node_placement="best-fit")
    assert SolverConfig().node_placement == "lwf-kappa"


@pytest.mark.parametrize("name", SRSF)
def test_running_jobs_keep_their_placements_and_impossible_jobs_say_why(name):
    cl = cluster()
    old = running("old", ("n1", "n2"), 2)
    failed_everywhere = frozenset(f"v100:{n}gpus:pp1" for n in (1, 2, 4, 8, 16, 32, 64))
    r = schedule(name, cl, [old, job("huge", 64, excluded_cells=failed_everywhere), job("other", 2)])
    assert r.placements["old"] == old.current
    assert "huge" not in r.placements and "no feasible layout" in r.reasons["huge"]
    assert "other" in r.placements


class FitsFrom8(EstimatorBase):
    """A model whose data-parallel replica fits only on 8 or more GPUs (its
    optimizer state sharded over them), at 1 s an iteration."""

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        if cell.num_gpus < 8:
            return Estimate(cell, None, math.inf, 0.0, EstimateSource.NONE, "out of memory")
        return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), 1.0, 30.0, EstimateSource.MEASURED)


@pytest.mark.parametrize("name", SRSF)
def test_a_job_that_does_not_fit_at_its_gpu_count_runs_at_the_smallest_larger_count_that_fits(name):
    req = ScheduleRequest(cluster(), (job("big", 4),), config=SolverConfig(mixed_cells=False))
    r = get_policy(name).schedule(req, FitsFrom8())
    assert r.placements["big"].cell.num_gpus == 8  # not 4 (does not fit), nor 16 (fits, but larger)


@pytest.mark.parametrize("name", SRSF)
def test_a_job_that_failed_at_every_layout_of_its_count_runs_at_a_smaller_one(name):
    failed = frozenset({"v100:16gpus:pp1"})  # e.g. no truth for 4 x 4 GPUs: it failed there
    r = schedule(name, cluster(), [job("j", 16, excluded_cells=failed)])
    assert r.placements["j"].cell.num_gpus == 8  # 32 and 64 do not exist on 16 GPUs; 8 is the next down
