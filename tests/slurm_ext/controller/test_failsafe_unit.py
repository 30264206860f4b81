"""The fail-safe (slurm_ext.failsafe): the decision to act or stand down, which
held jobs qualify, their static cells, and one check against the simulated
Slurm with a real state file. The dev-cluster test is test_failsafe_slurm."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from slurm_ext.backends.base import SubmitRequest
from slurm_ext.cli import main
from slurm_ext.config import from_dict
from slurm_ext.controller import inputs as inp
from slurm_ext.controller.round import Controller
from slurm_ext.failsafe.check import check
from slurm_ext.failsafe.decision import select, verdict
from slurm_ext.failsafe.hint import HintError, StaticCell, per_node_options, release_update, static_cell
from slurm_ext.records import ClusterSnapshot, SlurmJob, SlurmNode, SlurmPartition
from slurm_ext.sim.backend import SimBackend
from slurm_ext.sim.types import ClusterSpec, NodeGroup
from slurm_ext.sim.world import SimWorld
from slurm_ext.state import HistoryEvent, JobRow, RoundStatus, StateError, StateStore
from solver import contract
from solver.contract.jobspec import JobSpec

SPEC = JobSpec(model="gpt-350m", global_batch=64, iterations=100)
NODES = (("n1", "a100", 4), ("n2", "a100", 4), ("n3", "v100", 8), ("n4", "a40", 2), ("n5", "a40", 2))


def snapshot(*jobs: SlurmJob, down: tuple[str, ...] = ()) -> ClusterSnapshot:
    nodes = tuple(
        SlurmNode(name=n, gpu_type=t, gpus_total=g, state="down" if n in down else "idle", partitions=(t, "all"))
        for n, t, g in NODES
    )
    types = ("a100", "v100", "a40")
    parts = tuple(SlurmPartition(name=t, nodes=tuple(n for n, tt, _ in NODES if tt == t)) for t in types)
    parts += (SlurmPartition(name="all", nodes=tuple(n for n, _, _ in NODES), default=True),)
    return ClusterSnapshot(nodes=nodes, partitions=parts, jobs=jobs, taken_at=1000.0)


def held(job_id: str, spec: JobSpec = SPEC, **kw) -> SlurmJob:
    base = dict(
        job_id=job_id,
        user="alice",
        state="PENDING",
        held=True,
        reason="JobHeldUser",
        partition="all",
        comment=spec.to_comment(),
        submit_time=100.0,
        gpus_per_node=1,
    )
    return SlurmJob(**{**base, **kw})


def managed(job: SlurmJob, **known) -> inp.ManagedJob:
    (m,) = inp.classify(snapshot(job), {}, {}, **known)
    return m


# --- act or stand down --------------------------------------------------------


def test_it_acts_only_when_no_round_completed_within_after():
    assert verdict(None, 1000.0, 600.0).act  # no controller round ever
    assert not verdict(999.0, 1000.0, 600.0).act
    assert not verdict(401.0, 1000.0, 600.0).act
    assert verdict(400.0, 1000.0, 600.0).act  # exactly `after` ago
    assert verdict(0.0, 1000.0, 600.0).act
    down = verdict(990.0, 1000.0, 600.0)
    assert down.why == "a controller round completed 10.0 s ago (within 600 s): standing down"
    assert verdict(100.0, 1000.0, 600.0).why == "no controller round has completed for 900.0 s (>= 600 s)"


def test_the_last_completed_round_is_the_newest_ok_one_and_is_read_read_only(tmp_path):
    path = tmp_path / "state.sqlite"
    with StateStore(path) as st:
        assert st.last_completed_round() is None
        r = st.begin_round(100.0)
        st.finish_round(r, status=RoundStatus.OK, duration_s=2.5)
        for status in (RoundStatus.ERROR, RoundStatus.UNAVAILABLE):  # rounds that place nothing do not count
            st.finish_round(st.begin_round(200.0), status=status, duration_s=1.0)
        st.begin_round(300.0)  # still running
    with StateStore(path, readonly=True) as ro:
        assert ro.last_completed_round() == 102.5
    with pytest.raises(StateError, match="does not exist"):
        StateStore(tmp_path / "missing.sqlite", readonly=True)


# --- which jobs qualify -------------------------------------------------------


def test_only_jobs_held_for_their_placement_qualify():
    bad = held("5", comment="cellsched/v1 {not json")
    jobs = (
        held("1"),  # waiting for its first placement: released
        held("2", submit_time=None),  # submit time unknown: released
        held("3"),  # parked by the controller
        held("4"),  # held again after the controller released it
        bad,
        held("6", submit_time=990.0),  # 10 s old: a controller gets `after` to place it
        held("7", held=False, reason="Priority"),  # pending, not held: Slurm runs it anyway
        held("8", state="RUNNING", held=False, reason="None"),
        SlurmJob(job_id="9", user="bob", state="PENDING", held=True, reason="JobHeldUser"),  # unmanaged
    )
    known = {
        "4": JobRow(
            "4",
            "alice",
            "RUNNING",
            "running",
            "",
            100.0,
            200.0,
            None,
            None,
            None,
            None,
            False,
            SPEC.to_json(),
            "comment",
            None,
            100.0,
            200.0,
        )
    }
    ms = inp.classify(snapshot(*jobs), known, {}, released={"4"}, parked={"3"})
    sel = select(ms, 1000.0, 600.0)
    assert [m.job_id for m in sel.release] == ["1", "2"]
    assert set(sel.skipped) == {"3", "4", "5", "6"}
    assert sel.skipped["3"].startswith("parked by the controller")
    assert sel.skipped["4"].startswith("held again after cellsched released it: its user's or an operator's hold")
    assert sel.skipped["5"].startswith("its spec cannot be used (bad spec: ")
    assert sel.skipped["6"] == "submitted 10.0 s ago: a controller has 600 s to place it"


def test_a_held_job_with_an_open_intent_qualifies():
    """The controller died between journalling a placement and releasing the job."""
    m = managed(held("1"))
    assert select([dataclasses.replace(m, intent=object())], 1000.0, 600.0).release  # type: ignore[arg-type]


# --- static cells -------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "cell"),
    [
        (SPEC, StaticCell("a100", 1, 1, "a100")),  # no request: min_gpus of the type with the most GPUs (8, by name)
        (dataclasses.replace(SPEC, gpu_types=("v100", "a40")), StaticCell("v100", 1, 1, "v100")),
        (dataclasses.replace(SPEC, requested_gpus=4, requested_gpu_type="a100"), StaticCell("a100", 1, 4, "a100")),
        (dataclasses.replace(SPEC, requested_gpus=8, requested_gpu_type="a100"), StaticCell("a100", 2, 4, "a100")),
        (dataclasses.replace(SPEC, requested_gpus=3, gpu_types=("a100", "a40")), StaticCell("a100", 1, 3, "a100")),
        (dataclasses.replace(SPEC, min_gpus=4, gpu_types=("a40",)), StaticCell("a40", 2, 2, "a40")),
        (dataclasses.replace(SPEC, min_gpus=2, partitions=("all",)), StaticCell("a100", 1, 2, "all")),
        # at most V GPUs: dp <= virtual workers
        (
            dataclasses.replace(SPEC, requested_gpus=8, virtual_workers=4, runtime="exact"),
            StaticCell("a100", 1, 4, "a100"),
        ),
    ],
)
def test_the_static_cell_is_the_request_else_a_conservative_default(spec, cell):
    assert static_cell(managed(held("1", spec)), snapshot()) == cell


def test_no_static_cell_is_an_error_that_says_why():
    big = dataclasses.replace(SPEC, requested_gpus=16, requested_gpu_type="a100")
    with pytest.raises(HintError, match="no partition of it holds 16 a100 GPUs"):
        static_cell(managed(held("1", big)), snapshot())
    a40 = dataclasses.replace(SPEC, requested_gpu_type="a40")
    with pytest.raises(HintError, match="no node of its requested GPU type a40 is up"):
        static_cell(managed(held("1", a40)), snapshot(down=("n4", "n5")))
    eight = dataclasses.replace(SPEC, requested_gpus=8, requested_gpu_type="a100")
    with pytest.raises(HintError, match="no partition of it holds 8 a100 GPUs on nodes that are up"):
        static_cell(managed(held("1", eight)), snapshot(down=("n1",)))


def test_layouts_put_all_gpus_on_one_node_first():
    assert per_node_options(8, 8) == [8, 4, 2, 1]
    assert per_node_options(8, 4) == [4, 2, 1]
    assert per_node_options(6, 8) == [6, 2, 1]
    assert per_node_options(3, 2) == [1]


def test_the_update_carries_spec_and_plan_and_leaves_the_nodes_to_slurm():
    # the reference trainer (runtime exact): an earlier plan's virtual workers are kept
    spec = dataclasses.replace(SPEC, requested_gpus=8, requested_gpu_type="a100", runtime="exact")
    m = managed(held("7", spec, work_dir="/home/alice/run"))
    cell = static_cell(m, snapshot())
    up = release_update(m, cell, "/tmp/ckpt")
    assert (up.partition, up.features, up.num_nodes, up.gres_per_node, up.num_tasks, up.tasks_per_node) == (
        "a100",
        "a100",
        2,
        4,
        8,
        4,
    )
    assert up.req_nodes == () and up.start_soon is False  # Slurm picks the nodes; a new job
    d = contract.admin_comment_dict(up.admin_comment)
    assert d["spec"] == json.loads(spec.to_json())
    plan = contract.admin_comment_plan(up.admin_comment)
    assert (plan.pp, plan.dp, plan.tp, plan.virtual_workers, plan.job_id, plan.cell) == (
        1,
        8,
        1,
        8,
        "7",
        "a100:2x4:pp1",
    )
    assert plan.checkpoint_dir == "/home/alice/run/.cellsched/7" and plan.nodes == ()
    assert plan.runtime == "exact"
    # a job placed before (requeued held) keeps its checkpoint directory and V, and may start at once
    before = contract.encode_admin_comment(
        json.loads(spec.to_json()),
        dataclasses.replace(plan, nodes=("n3",), dp=4, virtual_workers=16, checkpoint_dir="/ckpt/7"),
    )
    again = release_update(managed(held("7", spec, admin_comment=before)), cell, "/tmp/ckpt")
    plan2 = contract.admin_comment_plan(again.admin_comment)
    assert again.start_soon and (plan2.checkpoint_dir, plan2.virtual_workers, plan2.dp) == ("/ckpt/7", 16, 8)


# --- one check on the simulated Slurm -----------------------------------------

CLUSTER = ClusterSpec((NodeGroup("a100", 2, 4), NodeGroup("v100", 1, 8)))


def sim_with_jobs(n: int = 3) -> tuple[SimWorld, SimBackend, list[str]]:
    world = SimWorld(CLUSTER, speed=lambda spec, gpu_type, nodes, gpus_per_node, plan: 1.0, start_time=1000.0)
    sim = SimBackend(world)
    spec = JobSpec(model="gpt-350m", global_batch=32, iterations=10, requested_gpus=4, requested_gpu_type="a100")
    ids = [
        sim.submit(SubmitRequest(script="job.sh", gres_per_node=1, hold=True, comment=spec.to_comment()))
        for _ in range(n)
    ]
    return world, sim, ids


def a_round_at(path, t: float, status: RoundStatus = RoundStatus.OK) -> None:
    with StateStore(path) as st:
        st.finish_round(st.begin_round(t), status=status, duration_s=1.0)


def test_a_check_stands_down_while_rounds_complete_and_releases_once_they_stop(tmp_path):
    state = tmp_path / "state.sqlite"
    world, sim, ids = sim_with_jobs()
    a_round_at(state, 1000.0)
    world.advance(1100.0)
    down = check(str(state), sim, 600.0, "/ckpt", clock=lambda: world.now)
    assert not down.acted and down.released == () and down.last_round_at == 1001.0
    assert all(sim.observe().job(j).held for j in ids)

    a_round_at(state, 1200.0, RoundStatus.ERROR)  # a controller whose rounds fail is no controller
    world.advance(1601.0)
    with StateStore(state) as st:  # the controller parked the third job before it died
        st.add_history(ids[2], HistoryEvent.PARKED, 1500.0)
    up = check(str(state), sim, 600.0, "/ckpt", clock=lambda: world.now)
    assert up.acted and up.why == "no controller round has completed for 600.0 s (>= 600 s)"
    assert [(r.job_id, r.cell, r.partition) for r in up.released] == [(j, "a100:1x4:pp1", "a100") for j in ids[:2]]
    assert set(up.skipped) == {ids[2]} and not up.failed
    world.advance(world.now + 30)
    snap = sim.observe()
    assert [snap.job(j).state for j in ids] == ["COMPLETED", "COMPLETED", "PENDING"] and snap.job(ids[2]).held
    assert contract.admin_comment_plan(snap.job(ids[0]).admin_comment).dp == 4

    # a controller is back: its round completes, and the next check does nothing
    config = from_dict({"controller": {"state_path": str(state), "kick_file": ""}})
    ctl = Controller(config, backend=sim, state=StateStore(state), clock=lambda: world.now)
    assert ctl.round().status == "ok"
    ctl.state.close()
    assert not check(str(state), sim, 600.0, "/ckpt", clock=lambda: world.now).acted


def test_released_jobs_are_the_controllers_again_when_it_comes_back(tmp_path):
    """Running on the fail-safe's plan: the controller leaves them be (their GPUs count as taken). Released
    but not started: the controller places it again (the fail-safe's plan names no nodes)."""
    state = tmp_path / "state.sqlite"
    world, sim, ids = sim_with_jobs(3)  # 3 x 4 a100 GPUs on 2 nodes: one waits
    a_round_at(state, 0.0)
    world.advance(2000.0)
    assert len(check(str(state), sim, 600.0, "/ckpt", clock=lambda: world.now).released) == 3
    world.advance(2001.0)
    config = from_dict({"controller": {"state_path": str(state), "kick_file": ""}})
    ctl = Controller(config, backend=sim, state=StateStore(state), clock=lambda: world.now)
    report = ctl.round()
    assert {s.job_id: s.phase for s in report.jobs} == {ids[0]: "unplanned", ids[1]: "unplanned", ids[2]: "released"}
    assert [(a["kind"], a["job"], a["why"]) for a in report.actions] == [("place", ids[2], "new")]
    ctl.state.close()


def test_a_spec_that_cannot_be_parsed_is_never_acted_on(tmp_path):
    state = tmp_path / "state.sqlite"
    world = SimWorld(CLUSTER, start_time=1000.0)
    sim = SimBackend(world)
    bad = sim.submit(SubmitRequest(script="job.sh", gres_per_node=1, hold=True, comment="cellsched/v1 {oops"))
    a_round_at(state, 0.0)
    report = check(str(state), sim, 600.0, "/ckpt", clock=lambda: world.now + 700)
    assert report.acted and report.released == () and list(report.skipped) == [bad]
    assert sim.observe().job(bad).held


# --- the command --------------------------------------------------------------


def test_once_says_it_stands_down_and_after_overrides_the_config(tmp_path):
    import time

    state = tmp_path / "state.sqlite"
    a_round_at(state, time.time())
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[controller]\nstate_path = "{state}"\n[log]\nformat = "text"\n')
    res = CliRunner().invoke(main, ["failsafe", "--once", "--config", str(cfg)], prog_name="cellsched")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert not out["acted"] and "standing down" in out["why"] and out["released"] == []
    res = CliRunner().invoke(main, ["failsafe", "--once", "--after", "0"], prog_name="cellsched")
    assert res.exit_code == 2 and "is not in the range x>0" in res.output
    missing = tmp_path / "m.toml"
    missing.write_text(f'[controller]\nstate_path = "{tmp_path / "nope.sqlite"}"\n')
    res = CliRunner().invoke(main, ["failsafe", "--once", "--config", str(missing)], prog_name="cellsched")
    assert res.exit_code == 2 and "does not exist" in res.output


def test_the_config_key_must_be_positive():
    from slurm_ext.config import ConfigError

    assert from_dict({}).controller.failsafe_after_s == 600.0
    with pytest.raises(ConfigError, match="controller.failsafe_after_s must be > 0"):
        from_dict({"controller": {"failsafe_after_s": 0}})


def test_the_failsafe_writes_nothing_to_the_state(tmp_path):
    """The fail-safe writes nothing to the state (it opens it read-only)."""
    state = tmp_path / "state.sqlite"
    world, sim, ids = sim_with_jobs(1)
    a_round_at(state, 0.0)
    before = state.read_bytes()
    world.advance(5000.0)
    check(str(state), sim, 600.0, "/ckpt", clock=lambda: world.now)
    assert state.read_bytes() == before and not sim.observe().job(ids[0]).held
