"""SimBackend: the Backend protocol's semantics on the simulated Slurm
(what tests/slurm_ext/backends/ checks on the real one), and the simulated
runs of its world (slurm_ext.sim.world) as its accounting records them."""

from __future__ import annotations

import json

import pytest

from slurm_ext.backends.base import Backend, JobUpdate, SlurmCommandError, SubmitRequest, UpdateNotApplied
from slurm_ext.sim.accounting import Accounting
from slurm_ext.sim.backend import SimBackend
from slurm_ext.sim.quantum import ITERATIONS, QuantumMode
from slurm_ext.sim.types import SINGLE, ClusterSpec, JobOutcome, KindUse, NodeGroup
from slurm_ext.sim.world import SimWorld
from solver.contract import EXIT_CHECKPOINTED
from solver.contract.jobspec import JobSpec
from solver.contract.plan import JobPlan

CLUSTER = ClusterSpec((NodeGroup("a100", 2, 4), NodeGroup("v100", 2, 8)))
#: seconds per iteration by GPU type (x GPUs: perfect scaling of a 1-GPU time)
ONE_GPU = {"a100": 4.0, "v100": 8.0}


def speed(spec, gpu_type, num_nodes, gpus_per_node, plan):
    return ONE_GPU.get(gpu_type, 0) / (num_nodes * gpus_per_node) or None


def sim(**kw) -> tuple[SimWorld, SimBackend, Accounting]:
    """A world on CLUSTER (at `speed` unless told), the backend over it, and its accounting."""
    kw.setdefault("speed", speed)
    accounting = Accounting()
    world = SimWorld(CLUSTER, observers=(accounting,), **kw)
    return world, SimBackend(world), accounting


def spec(iterations: int = 100, elastic: bool = True) -> JobSpec:
    return JobSpec(model="bert__760M", global_batch=64, iterations=iterations, elastic=elastic)


def submit(b: SimBackend, s: JobSpec | None = None, hold: bool = True) -> str:
    return b.submit(
        SubmitRequest(script="job.sh", gres_per_node=1, nodes=1, hold=hold, comment=(s or spec()).to_comment())
    )


def place(b: SimBackend, job_id: str, nodes: tuple[str, ...], gpn: int, *, now: bool = False) -> None:
    gpu_type = nodes[0].split("-")[0]
    plan = JobPlan(pp=1, dp=len(nodes) * gpn, tp=1, gpu_types=(gpu_type,), nodes=nodes, gpus_per_node=gpn)
    b.update(
        job_id,
        JobUpdate(
            partition=gpu_type,
            features=gpu_type,
            num_nodes=len(nodes),
            req_nodes=nodes,
            gres_per_node=gpn,
            num_tasks=len(nodes) * gpn,
            tasks_per_node=gpn,
            admin_comment=json.dumps({"plan": json.loads(plan.to_json())}),
            start_soon=now,
        ),
    )
    b.release(job_id)


def test_the_cluster_looks_like_slurm_shows_it():
    snap = sim(start_time=1000.0)[1].observe()
    assert snap.taken_at == 1000.0
    assert [n.name for n in snap.nodes] == ["a100-1", "a100-2", "v100-1", "v100-2"]
    n = snap.node("v100-2")
    assert (n.gpu_type, n.gpus_total, n.gpus_alloc, n.state, n.features, n.partitions) == (
        "v100",
        8,
        0,
        "idle",
        ("v100",),
        ("v100", "all"),
    )
    assert {p.name: p.nodes for p in snap.partitions} == {
        "a100": ("a100-1", "a100-2"),
        "v100": ("v100-1", "v100-2"),
        "all": ("a100-1", "a100-2", "v100-1", "v100-2"),
    }
    assert [p.name for p in snap.partitions if p.default] == ["all"]


def test_a_held_job_runs_where_the_update_puts_it():
    w, b, acct = sim()
    job_id = submit(b)
    held = b.observe().job(job_id)
    assert (held.state, held.held, held.reason, held.partition, held.gpus_per_node, held.gpu_type) == (
        "PENDING",
        True,
        "JobHeldUser",
        "all",
        1,
        None,
    )
    assert held.comment.startswith("cellsched/v1 ")
    place(b, job_id, ("a100-1", "a100-2"), 2)
    job = b.observe().job(job_id)
    assert (job.state, job.nodes, job.num_nodes, job.batch_host, job.partition, job.features) == (
        "RUNNING",
        ("a100-1", "a100-2"),
        2,
        "a100-1",
        "a100",
        "a100",
    )
    assert (job.num_tasks, job.tasks_per_node, job.start_time) == (4, 2, 0.0)
    snap = b.observe()
    assert (snap.node("a100-1").gpus_alloc, snap.node("a100-1").state, snap.node("v100-1").gpus_alloc) == (
        2,
        "mixed",
        0,
    )


