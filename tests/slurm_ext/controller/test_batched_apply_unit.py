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
from slurm_ext.controller.progress import EachCall, JobProgress
from slurm_ext.controller.reconcile import DEFERRED
from slurm_ext.controller.round import Controller
from slurm_ext.sim.backend import SimBackend
from slurm_ext.sim.types import ClusterSpec, NodeGroup
from slurm_ext.sim.world import SimWorld
from slurm_ext.state import PlanStatus, StateStore
from solver.contract.jobspec import JobSpec

CLUSTER = ClusterSpec((NodeGroup("a100", 4, 4), NodeGroup("v100", 2, 8)))
#: a100 nodes only, so that a new 4-GPU job makes the elastic one on both of them shrink (a move)
MOVE_CLUSTER = ClusterSpec((NodeGroup("a100", 2, 4), NodeGroup("v100", 2, 8)))
#: the reference trainer (runtime exact): it answers the checkpoint signal itself, so it is moved
ELASTIC = JobSpec(
    model="gpt-350m", global_batch=64, iterations=10_000, elastic=True, max_gpus=8, gpu_types=("a100",), runtime="exact"
)
FIXED = JobSpec(model="gpt-350m", global_batch=64, iterations=10_000, requested_gpus=4, gpu_types=("a100",))
SMALL = JobSpec(model="gpt-350m", global_batch=32, iterations=10_000, requested_gpus=1, gpu_types=("v100",))
#: the writes of the batch the kill points cut: the new jobs' (the loose ones held first), then the move's
BATCH = ("hold_many", "update_many", "release_many", "update_many") + (
    "requeue_many",
    "update_many",
    "release_many",
    "update_many",
)


def submit(sim: SimBackend, spec: JobSpec, hold: bool = True) -> str:
    return sim.submit(SubmitRequest(script="job.sh", gres_per_node=1, hold=hold, comment=spec.to_comment()))


def cluster_with_jobs() -> tuple[SimWorld, SimBackend, list[str]]:
    world = SimWorld(CLUSTER, speed=lambda spec, gpu_type, nodes, gpus_per_node, plan: 1.0)  # 1 s an iteration
    sim = SimBackend(world)
    spec = JobSpec(model="gpt-350m", global_batch=32, iterations=10_000)
    return world, sim, [submit(sim, spec) for _ in range(5)]


def controller(tmp_path, backend, world: SimWorld, **cc) -> Controller:
    config = from_dict(
        {"controller": {"state_path": str(tmp_path / "state.sqlite"), "kick_file": "", "checkpoint_wait_s": 30.0, **cc}}
    )

    def progress(m) -> JobProgress | None:
        done = world.iterations_done(m.job_id)
        return None if done is None else JobProgress(done, world.first_step_at(m.job_id), world.iter_time(m.job_id))

    return Controller(
        config,
        backend=backend,
        state=StateStore(tmp_path / "state.sqlite"),
        clock=lambda: world.now,
        sleep=lambda dt: world.advance(world.now + dt),  # the checkpoint wait: simulated time
        progress=EachCall(progress),
    )


def cluster_with_a_move_to_make(tmp_path) -> tuple[SimWorld, SimBackend, str, list[str]]:
    """An elastic job running on both A100 nodes (placed by an earlier round
    on the same state file); then a 4-GPU A100 job (held), two small ones
    held and two loose (pending, not held: the controller holds them first).
    Slurm's own scheduler starts an eligible job 60 s after it became so:
    the loose jobs wait for the controller."""
    world = SimWorld(MOVE_CLUSTER, speed=lambda *_: 1.0, checkpoint_s=5.0, start_delay_s=60.0, requeue_delay_s=0.0)
    sim = SimBackend(world)
    moved = submit(sim, ELASTIC)
    earlier = controller(tmp_path, sim, world)
    assert earlier.round().status == "ok"
    earlier.state.close()
    world.advance(world.now + 70)
    job = sim.observe().job(moved)
    assert job.state == "RUNNING" and job.num_nodes * (job.gpus_per_node or 0) == 8
    new = [
        submit(sim, FIXED),
        submit(sim, SMALL),
        submit(sim, SMALL),
        submit(sim, SMALL, False),
        submit(sim, SMALL, False),
    ]
    return world, sim, moved, new


def test_the_probe_round_makes_the_writes_of_a_batch(tmp_path):
    world, sim, _ = cluster_with_jobs()
    probe = DiesAt(sim, None)
    ctl = controller(tmp_path, probe, world)
    assert ctl.round().status == "ok"
    ctl.state.close()
    assert probe.calls == ["update_many", "release_many", "update_many"]  # update, release, tidy the AdminComments
    world, sim, moved, new = cluster_with_a_move_to_make(tmp_path / "move")
    probe = DiesAt(sim, None)
    ctl = controller(tmp_path / "move", probe, world)
    report = ctl.round()
    ctl.state.close()
    assert report.status == "ok" and {a["job"]: a["why"] for a in report.actions} == {
        **dict.fromkeys(new, "new"),
        moved: "resize",
    }
    assert tuple(probe.calls) == BATCH


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("at", range(1, len(BATCH) + 1), ids=[f"{i}-{w}" for i, w in enumerate(BATCH, 1)])
def test_a_batch_cut_short_at_any_write_is_finished_by_the_next_start(tmp_path, at, after):
    """Killed just before or just after each write of a batch that holds
    loose jobs, places new ones and requeues a moved one: a new process on
    the same state file finishes it. Each job is released once (the moved
    one once more, by its move: it restarts once) and none stays held."""
    world, sim, moved, new = cluster_with_a_move_to_make(tmp_path)
    released: Counter = Counter()
    first = controller(tmp_path, DiesAt(sim, at, after=after, released=released), world)
    with pytest.raises(Killed, match=BATCH[at - 1]):
        first.round()
    first.state.close()
    second = controller(tmp_path, DiesAt(sim, None, released=released), world)  # a new process, the same state file
    for _ in range(3):
        assert second.round().status == "ok"
        world.advance(world.now + 65)  # released jobs start
    ids = [moved, *new]
    snap = sim.observe()
    assert [j for j in ids if snap.job(j).held] == []
    assert released == Counter(ids), released  # each job released once, whatever the kill
    assert {j: world.all_jobs[j].restarts for j in ids} == {j: int(j == moved) for j in ids}  # requeued once
    assert second.state.open_plans() == {}
    applied = {j: sum(p.applied for p in second.state.plans_of(j)) for j in ids}
    assert applied == {j: 1 + (j == moved) for j in ids}  # the moved job: its first placement and its move
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
