"""State rebuilt from Slurm, on the simulated backend: the controller is
"killed" (an exception nothing catches, standing for SIGKILL) right after
each step of a move, its state file is lost, and a fresh controller on an
EMPTY state file takes over from what the jobs' AdminComments show. It
finishes the move: the job is signalled at least once and at most once
by each controller (the fresh one asks a job still running again: the
dying one may have written the Step and not signalled), requeued and
released once, never cancelled, and every job completes; a job moved to
grow, observed as the cli backend observes Slurm (the nodes read before
the jobs: the job's checkpoint ends in between), is placed once, on the
move's target. A job held by its user after a release, and a parked job,
stay held.

The dev-cluster version: test_rebuild_slurm.py."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from controller_support import Killed

from slurm_ext.backends.base import SubmitRequest
from slurm_ext.config import from_dict
from slurm_ext.controller.inputs import Phase
from slurm_ext.controller.progress import EachCall, JobProgress
from slurm_ext.controller.round import Controller
from slurm_ext.records import ClusterSnapshot
from slurm_ext.sim.backend import SimBackend
from slurm_ext.sim.types import ClusterSpec, NodeGroup
from slurm_ext.sim.world import Observer, SimJob, SimWorld
from slurm_ext.state import StateStore
from solver import contract
from solver.contract.jobspec import JobSpec

CLUSTER = ClusterSpec((NodeGroup("a100", 2, 4),))
#: the reference trainer (runtime exact): it answers the checkpoint signal itself, so it is moved
ELASTIC = JobSpec(
    model="gpt-350m", global_batch=64, iterations=400, elastic=True, min_gpus=1, max_gpus=8, runtime="exact"
)
FIXED = JobSpec(model="gpt-350m", global_batch=64, iterations=800, requested_gpus=4, requested_gpu_type="a100")


class Recorder:
    """The simulated Slurm, counting each change by (method, job), and dying
    (Killed) right after the first call of `dies_after` = (method, job) that
    changes that job (None: never)."""

    def __init__(
        self, sim: SimBackend, dies_after: tuple[str, str] | None = None, calls: Counter | None = None
    ) -> None:
        self.sim, self.dies_after = sim, dies_after
        self.calls = Counter() if calls is None else calls
        self.name = sim.name

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.sim, name)
        if name not in ("update", "update_many", "signal", "hold_many", "requeue_many", "release_many", "cancel"):
            return call

        def write(ids: Any, *args: Any, **kw: Any) -> Any:
            out = call(ids, *args, **kw)
            jobs = [ids] if isinstance(ids, str) else list(ids)
            for j in jobs:
                self.calls[(name, j)] += 1
            if self.dies_after is not None and self.dies_after[0] == name and self.dies_after[1] in jobs:
                self.dies_after = None
                raise Killed(name)
            return out

        return write


def controller(state: Path, backend: Any, sim: SimWorld) -> Controller:
    cc = {
        "state_path": str(state),
        "kick_file": "",
        "checkpoint_wait_s": 30.0,
        "checkpoint_poll_s": 1.0,
        "checkpoint_timeout_s": 60.0,
    }
    config = from_dict({"controller": cc})

    def progress(m: Any) -> JobProgress | None:
        done = sim.iterations_done(m.job_id)
        return None if done is None else JobProgress(done, sim.first_step_at(m.job_id), sim.iter_time(m.job_id))

    return Controller(
        config,
        backend=backend,
        state=StateStore(state),
        clock=lambda: sim.now,
        sleep=lambda dt: sim.advance(sim.now + dt),
        progress=EachCall(progress),
    )


def submit(sim: SimBackend, spec: JobSpec) -> str:
    return sim.submit(SubmitRequest(script="job.sh", gres_per_node=1, hold=True, comment=spec.to_comment()))


def running_elastic_job(tmp_path: Path) -> tuple[SimWorld, SimBackend, str, Counter]:
    """An elastic job placed on the whole cluster and training."""
    world = SimWorld(CLUSTER, speed=lambda spec, gpu_type, nodes, gpus_per_node, plan: 1.0, checkpoint_s=5.0)
    world.requeue_delay_s = 0.0
    sim = SimBackend(world)
    calls: Counter = Counter()
    job = submit(sim, ELASTIC)
    first = controller(tmp_path / "first.sqlite", Recorder(sim, calls=calls), world)
    assert first.round().status == "ok"
    world.advance(world.now + 10)
    assert sim.observe().job(job).state == "RUNNING" and world.first_step_at(job) is not None
    first.state.close()
    return world, sim, job, calls


#: the move's steps: its Step written, signalled, requeued held, updated (with its Step "updated"), released
STEPS = ("update", "signal", "requeue_many", "update_many", "release_many")


@pytest.mark.parametrize("dies_after", STEPS)
def test_an_empty_state_takes_over_a_move_cut_short_after_any_step(tmp_path, dies_after):
    world, sim, moved, calls = running_elastic_job(tmp_path)
    other = submit(sim, FIXED)  # room for it: the elastic job shrinks (a move)
    dying = controller(tmp_path / "first.sqlite", Recorder(sim, (dies_after, moved), calls), world)
    with pytest.raises(Killed):
        dying.round()
    dying.state.close()
    assert calls[("signal", moved)] == (dies_after != "update")
    (tmp_path / "first.sqlite").unlink()  # the state is lost
    fresh = controller(tmp_path / "fresh.sqlite", Recorder(sim, calls=calls), world)
    for _ in range(400):
        assert fresh.round().status == "ok"
        if all(world.all_jobs[j].state == "COMPLETED" for j in (moved, other)):
            break
        world.advance(world.now + 5)
    assert {j: world.all_jobs[j].state for j in (moved, other)} == {moved: "COMPLETED", other: "COMPLETED"}
    # the fresh controller asks a job still running again: the one that the dying controller never signalled
    # (died after the Step), and the one it did (the request is a flag: it checkpoints once)
    assert calls[("signal", moved)] == {"update": 1, "signal": 2}.get(dies_after, 1)
    assert calls[("requeue_many", moved)] == 1  # the move's one restart
    assert calls[("release_many", moved)] == 2 and calls[("release_many", other)] == 1  # first placement, move
    assert not any(name == "cancel" for name, _ in calls)
    assert world.all_jobs[moved].restarts == 1 and world.all_jobs[other].restarts == 0
    assert contract.admin_comment_step(world.all_jobs[moved].admin_comment) is None  # tidied once released
    assert fresh.state.open_plans() == {}
    fresh.state.close()


class NodesReadFirst:
    """The simulated Slurm observed as the cli backend observes a real one:
    the nodes first (sinfo), then, `lag_s` seconds later, the jobs (squeue).
    A job that ends in between is seen ended while its nodes still count
    its GPUs, as Slurm also shows a job that has ended and whose nodes it
    has not freed yet."""

    def __init__(self, sim: SimBackend, world: SimWorld, lag_s: float) -> None:
        self.sim, self.world, self.lag_s = sim, world, lag_s
        self.name = sim.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sim, name)

    def observe(self) -> ClusterSnapshot:
        nodes = self.sim.observe()
        self.world.advance(self.world.now + self.lag_s)
        jobs = self.sim.observe()
        return ClusterSnapshot(nodes.nodes, nodes.partitions, jobs.jobs, nodes.taken_at)


class Starts(Observer):
    """The cells each job started in, as the world saw it start (in order)."""

    def __init__(self) -> None:
        self.cells: dict[str, list[str]] = {}

    def started(self, job: SimJob, cell: str) -> None:
        self.cells.setdefault(job.job_id, []).append(cell)


def growing_job(tmp_path: Path) -> tuple[SimWorld, SimBackend, str, Counter, Starts]:
    """An elastic job training on one node, the other taken by a job that is
    not cellsched's and has just been cancelled: the job may grow to both
    (a move), as in test_rebuild_slurm.py."""
    starts = Starts()
    world = SimWorld(CLUSTER, speed=lambda spec, gpu_type, nodes, gpus_per_node, plan: 1.0, observers=[starts])
    world.requeue_delay_s = 0.0
    sim = SimBackend(world)
    blocker = sim.submit(SubmitRequest(script="blocker.sh", gres_per_node=4, nodes=1))
    calls: Counter = Counter()
    job = submit(sim, ELASTIC)
    first = controller(tmp_path / "first.sqlite", Recorder(sim, calls=calls), world)
    assert first.round().placements[job]["cell"] == "a100:1x4:pp1"
    world.advance(world.now + 10)
    assert first.round().status == "ok"  # sees the job train: it may be moved from now on
    first.state.close()
    sim.cancel(blocker)
    return world, sim, job, calls, starts


@pytest.mark.parametrize("dies_after", STEPS)
def test_a_move_to_grow_cut_short_is_finished_once_on_its_target_with_the_nodes_read_before_the_jobs(
    tmp_path, dies_after
):
    """The fresh controller's round reads the nodes before the moved job's
    checkpoint ends and the jobs after: the GPUs the job held still count
    on its node. They are its own: it is placed once, on the move's target
    (both nodes), never first on the other node alone and then moved again."""
    world, sim, moved, calls, starts = growing_job(tmp_path)
    dying = controller(tmp_path / "first.sqlite", Recorder(sim, (dies_after, moved), calls), world)
    with pytest.raises(Killed):
        dying.round()
    dying.state.close()
    (tmp_path / "first.sqlite").unlink()  # the state is lost
    # the lag is the checkpoint's time: the first round that sees the job ended read its nodes before the end
    fresh = controller(tmp_path / "fresh.sqlite", Recorder(NodesReadFirst(sim, world, 5.0), calls=calls), world)
    for _ in range(400):
        assert fresh.round().status == "ok"
        if world.all_jobs[moved].state == "COMPLETED":
            break
        world.advance(world.now + 1)
    assert world.all_jobs[moved].state == "COMPLETED"
    assert starts.cells[moved] == ["a100:1x4", "a100:2x4"]  # its first placement, the move's target: no other
    # signalled once: by the dying controller, or (died before its signal) by the fresh one; a job signalled
    # is seen checkpointed by the fresh controller's first round (its jobs read after the checkpoint's end)
    assert calls[("signal", moved)] == 1
    assert calls[("requeue_many", moved)] == 1  # the move's one restart
    assert calls[("release_many", moved)] == 2  # its first placement and the move
    assert not any(name == "cancel" for name, _ in calls)
    assert world.all_jobs[moved].restarts == 1
    assert fresh.state.open_plans() == {}
    fresh.state.close()


def test_an_empty_state_leaves_a_job_held_by_its_user_and_a_parked_job_held(tmp_path):
    world, sim, job, calls = running_elastic_job(tmp_path)
    parked = submit(sim, FIXED)
    world.advance(world.now + 1)
    sim.requeue(job, hold=True)  # its user (or an operator): held, with the plan cellsched gave it
    plan_comment = contract.encode_admin_comment(
        contract.admin_comment_spec(sim.observe().job(job).admin_comment) or {},
        contract.admin_comment_plan(sim.observe().job(job).admin_comment),
    )
    step = contract.Step(contract.PARKED, world.now)
    sim.update(parked, _comment(contract.with_step(plan_comment, step)))  # parked by the lost controller
    fresh = controller(tmp_path / "fresh.sqlite", Recorder(sim, calls=calls), world)
    report = fresh.round()
    assert report.status == "ok"
    phases = {s.job_id: s.phase for s in report.jobs}
    assert phases == {job: Phase.OPERATOR_HOLD, parked: Phase.PARKED}
    assert calls[("release_many", job)] == 1 and calls[("release_many", parked)] == 0  # the first placement only
    snap = sim.observe()
    assert snap.job(job).held and snap.job(parked).held
    fresh.state.close()


def _comment(text: str) -> Any:
    from slurm_ext.backends.base import JobUpdate

    return JobUpdate(admin_comment=text)


def test_a_step_whose_plan_names_no_gpus_per_node_stands_for_no_intent_and_rounds_go_on(tmp_path):
    """A Step "signalled" whose target plan has no gpus_per_node (edited by
    hand, or written by a broken controller) stands for no intent: were it
    journalled, its nodes would read "n1:None" and every later round would
    fail reading the journal. The held job is placed again as a new one."""
    world, sim, job, calls = running_elastic_job(tmp_path)
    plan = contract.admin_comment_plan(sim.observe().job(job).admin_comment)
    assert plan is not None and plan.gpus_per_node is not None
    target = json.loads(plan.to_json())
    del target["gpus_per_node"]
    sim.requeue(job, hold=True)
    step = contract.Step(contract.SIGNALLED, world.now, target, "")
    sim.update(job, _comment(contract.with_step(sim.observe().job(job).admin_comment, step)))
    fresh = controller(tmp_path / "fresh.sqlite", Recorder(sim, calls=calls), world)
    for _ in range(3):
        assert fresh.round().status == "ok"
        world.advance(world.now + 5)
    assert sim.observe().job(job).state == "RUNNING"
    assert contract.admin_comment_step(sim.observe().job(job).admin_comment) is None
    fresh.state.close()
