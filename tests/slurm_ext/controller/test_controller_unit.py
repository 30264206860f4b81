"""Controller pieces on constructed snapshots: config, state, inputs,
reconcile, progress, metrics, notify, status rows (no Slurm needed)."""

from __future__ import annotations

import json
import os
import re
import socket
import urllib.request
from pathlib import Path

import pytest

from slurm_ext.cli.status_cmd import job_rows
from slurm_ext.config import Config, ConfigError, from_dict, load
from slurm_ext.controller import inputs as inp
from slurm_ext.controller.metrics import Metrics, serve
from slurm_ext.controller.notify import sd_notify
from slurm_ext.controller.progress import (
    Progress,
    ProgressFiles,
    collect_progress,
    default_checkpoint_dir,
    estimate_done,
    read_progress,
)
from slurm_ext.controller.reconcile import ActionKind, checked, choose_partition, decide, intent_outcomes
from slurm_ext.records import ClusterSnapshot, SlurmJob, SlurmNode, SlurmPartition
from slurm_ext.state import HistoryEvent, JobStatus, StateStore
from solver.contract.jobspec import JobSpec
from solver.contract.plan import JobPlan
from solver.types import Cell, ParallelPlan, Placement

ROOT = Path(__file__).resolve().parents[3]
SPEC = JobSpec(model="gpt-350m", global_batch=64, iterations=100)
NODES = (("n1", "a100", 4), ("n2", "a100", 4), ("n3", "v100", 8), ("n4", "a40", 2))


def snapshot(*jobs: SlurmJob, alloc: dict[str, int] | None = None) -> ClusterSnapshot:
    nodes = tuple(
        SlurmNode(
            name=n, gpu_type=t, gpus_total=g, gpus_alloc=(alloc or {}).get(n, 0), state="idle", partitions=(t, "all")
        )
        for n, t, g in NODES
    )
    parts = tuple(
        SlurmPartition(name=t, nodes=tuple(n for n, tt, _ in NODES if tt == t)) for t in ("a100", "v100", "a40")
    )
    parts += (SlurmPartition(name="all", nodes=tuple(n for n, _, _ in NODES)),)
    return ClusterSnapshot(nodes=nodes, partitions=parts, jobs=jobs, taken_at=1000.0)


def managed_job(job_id: str, **kw) -> SlurmJob:
    base = dict(
        job_id=job_id,
        user="alice",
        state="PENDING",
        held=True,
        reason="JobHeldUser",
        partition="all",
        comment=SPEC.to_comment(),
        submit_time=900.0,
        gpus_per_node=1,
    )
    base.update(kw)
    return SlurmJob(**base)


def plan_comment(job_id: str, nodes: tuple[str, ...], gpu_type: str = "a100", gpn: int = 2, pp: int = 1) -> str:
    dp = len(nodes) * gpn // pp
    plan = JobPlan(
        pp=pp,
        dp=dp,
        tp=1,
        global_batch=64,
        gpu_types=(gpu_type,),
        nodes=nodes,
        gpus_per_node=gpn,
        cell=f"{gpu_type}:{len(nodes)}x{gpn}:pp{pp}",
        job_id=job_id,
        iter_time_s=0.5,
        checkpoint_dir=f"/ckpt/{job_id}",
    )
    return json.dumps({"spec": json.loads(SPEC.to_json()), "plan": json.loads(plan.to_json())}, separators=(",", ":"))


def placement(job_id: str, nodes: tuple[str, ...], gpu_type: str = "a100", gpn: int = 2) -> Placement:
    cell = Cell(gpu_type, len(nodes), gpn, 1)
    return Placement(job_id, cell, tuple((n, gpn) for n in nodes), ParallelPlan(1, cell.num_gpus, 1), 0.5)


# --- config -------------------------------------------------------------------


