"""A running job's next plan as the controller writes it, and the model it
prices the job as, without Slurm: the micro-batches of a moved plan
(reconcile.job_plan), the layout a job's checkpoint binds
(inputs.resumes_from), and the model shape a job reports in progress.json
(read as untrusted input, kept once, priced from then on)."""

from __future__ import annotations

import json
import os

import pytest

from slurm_ext.config import from_dict
from slurm_ext.controller import inputs as inp
from slurm_ext.controller.progress import EachCall, JobProgress, collect_progress, parse_progress
from slurm_ext.controller.reconcile import decide
from slurm_ext.controller.round import Controller
from slurm_ext.records import ClusterSnapshot, SlurmJob, SlurmNode, SlurmPartition
from slurm_ext.site import SiteReading
from solver.contract.jobspec import JobSpec
from solver.contract.models import ModelShape, get_model
from solver.contract.plan import JobPlan
from solver.contract.runtimes import Layout
from solver.types import Cell, ParallelPlan, Placement, ScheduleReply, SolverStatus

NODES = (("n1", "a100", 4), ("n2", "a100", 4))
TRAINED = ModelShape(8, 32, 4, 16, 64)


def snapshot(*jobs: SlurmJob) -> ClusterSnapshot:
    nodes = tuple(
        SlurmNode(name=n, gpu_type=t, gpus_total=g, gpus_alloc=0, state="idle", partitions=(t, "all"))
        for n, t, g in NODES
    )
    parts = (SlurmPartition(name="a100", nodes=("n1", "n2")), SlurmPartition(name="all", nodes=("n1", "n2")))
    return ClusterSnapshot(nodes=nodes, partitions=parts, jobs=jobs, taken_at=1000.0)


def running(spec: JobSpec, plan: JobPlan, **kw) -> SlurmJob:
    """Job 7 running on n1 with `plan` in its AdminComment."""
    ac = json.dumps({"spec": json.loads(spec.to_json()), "plan": json.loads(plan.to_json())})
    base = dict(
        job_id="7",
        user="alice",
        uid=os.getuid(),
        state="RUNNING",
        held=False,
        partition="a100",
        comment=spec.to_comment(),
        admin_comment=ac,
        submit_time=900.0,
        start_time=950.0,
        nodes=plan.nodes,
        gpus_per_node=plan.gpus_per_node,
    )
    return SlurmJob(**{**base, **kw})


def on_n1(runtime: str, pp: int, dp: int, m: int, **kw) -> JobPlan:
    gpus = pp * dp
    return JobPlan(
        pp=pp,
        dp=dp,
        micro_batches=m,
        global_batch=12,
        gpu_types=("a100",),
        nodes=("n1",),
        gpus_per_node=gpus,
        cell=f"a100:1x{gpus}:pp{pp}",
        job_id="7",
        runtime=runtime,
        checkpoint_dir="/ck/7",
        **kw,
    )


def written(spec: JobSpec, old: JobPlan, to: Placement) -> JobPlan:
    """The plan the controller writes when it moves the job running `old` to `to`."""
    snap = snapshot(running(spec, old))
    (m,) = inp.classify(snap, {}, {})
    assert m.phase == inp.Phase.RUNNING and m.plan == old
    view = inp.build_request(snap, (m,), {}, from_dict({}).solver).view
    (action,) = decide((m,), {"7": to}, view, "/ck")
    return JobPlan.from_dict(json.loads(action.update.admin_comment)["plan"])


def test_a_job_moved_into_a_pipeline_gets_at_least_pp_micro_batches_and_keeps_them_out_of_it():
    """The bug: job_plan kept an exact job's one micro-batch from pp=1, and 1F1B refused pp=2 with it."""
    spec = JobSpec(model="gpt-tiny", global_batch=12, iterations=10, elastic=True, runtime="exact", virtual_workers=6)
    pp2 = Placement("7", Cell("a100", 1, 4, pp=2), (("n1", 4),), ParallelPlan(2, 2, 1, micro_batches=2), 0.5)
    into = written(spec, on_n1("exact", 1, 2, 1, virtual_workers=6), pp2)
    assert (into.pp, into.micro_batches, into.virtual_workers) == (2, 2, 6)
    dp2 = Placement("7", Cell("a100", 1, 2), (("n1", 2),), ParallelPlan(1, 2, 1, micro_batches=1), 0.5)
    out = written(spec, on_n1("exact", 2, 2, 2, virtual_workers=6), dp2)
    assert (out.pp, out.micro_batches) == (1, 2)  # a virtual worker's work stays the same
    sharded = JobSpec(model="gpt-tiny", global_batch=12, iterations=10, elastic=True, runtime="sharded")
    assert written(sharded, on_n1("sharded", 2, 2, 2), dp2).micro_batches == 1  # the new plan's own


