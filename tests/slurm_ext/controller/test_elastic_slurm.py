"""Elastic jobs on the real dev cluster: a default elastic job (no
--virtual-workers) is grown when GPUs free up and shrunk again when another
job needs them (checkpoint, requeue, update, release, resume); a restart
that dies before training is requeued and completes; a trained job whose
restarts keep failing is parked held until its user releases it; a job is
re-placed when its node goes down. The training is the reference trainer under srun
cellsched-launch; its losses must be bitwise those of an uninterrupted run."""

from __future__ import annotations

import json
import logging
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "launch"))  # trainer_runs, srun_local

from controller_support import (
    ROOT,
    end_blocker,
    find_job,
    job_env,
    job_logs,
    job_progress,
    round_placing,
    start_blocker,
    submit_managed,
    submit_training,
    wait_job_state,
    wait_until,
    write_config,
)
from trainer_runs import train

from slurm_ext.backends import STEPS as TO_STEPS
from slurm_ext.backends import get_backend
from slurm_ext.config import load
from slurm_ext.controller import relaunch
from slurm_ext.controller.round import Controller
from solver.contract.profiles.arena import load_device_specs
from solver.contract.profiles.gpus import default_gpu_specs
from solver.contract.profiles.records import CellRecord
from solver.contract.profiles.store import ProfileStore

pytestmark = pytest.mark.slurm

TRAIN = ROOT / "contrib" / "examples" / "train_gpt.py"
#: the steps a job trains: the default test's job must still be training when it is shrunk, after
#: its grow and a failed restart; the other jobs meet their events within their first few steps
STEPS = 60
SHORT_STEPS = 30
#: global batch: the plan's (64 by default: gpt-350m gets one sample per micro-batch, so a step of
#: 256 samples is 256 micro-batches; 64 is a quarter of the compute, with the same cells and V)
TRAIN_FLAGS = ("--model", "gpt-tiny", "--dtype", "float64")


def uninterrupted(tmp_path: Path, plan: dict, steps: int = STEPS) -> list[float]:
    """The losses of the same training run without a stop, under `plan`
    (the job's first plan), on local ranks."""
    keep = ("pp", "dp", "tp", "micro_batches", "virtual_workers", "global_batch")
    run = train({k: plan[k] for k in keep if k in plan}, tmp_path / "uninterrupted.json", steps, *TRAIN_FLAGS)
    return run.losses


@contextmanager
def _meanwhile(fn: Callable[..., list[float]], *args: object) -> Iterator[Future]:
    """fn(*args) in a thread while the block waits on the cluster (the job
    mostly sleeps between its steps); yields its Future; leaving the block
    waits for it."""
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(fn, *args)


def _controller(tmp_path: Path, **controller: object) -> Controller:
    """An in-process controller on the test cluster; data-parallel plans only
    (pp = 1 here, and tp = 1 is what the estimator picks for this model), so
    that a resize changes only dp and the losses stay bitwise the same."""
    config = write_config(tmp_path / "cellsched.toml", tmp_path / "state.sqlite", **controller)
    with config.open("a") as f:
        f.write("max_pp = 1\n")
    return Controller(load(config))


def _submit_elastic(
    tmp_path: Path,
    *extra: str,
    step_delay: float = 0.3,
    fail_restart: int | None = None,
    batch: int = 64,
    fail_while: Path | None = None,
    steps: int = STEPS,
) -> str:
    """An elastic managed job running the reference trainer; scheduled as a
    long gpt-350m job (so growing it pays), trained as gpt-tiny. With
    `fail_restart`, that restart of the job dies before training, once; with
    `fail_while`, every run dies before training while that file exists."""
    train = [str(TRAIN), *TRAIN_FLAGS, "--steps", str(steps), "--step-delay", str(step_delay)]
    train += ["--out", str(tmp_path / "losses.json")]
    fail = ""
    if fail_restart is not None:
        marker = tmp_path / "failed-once"
        fail = (
            f'if [ "${{SLURM_RESTART_COUNT:-0}}" = {fail_restart} ] && [ ! -e {marker} ]; then '
            f"touch {marker}; echo 'injected start-up failure' >&2; exit 1; fi\n"
        )
    if fail_while is not None:
        fail += f"if [ -e {fail_while} ]; then echo 'injected start-up failure' >&2; exit 1; fi\n"
    # the reference trainer's runtime: any plan, moved on the checkpoint signal
    sbatch = ["--runtime", "exact", "--model", "gpt-350m", "--global-batch", str(batch), "--iterations", "200000"]
    return submit_training(tmp_path, train, [*sbatch, "--elastic", *extra], prelude=fail)


