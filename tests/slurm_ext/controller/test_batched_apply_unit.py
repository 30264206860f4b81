"""A round's batched apply. Cut short between any two steps: for every write
the batch makes to Slurm, the controller "dies" (an exception nothing
catches, standing for SIGKILL) just before it and just after it; a fresh
controller on the same state file then finishes the round. Every job ends
released exactly once with one applied plan, and none is left held. Out
of time (the apply budget): the rest is journalled and the next round
carries it out.

The simulated Slurm makes the kill points exact; the real-cluster version
(random SIGKILLs, some inside batches) is test_controller_slurm's
test_sigkill_at_random_points_loses_nothing."""

from __future__ import annotations

from collections import Counter

import pytest
from controller_support import DiesAt, Killed

from slurm_ext.backends.base import SubmitRequest
from slurm_ext.config import from_dict
from slurm_ext.controller.reconcile import DEFERRED
from slurm_ext.controller.round import Controller
from slurm_ext.jobspec import JobSpec
from slurm_ext.sim.backend import SimBackend
from slurm_ext.sim.types import ClusterSpec, NodeGroup
from slurm_ext.sim.world import SimWorld
from slurm_ext.state import PlanStatus, StateStore

CLUSTER = ClusterSpec((NodeGroup("a100", 4, 4), NodeGroup("v100", 2, 8)))


def cluster_with_jobs() -> tuple[SimWorld, SimBackend, list[str]]:
    world = SimWorld(CLUSTER, speed=lambda spec, gpu_type, nodes, gpus_per_node, plan: 1.0)  # 1 s an iteration
    sim = SimBackend(world)
    spec = JobSpec(model="gpt-350m", global_batch=32, iterations=10_000)
    ids = [
        sim.submit(SubmitRequest(script="job.sh", gres_per_node=1, hold=True, comment=spec.to_comment()))
        for _ in range(5)
    ]
    return world, sim, ids


def controller(tmp_path, backend, world: SimWorld, **cc) -> Controller:
    config = from_dict({"controller": {"state_path": str(tmp_path / "state.sqlite"), "kick_file": "", **cc}})
    return Controller(config, backend=backend, state=StateStore(tmp_path / "state.sqlite"), clock=lambda: world.now)


def writes_of_one_round(tmp_path) -> int:
    world, sim, _ = cluster_with_jobs()
    probe = DiesAt(sim, None)
    ctl = controller(tmp_path / "probe", probe, world)
    assert ctl.round().status == "ok"
    ctl.state.close()
    return probe.writes


def test_the_probe_round_makes_the_writes_of_a_batch(tmp_path):
    assert writes_of_one_round(tmp_path) == 3  # update them all, release them all, tidy their AdminComments


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("at", [1, 2, 3])
def test_a_batch_cut_short_at_any_step_is_finished_by_the_next_start(tmp_path, at, after):
    world, sim, ids = cluster_with_jobs()
    released: Counter = Counter()
    first = controller(tmp_path, DiesAt(sim, at, after=after, released=released), world)
    with pytest.raises(Killed):
        first.round()
    first.state.close()
    second = controller(tmp_path, DiesAt(sim, None, released=released), world)  # a new process, the same state file
    for _ in range(3):
        world.advance(world.now + 5)  # released jobs start
        assert second.round().status == "ok"
    snap = sim.observe()
    assert [j for j in ids if snap.job(j).held] == []
    assert released == Counter({j: 1 for j in ids}), released  # each job released once, whatever the kill
    assert second.state.open_plans() == {}
    assert {j: sum(p.applied for p in second.state.plans_of(j)) for j in ids} == dict.fromkeys(ids, 1)
    second.state.close()


def test_placements_past_the_apply_budget_are_journalled_and_carried_out_by_the_next_round(tmp_path):
    world, sim, ids = cluster_with_jobs()
    released: Counter = Counter()
    first = controller(tmp_path, DiesAt(sim, None, released=released), world, apply_budget_s=1e-9, apply_batch=2)
    report = first.round()
    assert report.status == "ok" and not released  # Slurm untouched
    assert {a["job"]: a["error"] for a in report.actions} == dict.fromkeys(ids, DEFERRED)
    assert {j.job_id: j.reason for j in report.jobs} == dict.fromkeys(ids, DEFERRED)  # what status shows
    intents = first.state.open_plans()
    assert {j: p.status for j, p in intents.items()} == dict.fromkeys(ids, PlanStatus.INTENT)
    first.state.close()
    second = controller(tmp_path, DiesAt(sim, None, released=released), world, apply_batch=2)
    report = second.round()
    assert {a["job"]: a["why"] for a in report.actions} == dict.fromkeys(ids, "recover")
    assert released == Counter({j: 1 for j in ids})
    assert {j: p.cell for j, p in second.state.latest_plans().items()} == {j: p.cell for j, p in intents.items()}
    second.state.close()