def test_the_documented_example_config_is_the_defaults():
    example = load(ROOT / "slurm_ext" / "admin" / "cellsched.toml")
    assert example.controller == Config().controller
    assert example.solver == Config().solver
    assert example.metrics == Config().metrics and example.log == Config().log
    assert example.solver.allow_resize is True  # running elastic jobs are moved


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="controller.intervall_s"):
        from_dict({"controller": {"intervall_s": 3}})
    with pytest.raises(ConfigError, match=r"\[solvr\]"):
        from_dict({"solvr": {}})
    with pytest.raises(ConfigError, match="solver.time_limit_s must be a number"):
        from_dict({"solver": {"time_limit_s": "fast"}})
    with pytest.raises(ConfigError, match="solver.workers must be an integer"):
        from_dict({"solver": {"workers": 1.5}})
    with pytest.raises(ConfigError, match="controller.interval_s must be > 0"):
        from_dict({"controller": {"interval_s": 0}})
    with pytest.raises(ConfigError, match="log.format"):
        from_dict({"log": {"format": "xml"}})
    with pytest.raises(ConfigError, match="node_placement"):
        from_dict({"solver": {"node_placement": "best-fit"}})
    assert from_dict({"solver": {"node_placement": "first-fit"}}).solver.node_placement == "first-fit"
    bad = tmp_path / "bad.toml"
    bad.write_text("[controller\n")
    with pytest.raises(ConfigError, match="bad.toml"):
        load(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "missing.toml")


def test_network_config_gives_each_node_its_card_and_rack_and_names_a_bad_key():
    net = from_dict(
        {
            "network": {
                "nic_gbps": 25,
                "nic_gbps_by_type": {"a100": 200},
                "nodes": {"n[1-2]": 10},
                "racks": {"r1": "n[1-4]"},
                "uplink_gbps": {"r1": 40},
            }
        }
    ).network
    assert [net.nic_of(n, t) for n, t in (("n1", "a100"), ("n3", "a100"), ("n3", "a40"))] == [10.0, 200.0, 25.0]
    assert (net.rack_of("n4"), net.rack_of("n5")) == ("r1", "")
    assert from_dict({}).network.nic_of("x", "a40") == 100.0  # the GPU type's default
    assert from_dict({"network": {"modelled": False}}).network.nic_of("x", "a40") == 0.0
    for bad, named in (
        ({"nic_gbps": -1}, "network.nic_gbps"),
        ({"nodes": {"n[1-": 10}}, "network.nodes.n[1-"),
        ({"nic_gbps_by_type": {"a100": "fast"}}, "network.nic_gbps_by_type.a100"),
        ({"uplink_gbps": {"r9": 10}}, "network.uplink_gbps.r9: no such rack"),
        ({"racks": {"r1": 3}}, "network.racks.r1"),
        ({"nic": 1}, "network.nic"),
    ):
        with pytest.raises(ConfigError, match=re.escape(named)):
            from_dict({"network": bad})


def test_config_from_env_and_values(tmp_path, monkeypatch):
    f = tmp_path / "c.toml"
    f.write_text('[controller]\ninterval_s = 5\npolicy = "fcfs"\n[solver]\nseed = 7\nw_age = 1\n[metrics]\nport = 0\n')
    monkeypatch.setenv("CELLSCHED_CONFIG", str(f))
    c = load()
    assert (c.controller.interval_s, c.controller.policy, c.solver.seed, c.solver.w_age, c.metrics.port) == (
        5.0,
        "fcfs",
        7,
        1.0,
        0,
    )
    assert c.source == str(f)


# --- state --------------------------------------------------------------------


def test_state_keeps_the_first_spec_and_tracks_intents(tmp_path):
    path = tmp_path / "s.sqlite"
    with StateStore(path) as st:
        st.accept_spec("5", "alice", SPEC.to_json(), "comment", 1.0)
        st.accept_spec("5", "alice", '{"model":"other"}', "comment", 2.0)
        a = st.begin_plan("5", 1, "a100:1x2:pp1", (("n1", 2),), "a100", "{}", "ac1", 3.0)
        b = st.begin_plan("5", 2, "a100:1x2:pp1", (("n2", 2),), "a100", "{}", "ac2", 4.0)
        assert list(st.open_plans()) == ["5"] and st.open_plans()["5"].id == b
        st.set_plan_status(b, "updated", 5.0)
        st.begin_round(6.0)
    with StateStore(path) as st:  # a restart sees everything
        assert st.jobs()["5"].spec == SPEC.to_json()
        assert st.open_plans()["5"].status == "updated"
        assert [p.status for p in st.plans_of("5")] == ["superseded", "updated"]
        assert st.rounds()[0]["status"] == "interrupted"  # the run died mid-round
        st.set_plan_status(b, "released", 7.0)
        assert st.open_plans() == {} and st.latest_plans()["5"].nodes == (("n2", 2),)
        assert st.history("5")[0]["event"] == "placed"
        c = st.begin_plan("5", 3, "v100:1x8:pp1", (("n3", 8),), "v100", "{}", "ac3", 8.0)
        st.set_plan_status(c, "failed", 9.0, "boom")
        assert st.cell_failures(["5"]) == {"5": {"v100:1x8:pp1": 1}}
        assert a != b
    with StateStore(path, readonly=True) as st:
        assert st.jobs()["5"].user == "alice"


