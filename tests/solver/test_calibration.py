"""Online calibration: observed / estimated ratios turn into factors per
(job, cell): the job's own on its type, the group's (one vote per user,
shrunk) elsewhere, the job's own deviation carried along."""

from __future__ import annotations

import dataclasses
import math

import pytest

from solver.calibration import CalibratedEstimator, Calibration, Observation, running_ratio
from solver.contract.models import get_model
from solver.estimator import EstimatorBase
from solver.mixed import mixed_cell
from solver.types import Cell, Estimate, EstimateSource, JobRequest, ParallelPlan

A100, A40 = Cell("a100", 1, 4, 1), Cell("a40", 2, 2, 1)


def test_running_ratio_is_a_geometric_mean_that_forgets_after_memory_rounds():
    assert running_ratio(None, 2.0) == (2.0, 1)
    r, n = running_ratio((2.0, 1), 0.5)
    assert n == 2 and r == pytest.approx(1.0)
    r, n = running_ratio((4.0, 50), 1.0, memory=4)  # the old mean weighs 3 rounds, not 50
    assert n == 51 and r == pytest.approx(4.0 ** (3 / 4))


def test_a_job_on_its_own_type_takes_its_own_ratio():
    cal = Calibration([Observation("1", "alice", "m", "a100", 2.0, samples=1)])
    assert cal.factor("1", "m", A100) == pytest.approx(2.0)
    assert cal.factor("1", "m", Cell("a100", 2, 4, 2)) == pytest.approx(2.0)  # any cell of the type


def test_other_types_get_the_group_and_the_jobs_own_deviation():
    obs = [
        Observation("1", "alice", "m", "a100", 2.0, samples=3),  # job 1: slow on a100
        Observation("2", "bob", "m", "a100", 1.0, samples=3),
        Observation("3", "carol", "m", "a100", 1.0, samples=3),
        Observation("4", "bob", "m", "a40", 1.5, samples=1),
    ]
    cal = Calibration(obs)
    w3 = 3 / 4
    # a100: the users' medians are log 2, 0, 0 -> 0; a40: bob's log 1.5, shrunk by W / (W + 1), W = 1/2
    assert cal.group("m", "a100") == pytest.approx(1.0)
    g40 = math.log(1.5) * 0.5 / 1.5
    assert cal.group("m", "a40") == pytest.approx(math.exp(g40))
    # job 1 on a40: the a40 group times its own deviation on a100 (log 2 - 0), weighted n / (n + 1)
    assert cal.factor("1", "m", A40) == pytest.approx(math.exp(g40 + w3 * math.log(2.0)))
    assert cal.factor("9", "m", A40) == pytest.approx(math.exp(g40))  # a job never seen: the group
    assert cal.factor("9", "other", A40) == 1.0  # another model: nothing known


def test_one_user_has_one_vote_however_many_jobs():
    many = [Observation(str(i), "mallory", "m", "a100", 10.0, samples=10) for i in range(20)]
    fair = [Observation("a", "alice", "m", "a100", 1.0, 10), Observation("b", "bob", "m", "a100", 1.0, 10)]
    cal = Calibration(many + fair)
    assert cal.group("m", "a100") == pytest.approx(1.0)
    assert cal.factor("a", "m", A40) == 1.0


def test_factors_are_bounded_and_a_mixed_cell_takes_its_slowest_part():
    cal = Calibration(
        [Observation("1", "u", "m", "a100", 1000.0), Observation("2", "u", "m", "a40", 0.5)], max_factor=10.0
    )
    assert cal.factor("1", "m", A100) == pytest.approx(10.0)
    obs = [Observation("1", "u", "m", "a100", 1.2, 3), Observation("1", "u", "m", "a40", 1.6, 3)]
    assert Calibration(obs).factor("1", "m", mixed_cell((("a100", 1), ("a40", 1)), 2)) == pytest.approx(1.6)


class _Fixed(EstimatorBase):
    """An estimator: 2 s per iteration everywhere, a100 only."""

    def estimate(self, job, cell):
        if cell.gpu_type != "a100":
            return Estimate(cell, None, math.inf, 0.0, EstimateSource.NONE, "no data")
        return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), 2.0, 1.0, EstimateSource.ANALYTIC, "model")


