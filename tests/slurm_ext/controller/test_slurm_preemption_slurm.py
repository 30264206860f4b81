"""Slurm preempts a managed job, on a real Slurm (docs/preemption.md): a dev
cluster of its own with one node of 2 A40s (KillWait 2 s, cred_expire 10 s),
started once for the cases below. On 22.05: accounting and QOS preemption
(DEVCLUSTER_PREEMPT=qos: QOS `urgent` preempts `normal`); on 24.11 (its dev
cluster has no accounting; run inside its root with `devcluster.sh exec`, see
`slurm24_preemption` in contrib/test.sh): partition preemption
(DEVCLUSTER_PREEMPT=partition: partition `urgent` preempts `a40`). Both with
PreemptMode=REQUEUE, then CANCEL.

A managed `exact` job of the reference trainer holds both GPUs; a plain
urgent job asks for them:

* GraceTime 20 s, longer than the job's checkpoint: the launcher saves on
  Slurm's SIGTERM and exits 75 within the grace time. 22.05 ends the job
  FAILED 75 and does not requeue it (the controller requeues it held);
  24.11 requeues it unheld (the controller holds it before Slurm starts it
  again by itself). Either way it is placed again once the urgent job ended;
* GraceTime 0, shorter than its checkpoint: Slurm requeues the job at once,
  unheld, to start by itself cred_expire later; the controller holds it
  before that (the job saved within KillWait) and places it again;
* PreemptMode=CANCEL: the job ends PREEMPTED, with a reason that says so in
  `cellsched status` and the journal, never as completed.

Each job resumes from its checkpoint and completes with the losses of an
uninterrupted run, bitwise (same plan); each of its runs in sacct (22.05) or
seen running (24.11) started after the controller had released it on
exactly its plan's nodes: Slurm never started it by itself. The test waits
for Slurm's states, never for time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "launch"))  # trainer_runs, srun_local

from controller_support import ROOT, find_job, job_env, job_logs, submit_training, wait_until, write_config
from support import WORKER, cluster_of
from trainer_runs import train

from slurm_ext.backends import get_backend
from slurm_ext.config import load
from slurm_ext.controller.inputs import Phase, admin_comment_plan
from slurm_ext.controller.progress import read_progress_file
from slurm_ext.controller.round import Controller
from slurm_ext.records import SlurmJob, expand_hostlist
from slurm_ext.state import PlanStatus

pytestmark = pytest.mark.slurm

SHAPE = "n1:a40:2"
ENV = {
    "LAB": os.environ.get("CELLSCHED_TEST_PREEMPT_LAB", "/tmp/cellsched-test-preempt")
    + (f"-gw{WORKER}" if WORKER else ""),
    "CTLD_PORT": str(int(os.environ.get("CELLSCHED_TEST_PREEMPT_CTLD_PORT", "13817")) + 200 * WORKER),
    "SLURMD_BASEPORT": str(int(os.environ.get("CELLSCHED_TEST_PREEMPT_SLURMD_BASEPORT", "13900")) + 200 * WORKER),
    "DEVCLUSTER_GRACE_S": "20",
    "DEVCLUSTER_SHAPE": SHAPE,
}
TRAIN = ROOT / "contrib" / "examples" / "train_gpt.py"
TRAIN_FLAGS = ("--model", "gpt-tiny", "--dtype", "float64")
STEPS = 16


@dataclass(frozen=True)
class Site:
    """How this Slurm preempts: by QOS with accounting (22.05) or by partition (23.02 and later)."""

    qos: bool

    @property
    def env(self) -> dict[str, str]:
        return (
            {"DEVCLUSTER_ACCOUNTING": "1", "DEVCLUSTER_PREEMPT": "qos"}
            if self.qos
            else {"DEVCLUSTER_PREEMPT": "partition"}
        )

    @property
    def job_args(self) -> list[str]:
        """What a managed job is submitted with: an account without a GPU limit (the accounts: 22.05 only)."""
        return ["-A", "acct-b"] if self.qos else []

    @property
    def urgent_args(self) -> list[str]:
        return ["-A", "acct-b", "-q", "urgent"] if self.qos else ["-p", "urgent"]

    def grace(self, seconds: int) -> None:
        if self.qos:
            _run("sacctmgr", "-i", "modify", "qos", "normal", "set", f"GraceTime={seconds}")
            return
        for partition in ("a40", "all"):
            _run("scontrol", "update", f"PartitionName={partition}", f"GraceTime={seconds}")


def _slurm_major() -> tuple[int, int]:
    ctld = shutil.which("slurmctld") or "/usr/sbin/slurmctld"  # an sbin, maybe not on PATH
    version = subprocess.run([ctld, "-V"], capture_output=True, text=True, timeout=30, check=True).stdout
    major, minor = version.split()[1].split(".")[:2]
    return int(major), int(minor)


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    here = Site(qos=_slurm_major() < (23, 2))
    with cluster_of({**ENV, **here.env}, SHAPE).running("the dev cluster with preemption"):
        yield here


@pytest.fixture(autouse=True)
def _empty_queue_after(site: Site) -> Iterator[None]:
    """The cluster is the module's: a case that failed leaves none of its jobs to the next."""
    yield
    _run("scancel", "--user", os.environ.get("USER") or "root")
    wait_until(lambda: not _run("squeue", "-h", "-o", "%i").split(), 120, "the queue to empty")