def test_state_retires_a_reused_job_id(tmp_path):
    with StateStore(tmp_path / "s.sqlite") as st:
        st.accept_spec("1", "alice", SPEC.to_json(), "comment", 100.0)
        st.begin_plan("1", 1, "c", (("n1", 1),), "a100", "{}", "", 101.0)
        st.retire("1")
        assert "1" not in st.jobs() and st.open_plans() == {}
        assert any(k.startswith("1~") for k in st.jobs())


# --- inputs -------------------------------------------------------------------


def test_classify_phases():
    plain = SlurmJob(job_id="1", state="RUNNING", nodes=("n1",), gpus_per_node=2, partition="a100")
    held = managed_job("2")
    released = managed_job("3", held=False, reason="Resources", admin_comment=plan_comment("3", ("n2",)))
    running = managed_job("4", held=False, state="RUNNING", nodes=("n2",), admin_comment=plan_comment("4", ("n2",)))
    bad = managed_job("5", comment='cellsched/v1 {"model":"nope","global_batch":1,"iterations":1}')
    loose = managed_job("6", held=False, reason="Priority")
    rogue = managed_job("7", held=False, state="RUNNING", nodes=("n3",))
    done = managed_job("8", held=False, state="COMPLETED", exit_code=0)
    jobs = {
        m.job_id: m for m in inp.classify(snapshot(plain, held, released, running, bad, loose, rogue, done), {}, {})
    }
    assert "1" not in jobs  # not managed
    assert {k: m.phase for k, m in jobs.items()} == {
        "2": inp.Phase.HELD,
        "3": inp.Phase.RELEASED,
        "4": inp.Phase.RUNNING,
        "5": inp.Phase.BAD,
        "6": inp.Phase.LOOSE,
        "7": inp.Phase.UNPLANNED,
        "8": inp.Phase.FINISHED,
    }
    assert jobs["4"].current == placement("4", ("n2",))
    assert "model" in jobs["5"].reason
    assert jobs["3"].plan.checkpoint_dir == "/ckpt/3"


def test_stored_spec_wins_and_admin_comment_beats_comment(tmp_path):
    other = JobSpec(model="bert__760M", global_batch=32, iterations=10)
    j = managed_job("2", admin_comment=json.dumps({"spec": json.loads(other.to_json())}))
    (m,) = inp.classify(snapshot(j), {}, {})
    assert (m.spec, m.spec_source) == (other, "admin_comment")
    with StateStore(tmp_path / "s.sqlite") as st:
        st.accept_spec("2", "alice", SPEC.to_json(), "comment", 1.0)
        (m,) = inp.classify(snapshot(j), st.jobs(), {})
        assert (m.spec, m.spec_source) == (SPEC, "state")
        # the same id, submitted at another time: a new job, the stored spec does not apply
        st.save_statuses(
            [JobStatus("2", "alice", "PENDING", "held", "", 900.0, None, None, None, None, None, False)], 2.0
        )
        (m,) = inp.classify(
            snapshot(managed_job("2", submit_time=5000.0, admin_comment=j.admin_comment)), st.jobs(), {}
        )
        assert m.spec == other


def test_request_counts_unmanaged_gpus_as_taken_and_keeps_running_jobs():
    plain = SlurmJob(job_id="1", state="RUNNING", nodes=("n1",), gpus_per_node=3, partition="a100")
    running = managed_job(
        "4",
        held=False,
        state="RUNNING",
        nodes=("n2",),
        gpus_per_node=2,
        admin_comment=plan_comment("4", ("n2",)),
        start_time=700.0,
    )
    snap = snapshot(plain, running, managed_job("2", start_time=800.0), alloc={"n1": 3, "n2": 2})
    jobs = inp.classify(snap, {}, {})
    built = inp.build_request(snap, jobs, {"4": 30.0}, Config().solver)
    free = {n.name: n.gpus_free for n in built.view.nodes}
    assert free["n1"] == 1 and free["n2"] == 4  # the managed job's GPUs are the solver's to keep
    reqs = {r.job_id: r for r in built.request.jobs}
    assert set(reqs) == {"2", "4"}
    assert reqs["4"].current is not None and reqs["4"].iterations_done == 30.0
    assert reqs["2"].current is None and reqs["2"].user == "alice"
    # how long a running job has stayed weighs its restart; a pending job's StartTime is only a guess
    assert reqs["4"].running_since == 700.0 and reqs["2"].running_since is None