def test_the_progress_file_gives_the_model_shape_as_the_jobs_own_word():
    record = {"step": 3, "iterations_done": 3, "model": TRAINED.to_dict()}
    assert parse_progress(json.dumps(record).encode()) == JobProgress(3.0, model=TRAINED)
    assert parse_progress(b'{"step": 3, "model": {"layers": 2}}').model == ModelShape(2)  # layers alone
    for bad, why in (
        ({"layers": 0}, "'layers' must be an integer from 1 to 10000, got 0"),
        ({"layers": 8, "hidden": 10**7}, "'hidden' must be an integer from 1 to 1000000"),
        ({"layers": True}, "'layers' must be an integer"),
        ({"layers": 8.0}, "'layers' must be an integer"),
        ({"hidden": 32}, "missing field 'layers'"),
        ({"layers": 8, "experts": 4}, "unknown field 'experts'"),
        ([8], "expected an object, got list"),
    ):
        p = parse_progress(json.dumps({"step": 3, "model": bad}).encode())
        assert (p.iterations_done, p.model) == (3.0, None), bad  # the progress itself is still used
        assert why in p.model_note, (bad, p.model_note)


def test_the_controller_prices_the_model_trained_from_its_first_report_on(tmp_path):
    """A sharded job submitted as gpt-350m reports 8 layers: the request's
    model is the one it trains, and the first shape is kept (once)."""
    spec = JobSpec(model="gpt-350m", global_batch=12, iterations=100, elastic=True, runtime="sharded")
    job = running(spec, on_n1("sharded", 1, 2, 1))
    reports = {"shape": None}

    class Frozen:
        name = "frozen"

        def observe(self):
            return snapshot(job)

        def read_site(self):
            return SiteReading()

    class Asked:  # keeps the job where it runs; remembers the requests
        name = "asked"
        requests = []

        def schedule(self, request, estimator):
            self.requests.append(request)
            return ScheduleReply({j.job_id: j.current for j in request.jobs}, SolverStatus.FEASIBLE)

    def report(m):
        return JobProgress(5.0, first_step_at=960.0, model=reports["shape"])

    config = from_dict({"controller": {"state_path": str(tmp_path / "s.sqlite")}})
    ctl = Controller(config, backend=Frozen(), policy=Asked(), progress=EachCall(report))
    ctl.round()
    assert Asked.requests[-1].jobs[0].model == get_model("gpt-350m")
    for shape in (TRAINED, ModelShape(2)):  # the first kept: a later one does not replace it
        reports["shape"] = shape
        ctl.round()
        (req,) = Asked.requests[-1].jobs
        assert (req.model.num_layers, req.model.hidden, req.model.heads, req.model.seq_len, req.model.vocab) == (
            8,
            32,
            4,
            16,
            64,
        )
        assert req.model.family == "gpt" and req.model.name == "gpt-350m (trained L8 H32 A4 S16 V64)"
        assert ctl.state.jobs()["7"].model_shape == json.dumps(TRAINED.to_dict(), sort_keys=True)
    ctl.state.close()


def test_a_shape_that_makes_no_model_of_the_spec_is_not_used():
    spec = JobSpec(model="gpt-350m", global_batch=12, iterations=100, runtime="sharded")
    assert inp.trained_model(spec, ModelShape(8, hidden=30, heads=4)) == get_model("gpt-350m")  # 4 heads, hidden 30
    assert inp.trained_model(spec, None) == get_model("gpt-350m")


@pytest.mark.parametrize(("done", "binds"), [(0.0, False), (5.0, True)])
def test_a_job_that_has_trained_resumes_from_its_last_plan(done, binds):
    spec = JobSpec(model="gpt-350m", global_batch=12, iterations=100, elastic=True, runtime="torchtitan")
    snap = snapshot(running(spec, on_n1("torchtitan", 1, 2, 1)))
    (m,) = inp.classify(snap, {}, {})
    (req,) = inp.build_request(snap, (m,), {"7": done}, from_dict({}).solver).request.jobs
    assert req.resumes_from == (Layout(1, 2, 1, frozenset({"a100"})) if binds else None)
    assert req.move_pins == ((("dp", "2"),) if binds else ())


def test_collect_progress_hands_on_the_shapes_and_notes_a_bad_one():
    spec = JobSpec(model="gpt-350m", global_batch=12, iterations=100, runtime="sharded")
    jobs = inp.classify(snapshot(running(spec, on_n1("sharded", 1, 2, 1))), {}, {})
    good = collect_progress(jobs, 1000.0, (), EachCall(lambda m: JobProgress(5.0, 960.0, model=TRAINED)))
    assert good.models == {"7": TRAINED} and good.notes == {}
    bad = collect_progress(jobs, 1000.0, (), EachCall(lambda m: JobProgress(5.0, 960.0, model_note="its model shape")))
    assert bad.models == {} and bad.notes == {"7": "its model shape"} and bad.done == {"7": 5.0}
