"""A round's phases, on the simulated backend: a dry run decides what a live
round would and changes nothing; the action kinds keep the strings the
state DB's journal and the logs hold."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from slurm_ext.backends.base import SubmitRequest
from slurm_ext.config import from_dict
from slurm_ext.controller.inputs import Phase
from slurm_ext.controller.progress import EachCall
from slurm_ext.controller.reconcile import Action, ActionKind
from slurm_ext.controller.round import Controller
from slurm_ext.sim.backend import SimBackend
from slurm_ext.sim.types import ClusterSpec, NodeGroup
from slurm_ext.sim.world import SimWorld
from slurm_ext.state import RoundStatus, StateStore
from solver.contract.jobspec import JobSpec

CLUSTER = ClusterSpec((NodeGroup("a100", 2, 4),))
SPEC = JobSpec(model="gpt-350m", global_batch=64, iterations=400, requested_gpus=4, requested_gpu_type="a100")
WRITES = ("update", "update_many", "signal", "hold_many", "requeue_many", "release_many", "cancel")


class Counting:
    """The simulated Slurm, counting the calls that change it."""

    def __init__(self, sim: SimBackend) -> None:
        self.sim, self.name, self.writes = sim, sim.name, Counter()

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.sim, name)
        if name not in WRITES:
            return call

        def write(*args: Any, **kw: Any) -> Any:
            self.writes[name] += 1
            return call(*args, **kw)

        return write


def controller(state: Path, backend: Any, world: SimWorld) -> Controller:
    config = from_dict({"controller": {"state_path": str(state), "kick_file": ""}})
    return Controller(
        config, backend=backend, state=StateStore(state), clock=lambda: world.now, progress=EachCall(lambda m: None)
    )


def test_a_dry_run_decides_what_a_live_round_does_and_changes_nothing(tmp_path):
    world = SimWorld(CLUSTER, speed=lambda spec, gpu_type, nodes, gpus_per_node, plan: 1.0)
    sim = SimBackend(world)
    request = SubmitRequest(script="job.sh", gres_per_node=1, hold=True, comment=SPEC.to_comment())
    jobs = [sim.submit(request) for _ in range(3)]
    backend = Counting(sim)
    ctl = controller(tmp_path / "s.sqlite", backend, world)

    dry = ctl.round(dry_run=True)
    assert dry.status == RoundStatus.OK and dry.dry_run and dry.round_id is None
    assert not backend.writes  # Slurm untouched ...
    assert ctl.state.rounds() == [] and ctl.state.jobs() == {} and ctl.state.open_plans() == {}  # ... and the DB
    assert all(sim.observe().job(j).held for j in jobs)

    live = ctl.round()
    assert live.status == RoundStatus.OK and not live.dry_run and live.round_id is not None
    assert backend.writes["release_many"] >= 1
    # the same decisions: each action the dry run showed is the one the live round carried out, and it went well
    assert [{k: v for k, v in a.items() if k != "ok"} for a in live.actions] == list(dry.actions)
    assert all(a["ok"] for a in live.actions)
    assert dry.placements == live.placements and set(live.placements) == set(jobs)
    assert {s.phase for s in dry.jobs} == {Phase.HELD}  # shown, not released ...
    assert {s.phase for s in live.jobs} == {Phase.RELEASED}  # ... and released by the live round
    assert [r["status"] for r in ctl.state.rounds()] == ["ok"]
    ctl.state.close()


def test_the_action_kinds_keep_the_strings_the_journal_holds():
    old = {"place", "hold", "move", "requeue", "tidy", "resignal"}  # what rounds journalled before the enum
    assert {k.value for k in ActionKind} == old | {"preempt"}  # preemption to zero came later
    for value in old:
        kind = ActionKind(value)  # an old journal's string reads back as the kind
        assert kind == value and hash(kind) == hash(value) and str(kind) == value and f"{kind}" == value
    summary = Action(ActionKind.PLACE, "7", "new").summary()
    assert json.loads(json.dumps(summary)) == {"kind": "place", "job": "7", "why": "new"}
    assert type(summary["kind"]) is str  # stored as the plain string


class Recording:
    """cellsched's policy, noting whether each round's request re-plans every running job."""

    def __init__(self) -> None:
        from solver.policies import get_policy

        self.policy, self.name, self.replan_all = get_policy("cellsched"), "cellsched", []

    def schedule(self, request: Any, estimator: Any) -> Any:
        self.replan_all.append(request.replan_all)
        return self.policy.schedule(request, estimator)


def replan_rounds(tmp_path: Path, interval: float, times: list[float], back_at: int | None = None) -> list[bool]:
    """Whether each round at `times` re-planned every running job, with
    replan_interval_s `interval`; before the round of index `back_at`, the
    last whole round is set after it (the clock went back)."""
    world = SimWorld(CLUSTER, speed=lambda spec, gpu_type, nodes, gpus_per_node, plan: 1.0)
    sim = SimBackend(world)
    sim.submit(SubmitRequest(script="job.sh", gres_per_node=1, hold=True, comment=SPEC.to_comment()))
    state = tmp_path / f"s{interval}-{back_at}.sqlite"
    config = from_dict(
        {"controller": {"state_path": str(state), "kick_file": ""}, "solver": {"replan_interval_s": interval}}
    )
    policy = Recording()
    ctl = Controller(
        config,
        backend=sim,
        state=StateStore(state),
        policy=policy,
        clock=lambda: world.now,
        progress=EachCall(lambda m: None),
    )
    for i, t in enumerate(times):
        world.advance(t)
        if i == back_at:
            ctl.replanned_at = t + 1.0
        ctl.round()
    assert ctl.replanned_at == max(t for t, whole in zip(times, policy.replan_all, strict=True) if whole)
    return policy.replan_all


def test_rounds_replan_every_running_job_once_replan_interval_s_has_passed(tmp_path):
    """SolverConfig.replan_interval_s: the first round re-plans everything,
    the rounds after it are partial until 300 s have passed; 0 (the
    default): every round is whole; a clock gone back starts a whole one."""
    times = [0.0, 100.0, 299.0, 300.0, 420.0, 650.0]
    assert replan_rounds(tmp_path, 300.0, times) == [True, False, False, True, False, True]
    assert replan_rounds(tmp_path, 0.0, times) == [True] * len(times)
    assert replan_rounds(tmp_path, 300.0, times[:3], back_at=2) == [True, False, True]