# --- reconcile ----------------------------------------------------------------


def test_decide_places_held_jobs_with_the_per_type_partition():
    snap = snapshot(managed_job("2"))
    jobs = inp.classify(snap, {}, {})
    view = inp.build_request(snap, jobs, {}, Config().solver).view
    (a,) = decide(jobs, {"2": placement("2", ("n1", "n2"))}, view, "/ck")
    assert a.kind == ActionKind.PLACE and not a.hold_first and a.why == "new"
    u = a.update
    assert (u.partition, u.features, u.num_nodes, u.req_nodes, u.gres_per_node) == ("a100", "a100", 2, ("n1", "n2"), 2)
    assert (u.num_tasks, u.tasks_per_node) == (4, 2)  # one task per GPU for `srun cellsched-launch`
    ac = json.loads(u.admin_comment)
    assert JobSpec.from_dict(ac["spec"]) == SPEC
    plan = JobPlan.from_dict(ac["plan"])
    assert (plan.pp, plan.dp, plan.tp, plan.nodes, plan.gpus_per_node, plan.gpu_types) == (
        1,
        4,
        1,
        ("n1", "n2"),
        2,
        ("a100",),
    )
    assert (plan.job_id, plan.cell, plan.global_batch, plan.checkpoint_dir, plan.virtual_workers) == (
        "2",
        "a100:2x2:pp1",
        64,
        "/ck/alice/2",
        4,
    )


def test_decide_leaves_unchanged_and_running_jobs_alone():
    released = managed_job("3", held=False, admin_comment=plan_comment("3", ("n2",)))
    running = managed_job("4", held=False, state="RUNNING", nodes=("n1",), admin_comment=plan_comment("4", ("n1",)))
    loose = managed_job("6", held=False)
    snap = snapshot(released, running, loose)
    jobs = inp.classify(snap, {}, {})
    view = inp.build_request(snap, jobs, {}, Config().solver).view
    same = {"3": placement("3", ("n2",)), "4": placement("4", ("n1",))}
    assert [(a.kind, a.job_id) for a in decide(jobs, same, view, "/ck")] == [(ActionKind.HOLD, "6")]
    moved = {"3": placement("3", ("n3",), "v100", 2), "4": placement("4", ("n2",))}
    acts = decide(jobs, moved, view, "/ck")
    assert [(a.kind, a.job_id, a.hold_first, a.why) for a in acts] == [
        (ActionKind.PLACE, "3", True, "move"),
        (ActionKind.HOLD, "6", False, "pending without a plan"),
    ]
    assert json.loads(acts[0].update.admin_comment)["plan"]["checkpoint_dir"] == "/ckpt/3"  # kept from the old plan


def test_choose_partition_and_checked():
    snap = snapshot()
    view = inp.build_request(snap, (), {}, Config().solver).view
    assert choose_partition(view, placement("x", ("n1",))) == "a100"
    assert choose_partition(view, placement("x", ("n1",)), allowed=("all",)) == "all"
    assert choose_partition(view, placement("x", ("n1",)), allowed=("v100",)) is None
    ok, rejected = checked(
        view, {"a": placement("a", ("n4",), "a40", 2), "b": placement("b", ("n4",), "a40", 2)}, {"b"}
    )
    assert set(ok) == {"b"} and "n4" in rejected["a"]