def test_an_update_of_a_running_job_is_refused_but_its_admin_comment_sticks():
    w, b, acct = sim()
    job_id = submit(b)
    place(b, job_id, ("a100-1",), 4)
    with pytest.raises(UpdateNotApplied) as info:
        b.update(job_id, JobUpdate(partition="v100", num_nodes=2, admin_comment="x"))
    assert set(info.value.mismatches) == {"partition", "num_nodes"}
    assert "no longer pending" in info.value.detail
    assert b.update(job_id, JobUpdate(admin_comment="y")).admin_comment == "y"
    with pytest.raises(SlurmCommandError, match="no longer pending"):
        b.hold(job_id)


def test_req_nodes_outside_the_partition_is_reported_like_the_cli_backend():
    w, b, acct = sim()
    job_id = submit(b)
    with pytest.raises(UpdateNotApplied) as info:
        b.update(job_id, JobUpdate(partition="v100", req_nodes=("a100-1",)))
    assert info.value.mismatches == {"req_nodes": ("nodes of partition v100", "a100-1 outside it")}
    b.release(job_id)  # released anyway: it can never start
    assert b.observe().job(job_id).reason == "BadConstraints"
    with pytest.raises(UpdateNotApplied) as info:  # not applied: the old list stays
        b.update(job_id, JobUpdate(req_nodes=("x-9",)))
    assert "Invalid node name" in info.value.detail and info.value.job.required_nodes == ("a100-1",)
    with pytest.raises(SlurmCommandError, match="Invalid job id"):
        b.update("99", JobUpdate(admin_comment="x"))


def test_a_released_job_without_nodes_waits_for_gpus_of_its_type():
    w, b, acct = sim()
    first = submit(b)
    place(b, first, ("v100-1", "v100-2"), 8)
    second = submit(b)
    b.update(second, JobUpdate(partition="v100", features="v100", gres_per_node=4))
    b.release(second)
    assert (b.observe().job(second).state, b.observe().job(second).reason) == ("PENDING", "Resources")
    b.cancel(first)
    job = b.observe().job(second)
    assert job.state == "RUNNING" and job.nodes[0].startswith("v100-")
    assert b.observe().job(first).state == "CANCELLED"


def test_a_job_completes_after_its_stall_and_iterations_then_vanishes():
    w, b, acct = sim(restart_cost=lambda s, gpus, first: 10.0 * gpus, min_job_age_s=300.0, start_time=50.0)
    job_id = submit(b, spec(iterations=30))
    place(b, job_id, ("a100-1",), 2)  # 2 GPUs: 2 s per iteration, 20 s restart stall
    assert w.next_event_time() == 70.0  # the stall ends
    w.advance(100.0)
    assert w.iterations_done(job_id) == pytest.approx(15.0)
    assert w.throughput() == pytest.approx(32.0)
    w.advance(129.0)
    assert b.observe().job(job_id).state == "RUNNING"
    w.advance(130.0)
    done = b.observe().job(job_id)
    assert (done.state, done.exit_code, done.end_time) == ("COMPLETED", 0, 130.0)
    assert acct.outcome(job_id, "j", 50.0).gpu_seconds == pytest.approx(2 * 80.0)
    w.advance(430.0)
    assert job_id not in {j.job_id for j in b.observe().jobs}


def test_a_job_started_at_time_zero_is_charged_its_gpu_seconds():
    w, b, acct = sim(restart_cost=lambda s, gpus, first: 0.0)
    job_id = submit(b, spec(iterations=30))
    place(b, job_id, ("a100-1",), 2)  # at t=0: 2 s per iteration
    w.advance(60.0)
    assert b.observe().job(job_id).state == "COMPLETED"
    assert acct.outcome(job_id, "j", 0.0).gpu_seconds == pytest.approx(2 * 60.0)


