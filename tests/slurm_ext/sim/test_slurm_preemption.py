"""Slurm's own preemption in the simulated Slurm (slurm_ext.sim.preempt):
a job of a QOS that preempts takes the GPUs of running jobs of the QOS it
preempts; what each victim becomes (checkpointed within its grace time,
requeued, PREEMPTED) is what the controller reads of a real Slurm 22.05
(docs/preemption.md), and a run in which an urgent plain job preempts a
managed one ends with every job complete and no work lost or counted twice."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from slurm_ext.backends.base import JobUpdate, SubmitRequest
from slurm_ext.controller.inputs import checkpointed, ended_reason, requeued_by_slurm
from slurm_ext.sim.backend import SimBackend
from slurm_ext.sim.clusterspec import ClusterSpecError, load_cluster_spec
from slurm_ext.sim.engine import SimError, SimOptions, Simulator
from slurm_ext.sim.preempt import SlurmPreemption
from slurm_ext.sim.site import SiteUsage
from slurm_ext.sim.types import AccountSpec, ClusterSpec, NodeGroup, QosSpec, SiteSpec, TraceJob
from slurm_ext.sim.world import SimWorld
from solver.contract import EXIT_CHECKPOINTED
from solver.contract.jobspec import JobSpec
from solver.contract.plan import JobPlan
from solver.estimator import EstimatorBase
from solver.site import LimitKind
from solver.types import Estimate, ParallelPlan

CLUSTER = ClusterSpec((NodeGroup("a100", 2, 4),))


def speed(spec, gpu_type, num_nodes, gpus_per_node, plan):
    """4 GPU-seconds per iteration: 1 s per iteration on 4 GPUs."""
    return 4.0 / (num_nodes * gpus_per_node)


def world(grace_s: float, mode: str = "REQUEUE", **kw) -> tuple[SimWorld, SimBackend]:
    p = SlurmPreemption({"urgent": frozenset({"normal"})}, {"normal": grace_s}, {"urgent": 10.0}, mode)
    w = SimWorld(CLUSTER, speed=speed, checkpoint_s=5.0, requeue_delay_s=120.0, preemption=p, **kw)
    return w, SimBackend(w)


def managed(b: SimBackend, node: str, *, elastic: bool = True, iterations: int = 1000) -> str:
    """A managed job of QOS normal, released on all 4 GPUs of `node` (as the controller does)."""
    s = JobSpec(model="bert__760M", global_batch=64, iterations=iterations, elastic=elastic)
    job_id = b.submit(
        SubmitRequest(script="job.sh", gres_per_node=1, nodes=1, hold=True, comment=s.to_comment(), qos="normal")
    )
    place(b, job_id, node)
    return job_id


def place(b: SimBackend, job_id: str, node: str) -> None:
    plan = JobPlan(pp=1, dp=4, tp=1, gpu_types=("a100",), nodes=(node,), gpus_per_node=4)
    b.update(
        job_id,
        JobUpdate(
            partition="a100",
            num_nodes=1,
            req_nodes=(node,),
            gres_per_node=4,
            admin_comment=json.dumps({"plan": json.loads(plan.to_json())}),
            start_soon=True,
        ),
    )
    b.release(job_id)


def urgent(b: SimBackend, gpus: int = 4, qos: str = "urgent") -> str:
    """A plain sbatch job (no spec: it runs until cancelled)."""
    return b.submit(SubmitRequest(script="u.sh", gres_per_node=gpus, nodes=1, partition="a100", qos=qos))


def test_a_victim_that_checkpoints_within_its_grace_time_ends_failed_75_with_its_progress():
    w, b = world(grace_s=20.0)
    a = managed(b, "a100-1")
    w.advance(1.0)
    c = managed(b, "a100-2")
    w.advance(41.5)  # c: 40.5 iterations
    u = urgent(b)
    assert b.observe().job(u).reason == "Resources"  # it waits for its victim's GPUs
    victim = b.observe().job(c)  # the younger one
    assert (victim.state, victim.preempted_at) == ("RUNNING", 41.5)
    assert b.observe().job(a).preempted_at is None
    w.advance(46.4)
    assert b.observe().job(c).state == "RUNNING"  # writing its checkpoint
    w.advance(46.5)
    ended = b.observe().job(c)
    assert (ended.state, ended.exit_code, ended.preempted_at) == ("FAILED", EXIT_CHECKPOINTED, 41.5)
    assert checkpointed(ended) and ended.preempted
    assert w.iterations_done(c) == 40.0  # whole iterations at the signal: kept
    assert b.observe().job(u).state == "RUNNING" and b.observe().job(u).nodes == ("a100-2",)
    w.advance(100.0)  # no kill at the end of the grace time: it ended
    assert (b.observe().job(c).state, w.all_jobs[c].restarts) == ("FAILED", 0)
    b.requeue(c, hold=True)  # the controller: Phase.CHECKPOINTED
    again = b.observe().job(c)
    assert (again.state, again.held, again.preempted_at, w.all_jobs[c].restarts) == ("PENDING", True, None, 1)
    assert w.iterations_done(c) == 40.0


def test_a_victim_whose_checkpoint_outlasts_the_grace_time_is_killed_and_requeued_by_slurm():
    w, b = world(grace_s=2.0)
    job_id = managed(b, "a100-1")
    managed(b, "a100-2")
    b.signal(job_id, "USR1", target="steps")  # an earlier checkpoint (the controller's) at 0 iterations ...
    w.advance(5.0)
    b.requeue(job_id, hold=True)
    place(b, job_id, "a100-1")
    w.advance(15.0)
    b.signal(job_id, "USR1", target="steps")  # ... and one at 10 iterations
    w.advance(20.0)
    b.requeue(job_id, hold=True)
    place(b, job_id, "a100-1")  # runs from 20 s, from 10 iterations, the younger job now
    w.advance(60.0)
    assert w.iterations_done(job_id) == pytest.approx(50.0)
    u = urgent(b)
    assert b.observe().job(job_id).preempted_at == 60.0
    w.advance(61.9)
    assert b.observe().job(job_id).state == "RUNNING" and b.observe().job(u).state == "PENDING"
    w.advance(62.0)
    job = b.observe().job(job_id)
    assert (job.state, job.held, job.reason, job.preempted_at, job.nodes) == ("PENDING", False, "BeginTime", None, ())
    assert (job.eligible_time, job.submit_time, w.all_jobs[job_id].restarts) == (62.0 + 120.0, 62.0, 3)
    assert requeued_by_slurm(job, w.now)  # what the controller holds at once (Phase.SLURM_REQUEUED)
    assert w.iterations_done(job_id) == 10.0  # back to its last checkpoint
    assert b.observe().job(u).nodes == ("a100-1",)
    w.advance(62.0 + 120.0)  # nobody held it: Slurm starts it again by itself once it fits (never here)
    assert b.observe().job(job_id).reason == "Resources"


def test_cancel_ends_a_victim_preempted_without_a_checkpoint():
    w, b = world(grace_s=0.0, mode="CANCEL")
    job_id = managed(b, "a100-1")
    managed(b, "a100-2", elastic=True)
    w.advance(30.0)
    w.all_jobs[job_id].start_time = 1.0  # the younger of the two
    u = urgent(b)
    w.advance(30.0)  # grace 0: killed at once
    job = b.observe().job(job_id)
    assert (job.state, job.exit_code, job.preempted_at) == ("PREEMPTED", 0, 30.0)
    assert job.finished and not checkpointed(job)
    assert ended_reason(job).startswith("preempted by Slurm (preempted)")
    assert b.observe().job(u).state == "RUNNING"


def test_a_plain_job_is_killed_and_requeued_and_starts_again_after_its_begin_time():
    w, b = world(grace_s=10.0)
    plain = b.submit(SubmitRequest(script="p.sh", gres_per_node=4, nodes=2, partition="a100", qos="normal"))
    w.advance(50.0)
    u = urgent(b, gpus=2)
    w.advance(59.9)
    assert b.observe().job(plain).state == "RUNNING"  # no checkpoint: it runs out its grace time
    w.advance(60.0)
    assert (b.observe().job(plain).state, w.all_jobs[plain].restarts) == ("PENDING", 1)
    assert b.observe().job(u).state == "RUNNING"
    b.cancel(u)
    w.advance(179.9)
    assert b.observe().job(plain).reason == "BeginTime"
    w.advance(180.0)
    assert b.observe().job(plain).state == "RUNNING"


def test_a_released_managed_job_preempts_on_the_nodes_of_its_plan_only():
    w, b = world(grace_s=0.0)
    older = managed(b, "a100-1")
    w.advance(10.0)
    younger = managed(b, "a100-2")
    s = JobSpec(model="bert__760M", global_batch=64, iterations=10, elastic=True)
    job_id = b.submit(
        SubmitRequest(script="job.sh", gres_per_node=1, nodes=1, hold=True, comment=s.to_comment(), qos="urgent")
    )
    place(b, job_id, "a100-1")  # its plan's node: the older job's, not the youngest's
    w.advance(10.0)
    assert b.observe().job(older).state == "PENDING" and b.observe().job(younger).preempted_at is None
    assert b.observe().job(job_id).nodes == ("a100-1",)


def test_victims_lowest_priority_first_then_youngest_and_only_those_needed():
    p = SlurmPreemption(
        {"urgent": frozenset({"normal", "scavenger"})}, {}, {"urgent": 10.0, "normal": 5.0, "scavenger": 0.0}
    )

    def job(job_id, qos, node, gpus, start, preempted=None):
        return SimpleNamespace(job_id=job_id, qos=qos, nodes=(node,), gres=gpus, start_time=start, preempt_at=preempted)

    running = [
        job("1", "scavenger", "n1", 2, 0.0),
        job("2", "normal", "n1", 2, 5.0),
        job("3", "normal", "n2", 4, 10.0),
        job("4", "urgent", "n2", 0, 20.0),  # not a QOS it preempts
    ]

    def on_one_node(gpus):
        return lambda freed: any(freed.get(n, 0) >= gpus for n in ("n1", "n2"))

    assert p.victims("urgent", running, on_one_node(2)) == ("1",)  # the lowest priority
    # 4 on one node: scavenger (n1: 2 free, not enough), then the youngest normal (n2: 4): scavenger let go
    assert p.victims("urgent", running, on_one_node(4)) == ("3",)
    # a job being preempted already frees its GPUs soon: 2 frees 2 of n1, with 1's there are 4
    running[1].preempt_at = 1.0
    assert p.victims("urgent", running, on_one_node(2)) == ()
    assert p.victims("urgent", running, on_one_node(4)) == ("1",)
    assert p.victims("urgent", running, on_one_node(8)) == ()  # nothing would do
    assert p.victims("normal", running, on_one_node(2)) == ()  # normal preempts nobody


def test_a_job_over_its_limit_preempts_nobody_and_waits_with_the_limits_reason():
    w, b = world(grace_s=0.0, gate=lambda job: "AssocGrpGRES" if job.qos == "urgent" else "")
    job_id = managed(b, "a100-1")
    managed(b, "a100-2")
    u = urgent(b)
    assert b.observe().job(u).reason == "AssocGrpGRES"
    w.advance(10.0)
    assert b.observe().job(job_id).state == "RUNNING" and b.observe().job(job_id).preempted_at is None


# ---- the cluster file ----------------------------------------------------------------------

NODES = '[[nodes]]\ngpu_type = "a100"\ncount = 1\ngpus_per_node = 4\n'
SITE = (
    "[site]\ndefault_qos = 'normal'\npreempt_mode = 'CANCEL'\n[site.accounts.a]\n"
    "[site.qos.normal]\ngrace_s = 30\n"
    "[site.qos.urgent]\npriority = 10\npreempt = ['normal']\nplain = true\n"
)


def test_the_preemption_of_the_cluster_file_is_read(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(NODES + SITE)
    site = load_cluster_spec(path).site
    assert site is not None and site.preempt_mode == "CANCEL"
    assert site.qos == (
        QosSpec("normal", grace_s=30.0),
        QosSpec("urgent", priority=10.0, preempt=("normal",), plain=True),
    )
    p = SlurmPreemption.of_site(site)
    assert p is not None and p.preempts_any("urgent") and not p.preempts_any("normal")
    assert (p.grace("normal"), p.grace("urgent"), p.mode) == (30.0, 0.0, "CANCEL")
    assert SlurmPreemption.of_site(SiteSpec((AccountSpec("a"),), (QosSpec("normal"),))) is None


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("preempt_mode = 'SUSPEND'", "field 'preempt_mode' must be one of REQUEUE, CANCEL"),
        ("preempt = ['low']", "site.qos.urgent: field 'preempt' must be a list of the other QOS"),
        ("preempt = ['urgent']", "site.qos.urgent: field 'preempt' must be a list of the other QOS"),
        ("grace_s = -1", "site.qos.normal: field 'grace_s' must be a number >= 0"),
        ("plain = 1", "site.qos.urgent: field 'plain' must be true or false"),
    ],
)
def test_a_bad_preemption_field_is_an_error_naming_it(tmp_path, bad, message):
    key = bad.split(" =")[0]
    lines = [(bad if line.startswith(key + " =") else line) for line in SITE.splitlines()]
    path = tmp_path / "c.toml"
    path.write_text(NODES + "\n".join(lines) + "\n")
    with pytest.raises(ClusterSpecError, match=message):
        load_cluster_spec(path)


# ---- a run -------------------------------------------------------------------------------


class Table(EstimatorBase):
    """4 GPU-seconds per iteration on any cell: truth and estimate."""

    def speed(self, spec, gpu_type, num_nodes, gpus_per_node, plan):
        return speed(spec, gpu_type, num_nodes, gpus_per_node, plan)

    def estimate(self, job, cell):
        return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), 4.0 / cell.num_gpus, 4.0 / cell.num_gpus, "measured")


def preempted_run(grace_s: float, mode: str = "REQUEUE", arena_compat: bool = False):
    """A managed job (normal, 1000 iterations, 4 GPUs at best) from t=0, and a
    plain urgent job of 4 GPUs (100 iterations) at t=300 on one 4-GPU node."""
    site = SiteSpec(
        (AccountSpec("a"),),
        (QosSpec("normal", grace_s=grace_s), QosSpec("urgent", priority=10.0, preempt=("normal",), plain=True)),
        "normal",
        preempt_mode=mode,
    )
    cluster = ClusterSpec((NodeGroup("a100", 1, 4),), site=site)
    trace = [
        TraceJob("m", 0.0, "bert__760M", 64, 1000, 4, "a100", account="a", user="u", qos="normal"),
        TraceJob("u", 300.0, "bert__760M", 64, 100, 4, "a100", account="a", user="u", qos="urgent"),
    ]
    opts = SimOptions(restart_per_gpu_s=0.0, restart_max_s=0.0, checkpoint_s=5.0, arena_compat=arena_compat)
    sim = Simulator(trace, cluster, "cellsched", speed=Table().speed, estimator=Table(), options=opts)
    return sim, sim.run()


@pytest.mark.parametrize(("grace_s", "lost_s"), [(20.0, 0.0), (2.0, 302.0)])
def test_an_urgent_plain_job_preempts_a_managed_one_which_resumes_from_its_checkpoint(grace_s, lost_s):
    sim, result = preempted_run(grace_s)
    jobs = {j.job_id: j for j in result.jobs}
    assert all(j.finished for j in jobs.values())
    m, u = jobs["m"], jobs["u"]
    assert (m.restarts, u.restarts) == (1, 0)
    assert m.cells == ("a100:1x4",) and m.first_start == 0.0
    # the urgent job starts when its victim leaves: after its checkpoint (5 s) or its grace time (2 s)
    assert u.first_start == 300.0 + (5.0 if grace_s >= 5.0 else grace_s)
    assert u.end_time == u.first_start + 100.0
    # the managed job's 1000 iterations at 4 GPU-seconds each, held once: the checkpoint's 5 s on top,
    # or the 302 s it ran past its last checkpoint (its start) done again; nothing else lost or skipped
    assert m.gpu_seconds == pytest.approx(4 * (1000.0 + (5.0 if not lost_s else lost_s)))
    assert m.end_time > u.end_time
    assert m.end_time - u.end_time == pytest.approx(1000.0 - (300.0 if not lost_s else 0.0), abs=5.0)


def test_slurms_preemption_is_refused_in_arena_compat_mode():
    with pytest.raises(SimError, match="not modelled in arena-compat mode"):
        preempted_run(20.0, arena_compat=True)


def test_the_gpus_of_running_plain_jobs_count_under_the_limits_the_policy_sees():
    """As the live controller counts jobs it does not manage (slurm_ext.site.round_policy)."""
    site = SiteSpec((AccountSpec("a", gpus=8, jobs=3),), (QosSpec("urgent", plain=True),))
    usage = SiteUsage(site, 16, lambda: 0.0, 0.0)
    usage.register("1", TraceJob("p", 0.0, "m", 64, 10, 4, "a100", account="a", user="u", qos="urgent"), plain=True)
    usage.register("2", TraceJob("m", 0.0, "m", 64, 10, 2, "a100", account="a", user="u"))
    for sid, gpus in (("1", 4), ("2", 2)):
        usage.started(SimpleNamespace(job_id=sid, gpus=gpus, gres=gpus, nodes=("a100-1",)), f"a100:1x{gpus}")
    limits = {(lim.kind, lim.name): lim.used_outside for lim in usage.site_policy().limits}
    assert limits == {(LimitKind.GRP, "a"): 4, (LimitKind.GRP_JOBS, "a"): 1}  # the plain job's, not the managed one's
    usage.stopped(SimpleNamespace(job_id="1", gpus=4, gres=4, nodes=("a100-1",)), 10.0)
    assert all(lim.used_outside == 0 for lim in usage.site_policy().limits)