def test_intent_outcomes(tmp_path):
    with StateStore(tmp_path / "s.sqlite") as st:
        ac = plan_comment("3", ("n2",))
        plan = json.dumps(json.loads(ac)["plan"])
        for j in ("2", "3", "4", "9"):
            st.begin_plan(j, 1, "a100:1x2:pp1", (("n2", 2),), "a100", plan, ac, 1.0)
        opens = st.open_plans()
    held = managed_job("2", admin_comment=ac)
    released = managed_job("3", held=False, admin_comment=ac)
    other = managed_job("4", held=False, admin_comment=plan_comment("4", ("n1",)))
    jobs = inp.classify(snapshot(held, released, other), {}, opens)
    assert intent_outcomes(jobs, opens) == {"3": "released", "4": "abandoned", "9": "gone"}
    held_job = next(m for m in jobs if m.job_id == "2")
    assert held_job.phase == inp.Phase.HELD and held_job.current == placement("2", ("n2",))  # recovered from the intent


# --- progress, metrics, notify, status ----------------------------------------


def test_progress(tmp_path):
    assert read_progress(str(tmp_path)) is None
    (tmp_path / "progress.json").write_text(json.dumps({"step": 12, "iterations_done": 11.5, "time": 3.0}))
    assert read_progress(str(tmp_path)) == 11.5
    (tmp_path / "progress.json").write_text('{"iterations_done": -1}')
    assert read_progress(str(tmp_path)) is None
    (tmp_path / "progress.json").write_text("not json")
    assert read_progress(str(tmp_path)) is None
    assert estimate_done(100.0, 160.0, 2.0, 1000) == 30.0
    assert estimate_done(100.0, 1e9, 2.0, 1000) == 1000.0
    assert estimate_done(None, 160.0, 2.0, 1000) == 0.0
    assert default_checkpoint_dir("7", "bob", "/home/bob/run", "/r") == "/home/bob/run/.cellsched/7"
    assert default_checkpoint_dir("7", "bob", None, "/r") == "/r/bob/7"


def test_collect_progress_prefers_the_job_file(tmp_path):
    ac = json.loads(plan_comment("4", ("n2",)))
    ac["plan"]["checkpoint_dir"] = str(tmp_path)
    mine = dict(held=False, state="RUNNING", start_time=990.0, uid=os.getuid())
    running = managed_job("4", nodes=("n2",), admin_comment=json.dumps(ac), **mine)
    other = managed_job("5", nodes=("n1",), admin_comment=plan_comment("5", ("n1",)), **mine)
    jobs = inp.classify(snapshot(running, other, managed_job("2")), {}, {})
    read = ProgressFiles()
    assert collect_progress(jobs, 1000.0, (), read) == Progress(
        {"4": 20.0, "5": 20.0}, {"4": "estimate", "5": "estimate"}, {}, {}
    )  # 10 s / 0.5 s
    (tmp_path / "progress.json").write_text(
        json.dumps({"step": 7, "iterations_done": 7, "time": 999.0, "first_step_at": 995.5})
    )
    assert collect_progress(jobs, 1000.0, (), read) == Progress(
        {"4": 7.0, "5": 20.0}, {"4": "file", "5": "estimate"}, {"4": 995.5}, {}
    )


def test_metrics_exposition_over_http():
    m = Metrics()
    m.declare("actions_total", "counter", "Actions")
    m.inc("actions_total", labels={"kind": "place", "result": "ok"})
    m.inc("actions_total", labels={"kind": "place", "result": "ok"})
    m.set("round_duration_seconds", 0.25)
    server = serve(m, 0)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
    assert "# TYPE cellsched_actions_total counter" in body
    assert 'cellsched_actions_total{kind="place",result="ok"} 2' in body
    assert "cellsched_round_duration_seconds 0.25" in body


def test_sd_notify_sends_one_datagram(tmp_path, monkeypatch):
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert sd_notify("READY=1", "STATUS=round 1: ok")
        assert s.recv(4096) == b"READY=1\nSTATUS=round 1: ok"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not sd_notify("READY=1")


