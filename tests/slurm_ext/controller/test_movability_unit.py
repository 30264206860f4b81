"""Movability from the checkpoint hook (slurm_ext.controller.hooks): a
running job whose runtime checkpoints only through the script's hook (ddp)
is static (never signalled, resized or moved) until its hook file names it
for its current run. Without Slurm: the file read as untrusted input, the
request, the actions, and whole rounds on the simulated backend."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from slurm_ext.backends.base import SubmitRequest
from slurm_ext.config import from_dict
from slurm_ext.controller import inputs as inp
from slurm_ext.controller.hooks import MAX_BYTES, STATIC_REASON, Hook, HookFiles, collect_movability, parse_hook
from slurm_ext.controller.progress import EachCall, JobProgress, Unreadable
from slurm_ext.controller.reconcile import ActionKind, decide
from slurm_ext.controller.round import Controller
from slurm_ext.records import ClusterSnapshot, SlurmJob, SlurmNode, SlurmPartition
from slurm_ext.sim.backend import SimBackend
from slurm_ext.sim.types import ClusterSpec, NodeGroup
from slurm_ext.sim.world import SimWorld
from slurm_ext.state import StateStore
from slurm_ext.view import to_cluster_view
from solver.contract import HOOK_FILE
from solver.contract.jobspec import JobSpec
from solver.contract.plan import JobPlan
from solver.types import Cell, ParallelPlan, Placement, ScheduleReply, SolverStatus

DDP = JobSpec(model="gpt-350m", global_batch=64, iterations=10_000, elastic=True, gpu_types=("a100",))
EXACT = JobSpec(
    model="gpt-350m", global_batch=64, iterations=10_000, elastic=True, gpu_types=("a100",), runtime="exact"
)


# ---- the hook file: the job's own word ---------------------------------------------------


def test_a_hook_record_is_parsed():
    assert parse_hook(b'{"job_id": "42", "time": 1700000000.5}') == Hook("42", 1700000000.5)
    assert parse_hook(b'{"job_id": "42", "time": 7, "extra": [1]}') == Hook("42", 7.0)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"", "not JSON"),
        (b"{", "not JSON"),
        (b'["42", 1]', "not a JSON object"),
        (b'{"time": 1}', "no job_id (a string)"),
        (b'{"job_id": 42, "time": 1}', "no job_id (a string)"),
        (b'{"job_id": "", "time": 1}', "no job_id (a string)"),
        (b'{"job_id": "42"}', "no time (a number >= 0)"),
        (b'{"job_id": "42", "time": true}', "no time (a number >= 0)"),
        (b'{"job_id": "42", "time": "now"}', "no time (a number >= 0)"),
        (b'{"job_id": "42", "time": -1}', "no time (a number >= 0)"),
        (b'{"job_id": "42", "time": NaN}', "no time (a number >= 0)"),
        (b'{"job_id": "42", "time": Infinity}', "no time (a number >= 0)"),
    ],
)
def test_a_malformed_hook_record_is_unreadable(raw, why):
    with pytest.raises(Unreadable) as e:
        parse_hook(raw)
    assert str(e.value) == why


def running(job_id: str, spec: JobSpec, ckpt: str | None, start: float = 1000.0, **kw: Any) -> inp.ManagedJob:
    plan = JobPlan(
        dp=4, global_batch=64, gpu_types=("a100",), nodes=("n1",), gpus_per_node=4, checkpoint_dir=ckpt, job_id=job_id
    )
    job = SlurmJob(
        job_id=job_id,
        user="alice",
        uid=os.getuid(),
        state="RUNNING",
        partition="all",
        nodes=("n1",),
        start_time=start,
        submit_time=900.0,
        comment=spec.to_comment(),
    )
    current = inp.placement_of(job_id, plan)
    return inp.ManagedJob(job, inp.Phase.RUNNING, spec, spec.to_json(), "comment", "", plan, current, **kw)


def test_the_hook_file_is_read_without_trusting_it(tmp_path):
    read = HookFiles(timeout_s=2.0, budget_s=10.0)
    m = running("42", DDP, str(tmp_path))
    assert read(m) is None  # no file yet
    hook = tmp_path / HOOK_FILE
    hook.write_text(json.dumps({"job_id": "42", "time": 1001.0}))
    assert read(m) == Hook("42", 1001.0)
    hook.unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps({"job_id": "42", "time": 1001.0}))
    hook.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(Unreadable, match="a symbolic link"):
        read(m)
    hook.unlink()
    os.mkfifo(hook)  # a FIFO nobody writes: opened without waiting, then refused
    with pytest.raises(Unreadable, match="not a regular file"):
        read(m)
    hook.unlink()
    hook.write_text(json.dumps({"job_id": "42", "time": 1001.0, "pad": "x" * MAX_BYTES}))
    with pytest.raises(Unreadable, match=f"more than {MAX_BYTES}"):
        read(m)
    assert read(running("42", DDP, None)) is None  # a plan without a checkpoint directory: nothing to read


def test_a_hook_file_of_another_owner_is_refused(tmp_path):
    (tmp_path / HOOK_FILE).write_text(json.dumps({"job_id": "42", "time": 1001.0}))
    m = running("42", DDP, str(tmp_path))
    other = inp.ManagedJob(**{**m.__dict__, "job": SlurmJob(**{**m.job.__dict__, "uid": os.getuid() + 1})})
    with pytest.raises(Unreadable, match="not by the job's user"):
        HookFiles()(other)


# ---- static or movable ---------------------------------------------------------------------


def answers(hooks: dict[str, Any]):
    """A HookReader answering from `hooks` (job id -> a Hook, an exception, or absent: no file)."""

    def read(m: inp.ManagedJob) -> Hook | None:
        got = hooks.get(m.job_id)
        if isinstance(got, Exception):
            raise got
        return got

    return EachCall(read)


def test_a_ddp_job_is_static_until_its_hook_names_it_in_its_current_run():
    jobs = tuple(running(j, DDP, "/ck/" + j) for j in ("1", "2", "3", "4", "5"))
    hooks = {
        "2": Hook("2", 1000.0),  # registered when the run started: movable
        "3": Hook("99", 1000.0),  # another job's file (a copied directory)
        "4": Hook("4", 500.0),  # an earlier run's: this run has not registered yet
        "5": Unreadable("not JSON"),
    }
    moving, seen = collect_movability(jobs, answers(hooks))
    assert moving.static == {"1", "3", "4", "5"}
    assert moving.notes == {"5": "checkpoint hook file not read: not JSON"}
    assert seen == {"2": 1000.0}
    # the clock slack: a hook written up to a minute "before" the start (another node's clock) counts
    moving, _ = collect_movability((running("6", DDP, "/ck/6"),), answers({"6": Hook("6", 941.0)}))
    assert moving.static == frozenset()


def test_a_registered_run_is_not_read_again_and_a_new_run_must_register_again():
    calls: list[str] = []

    def read(m: inp.ManagedJob) -> Hook | None:
        calls.append(m.job_id)
        return Hook(m.job_id, 1000.0)

    m = running("1", DDP, "/ck/1")
    moving, seen = collect_movability((m,), read)
    assert not moving.static and calls == ["1"]
    moving, seen = collect_movability((m,), read, seen)
    assert not moving.static and calls == ["1"]  # not read again
    rerun = running("1", DDP, "/ck/1", start=2000.0)  # requeued: its file is the earlier run's
    moving, seen = collect_movability((rerun,), read, seen)
    assert moving.static == {"1"} and calls == ["1", "1"]


def test_runtimes_that_answer_the_signal_are_never_static_and_their_files_are_not_read():
    def read(m: inp.ManagedJob) -> Hook | None:
        raise AssertionError(f"job {m.job_id}'s hook file was read")

    jobs = tuple(
        running(str(i), JobSpec(**{**DDP.__dict__, "runtime": r}), "/ck")
        for i, r in enumerate(("exact", "sharded", "torchtitan", "megatron", "adaptive"))
    )
    moving, _ = collect_movability(jobs, read)
    assert moving.static == frozenset() and moving.notes == {}


def test_a_static_job_is_neither_elastic_nor_movable_in_the_request_and_is_never_moved():
    m = running("1", DDP, "/ck/1")
    snap = ClusterSnapshot(
        nodes=(
            SlurmNode(name="n1", gpu_type="a100", gpus_total=4, gpus_alloc=4, state="alloc", partitions=("all",)),
            SlurmNode(name="n2", gpu_type="a100", gpus_total=4, gpus_alloc=0, state="idle", partitions=("all",)),
        ),
        partitions=(SlurmPartition(name="all", nodes=("n1", "n2")),),
        jobs=(m.job,),
        taken_at=2000.0,
    )
    cfg = from_dict({}).solver
    (free,) = inp.build_request(snap, (m,), {}, cfg).request.jobs
    assert free.elastic and free.movable
    (req,) = inp.build_request(snap, (m,), {}, cfg, static={"1"}).request.jobs
    assert not req.elastic and not req.movable and req.current == m.current
    view = to_cluster_view(snap, ["1"])
    wider = Placement("1", Cell("a100", 2, 4, 1), (("n1", 4), ("n2", 4)), ParallelPlan(1, 8, 1), 0.25)
    (a,) = decide((m,), {"1": wider}, view, "/ck")
    assert a.kind == ActionKind.MOVE  # movable: resized
    assert decide((m,), {"1": wider}, view, "/ck", static={"1"}) == ()  # static: left alone


# ---- whole rounds: no policy gets a static job signalled ---------------------------------------


class Widen:
    """A policy that puts a waiting job on the first node, and widens every
    running job to both nodes whatever its flags say: only the controller
    stands between it and a static job."""

    name = "widen"

    def schedule(self, request, estimator) -> ScheduleReply:
        nodes = [n.name for n in request.cluster.nodes]
        out = {}
        for j in request.jobs:
            if j.current is None:
                out[j.job_id] = Placement(j.job_id, Cell("a100", 1, 4, 1), ((nodes[0], 4),), ParallelPlan(1, 4, 1), 1.0)
            else:
                both = tuple((n, 4) for n in nodes)
                out[j.job_id] = Placement(j.job_id, Cell("a100", 2, 4, 1), both, ParallelPlan(1, 8, 1), 0.5)
        return ScheduleReply(out, SolverStatus.HEURISTIC)


def rounds_until_running(tmp_path: Path, spec: JobSpec, hooks: dict[str, Any]):
    world = SimWorld(ClusterSpec((NodeGroup("a100", 2, 4),)), speed=lambda *a: 1.0)
    sim = SimBackend(world)
    signals: list[str] = []
    real_signal = sim.signal

    def signal(job_id: str, *a: Any, **kw: Any) -> None:
        signals.append(job_id)
        real_signal(job_id, *a, **kw)

    sim.signal = signal  # type: ignore[method-assign]
    job_id = sim.submit(SubmitRequest(script="job.sh", gres_per_node=1, hold=True, comment=spec.to_comment()))
    config = from_dict({"controller": {"state_path": str(tmp_path / "s.sqlite"), "kick_file": ""}})

    def progress(m: inp.ManagedJob) -> JobProgress | None:
        done = world.iterations_done(m.job_id)
        return None if done is None else JobProgress(done, world.first_step_at(m.job_id))

    ctl = Controller(
        config,
        backend=sim,
        state=StateStore(tmp_path / "s.sqlite"),
        clock=lambda: world.now,
        sleep=lambda dt: world.advance(world.now + dt),
        progress=EachCall(progress),
        policy=Widen(),
        hooks=answers(hooks),
    )
    ctl.round()  # placed on one node
    world.advance(world.now + 30.0)
    assert sim.observe().job(job_id).state == "RUNNING"
    return ctl, world, job_id, signals


def test_a_static_job_is_never_signalled_whatever_the_policy_wants(tmp_path):
    ctl, world, job_id, signals = rounds_until_running(tmp_path, DDP, {})
    for _ in range(3):
        report = ctl.round()
        world.advance(world.now + 30.0)
        (status,) = report.jobs
        assert status.phase == inp.Phase.RUNNING and status.reason == STATIC_REASON
        assert report.actions == () and signals == []
    ctl.state.close()


def test_a_job_whose_hook_names_it_is_moved(tmp_path):
    hooks: dict[str, Any] = {}
    ctl, world, job_id, signals = rounds_until_running(tmp_path, DDP, hooks)
    assert ctl.round().actions == () and signals == []
    hooks[job_id] = Hook(job_id, world.now)  # the script called launch.on_checkpoint
    report = ctl.round()
    assert [a["kind"] for a in report.actions] == ["move"] and signals == [job_id]
    ctl.state.close()


def test_a_job_whose_runtime_answers_the_signal_is_moved_without_a_hook(tmp_path):
    ctl, world, job_id, signals = rounds_until_running(tmp_path, EXACT, {})
    report = ctl.round()
    assert [a["kind"] for a in report.actions] == ["move"] and signals == [job_id]
    ctl.state.close()


def test_a_jobs_requeues_reach_its_request_as_restarts():
    m = running("1", DDP, "/ck/1")
    snap = ClusterSnapshot(
        nodes=(SlurmNode(name="n1", gpu_type="a100", gpus_total=4, gpus_alloc=4, state="alloc", partitions=("all",)),),
        partitions=(SlurmPartition(name="all", nodes=("n1",)),),
        jobs=(m.job,),
        taken_at=2000.0,
    )
    cfg = from_dict({}).solver
    (req,) = inp.build_request(snap, (m,), {}, cfg, restarts={"1": 3, "2": 9}).request.jobs
    assert req.restarts == 3
    (never,) = inp.build_request(snap, (m,), {}, cfg).request.jobs
    assert never.restarts == 0
