"""A job's runtime (solver.contract.runtimes) from its spec to the solver's request
and the plan the controller writes, without Slurm (docs/runtimes.md)."""

from __future__ import annotations

import json

import pytest

from slurm_ext.config import Config
from slurm_ext.controller import inputs as inp
from slurm_ext.controller.reconcile import decide
from slurm_ext.records import ClusterSnapshot, SlurmJob, SlurmNode, SlurmPartition
from slurm_ext.sim.engine import TRACE_RUNTIME, Simulator
from slurm_ext.sim.types import ClusterSpec, NodeGroup, TraceJob
from solver.contract.jobspec import JobSpec, JobSpecError
from solver.contract.plan import JobPlan
from solver.estimator import EstimatorBase
from solver.types import Cell, Estimate, ParallelPlan, Placement

NODES = (("n1", "a100", 4), ("n2", "a100", 4), ("n3", "v100", 8), ("n4", "a40", 2), ("n5", "a40", 2))


def snapshot(*jobs: SlurmJob) -> ClusterSnapshot:
    nodes = tuple(
        SlurmNode(name=n, gpu_type=t, gpus_total=g, gpus_alloc=0, state="idle", partitions=(t, "all"))
        for n, t, g in NODES
    )
    parts = (SlurmPartition(name="all", nodes=tuple(n for n, _, _ in NODES)),)
    return ClusterSnapshot(nodes=nodes, partitions=parts, jobs=jobs, taken_at=1000.0)


def held(job_id: str, spec: JobSpec) -> SlurmJob:
    return SlurmJob(
        job_id=job_id,
        user="alice",
        state="PENDING",
        held=True,
        reason="JobHeldUser",
        partition="all",
        comment=spec.to_comment(),
        submit_time=900.0,
        gpus_per_node=1,
    )


def written_plan(spec: JobSpec) -> JobPlan:
    """The plan the controller writes when it places a held job with this spec on 2 A100s."""
    snap = snapshot(held("5", spec))
    (m,) = inp.classify(snap, {}, {})
    view = inp.build_request(snap, (m,), {}, Config().solver).view
    p = Placement("5", Cell("a100", 1, 2, 1), (("n1", 2),), ParallelPlan(1, 2, 1, 1), 0.5)
    (a,) = decide((m,), {"5": p}, view, "/ck")
    return JobPlan.from_dict(json.loads(a.update.admin_comment)["plan"])


def test_a_spec_that_names_no_runtime_is_ddp():
    raw = {"model": "gpt-350m", "global_batch": 64, "iterations": 10}  # a spec from before runtimes had names
    assert JobSpec.from_dict(raw).runtime == "ddp"
    assert json.loads(JobSpec.from_dict(raw).to_json())["runtime"] == "ddp"  # kept explicit from then on


@pytest.mark.parametrize("name", ["ddp", "sharded", "exact", "torchtitan", "megatron", "adaptive"])
def test_the_runtime_goes_from_the_spec_to_the_request_and_the_plan(name):
    spec = JobSpec(model="gpt-350m", global_batch=64, iterations=10, runtime=name)
    snap = snapshot(held("5", spec))
    (m,) = inp.classify(snap, {}, {})
    assert m.spec.runtime == name
    (req,) = inp.build_request(snap, (m,), {}, Config().solver).request.jobs
    assert req.runtime == name
    assert written_plan(spec).runtime == name


def test_an_unknown_runtime_in_a_spec_is_refused_naming_the_known_ones():
    with pytest.raises(JobSpecError) as e:
        JobSpec.from_dict({"model": "gpt-350m", "global_batch": 64, "iterations": 10, "runtime": "horovod"})
    assert str(e.value) == (
        "runtime: unknown runtime 'horovod' (known: ddp, sharded, exact, torchtitan, megatron, adaptive)"
    )
    job = held("5", JobSpec(model="gpt-350m", global_batch=64, iterations=10))
    bad = job.comment.replace('"runtime":"ddp"', '"runtime":"horovod"')
    (m,) = inp.classify(snapshot(SlurmJob(**{**job.__dict__, "comment": bad})), {}, {})
    assert m.phase == inp.Phase.BAD and "unknown runtime 'horovod'" in m.reason