def test_status_rows_filter_by_user(tmp_path):
    with StateStore(tmp_path / "s.sqlite") as st:
        for j, user in (("2", "alice"), ("3", "bob")):
            st.accept_spec(j, user, SPEC.to_json(), "comment", 1.0)
        plan = JobPlan.from_dict(json.loads(plan_comment("2", ("n1",)))["plan"])
        pid = st.begin_plan("2", 1, plan.cell, (("n1", 2),), "a100", plan.to_json(), "", 2.0)
        st.set_plan_status(pid, "released", 3.0)
        st.save_statuses(
            [
                JobStatus("2", "alice", "RUNNING", "running", "", 900.0, 950.0, None, None, 20.0, "file", False),
                JobStatus("3", "bob", "PENDING", "held", "waiting", 900.0, None, None, None, None, None, False),
            ],
            4.0,
        )
        rows = {r["job_id"]: r for r in job_rows(st, now=1000.0)}
        assert set(rows) == {"2", "3"}
        r = rows["2"]
        assert (
            r["cell"],
            r["nodes"],
            r["pp"],
            r["dp"],
            r["tp"],
            r["iterations_done"],
            r["iterations"],
            r["queued_s"],
        ) == ("a100:1x2:pp1", ["n1:2"], 1, 2, 1, 20.0, 100, 50.0)
        assert r["samples_per_s"] == 128.0 and r["plan"] == json.loads(plan.to_json())
        assert rows["3"]["reason"] == "waiting" and rows["3"]["queued_s"] == 100.0
        assert [r["job_id"] for r in job_rows(st, now=1000.0, only_user="bob")] == ["3"]


def test_cli_status_without_state_is_a_clean_error(tmp_path):
    from click.testing import CliRunner

    from slurm_ext.cli import main

    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[controller]\nstate_path = "{tmp_path / "none.sqlite"}"\n')
    res = CliRunner().invoke(main, ["status", "--config", str(cfg)])
    assert res.exit_code == 2 and "no controller state" in res.output
    cfg.write_text("[controller]\nbogus = 1\n")
    res = CliRunner().invoke(main, ["controller", "run", "--once", "--config", str(cfg)])
    assert res.exit_code == 2 and "controller.bogus" in res.output
    assert os.environ.get("NOTIFY_SOCKET") is None


def test_a_job_the_solver_fails_on_is_left_out(tmp_path):
    """The real cellsched policy behind a wrapper that fails on one job: the
    round still places the others and names the culprit."""
    from slurm_ext.controller.round import Controller
    from slurm_ext.site import SiteReading
    from solver.policies import get_policy

    class Picky:
        name = "picky"

        def __init__(self) -> None:
            self.inner = get_policy("cellsched")

        def schedule(self, request, estimator):
            if any(j.job_id == "3" for j in request.jobs):
                raise RuntimeError("cannot handle job 3")
            return self.inner.schedule(request, estimator)

    class Frozen:  # a backend that only observes this snapshot (no accounting)
        name = "frozen"

        def observe(self):
            return snapshot(managed_job("2"), managed_job("3"))

        def read_site(self):
            return SiteReading()

    config = from_dict({"controller": {"state_path": str(tmp_path / "s.sqlite")}})
    ctl = Controller(config, backend=Frozen(), policy=Picky())
    report = ctl.round(dry_run=True)
    assert report.status == "ok"
    assert [a["job"] for a in report.actions] == ["2"]
    assert "cannot handle job 3" in {j.job_id: j.reason for j in report.jobs}["3"]
    ctl.state.close()


def test_one_controller_per_state_file(tmp_path):
    from slurm_ext.controller.lock import LockError, StateLock

    with StateLock(str(tmp_path / "s.sqlite")):
        with pytest.raises(LockError, match="another controller"):
            StateLock(str(tmp_path / "s.sqlite")).__enter__()
    with StateLock(str(tmp_path / "s.sqlite")):  # free again once released
        pass


def test_plan_status_transitions_are_checked(tmp_path):
    """A plan moves on (intent -> signalled -> requeued -> updated) or ends; it never goes back, and an ended plan
    stays ended."""
    from slurm_ext.state import PlanStatus, StateError, StateStore

    with StateStore(tmp_path / "s.sqlite") as st:
        plan = st.begin_plan("1", None, "a100 x 2", [("n1", 2)], "a100", "{}", "{}", 10.0)
        for status in (PlanStatus.SIGNALLED, PlanStatus.REQUEUED, PlanStatus.UPDATED, PlanStatus.RELEASED):
            st.set_plan_status(plan, status, 11.0)
        assert st.plans_of("1")[0].applied
        for bad in (PlanStatus.UPDATED, PlanStatus.FAILED, PlanStatus.RELEASED):
            with pytest.raises(StateError, match=f"released -> {bad} is not a status change"):
                st.set_plan_status(plan, bad, 12.0)
        other = st.begin_plan("2", None, "a100 x 2", [("n2", 2)], "a100", "{}", "{}", 10.0)
        st.set_plan_status(other, PlanStatus.UPDATED, 11.0)
        with pytest.raises(StateError, match="updated -> signalled"):
            st.set_plan_status(other, PlanStatus.SIGNALLED, 12.0)
        with pytest.raises(ValueError):
            st.set_plan_status(other, "done", 12.0)  # not a status at all
        assert [p.status for p in st.plans_of("2")] == [PlanStatus.UPDATED]
        with pytest.raises(StateError, match="no plan 99"):
            st.set_plan_status(99, PlanStatus.RELEASED, 12.0)


