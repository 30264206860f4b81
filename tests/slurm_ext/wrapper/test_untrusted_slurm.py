"""A hostile user on the real dev cluster: cs_alice's managed job plants
things where the controller (root) reads her progress, and writes escapes
and oversized specs into what Slurm keeps for her. Each case: the round
ends within 2 s of a normal one, cs_bob's job is placed, nothing of a
root-only file appears in the log, the state or `status`, and alice's job
gains nothing (its progress is the controller's estimate)."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import pathlib
import secrets
import shutil
import subprocess
import tempfile

import pytest
from support import wait_for

from slurm_ext.cli.status_cmd import _table, job_rows
from slurm_ext.config import Config, ControllerConfig
from slurm_ext.controller import logs
from slurm_ext.controller.progress import ProgressFiles
from slurm_ext.controller.round import Controller
from slurm_ext.state import RoundStatus, StateStore
from solver.contract.jobspec import MAX_SPEC_BYTES, TAG, JobSpec
from solver.types import SolverConfig

pytestmark = pytest.mark.slurm

#: a big model and many iterations: the estimate never gets near the end
SPEC = JobSpec(model="gpt-1.3b", global_batch=64, iterations=1_000_000, gpu_types=("a100",), min_gpus=4)
BOB = JobSpec(model="gpt-350m", global_batch=64, iterations=1000, gpu_types=("v100",), min_gpus=8)


@pytest.fixture
def secret():
    """A root-only file with a random word in it."""
    word = "TOPSECRET-" + secrets.token_hex(8)
    d = pathlib.Path(tempfile.mkdtemp(prefix="cellsched-secret-", dir="/root"))
    d.chmod(0o700)
    (d / "progress.json").write_text(json.dumps({"iterations_done": 999_999, "note": word}))
    (d / "progress.json").chmod(0o600)
    yield d, word
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def alice_dir(users):
    d = pathlib.Path(tempfile.mkdtemp(prefix="cellsched-alice-", dir="/tmp"))
    os.chown(d, users.uids["cs_alice"], -1)
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def as_alice(cluster, *args: str, stdin: str | None = None) -> None:
    proc = subprocess.run(
        ["runuser", "-u", "cs_alice", "--", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=cluster.env,
    )
    assert proc.returncode == 0, (args, proc.stderr)


def submit(cluster, user: str, spec: JobSpec, work_dir: str, *extra: str) -> str:
    proc = cluster.run(
        [
            "sbatch",
            "--parsable",
            "-H",
            f"--comment={spec.to_comment()}",
            "-D",
            work_dir,
            "-o",
            "/dev/null",
            *extra,
            "--wrap",
            "sleep 300",
        ],
        user=user,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def plant_fifo(cluster, ckpt, secret):
    as_alice(cluster, "mkfifo", str(ckpt / "progress.json"))


def plant_dev_zero(cluster, ckpt, secret):
    as_alice(cluster, "ln", "-s", "/dev/zero", str(ckpt / "progress.json"))


def plant_link_to_root_file(cluster, ckpt, secret):
    as_alice(cluster, "ln", "-s", str(secret[0] / "progress.json"), str(ckpt / "progress.json"))


def plant_linked_dir_to_root(cluster, ckpt, secret):
    as_alice(cluster, "rmdir", str(ckpt))
    as_alice(cluster, "ln", "-s", str(secret[0]), str(ckpt))


def plant_1gb(cluster, ckpt, secret):
    as_alice(cluster, "truncate", "-s", "1G", str(ckpt / "progress.json"))


def plant_beyond_the_end(cluster, ckpt, secret):
    as_alice(cluster, "tee", str(ckpt / "progress.json"), stdin=json.dumps({"iterations_done": 10**9}))


def plant_far_future_first_step(cluster, ckpt, secret):
    as_alice(
        cluster, "tee", str(ckpt / "progress.json"), stdin=json.dumps({"iterations_done": 1, "first_step_at": 1e15})
    )


def plant_negative_first_step(cluster, ckpt, secret):
    as_alice(cluster, "tee", str(ckpt / "progress.json"), stdin=json.dumps({"iterations_done": 1, "first_step_at": -5}))


def plant_almost_done(cluster, ckpt, secret):  # the short-job weight it would win
    as_alice(cluster, "tee", str(ckpt / "progress.json"), stdin=json.dumps({"iterations_done": 999_990}))


def cancel(cluster, ids: list[str]) -> None:
    """Cancel the jobs and wait until they hold no GPUs (the next case needs them)."""
    for i in ids:
        cluster.run(["scancel", i])
    wait_for(lambda: not any(cluster.backend.job(i).holds_resources for i in ids), timeout=60, what="the jobs to end")


class Rounds:
    """An in-process controller (root) on the test cluster, its log captured."""

    def __init__(self, cluster, tmp: pathlib.Path) -> None:
        self.log = io.StringIO()
        logs.setup("json", "info", stream=self.log)
        self.state_path = tmp / "state.sqlite"
        config = Config(
            controller=ControllerConfig(state_path=str(self.state_path), kick_file="", checkpoint_root=str(tmp)),
            solver=SolverConfig(time_limit_s=30.0),
        )
        self.ctl = Controller(config, backend=cluster.backend)
        self.ids: list[str] = []

    def round(self):
        report = self.ctl.round()
        assert report.status == RoundStatus.OK, report
        return report

    def close(self) -> None:
        self.ctl.state.close()
        logging.getLogger("cellsched").handlers.clear()


@pytest.fixture
def rounds(plain_cluster, tmp_path):
    """The controller on the test cluster; the jobs in `rounds.ids` are cancelled at the end."""
    r = Rounds(plain_cluster, tmp_path)
    yield r
    r.close()
    cancel(plain_cluster, r.ids)


@pytest.mark.parametrize(
    "plant",
    [
        plant_fifo,
        plant_dev_zero,
        plant_link_to_root_file,
        plant_linked_dir_to_root,
        plant_1gb,
        plant_beyond_the_end,
        plant_far_future_first_step,
        plant_negative_first_step,
        plant_almost_done,
    ],
)
def test_a_hostile_progress_file_neither_stalls_nor_steers_the_controller(
    plain_cluster, users, alice_dir, secret, rounds, plant
):
    alice = submit(plain_cluster, "cs_alice", SPEC, str(alice_dir))
    rounds.ids.append(alice)
    normal = rounds.round()  # places alice's job: a normal round
    assert alice in normal.placements, normal
    ckpt = alice_dir / ".cellsched" / alice
    as_alice(plain_cluster, "mkdir", "-p", str(ckpt))
    plant(plain_cluster, ckpt, secret)
    bob = submit(plain_cluster, "cs_bob", BOB, "/tmp")
    rounds.ids.append(bob)
    hostile = rounds.round()
    assert bob in hostile.placements, hostile  # the other user's job is placed
    # never stalled: whatever the file, reading it costs at most the round's budget for users' files (a
    # blocking read would hang the round); a margin of the whole budget keeps a loaded machine's noise out
    budget = ProgressFiles().reader.budget_s
    assert hostile.total_s < normal.total_s + budget, (hostile.total_s, normal.total_s, budget)
    rounds.round()
    with StateStore(rounds.state_path, readonly=True) as st:
        row = st.jobs(job_ids=[alice])[alice]
        status = _table(job_rows(st, now=0.0))
    assert row.iterations_done is None or row.iterations_done < 1000, row  # never the claim of 10**9 or 999,990
    word = secret[1]
    assert word not in rounds.log.getvalue() and word not in status
    assert word.encode() not in rounds.state_path.read_bytes()


def test_progress_that_jumps_backwards_does_not_take_the_count_back(plain_cluster, users, alice_dir, rounds):
    alice = submit(plain_cluster, "cs_alice", SPEC, str(alice_dir))
    rounds.ids.append(alice)
    assert alice in rounds.round().placements
    wait_for(lambda: plain_cluster.backend.job(alice).state == "RUNNING", timeout=60, what="alice's job to run")
    ckpt = alice_dir / ".cellsched" / alice
    as_alice(plain_cluster, "mkdir", "-p", str(ckpt))
    as_alice(plain_cluster, "tee", str(ckpt / "progress.json"), stdin=json.dumps({"iterations_done": 2}))

    def counted() -> tuple[float | None, str | None]:
        rounds.round()
        with StateStore(rounds.state_path, readonly=True) as st:
            row = st.jobs(job_ids=[alice])[alice]
        return row.iterations_done, row.progress_source

    wait_for(lambda: counted() == (2.0, "file"), timeout=60, what="the count of 2 to be taken from the file")
    as_alice(plain_cluster, "tee", str(ckpt / "progress.json"), stdin=json.dumps({"iterations_done": 1}))
    assert counted() == (2.0, "file")  # never back


def test_escapes_in_a_job_name_and_specs_at_the_size_limit(plain_cluster, users, alice_dir, rounds):
    base = dict(family="gpt", layers=2, hidden=64, heads=4, seq_len=32, vocab=256)
    small = JobSpec(model="m.json", global_batch=8, iterations=10, gpu_types=("a10",), model_def={**base, "name": "x"})
    pad = MAX_SPEC_BYTES - len(small.to_json())
    at_limit = dataclasses.replace(small, model_def={**base, "name": "x" * (1 + pad)})
    assert len(at_limit.to_json()) == MAX_SPEC_BYTES
    named = submit(
        plain_cluster,
        "cs_alice",
        JobSpec(model="gpt-tiny", global_batch=8, iterations=10, gpu_types=("a40",)),
        str(alice_dir),
        "-J",
        "\x1b]0;pwned\x07\x1b[2J\u202eevil",
    )
    limit = submit(plain_cluster, "cs_alice", at_limit, str(alice_dir))  # a Comment of 1024 bytes, Slurm's most
    hostile_model = TAG + json.dumps({"model": "\u202eevil\x9b[2J", "global_batch": 8, "iterations": 10})
    proc = plain_cluster.run(
        [
            "sbatch",
            "--parsable",
            "-H",
            f"--comment={hostile_model}",
            "-D",
            str(alice_dir),
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 300",
        ],
        user="cs_alice",
    )
    assert proc.returncode == 0, proc.stderr
    refused = proc.stdout.strip()
    rounds.ids += [named, limit, refused]
    report = rounds.round()
    assert named in report.placements and limit in report.placements, report
    with StateStore(rounds.state_path, readonly=True) as st:
        rows = {r["job_id"]: r for r in job_rows(st, now=0.0)}
        status = _table(list(rows.values()))
    assert "evil" in rows[refused]["reason"] and "\\u202eevil" in status, status  # shown, escaped
    assert not any(c in status for c in "\x1b\x07\x9b\u202e"), repr(status)
    assert not any(c in rounds.log.getvalue() for c in "\x1b\x07\u202e")