def _losses(tmp_path: Path) -> list[float]:
    return json.loads((tmp_path / "losses.json").read_text())["losses"]


def _steps_done(backend, job_id: str) -> float:
    p = job_progress(backend, job_id)
    return p.iterations_done if p is not None else 0.0


def _first_step_after(backend, job_id: str, t: float) -> bool:
    p = job_progress(backend, job_id)
    return p is not None and (p.first_step_at or 0) > t


def test_default_elastic_job_grows_shrinks_survives_a_failed_restart_and_completes(slurm_cluster, tmp_path):
    """No --virtual-workers: V = 4 (the 4 A40s), fixed at acceptance. The
    job starts on 2 GPUs, grows to 4 when a blocker leaves (that restart dies
    before training, once: it is requeued and placed again), shrinks back to
    2 when another job needs the GPUs, and completes with the losses of an
    uninterrupted run."""
    ctl = _controller(tmp_path, checkpoint_wait_s=60.0)
    backend = get_backend("cli")
    blocker = start_blocker("n5", "a40", 2)
    wait_job_state(backend, blocker, ("RUNNING",), 30, tmp_path)
    job = _submit_elastic(tmp_path, "--gpu-types", "a40", "--min-gpus", "2", fail_restart=1)

    first = ctl.round()
    assert first.placements[job]["cell"] == "a40:1x2:pp1", first.placements
    assert (first.placements[job]["dp"], first.placements[job]["tp"]) == (2, 1), first.placements
    first_plan = json.loads(ctl.state.plans_of(job)[0].plan)
    assert first_plan["virtual_workers"] == 4, first_plan
    running = wait_job_state(backend, job, ("RUNNING",), 60, tmp_path)
    assert running.nodes == ("n4",)
    wait_until(lambda: _steps_done(backend, job) >= 3, 60, "three steps on two GPUs")

    end_blocker(backend, blocker)
    grow = ctl.round()
    moves = [a for a in grow.actions if a["job"] == job]
    assert moves and moves[0]["kind"] == "move" and moves[0]["ok"], grow.actions
    assert grow.placements[job]["cell"] == "a40:2x2:pp1"
    assert json.loads(ctl.state.plans_of(job)[-1].plan)["dp"] == 4

    # the grown job's first restart dies before training (injected): requeued from its checkpoint
    wait_job_state(backend, job, ("FAILED",), 60, tmp_path)
    relaunched = ctl.round()
    assert [a["kind"] for a in relaunched.actions if a["job"] == job] == ["place"], relaunched.actions
    assert [e["cell"] for e in ctl.state.history(job) if e["event"] == "run-failed"] == ["a40:2x2:pp1"]
    regrown = wait_job_state(backend, job, ("RUNNING",), 60, tmp_path)
    assert sorted(regrown.nodes) == ["n4", "n5"]
    signalled_at = next(e["time"] for e in ctl.state.history(job) if e["event"] == "signalled")
    wait_until(lambda: _first_step_after(backend, job, signalled_at), 60, "the first step on four GPUs")
    ctl.round()  # measures the restart

    other = submit_managed(
        "gpt-350m",
        tmp_path,
        done_file=tmp_path / "done.txt",
        sleep=1,
        extra=("--gpu-types", "a40", "--min-gpus", "2", "--max-gpus", "2"),
    )
    shrink = ctl.round()
    kinds = {a["job"]: a["kind"] for a in shrink.actions}
    assert kinds.get(job) == "move" and shrink.placements[job]["cell"] == "a40:1x2:pp1", shrink.actions
    assert other in shrink.placements, shrink.placements
    assert json.loads(ctl.state.plans_of(job)[-1].plan)["dp"] == 2
    with _meanwhile(uninterrupted, tmp_path, first_plan) as reference:
        done = wait_job_state(backend, job, ("COMPLETED", "FAILED"), 300, tmp_path)
    assert done.state == "COMPLETED", job_logs(tmp_path)
    ctl.round()

    plans = [json.loads(p.plan) for p in ctl.state.plans_of(job)]
    assert {(p["dp"], p["virtual_workers"], p["micro_batches"]) for p in plans} == {
        (2, 4, first_plan["micro_batches"]),
        (4, 4, first_plan["micro_batches"]),
    }, plans
    assert _losses(tmp_path) == reference.result(), (
        "the resized run's losses are not bitwise those of an uninterrupted run"
    )
    history = [(e["event"], e["cell"]) for e in ctl.state.history(job)]
    # once per cell, the first time a run there reports a step: 2x2 too, after its failed run
    assert [c for e, c in history if e == "trained"] == ["a40:1x2:pp1", "a40:2x2:pp1"], history
    events = [(e, c) for e, c in history if e != "trained"]
    assert events[:2] == [("placed", "a40:1x2:pp1"), ("signalled", "a40:2x2:pp1")], events
    assert ("run-failed", "a40:2x2:pp1") in events and ("signalled", "a40:1x2:pp1") in events, events
    assert events[-1][0] == "finished", events
    restart = [e["value"] for e in ctl.state.history(job) if e["event"] == "resumed"]
    assert restart and all(0 < r < 120 for r in restart), restart
    print(f"\nmeasured restart costs (signal -> first step after resume): {restart} s")

    shown = subprocess.run(
        [sys.executable, "-m", "slurm_ext", "status", "--config", str(tmp_path / "cellsched.toml"), "--history", job],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    for word in ("a40:1x2:pp1", "a40:2x2:pp1", "resumed", "run-failed"):
        assert word in shown.stdout, shown.stdout


def _kinds(report, job: str) -> list[str]:
    return [a["kind"] for a in report.actions if a["job"] == job]


def test_a_trained_job_whose_restarts_keep_failing_is_parked_held_until_released(slurm_cluster, tmp_path):
    """max_relaunches = 1. The job trains, checkpoints (as for a move), and
    then every run dies before training: relaunched once, then parked:
    PENDING with a user hold, its reason in `cellsched status`, never FAILED,
    and left held by later rounds. Its user fixes the cause and releases it:
    managed again (its count starts over), it resumes and completes."""
    ctl = _controller(tmp_path, max_relaunches=1)
    backend = get_backend("cli")
    broken = tmp_path / "broken"
    job = _submit_elastic(
        tmp_path, "--gpu-types", "a40", "--min-gpus", "2", "--max-gpus", "2", fail_while=broken, steps=SHORT_STEPS
    )
    assert job in ctl.round().placements
    wait_job_state(backend, job, ("RUNNING",), 60, tmp_path)
    wait_until(lambda: _steps_done(backend, job) >= 3, 60, "three steps")
    ctl.round()  # sees it train
    assert job in relaunch.trained_jobs(ctl.state.jobs(job_ids=[job]))

    broken.touch()
    backend.signal(job, "USR1", target=TO_STEPS)
    assert wait_job_state(backend, job, ("FAILED", "COMPLETED"), 60, tmp_path).exit_code == 75, job_logs(tmp_path)
    assert _kinds(ctl.round(), job) == ["place"]  # resumed from its checkpoint: that run dies before training
    wait_job_state(backend, job, ("FAILED",), 60, tmp_path)
    assert _kinds(ctl.round(), job) == ["place"]  # failure 1 of 1 since it trained: relaunched
    wait_job_state(backend, job, ("FAILED",), 60, tmp_path)
    assert _kinds(ctl.round(), job) == ["requeue"]  # failure 2: parked

    parked = wait_until(
        lambda: (j := find_job(backend, job)) is not None and j.state == "PENDING" and j.held and j, 30, "the job held"
    )
    assert parked.reason == "JobHeldUser", parked  # a user hold: its owner may release it
    assert _kinds(ctl.round(), job) == [] and find_job(backend, job).held  # not released by the controller
    row = ctl.state.jobs(job_ids=[job])[job]
    assert row.phase == "parked" and not row.finished, row
    assert "failed before training 2 times in a row" in row.reason and f"scontrol release {job}" in row.reason
    shown = subprocess.run(
        [sys.executable, "-m", "slurm_ext", "status", "--config", str(tmp_path / "cellsched.toml"), "--json"],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    shown_row = next(r for r in json.loads(shown.stdout)["jobs"] if r["job_id"] == job)
    assert shown_row["state"] == "PENDING" and shown_row["reason"] == row.reason, shown_row
    assert _kinds(ctl.round(), job) == [] and find_job(backend, job).held  # nor on later rounds
    assert [e["event"] for e in ctl.state.history(job)].count("parked") == 1

    broken.unlink()  # the user fixes the cause and releases the job
    subprocess.run(["scontrol", "release", job], env=job_env(), check=True, timeout=30)
    wait_until(lambda: not find_job(backend, job).held, 30, "the hold to go")
    ctl.round()  # managed again (unparked)
    events = [e["event"] for e in ctl.state.history(job)]
    assert "unparked" in events[events.index("parked") :], events
    assert ctl.state.jobs(job_ids=[job])[job].phase != "parked"
    # released within its BeginTime it looks like Slurm's own requeue: held by that round, placed from the next
    wait_until(
        lambda: ctl.round() and ((j := find_job(backend, job)) is None or j.state in ("RUNNING", "COMPLETED")),
        120,
        "the job to run again",
        interval=1.0,
    )
    done = wait_job_state(backend, job, ("COMPLETED", "FAILED"), 300, tmp_path)
    assert done.state == "COMPLETED", job_logs(tmp_path)
    ctl.round()


def test_job_on_a_node_set_down_is_replaced_and_completes(slurm_cluster, tmp_path):
    ctl = _controller(tmp_path)
    backend = get_backend("cli")
    job = _submit_elastic(
        tmp_path, "--gpu-types", "a40", "--min-gpus", "2", "--max-gpus", "2", step_delay=0.3, steps=SHORT_STEPS
    )
    placed = ctl.round()
    assert placed.placements[job]["cell"] == "a40:1x2:pp1"
    node = wait_job_state(backend, job, ("RUNNING",), 60, tmp_path).nodes[0]
    wait_until(
        lambda: (job_progress(backend, job) or 0) and job_progress(backend, job).iterations_done >= 3, 60, "three steps"
    )
    env = job_env()
    try:
        subprocess.run(
            ["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=cellsched-test"],
            env=env,
            check=True,
            timeout=30,
        )
        # keep it out of service (the fake node's slurmd would bring it back at once)
        subprocess.run(
            ["scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=cellsched-test"],
            env=env,
            check=True,
            timeout=30,
        )
        wait_until(lambda: find_job(backend, job).state != "RUNNING", 30, "the job to leave the failed node")
        again = round_placing(ctl, job)
        assert again.placements[job]["cell"] == "a40:1x2:pp1", again.placements
        other = wait_job_state(backend, job, ("RUNNING",), 60, tmp_path)
        assert other.nodes[0] != node
        first_plan = json.loads(ctl.state.plans_of(job)[0].plan)
        with _meanwhile(uninterrupted, tmp_path, first_plan, SHORT_STEPS) as reference:
            done = wait_job_state(
                backend, job, ("COMPLETED", "FAILED"), 300, tmp_path
            )  # a bound, not a pace: slow on loaded cores
        assert done.state == "COMPLETED", job_logs(tmp_path)
    finally:
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=env, timeout=30, check=False)
    # resumed from its last checkpoint (or from the start): the steps after it
    # were done again, with the same data: the same losses
    assert _losses(tmp_path) == reference.result()


class _Records(logging.Handler):
    """Keeps the records of one logger (whatever other tests did to propagation)."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.logger = logging.getLogger(name)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> _Records:
        self.level_before = self.logger.level
        self.logger.addHandler(self)
        self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level_before)


def test_a_job_slower_than_its_profile_is_noticed_and_its_estimate_follows_within_3_rounds(slurm_cluster, tmp_path):
    """The profile store says 0.2 s per iteration for the job's only cell; the
    job really takes more than twice that (a 0.4 s delay per step). The first
    round that reads its speed logs it, and the controller's estimate for the
    cell is within 10% of the mean speed the job reported so far in each of
    the next 3 rounds; `status` shows both."""
    store = ProfileStore(tmp_path / "profiles.sqlite")
    for spec in default_gpu_specs(load_device_specs()["simulator_gpu_specs"]).values():
        store.put_gpu(spec)
    # the job is submitted as gpt-350m; from its first report on it is priced as the model it trains
    # (solver.contract.models: the reference trainer's shape here), which the profile covers too
    trained = "gpt-350m (trained L4 H64 A4 S32 V256)"
    store.put_cells([CellRecord(model, 8, "a10", 1, 1, 0.2) for model in ("gpt-350m", trained)])
    store.close()
    ctl = _controller(tmp_path, profiles_path=str(tmp_path / "profiles.sqlite"))
    backend = get_backend("cli")
    job = _submit_elastic(tmp_path, "--gpu-types", "a10", "--max-gpus", "1", step_delay=0.4, batch=8, steps=SHORT_STEPS)
    placed = ctl.round()
    assert placed.placements[job]["cell"] == "a10:1x1:pp1", placed.placements
    wait_job_state(backend, job, ("RUNNING",), 60, tmp_path)
    seen: list = []
    with _Records("cellsched.controller") as logged:
        for _ in range(3):
            last = seen[-1].observed_s if seen else None
            wait_until(
                lambda last=last: (
                    (q := job_progress(backend, job)) is not None and q.iter_time_s and q.iter_time_s != last
                ),
                60,
                "a new speed report",
            )
            ctl.round()
            (sp,) = [s for s in ctl.state.speeds(job_ids=[job]) if s.gpu_type == "a10"]
            seen.append(sp)
    print(f"\nestimated/observed s per iteration by round: {[(s.calibrated_s, s.observed_s) for s in seen]}")
    assert all(s.estimated_s == pytest.approx(0.2) and s.observed_s >= 0.36 for s in seen), seen  # 2x its profile
    # calibration keeps a running mean of the rounds' speeds (docs/scheduling.md, Calibration):
    # each round's estimate is within 10% of the mean speed the job reported in the rounds so far (one round's
    # report alone swings more than that on a loaded machine)
    means = [statistics.fmean(s.observed_s for s in seen[: i + 1]) for i in range(len(seen))]
    assert all(abs(s.calibrated_s / m - 1) <= 0.10 for s, m in zip(seen, means, strict=True)), (seen, means)
    noticed = [r for r in logged.records if r.getMessage() == "job speed differs from its estimate"]
    assert [r.fields["job"] for r in noticed] == [job], [r.getMessage() for r in logged.records]
    shown = subprocess.run(
        [sys.executable, "-m", "slurm_ext", "status", "--config", str(tmp_path / "cellsched.toml"), "--json"],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    row = next(r for r in json.loads(shown.stdout)["jobs"] if r["job_id"] == job)
    assert row["iter_s_profile"] == 0.2 and row["iter_s_observed"] == round(seen[-1].observed_s, 4), row
    # let it complete: a managed job cancelled with SIGTERM checkpoints (exit 75), and the next test's controller
    # would requeue it, as it must
    assert wait_job_state(backend, job, ("COMPLETED", "FAILED"), 120, tmp_path).state == "COMPLETED", job_logs(tmp_path)