def test_virtual_workers_belong_to_the_runtimes_that_have_them():
    JobSpec(model="gpt-350m", global_batch=64, iterations=10, virtual_workers=8, runtime="exact")
    with pytest.raises(JobSpecError, match=r"^virtual_workers: runtime ddp has no virtual workers"):
        JobSpec(model="gpt-350m", global_batch=64, iterations=10, virtual_workers=8)


def test_an_elastic_ddp_job_gets_no_virtual_workers_and_its_plan_v_is_its_dp():
    """EasyScale's V is the exact runtime's; a ddp job's dp is whatever its plan says."""
    spec = JobSpec(model="gpt-350m", global_batch=64, iterations=10, elastic=True)
    (m,) = inp.classify(snapshot(held("5", spec)), {}, {})
    assert m.spec.virtual_workers is None and inp.fixed_virtual_workers(m) is None
    plan = written_plan(spec)
    assert (plan.dp, plan.virtual_workers) == (2, 2)
    exact = JobSpec(model="gpt-350m", global_batch=64, iterations=10, elastic=True, runtime="exact")
    (m,) = inp.classify(snapshot(held("5", exact)), {}, {})
    assert m.spec.virtual_workers == 32  # 18 A100/V100/A40 GPUs: the smallest divisor of 64 from 18 up


def test_simulated_trace_jobs_run_adaptive_parallelism():
    """The documented rule: Arena's jobs run adaptive parallelism, as Arena
    assumes. The policy is asked about each trace job as an adaptive one."""
    asked: set[str] = set()

    def speed(spec, gpu_type, num_nodes, gpus_per_node, plan):
        return 1.0

    class Estimator(EstimatorBase):
        def estimate(self, job, cell):
            asked.add(job.runtime)
            return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), 1.0, 1.0, "measured")

    trace = [TraceJob("a", 0.0, "bert__760M", 64, 20, 2, "a100"), TraceJob("b", 5.0, "bert__760M", 64, 20, 4, "a100")]
    sim = Simulator(trace, ClusterSpec((NodeGroup("a100", 1, 8),)), "fcfs", speed=speed, estimator=Estimator())
    result = sim.run()
    assert all(j.finished for j in result.jobs)
    assert TRACE_RUNTIME == "adaptive" and asked == {"adaptive"}


def test_the_controller_applies_no_plan_outside_the_runtime_whatever_the_policy():
    """reconcile.checked, the last step before any action: a ddp job's pp=2
    placement is rejected; the plan it already runs on is left alone (a job
    placed before it had a runtime is not stopped for it)."""
    from slurm_ext.controller.reconcile import checked
    from slurm_ext.view import to_cluster_view
    from solver.contract.models import get_model
    from solver.types import JobRequest

    view = to_cluster_view(snapshot(), ())
    pp2 = Placement("5", Cell("a100", 1, 4, 2), (("n1", 4),), ParallelPlan(2, 2, 1), 0.5)
    dp4 = Placement("5", Cell("a100", 1, 4, 1), (("n1", 4),), ParallelPlan(1, 4, 1), 0.5)
    req = JobRequest("5", get_model("gpt-350m"), 64, 10, runtime="ddp")
    ok, rejected = checked(view, {"5": pp2}, jobs={"5": req})
    assert ok == {} and rejected == {"5": "plan rejected: job 5: runtime ddp has no pipeline parallelism (pp=2)"}
    assert checked(view, {"5": dp4}, jobs={"5": req}) == ({"5": dp4}, {})
    running = JobRequest("5", get_model("gpt-350m"), 64, 10, runtime="ddp", current=pp2, elastic=False)
    assert checked(view, {"5": pp2}, jobs={"5": running}) == ({"5": pp2}, {})