def _run(*args: str) -> str:
    proc = subprocess.run(list(args), env=job_env(), capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, f"{args}: {proc.stderr}"
    return proc.stdout


def _mode(mode: str) -> None:
    """Slurm's PreemptMode, changed in slurm.conf and read again (scontrol reconfigure)."""
    conf = Path(os.environ["SLURM_CONF"])
    lines = conf.read_text().splitlines()
    conf.write_text("\n".join(f"PreemptMode={mode}" if ln.startswith("PreemptMode=") else ln for ln in lines) + "\n")
    _run("scontrol", "reconfigure")
    wait_until(
        lambda: f"= {mode}" in _run("scontrol", "show", "config").split("PreemptMode")[1].split("\n")[0], 30, mode
    )


def _controller(tmp_path: Path) -> Controller:
    config = write_config(tmp_path / "cellsched.toml", tmp_path / "state.sqlite")
    with config.open("a") as f:
        f.write("max_pp = 1\n")
    return Controller(load(config))


def _submit(site: Site, tmp_path: Path) -> str:
    """A managed exact job of the reference trainer on both A40s (not elastic:
    only Slurm stops it); each run writes when it started and on which nodes
    to runs.txt."""
    train_args = [str(TRAIN), *TRAIN_FLAGS, "--steps", str(STEPS), "--step-delay", "0.3"]
    train_args += ["--out", str(tmp_path / "losses.json")]
    sbatch = ["--runtime", "exact", "--model", "gpt-350m", "--global-batch", "16", "--iterations", "200000"]
    sbatch += ["--gpu-types", "a40", "--min-gpus", "2", "--max-gpus", "2", "--open-mode", "append", *site.job_args]
    prelude = f'echo "$(date +%s.%N) $SLURM_JOB_NODELIST" >>{tmp_path / "runs.txt"}\n'
    return submit_training(tmp_path, train_args, sbatch, prelude=prelude)


def _urgent(site: Site, stop: Path) -> str:
    """A plain urgent GPU job on both GPUs, running until `stop` exists."""
    out = _run(
        "sbatch", "--parsable", *site.urgent_args, "-N1", "--gres=gpu:2", "-o", "/dev/null",
        "--wrap", f"while [ ! -e {stop} ]; do sleep 0.2; done",
    )  # fmt: skip
    return out.strip().split(";")[0]


def _job(backend, job_id: str) -> SlurmJob:
    job = find_job(backend, job_id)
    assert job is not None, f"job {job_id} left the queue"
    return job


def _steps_done(backend, job_id: str) -> float:
    plan = admin_comment_plan(_job(backend, job_id).admin_comment)
    p = read_progress_file(plan.checkpoint_dir if plan else None)
    return p.iterations_done if p is not None else 0.0


def _rounds_until(ctl: Controller, pred, timeout: float, what: str):
    """Controller rounds until `pred()` holds after one."""
    return wait_until(lambda: ctl.round() and pred(), timeout, what, interval=0.2)


def _placed_and_training(site: Site, ctl: Controller, backend, tmp_path: Path) -> tuple[str, dict]:
    job = _submit(site, tmp_path)
    first = ctl.round()
    assert first.placements[job]["cell"] == "a40:1x2:pp1", first.placements
    plan = json.loads(ctl.state.plans_of(job)[0].plan)
    wait_until(lambda: _steps_done(backend, job) >= 3, 240, f"three steps of job {job}")
    return job, plan


def _uninterrupted(tmp_path: Path, plan: dict) -> list[float]:
    keep = ("pp", "dp", "tp", "micro_batches", "virtual_workers", "global_batch")
    return train({k: plan[k] for k in keep if k in plan}, tmp_path / "uninterrupted.json", STEPS, *TRAIN_FLAGS).losses


def _sacct_runs(job_id: str) -> list[tuple[float, str]]:
    """(start, nodes) of each run of the job in sacct (-D: the requeued ones too)."""
    out = _run("sacct", "-D", "-X", "-n", "-P", "-j", job_id, "-o", "start,nodelist")
    runs = [line.split("|") for line in out.splitlines()]
    return sorted((datetime.fromisoformat(t).timestamp(), n) for t, n in runs if t not in ("Unknown", "None", ""))


def _only_planned_runs(site: Site, ctl: Controller, job_id: str, tmp_path: Path) -> int:
    """Every run of the job (as it wrote them, and in sacct where there is
    one) started after the controller released it (since the run before
    started) on exactly that plan's nodes; how many runs there were."""
    released = sorted(
        (p.applied_at, ",".join(sorted(n for n, _ in p.nodes)))
        for p in ctl.state.plans_of(job_id)
        if p.status == PlanStatus.RELEASED and p.applied_at is not None
    )
    written = [ln.split() for ln in (tmp_path / "runs.txt").read_text().splitlines()]
    runs = [(float(t), ",".join(expand_hostlist(n))) for t, n in written]
    sacct = [(t, ",".join(expand_hostlist(n))) for t, n in _sacct_runs(job_id)] if site.qos else runs
    assert [n for _, n in sacct] == [n for _, n in runs], (sacct, runs)
    for (start, nodes), (whole_second, _) in zip(runs, sacct, strict=True):
        before = max([t for t, _ in runs if t < start], default=0.0)
        by = [n for t, n in released if before < t <= start and t < whole_second + 1]
        assert by and by[-1] == nodes, f"a run at {start} on {nodes} without a release on it: {released} {runs}"
    return len(runs)


def _resumed_from_a_checkpoint(tmp_path: Path) -> None:
    """Both runs together printed each step once: the later one went on from
    the step the first one saved (its output is appended to the same file)."""
    steps = [json.loads(ln)["step"] for ln in job_logs(tmp_path, 100_000).splitlines() if ln.startswith('{"step"')]
    assert steps == list(range(1, STEPS + 1)), steps


def _requeued(backend, job_id: str) -> bool:
    """Slurm requeued the job: pending, its processes ended (24.11 shows it `PENDING,COMPLETING` until then)."""
    job = _job(backend, job_id)
    return job.pending and not job.holds_resources


def _held_before_slurm_restarts_it(ctl: Controller, backend, job: str) -> None:
    """Slurm requeued the job itself, unheld, to start again by itself
    cred_expire (10 s) later: the next round holds it (it cannot be placed:
    the urgent job has its GPUs), before that."""
    requeued = _job(backend, job)
    assert requeued.pending and not requeued.held, requeued
    report = ctl.round()
    assert [(a["kind"], a["ok"]) for a in report.actions if a["job"] == job] == [("requeue", True)], report.actions
    assert _job(backend, job).held
    status = {s.job_id: s for s in report.jobs}[job]
    assert status.phase == Phase.SLURM_REQUEUED, status  # its reason: why it waits (no free GPUs)
    events = [e["event"] for e in ctl.state.history(job)]
    assert events[-2:] == ["slurm-requeued", "requeued"], events


def _back_after_the_urgent_job(p: Preempted, tmp_path: Path) -> None:
    """The urgent job runs while the managed one stays held; once it ends, the
    controller places the managed job again and it completes with the losses
    of the uninterrupted run."""
    wait_until(lambda: _job(p.backend, p.urgent).state == "RUNNING", 60, "the urgent job to start")
    assert _job(p.backend, p.job).held
    p.stop.touch()
    _rounds_until(p.ctl, lambda: _job(p.backend, p.job).state == "COMPLETED", 180, f"job {p.job} to complete")
    assert json.loads((tmp_path / "losses.json").read_text())["losses"] == p.reference.result()


@dataclass
class Preempted:
    """A managed job that trains, a reference run of it going on meanwhile, and an urgent job that wants its GPUs."""

    ctl: Controller
    backend: Any
    job: str
    urgent: str
    stop: Path
    reference: Future


@contextmanager
def _preempting(site: Site, tmp_path: Path, grace: int) -> Iterator[Preempted]:
    """With GraceTime `grace`: a managed job placed and training, then an urgent job submitted."""
    site.grace(grace)
    ctl, backend = _controller(tmp_path), get_backend("cli")
    stop = tmp_path / "urgent-done"
    try:
        job, plan = _placed_and_training(site, ctl, backend, tmp_path)
        with ThreadPoolExecutor(1) as pool:
            reference = pool.submit(_uninterrupted, tmp_path, plan)
            yield Preempted(ctl, backend, job, _urgent(site, stop), stop, reference)
    finally:
        stop.touch()


def test_a_grace_time_longer_than_the_checkpoint(site, tmp_path):
    with _preempting(site, tmp_path, 20) as p:
        ctl, backend, job = p.ctl, p.backend, p.job
        ended = wait_until(lambda: not _job(backend, job).holds_resources and _job(backend, job), 60, "a checkpoint")
        if site.qos:  # 22.05 ends a job that exits within its grace time, and does not requeue it
            assert (ended.state, ended.exit_code, ended.preempted) == ("FAILED", 75, True), ended
            _rounds_until(ctl, lambda: _job(backend, job).held, 60, "the job requeued held")
            events = [e["event"] for e in ctl.state.history(job)]
            assert events[-2:] == ["slurm-preempted", "requeued"], events
        else:  # 24.11 requeues it all the same
            _held_before_slurm_restarts_it(ctl, backend, job)
        _back_after_the_urgent_job(p, tmp_path)
    _resumed_from_a_checkpoint(tmp_path)
    assert _only_planned_runs(site, ctl, job, tmp_path) == 2


def test_a_grace_time_shorter_than_the_checkpoint(site, tmp_path):
    with _preempting(site, tmp_path, 0) as p:
        wait_until(lambda: _requeued(p.backend, p.job), 60, "Slurm's requeue")
        _held_before_slurm_restarts_it(p.ctl, p.backend, p.job)
        _back_after_the_urgent_job(p, tmp_path)
    _resumed_from_a_checkpoint(tmp_path)  # it saved within KillWait, after Slurm's SIGTERM
    assert _only_planned_runs(site, p.ctl, p.job, tmp_path) == 2


#: a `ddp` script that never registers a checkpoint hook: rank 0 appends "time step restarts" after each step
NO_HOOK = """
import os, sys, time
out, steps = sys.argv[1], int(sys.argv[2])
for k in range(1, steps + 1):
    time.sleep(0.1)
    if os.environ["RANK"] == "0":
        with open(out, "a") as f:
            f.write(f"{time.time()} {k} {os.environ.get('SLURM_RESTART_COUNT', '0')}\\n")
"""


def test_a_job_that_cannot_checkpoint_runs_out_its_grace_time_and_comes_back(site, tmp_path):
    """A `ddp` job without a hook never sees Slurm's SIGTERM (cellsched-launch
    keeps it blocked): it runs on through its grace time until Slurm stops
    it, Slurm requeues it, and the controller holds it and places it again;
    it runs again from the start (it saved nothing) and completes. (24.11
    requeues such a job once more when that run ends: the controller holds
    and places that one too, docs/preemption.md.)"""
    grace, steps = 3, 200  # 20 s: longer than the grace time (and Slurm's delay in ending it)
    site.grace(grace)
    ctl, backend = _controller(tmp_path), get_backend("cli")
    sbatch = ["--runtime", "ddp", "--model", "gpt-350m", "--global-batch", "16", "--iterations", str(steps)]
    sbatch += ["--gpu-types", "a40", "--min-gpus", "2", "--max-gpus", "2", *site.job_args]
    prelude = f'echo "$(date +%s.%N) $SLURM_JOB_NODELIST" >>{tmp_path / "runs.txt"}\n'
    log = tmp_path / "steps.txt"
    job = submit_training(tmp_path, ["-c", NO_HOOK, str(log), str(steps)], sbatch, prelude=prelude)
    assert ctl.round().placements[job]["cell"] == "a40:1x2:pp1"
    wait_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 2, 90, f"two steps\n{job_logs(tmp_path)}")
    stop = tmp_path / "urgent-done"
    urgent = _urgent(site, stop)
    preempted = wait_until(lambda: _job(backend, job).preempted_at, 60, "Slurm to preempt the job")
    wait_until(lambda: _requeued(backend, job), 60, "Slurm's requeue")
    _held_before_slurm_restarts_it(ctl, backend, job)
    wait_until(lambda: _job(backend, urgent).state == "RUNNING", 60, "the urgent job to start")
    stop.touch()
    _rounds_until(ctl, lambda: _job(backend, job).state == "COMPLETED", 180, f"job {job} to complete")
    lines = [ln.split() for ln in log.read_text().splitlines()]
    first_run = [(float(t), int(k)) for t, k, r in lines if r == "0"]
    assert [k for _, k in first_run] == list(range(1, len(first_run) + 1)) and len(first_run) < steps, first_run
    assert first_run[-1][0] >= preempted + grace - 1, (preempted, first_run)  # alive through its grace time
    last = max(r for _, _, r in lines)
    assert [k for _, k, r in lines if r == last] == [str(k) for k in range(1, steps + 1)]
    assert _only_planned_runs(site, ctl, job, tmp_path) == int(last) + 1 >= 2


def test_preempt_mode_cancel_ends_the_job_as_preempted(site, tmp_path):
    site.grace(0)
    _mode("CANCEL")
    try:
        ctl, backend = _controller(tmp_path), get_backend("cli")
        job, _ = _placed_and_training(site, ctl, backend, tmp_path)
        stop = tmp_path / "urgent-done"
        _urgent(site, stop)
        wait_until(lambda: _job(backend, job).finished, 60, "the job to end")
        assert _job(backend, job).state == "PREEMPTED"
        ctl.round()
        stop.touch()
        config = str(tmp_path / "cellsched.toml")
        shown = subprocess.run(
            [sys.executable, "-m", "slurm_ext", "status", "--config", config, "--all", "--json"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        (row,) = [r for r in json.loads(shown)["jobs"] if str(r["job_id"]) == job]
        assert row["state"] == "PREEMPTED" and row["reason"].startswith("preempted by Slurm"), row
        events = [(e["event"], e["cell"]) for e in ctl.state.history(job)]
        assert events[-2:] == [("slurm-preempted", ""), ("finished", "PREEMPTED")], events
        ctl.round()
        assert _job(backend, job).state == "PREEMPTED"  # never requeued
    finally:
        _mode("REQUEUE")
