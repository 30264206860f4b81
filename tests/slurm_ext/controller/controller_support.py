"""Helpers of the controller tests (imported by conftest and the tests)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import support
from support import wait_for

from slurm_ext.state import RoundStatus

ROOT = Path(__file__).resolve().parents[3]
DEMO_JOB = ROOT / "contrib" / "examples" / "demo_job.sh"
#: node -> (gpu type, gpus) of contrib/dev-cluster/cluster.conf
SHAPE = support.read_shape(support.SHAPE)


def log_lines(path: Path) -> list[dict]:
    """The JSON lines of a controller's log."""
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.startswith("{")]


def start_daemon(config: Path, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`cellsched controller run --config CONFIG`, its stderr (the JSON log) in `log`."""
    with open(log, "w") as err:
        return subprocess.Popen(
            [support.console_script(), "controller", "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )


def stop(proc: subprocess.Popen) -> None:
    """Stop a daemon: SIGTERM, then SIGKILL after 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def write_config(path: Path, state: Path, **controller: Any) -> Path:
    """A controller config for tests: state under tmp, short intervals, JSON logs, no metrics. CP-SAT's
    deterministic budget decides each plan (the tests assert exact plans), never the wall clock."""
    opts = {
        "state_path": str(state),
        "interval_s": 1.0,
        "watch_s": 0.5,
        "min_gap_s": 0.2,
        "kick_file": str(path.parent / "kick"),
        "checkpoint_root": str(path.parent / "ckpt"),
        **controller,
    }
    lines = ["[controller]"] + [f"{k} = {json.dumps(v)}" for k, v in opts.items()]
    lines += [
        "[metrics]",
        "port = 0",
        "[log]",
        'format = "json"',
        "[solver]",
        "time_limit_s = 30.0",
        "deterministic = true",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def cellsched(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the `cellsched` command (this interpreter's package) with an argument list."""
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_ext", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ.copy(),
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"cellsched {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def submit_managed(
    model: str,
    out_dir: Path,
    *,
    done_file: Path,
    sleep: float = 2,
    batch: int = 64,
    extra: tuple[str, ...] = (),
    runtime: str = "exact",
) -> str:
    """Submit demo_job.sh as a managed job through `cellsched sbatch`; its id.
    The demo job stands for the reference trainer (`runtime` exact by
    default: any plan, moved on the checkpoint signal), whose placements
    these tests check."""
    env_opt = f"--export=ALL,DEMO_DONE_FILE={done_file},DEMO_SLEEP={sleep}"
    proc = cellsched(
        "sbatch",
        "--parsable",
        "--model",
        model,
        "--global-batch",
        str(batch),
        "--iterations",
        "50",
        "-o",
        str(out_dir / "%j.out"),
        env_opt,
        "--runtime",
        runtime,
        *extra,
        "--",
        str(DEMO_JOB),
    )
    job_id = proc.stdout.strip().splitlines()[-1]
    assert job_id.isdigit(), proc.stdout
    return job_id


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.5) -> Any:
    """wait_for with positional timeout/what, as these tests call it."""
    return wait_for(predicate, timeout=timeout, what=what, interval=interval)


def answered_round(ctl: Any, timeout: float = 120) -> Any:
    """ctl.round() until Slurm answered it (a busy machine can miss the
    controller's ping deadline: that round changes nothing); its report."""

    def answered() -> Any:
        report = ctl.round()
        return None if report.status == RoundStatus.UNAVAILABLE else report

    return wait_until(answered, timeout, "a round that Slurm answers")


def round_placing(ctl: Any, job_id: str, rounds: int = 3) -> Any:
    """The report of the first of `rounds` rounds that places `job_id`. A job
    Slurm requeued itself (a failed node, a preemption) is held by the round
    that sees it and placed from the next (docs/preemption.md); one still
    completing is left to a later round."""
    for _ in range(rounds):
        report = ctl.round()
        if job_id in report.placements:
            return report
    raise AssertionError(f"job {job_id} not placed in {rounds} rounds: {report.placements}")


def job_env() -> dict[str, str]:
    """The environment a submitted job starts from: this one without an
    enclosing Slurm job's or plan's variables, one OpenMP thread a rank, and
    this interpreter's bin (cellsched-launch) first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_JOB", "SLURM_STEP", "CELLSCHED_"))}
    return {**env, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}"}


def submit_training(tmp_path: Path, train: list[str], sbatch: list[str], prelude: str = "") -> str:
    """Submit `srun cellsched-launch -- python TRAIN...` (after the shell
    lines `prelude`) through `cellsched sbatch --parsable SBATCH...`, its
    output in tmp_path/job-<id>.out; the job's id."""
    launcher = shutil.which("cellsched-launch", path=job_env()["PATH"])
    assert launcher, "cellsched-launch not on PATH"
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\n{prelude}exec {shlex.join(['srun', launcher, '--', sys.executable, *train])}\n")
    script.chmod(0o755)
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_ext", "sbatch", "--parsable", *sbatch, "-o", str(tmp_path / "job-%j.out")]
        + ["--", str(script)],
        cwd=tmp_path,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def start_blocker(node: str, partition: str, gpus: int) -> str:
    """An unmanaged job holding `gpus` GPUs of `node` (sleeping); its id."""
    out = subprocess.run(
        ["sbatch", "--parsable", "-p", partition, "-w", node, "-N1", f"--gres=gpu:{gpus}", "-o", "/dev/null"]
        + ["--wrap", "sleep 600"],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.strip().split(";")[0]


def end_blocker(backend: Any, blocker: str) -> None:
    """Cancel job `blocker` and wait until it has left its GPUs."""
    subprocess.run(["scancel", blocker], env=job_env(), check=True, timeout=30)
    wait_until(lambda: (b := find_job(backend, blocker)) is None or b.finished, 30, "the blocker to end")


def fast_job_controller(tmp_path: Path) -> tuple[Path, Any, Any, str]:
    """For a job far faster than its spec's estimate: a controller that
    believes a progress file up to 30 times faster than the estimate (the
    default is 10) and waits 60 s for a checkpoint, and a blocker holding
    n5's 2 A40s, running. (config, controller, the cli backend, blocker id)."""
    from slurm_ext.backends import get_backend
    from slurm_ext.config import load
    from slurm_ext.controller.round import Controller

    config = write_config(
        tmp_path / "cellsched.toml", tmp_path / "state.sqlite", checkpoint_wait_s=60.0, progress_rate_factor=30.0
    )
    backend = get_backend("cli")
    blocker = start_blocker("n5", "a40", 2)
    wait_job_state(backend, blocker, ("RUNNING",), 30, tmp_path)
    return config, Controller(load(config)), backend, blocker


def job_progress(backend: Any, job_id: str) -> Any:
    """The progress record in the checkpoint folder of job `job_id`'s plan (None: none yet)."""
    from slurm_ext.controller.inputs import admin_comment_plan
    from slurm_ext.controller.progress import read_progress_file

    plan = admin_comment_plan(find_job(backend, job_id).admin_comment)
    return read_progress_file(plan.checkpoint_dir if plan and plan.checkpoint_dir else None)


def status_row(config: Path, job_id: str) -> dict[str, Any]:
    """Job `job_id`'s row of `cellsched status --json` under controller config `config`."""
    rows = json.loads(cellsched("status", "--json", "--config", str(config)).stdout)["jobs"]
    return next(r for r in rows if r["job_id"] == job_id)


def find_job(backend: Any, job_id: str) -> Any:
    """The backend's view of job `job_id` (None: not in the queue)."""
    return next((j for j in backend.observe().jobs if j.job_id == job_id), None)


def job_logs(tmp_path: Path, tail: int = 3000) -> str:
    """The last `tail` characters of each job output in tmp_path."""
    return "\n".join(p.read_text()[-tail:] for p in tmp_path.glob("job-*.out"))


def wait_job_state(backend: Any, job_id: str, states: tuple[str, ...], timeout: float, tmp_path: Path) -> Any:
    """Wait for job `job_id` to reach one of `states`; on time-out the
    assertion shows the job and its output."""

    def reached() -> Any:
        j = find_job(backend, job_id)
        return j if j is not None and j.state in states else None

    try:
        return wait_until(reached, timeout, f"job {job_id} in {states}")
    except AssertionError:
        raise AssertionError(f"job {job_id}: {find_job(backend, job_id)}\n{job_logs(tmp_path)}") from None


#: the calls through which a round's apply changes Slurm
WRITES = ("hold_many", "requeue_many", "update_many", "release_many")


class Killed(BaseException):
    """The controller's process ends here (a SIGKILL between two Slurm calls): nothing catches it."""


class DiesAt:
    """A backend that dies (Killed) at its `at`-th call of `methods`: before
    Slurm carries it out, or (`after`) once it has. `released` counts the
    jobs its release_many released; `writes` the calls so far, `calls` their
    method names in order."""

    def __init__(
        self,
        inner: Any,
        at: int | None = 1,
        *,
        after: bool = False,
        methods: tuple[str, ...] = WRITES,
        released: Counter | None = None,
    ) -> None:
        self.inner, self.at, self.after, self.methods, self.writes = inner, at, after, methods, 0
        self.calls: list[str] = []
        self.released = Counter() if released is None else released
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.inner, name)
        if name not in self.methods:
            return call

        def write(ids: Any, *args: Any, **kw: Any) -> Any:
            self.writes += 1
            self.calls.append(name)
            dies = self.writes == self.at
            if dies and not self.after:
                raise Killed(name)
            out = call(ids, *args, **kw)
            if name == "release_many":
                self.released.update(j for j in ids if j not in out)
            if dies:
                raise Killed(name)
            return out

        return write