def test_usr1_to_the_steps_checkpoints_an_elastic_job_and_a_requeue_resumes_it():
    w, b, acct = sim(checkpoint_s=5.0)
    job_id = submit(b, spec(iterations=100))
    place(b, job_id, ("a100-1",), 4)  # 1 s per iteration
    w.advance(10.5)
    b.signal(job_id, "USR1", target="steps")
    w.advance(15.4)
    assert b.observe().job(job_id).state == "RUNNING"  # still writing its checkpoint
    w.advance(15.5)
    ended = b.observe().job(job_id)
    assert (ended.state, ended.exit_code) == ("FAILED", EXIT_CHECKPOINTED)
    assert w.iterations_done(job_id) == 10.0  # whole iterations at the signal
    assert b.observe().node("a100-1").gpus_alloc == 0
    b.requeue(job_id, hold=True)
    again = b.observe().job(job_id)
    assert (again.state, again.held, again.exit_code, w.all_jobs[job_id].restarts) == ("PENDING", True, None, 1)
    place(b, job_id, ("a100-1", "a100-2"), 4, now=True)  # 8 GPUs now: 0.5 s per iteration
    assert b.observe().job(job_id).state == "RUNNING"
    w.advance(15.5 + 45.0)
    assert b.observe().job(job_id).state == "COMPLETED"
    assert acct.outcome(job_id, "j", 0.0).cells == ("a100:1x4", "a100:2x4")


def test_a_requeued_job_waits_for_its_begin_time_unless_told_start_now():
    w, b, acct = sim(checkpoint_s=0.0, requeue_delay_s=120.0)
    job_id = submit(b)
    place(b, job_id, ("a100-1",), 4)
    b.signal(job_id, "TERM", target="steps")
    w.advance(0.0)
    b.requeue(job_id, hold=True)
    place(b, job_id, ("a100-1",), 4)  # no StartTime=now
    assert b.observe().job(job_id).reason == "BeginTime"
    w.advance(119.0)
    assert b.observe().job(job_id).state == "PENDING"
    w.advance(120.0)
    assert b.observe().job(job_id).state == "RUNNING"


def test_a_non_elastic_job_ignores_usr1_and_dies_of_kill():
    w, b, acct = sim()
    job_id = submit(b, spec(elastic=False))
    place(b, job_id, ("a100-1",), 4)
    b.signal(job_id, "USR1", target="steps")
    w.advance(50.0)
    assert b.observe().job(job_id).state == "RUNNING"
    b.signal(job_id, "KILL", target="all")
    assert (b.observe().job(job_id).state, b.observe().job(job_id).exit_code) == ("FAILED", 137)
    with pytest.raises(SlurmCommandError, match="completed"):
        b.signal(job_id, "USR1", target="steps")


def test_a_node_going_down_requeues_its_jobs_back_to_their_last_checkpoint():
    w, b, acct = sim()
    job_id = submit(b)
    place(b, job_id, ("a100-1",), 4)
    w.advance(40.0)
    w.set_node_state("a100-1", "down")
    job = b.observe().job(job_id)
    assert (job.state, job.held, job.reason, job.nodes) == ("PENDING", False, "BeginTime", ())
    assert w.iterations_done(job_id) == 0.0 and w.all_jobs[job_id].restarts == 1
    node = b.observe().node("a100-1")
    assert (node.state, node.available, node.gpus_alloc) == ("down", False, 0)
    w.advance(200.0)
    assert b.observe().job(job_id).reason == "ReqNodeNotAvail"  # still requires the down node
    w.set_node_state("a100-1", "idle")
    assert b.observe().job(job_id).state == "RUNNING"


def test_a_drained_node_takes_no_new_work():
    w, b, acct = sim()
    w.set_node_state("a100-1", "drain")
    assert b.observe().node("a100-1").flags == ("DRAIN",)
    job_id = submit(b)
    place(b, job_id, ("a100-1",), 1)
    assert b.observe().job(job_id).state == "PENDING"


def test_an_infeasible_cell_fails_the_job_at_start():
    w, b, acct = sim(speed=lambda *a: None)
    job_id = submit(b)
    place(b, job_id, ("a100-1",), 1)
    job = b.observe().job(job_id)
    assert (job.state, job.exit_code, acct.infeasible_starts) == ("FAILED", 1, 1)