def test_a_preempted_job_is_signalled_then_checkpointing_then_requeued():
    """decide: a running job the reply preempted (and left without a
    placement) gets a PREEMPT action, unless static; classify: a running job
    cellsched preempted and has not requeued is checkpointing, and requeued
    after checkpoint_timeout_s without a checkpoint; ended with exit 75 it is
    checkpointed and requeued held like any job that ends so."""
    running = managed_job("4", held=False, state="RUNNING", nodes=("n1",), admin_comment=plan_comment("4", ("n1",)))
    snap = snapshot(running)
    jobs = inp.classify(snap, {}, {})
    view = inp.build_request(snap, jobs, {}, Config().solver).view
    acts = decide(jobs, {}, view, "/ck", preempted={"4": "9"})
    assert [(a.kind, a.job_id, a.preemptor, a.why) for a in acts] == [
        (ActionKind.PREEMPT, "4", "9", "preempted for job 9")
    ]
    assert decide(jobs, {}, view, "/ck", preempted={"4": "9"}, static={"4"}) == ()  # never signalled
    assert decide(jobs, {}, view, "/ck") == ()  # not preempted: left running
    yielding = inp.classify(snap, {}, {}, yielding={"4": (990.0, "9")})
    assert [(m.phase, m.reason, m.yielded) for m in yielding] == [
        (inp.Phase.CHECKPOINTING, "asked to checkpoint: preempted for job 9", (990.0, "9"))
    ]
    assert decide(yielding, {}, view, "/ck", now=1000.0, checkpoint_timeout_s=60.0) == ()  # still in its time
    late = decide(yielding, {}, view, "/ck", now=1100.0, checkpoint_timeout_s=60.0)
    assert [(a.kind, a.job_id) for a in late] == [(ActionKind.REQUEUE, "4")]
    ended = managed_job("4", held=False, state="FAILED", exit_code=75, admin_comment=plan_comment("4", ("n1",)))
    (m,) = inp.classify(snapshot(ended), {}, {}, yielding={"4": (990.0, "9")})
    assert m.phase == inp.Phase.CHECKPOINTED and m.current is None
    assert [(a.kind, a.why) for a in decide((m,), {}, view, "/ck")] == [
        (ActionKind.REQUEUE, "checkpointed; waits for a placement")
    ]


def test_the_state_keeps_preemptions_and_counts_restarts(tmp_path):
    with StateStore(tmp_path / "s.sqlite") as st:
        for job_id in ("1", "2", "3"):
            st.accept_spec(job_id, "alice", SPEC.to_json(), "comment", 1.0)
        st.add_history("1", HistoryEvent.YIELDED, 10.0, 1, "3")  # 1 preempted for 3 ...
        st.add_history("1", HistoryEvent.REQUEUED, 11.0, 1)  # ... and requeued
        st.add_history("1", HistoryEvent.YIELDED, 50.0, 2, "2")  # then for 2: not requeued yet
        st.add_history("2", HistoryEvent.YIELDED, 60.0, 3, "3")
        st.add_history("2", HistoryEvent.REQUEUED, 61.0, 3)
        st.add_history("2", HistoryEvent.REQUEUED, 90.0, 4)  # a move's requeue
        assert st.yielding(["1", "2", "3"]) == {"1": (50.0, "2")}
        assert st.preemptions(["1", "2", "3"]) == {
            "1": ((50.0, "2"), frozenset({"2", "3"})),
            "2": ((60.0, "3"), frozenset({"3"})),
        }
        assert st.preempted_for("3") == [(10.0, "1"), (60.0, "2")]
        assert st.restart_counts() == {"1": 1, "2": 2, "3": 0}
        assert st.restart_counts(["2", "9"]) == {"2": 2, "9": 0}