def test_the_calibrated_estimator_scales_feasible_times_only_and_passes_the_rest_through():
    job = JobRequest("1", get_model("gpt-350m"), 8, 10, runtime="adaptive")
    est = CalibratedEstimator(_Fixed())
    assert est.estimate(job, A100).iter_time_s == 2.0 and est.estimate_shape(job, A100).iter_time_s == 2.0
    est.calibration = Calibration([Observation("1", "u", "gpt-350m", "a100", 1.5)])
    got = est.estimate(job, A100)
    assert got.iter_time_s == pytest.approx(3.0) and got.note == "model; x1.5 calibrated"
    # the shape's estimate is the inner one; the job's factor comes on top (adjust)
    assert est.estimate_shape(job, A100).iter_time_s == 2.0
    assert est.adjust(job, [est.estimate_shape(job, A100)]) == [got]
    assert not est.estimate(job, A40).feasible


def test_a_scaled_estimate_is_replace_of_its_time_and_note_every_other_field_kept():
    base = Estimate(A40, ParallelPlan(1, 2, 2), 2.0, 11.5, EstimateSource.COMPOSED, "composed", state_gb=3.25)
    assert [f.name for f in dataclasses.fields(Estimate)] == [  # a new field: `scaled` must carry it
        "cell", "plan", "iter_time_s", "mem_per_gpu_gb", "source", "note", "state_gb"
    ]  # fmt: skip
    got = base.scaled(1.5, "x1.5")
    assert got == dataclasses.replace(base, iter_time_s=3.0, note="x1.5")


def test_the_estimate_cache_follows_the_profile_store(tmp_path):
    """A profile imported into the store (by another process too) replaces a
    cached estimate at the next refresh; an unchanged store keeps the cache."""
    from solver.contract.profiles.records import CellRecord
    from solver.contract.profiles.store import ProfileStore
    from solver.estimator import Estimator

    path = tmp_path / "p.sqlite"
    store = ProfileStore(path)
    store.put_cells([CellRecord("gpt-350m", 8, "a10", 1, 1, 0.2)])
    est = Estimator(store)
    job, cell = JobRequest("1", get_model("gpt-350m"), 8, 10, runtime="adaptive"), Cell("a10", 1, 1, 1)
    assert est.estimate(job, cell).iter_time_s == 0.2 and not est.refresh()
    other = ProfileStore(path)
    other.put_cells([CellRecord("gpt-350m", 8, "a10", 1, 1, 0.5)])
    other.close()
    assert est.estimate(job, cell).iter_time_s == 0.2  # cached until the next refresh
    assert est.refresh() and est.estimate(job, cell).iter_time_s == 0.5
    store.put_cells([CellRecord("gpt-350m", 8, "a10", 1, 1, 0.3)])  # this process's own import
    assert est.refresh() and est.estimate(job, cell).iter_time_s == 0.3 and not est.refresh()


def test_the_key_tells_apart_what_the_factors_tell_apart():
    obs = [Observation("1", "alice", "m", "a100", 2.0, 3), Observation("2", "bob", "m", "a40", 1.5, 1)]
    cal = Calibration(obs)
    assert cal.key("8", "m") == cal.key("9", "m")  # never seen: the model's group factors alone
    assert cal.key("1", "m") != cal.key("9", "m") and cal.key("9", "m") != cal.key("9", "other")
    twin = Calibration(list(obs))
    for jid, model in (("1", "m"), ("8", "m"), ("9", "other")):
        assert twin.key(jid, model) == cal.key(jid, model)
        assert [twin.factor(jid, model, c) for c in (A100, A40)] == [cal.factor(jid, model, c) for c in (A100, A40)]
    est = CalibratedEstimator(_Fixed())
    assert est.job_key(JobRequest("1", get_model("gpt-350m"), 8, 10, runtime="adaptive")) == ()  # uncalibrated
    est.calibration = cal
    m = dataclasses.replace(get_model("gpt-350m"), name="m")
    assert (
        est.job_key(JobRequest("1", m, 8, 10, runtime="adaptive"))
        == cal.key("1", "m")
        != est.job_key(JobRequest("2", m, 8, 10, runtime="adaptive"))
    )