def test_quantum_mode_completes_at_round_boundaries_and_rescales_executed_seconds():
    """Arena's progress: floor(executed seconds / the CURRENT iteration time)."""
    for model, after_resize in (("executed-seconds", 300.0), (ITERATIONS, 150.0)):
        w, b, acct = sim(quantum=QuantumMode(300.0, model), checkpoint_s=0.0)
        job_id = submit(b, spec(iterations=500))
        place(b, job_id, ("a100-1",), 2)  # 2 s per iteration
        w.quantum.settle(w, 300.0)
        assert w.iterations_done(job_id) == 150.0
        b.signal(job_id, "USR1", target="steps")
        w.advance(300.0)
        b.requeue(job_id, hold=True)
        place(b, job_id, ("a100-1",), 4, now=True)  # 1 s per iteration
        assert w.iterations_done(job_id) == after_resize
        w.quantum.settle(w, 600.0)
        assert b.observe().job(job_id).state == ("COMPLETED" if model == "executed-seconds" else "RUNNING")


def test_the_counts_the_engine_samples_and_the_accounts_it_reports():
    """What the engine reads: the world's counts, and each job's outcome from the accounting."""
    w, b, acct = sim(checkpoint_s=0.0, restart_cost=lambda s, gpus, first: 10.0)
    held, running = submit(b), submit(b, spec(iterations=50))
    place(b, running, ("a100-1",), 4)  # 1 s per iteration after a 10 s stall
    assert (w.num_pending(), w.num_running(), w.has_active_jobs()) == (1, 1, True)
    w.advance(20.0)
    b.signal(running, "USR1", target="steps")
    w.advance(20.0)
    b.requeue(running, hold=True)
    place(b, running, ("a100-1", "a100-2"), 4, now=True)
    assert not acct.completed(running)
    w.advance(100.0)
    assert (w.num_pending(), w.num_running(), w.has_active_jobs(), acct.completed(running)) == (1, 0, False, True)
    a = acct.outcome(running, "trace-2", 0.0)
    assert (a.job_id, a.first_start, a.finished, a.restarts, a.cells) == (
        "trace-2",
        0.0,
        True,
        1,
        ("a100:1x4", "a100:2x4"),
    )
    assert a.end_time == 20.0 + 10.0 + 40 * 0.5 and a.gpu_seconds == 4 * 20.0 + 8 * 30.0
    assert a.kinds == {SINGLE: KindUse(2, 20.0 + 30.0, 4 * 20.0 + 8 * 30.0)}
    assert acct.outcome(held, "trace-1", 0.0) == JobOutcome("trace-1", 0.0, None, None, False)
    b.requeue(running)  # a completed job requeued has not completed (yet)
    assert not acct.completed(running) and acct.outcome(running, "trace-2", 0.0).end_time is None


def test_a_rounds_throughput_takes_the_restart_stall_off():
    """Quantum mode: a job stalled for a third of the round counts two thirds of its speed."""
    w, b, acct = sim(quantum=QuantumMode(300.0), checkpoint_s=0.0, restart_cost=lambda s, gpus, first: 100.0)
    job_id = submit(b)
    place(b, job_id, ("a100-1",), 4)  # 1 s per iteration, 64 samples per iteration
    assert w.quantum.round_throughput(w, 0.0) == pytest.approx(64.0 * 2 / 3)
    assert w.quantum.round_throughput(w, 300.0) == 64.0


def test_the_sim_backend_is_registered():
    from slurm_ext.backends import get_backend

    b = get_backend("sim", cluster=CLUSTER, start_time=5.0)
    assert isinstance(b, SimBackend) and b.name == "sim" and b.observe().taken_at == 5.0
    assert get_backend("sim").observe().node("a100-01").gpus_total == 4  # Arena's cluster by default


def test_the_sim_backend_is_the_backend_protocol_and_nothing_more():
    """Everything else of the simulation (clock, world, accounting, Arena's rounds) lives outside it."""
    protocol = {n for n in dir(Backend) if not n.startswith("_")} | set(Backend.__annotations__)
    assert {n for n in dir(SimBackend) if not n.startswith("_")} == protocol
    _, b, _ = sim()
    assert [n for n in vars(b) if not n.startswith("_")] == []
    assert protocol >= {"observe", "submit", "update", "signal", "requeue_many", "name"}  # the oracle is not empty
