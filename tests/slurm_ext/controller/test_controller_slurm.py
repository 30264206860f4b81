"""The controller on the real local Slurm dev cluster.

Jobs are submitted through `cellsched sbatch`, placed by
`cellsched controller run` rounds, run demo_job.sh and complete; the
controller survives SIGKILL at random points and a slurmctld outage.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import pytest
from controller_support import SHAPE, DiesAt, Killed, cellsched, submit_managed, wait_until, write_config
from support import free_port

from slurm_ext.backends import SubmitRequest, get_backend
from slurm_ext.config import load
from slurm_ext.controller.round import Controller
from slurm_ext.records import ClusterSnapshot
from slurm_ext.state import StateStore
from solver.contract import admin_comment_dict

MODELS = ("gpt-1.3b", "bert__760M", "moe__690M", "wide_resnet__500M", "gpt-350m", "gpt-2.7b", "bert__1.3B")


def _cancel_all(backend) -> None:
    for j in backend.observe().jobs:
        if not j.finished:
            backend.cancel(j.job_id)
    wait_until(lambda: all(j.finished for j in backend.observe().jobs), 30, "all jobs to end")


def _check_promises(snap: ClusterSnapshot, managed: set[str]) -> None:
    """No node is promised more GPUs than it has: the plans of released or
    running managed jobs plus what unmanaged jobs hold fit every node."""
    use: Counter[str] = Counter()
    for j in snap.jobs:
        if j.finished or j.held:
            continue
        if j.job_id in managed:
            plan = admin_comment_dict(j.admin_comment).get("plan")
            if plan:
                for n in plan["nodes"]:
                    use[n] += plan["gpus_per_node"]
        elif j.holds_resources and j.gpus_per_node:
            for n in j.nodes:
                use[n] += j.gpus_per_node
    for node, gpus in use.items():
        assert gpus <= SHAPE[node][1], f"node {node}: {gpus} GPUs promised, it has {SHAPE[node][1]}"


def test_jobs_of_different_models_are_placed_run_and_complete(slurm_cluster, tmp_path):
    backend = get_backend("cli")
    done = tmp_path / "done.txt"
    config = write_config(tmp_path / "c.toml", tmp_path / "state.sqlite")
    with config.open("a") as f:  # one GPU type per job: this test checks the per-type partitions
        f.write("mixed_cells = false\n")  # (cells across types: test_hetero_controller_slurm.py)
    # an unmanaged job holding both a10 GPUs of n6 for the whole test
    script = tmp_path / "plain.sh"
    script.write_text("#!/bin/bash\nsleep 300\n")
    plain = subprocess.run(
        ["sbatch", "--parsable", "-p", "a10", "--gres=gpu:2", "-o", str(tmp_path / "plain.out"), str(script)],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    ).stdout.strip()
    wait_until(lambda: backend.observe().job(plain).state == "RUNNING", 20, "the unmanaged job to run")
    before = backend.observe().job(plain)
    ids = [submit_managed(m, tmp_path, done_file=done, sleep=2) for m in MODELS]
    ids += [submit_managed("gpt-125m", tmp_path, done_file=done, sleep=1, extra=("--gpu-types", "a10,a40"))]
    managed = set(ids)
    # a managed job whose spec the controller refuses (the wrapper would not submit it)
    bad_spec = '{"model":"no-such-model","global_batch":8,"iterations":5}'
    bad = backend.submit(
        SubmitRequest(
            script=str(script),
            hold=True,
            gres_per_node=1,
            comment="cellsched/v1 " + bad_spec,
            output=str(tmp_path / "bad.out"),
        )
    )

    # `cellsched plan` decides without changing anything
    planned = json.loads(cellsched("plan", "--json", "--config", str(config)).stdout)
    assert planned["status"] == "ok" and planned["dry_run"]
    assert {a["job"] for a in planned["actions"]} <= managed and len(planned["actions"]) >= 4
    assert all(j.held for j in backend.observe().jobs if j.job_id in managed)
    assert not (tmp_path / "state.sqlite").exists()

    plans: dict[str, dict] = {}
    seen_on: dict[str, tuple[str, ...]] = {}
    deadline = time.monotonic() + 150
    while True:
        proc = cellsched("controller", "run", "--once", "--config", str(config))
        report = json.loads(proc.stdout)
        assert report["status"] == "ok", report
        snap = backend.observe()
        _check_promises(snap, managed)
        for j in snap.jobs:
            if j.job_id in managed and j.holds_resources:
                seen_on[j.job_id] = j.nodes
            if j.job_id in managed and j.admin_comment:
                plan = admin_comment_dict(j.admin_comment).get("plan")
                if plan:
                    plans[j.job_id] = plan
        if all(snap.job(i).finished for i in ids):
            break
        assert time.monotonic() < deadline, [(j.job_id, j.state, j.reason) for j in snap.jobs if j.job_id in managed]
        time.sleep(0.5)

    snap = backend.observe()
    for i in ids:
        job = snap.job(i)
        assert job.state == "COMPLETED" and job.exit_code == 0, (i, job.state, job.exit_code)
        plan = plans[i]
        gpu_type = plan["gpu_types"][0]
        assert plan["pp"] * plan["dp"] * plan["tp"] == len(plan["nodes"]) * plan["gpus_per_node"]
        for n in plan["nodes"]:
            assert SHAPE[n][0] == gpu_type, (i, n, plan)
            assert plan["gpus_per_node"] <= SHAPE[n][1]
        assert job.partition == gpu_type  # the per-type partition
        assert job.features == gpu_type
        assert sorted(job.nodes) == sorted(plan["nodes"])  # it ran where the plan said
        assert job.gpus_per_node == plan["gpus_per_node"]
        assert "n6" not in plan["nodes"]  # the unmanaged job holds n6's GPUs
        out = (tmp_path / f"{i}.out").read_text()
        assert f"SLURM_JOB_NUM_NODES={len(plan['nodes'])}" in out
        assert '"plan":' in out  # the job read its plan from its AdminComment
    low = plans[ids[-1]]
    assert low["gpu_types"][0] in ("a10", "a40")
    assert sorted(done.read_text().split()) == sorted(ids)

    # one more round records the ends the last round could not have seen;
    # then status --json shows the plans the jobs carry
    cellsched("controller", "run", "--once", "--config", str(config))
    status = json.loads(cellsched("status", "--json", "--all", "--config", str(config)).stdout)
    rows = {r["job_id"]: r for r in status["jobs"]}
    for i in ids:
        assert rows[i]["plan"] == plans[i]
        assert rows[i]["state"] == "COMPLETED"
        assert rows[i]["cell"] == plans[i]["cell"]
        assert (rows[i]["pp"], rows[i]["dp"], rows[i]["tp"]) == (plans[i]["pp"], plans[i]["dp"], plans[i]["tp"])
    assert plain not in rows
    assert "model" in rows[bad]["reason"] and rows[bad]["cell"] is None
    assert backend.observe().job(bad).held  # refused, reported, left alone

    # the unmanaged job was not touched
    after = backend.observe().job(plain)
    assert after.state == "RUNNING"
    assert (after.partition, after.admin_comment, after.features, after.nodes, after.comment) == (
        before.partition,
        before.admin_comment,
        before.features,
        before.nodes,
        before.comment,
    )
    with StateStore(tmp_path / "state.sqlite", readonly=True) as st:
        assert plain not in st.jobs()
        assert not st.plans_of(plain)
        assert all(len(st.plans_of(i)) == 1 and st.plans_of(i)[0].applied for i in ids)
        assert st.jobs()[bad].spec is None and st.jobs()[bad].bad_reason
    _cancel_all(backend)


@pytest.mark.parametrize("crash_before", ["update_many", "release_many"])
def test_a_round_cut_short_is_finished_by_the_next(slurm_cluster, tmp_path, crash_before):
    """Killed before the update or between update and release: the next
    controller (same state file) places the job exactly once."""
    real = get_backend("cli")
    done = tmp_path / "done.txt"
    config = load(write_config(tmp_path / "c.toml", tmp_path / "state.sqlite"))
    job = submit_managed("gpt-350m", tmp_path, done_file=done, sleep=1)
    with StateStore(config.controller.state_path) as st:
        ctl = Controller(config, backend=DiesAt(real, methods=(crash_before,)), state=st)
        with pytest.raises(Killed):
            ctl.round()
        assert list(st.open_plans()) == [job]
        assert real.observe().job(job).held
    with StateStore(config.controller.state_path) as st:
        report = Controller(config, backend=real, state=st).round()
        assert report.status == "ok"
        assert [a["job"] for a in report.actions] == [job] and report.actions[0]["why"] == "recover"
        assert st.open_plans() == {}
        assert [p.status for p in st.plans_of(job)] == ["superseded", "released"]
    wait_until(lambda: real.observe().job(job).state == "COMPLETED", 30, "the job to complete")
    with StateStore(config.controller.state_path) as st:
        report = Controller(config, backend=real, state=st).round()
        assert report.actions == ()  # a released job is not touched again
    assert done.read_text().split() == [job]


def _start_controller(config: Path, log) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "slurm_ext", "controller", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=os.environ.copy(),
    )


def _round_left_running(state_path: Path) -> set[int]:
    """The last round, when a kill cut it short (still 'running'; a controller
    killed before it started marks nothing, so the same round may come again)."""
    if not state_path.exists():
        return set()
    with StateStore(state_path, readonly=True) as st:
        last = st.rounds(limit=1)
    return {last[0]["id"]} if last and last[0]["status"] == "running" else set()


def test_sigkill_at_random_points_loses_nothing(slurm_cluster, tmp_path):
    """24 jobs; the controller is SIGKILLed at random moments, inside batched
    applies (after a batch's intents are journalled, after its updates) and
    right after a placement (20 times, and on until two kills have landed in
    the middle of a round and two inside a batch) and restarted; every job
    runs exactly once, on its last plan, and none stays held."""
    backend = get_backend("cli")
    done = tmp_path / "done.txt"
    config = write_config(tmp_path / "c.toml", tmp_path / "state.sqlite", interval_s=0.3, min_gap_s=0.0, watch_s=0.2)
    models = ("gpt-125m", "gpt-350m", "bert__760M", "moe__690M", "wide_resnet__500M", "gpt-1.3b")
    # at least 4 GPUs each: about 5 run at a time, so placements come in waves
    ids = [
        submit_managed(models[k % len(models)], tmp_path, done_file=done, sleep=3, batch=32, extra=("--min-gpus", "4"))
        for k in range(24)
    ]
    rng = random.Random(20240611)
    log_path = tmp_path / "controller.log"
    # what a kill waits for in the log, then the most it waits on: a batch's intents journalled, a random
    # moment, a batch's updates done (its release follows within milliseconds), a placement
    marks = (('"step":"journalled"', 0.02), (None, 2.0), ('"step":"updated"', 0.005), ('"msg":"placed"', 0.08))
    with log_path.open("ab") as log:
        kill, mid_round, in_batch = 0, set(), 0
        while kill < 20 or ((len(mid_round) < 2 or in_batch < 2) and kill < 60):
            before = log_path.stat().st_size
            mark, delay = marks[kill % len(marks)]
            proc = _start_controller(config, log)
            if mark is None:
                time.sleep(rng.uniform(0.3, delay))
            else:
                deadline = time.monotonic() + 3
                with log_path.open("rb") as seen:
                    seen.seek(before)
                    text = b""
                    while time.monotonic() < deadline and mark.encode() not in text:
                        text += seen.read()
                        time.sleep(0.002)
                time.sleep(rng.uniform(0.0, delay))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            kill += 1
            mid_round |= _round_left_running(tmp_path / "state.sqlite")
            run = log_path.read_bytes()[before:].decode()
            in_batch += run.count('"step":"journalled"') > run.count('"step":"released"')
        assert len(mid_round) >= 2, f"only {len(mid_round)} of {kill} kills landed in the middle of a round"
        assert in_batch >= 2, f"only {in_batch} of {kill} kills landed inside a batched apply"
        proc = _start_controller(config, log)
        try:
            wait_until(
                lambda: all(backend.observe().job(i).finished for i in ids), 180, "all jobs to finish", interval=1
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=30)
    assert rc == 0, log_path.read_text()[-3000:]  # SIGTERM: the round in progress finishes, then a clean exit
    snap = backend.observe()
    assert [(i, snap.job(i).state) for i in ids if snap.job(i).state != "COMPLETED"] == []
    counts = Counter(done.read_text().split())
    assert counts == Counter({i: 1 for i in ids})
    with StateStore(tmp_path / "state.sqlite", readonly=True) as st:
        assert st.open_plans() == {}
        rounds = st.rounds(limit=1000)
        assert {r["id"] for r in rounds if r["status"] == "interrupted"} == mid_round  # each marked by the next start
        assert st.restart_counts(ids) == dict.fromkeys(ids, 0)  # none was requeued to run again
        for i in ids:
            # placed once, or placed again while it still waited (a released job Slurm has not started may be
            # moved): every plan but the last was carried out before the job's one start (Slurm's times are
            # whole seconds), and it ran on the last
            applied, job = [p for p in st.plans_of(i) if p.applied], snap.job(i)
            assert applied and job.start_time is not None, (i, applied, job)
            assert all(p.applied_at is not None and p.applied_at < job.start_time + 1 for p in applied[:-1]), (
                i,
                applied,
                job.start_time,
            )
            assert {n for n, _ in applied[-1].nodes} == set(job.nodes), (i, applied[-1], job.nodes)


def test_slurmctld_outage_backs_off_and_resumes(slurm_cluster, tmp_path):
    backend = get_backend("cli")
    done = tmp_path / "done.txt"
    config = write_config(tmp_path / "c.toml", tmp_path / "state.sqlite", interval_s=2.0, slurm_timeout_s=3.0)
    first = submit_managed("gpt-350m", tmp_path, done_file=done, sleep=1)
    log_path = tmp_path / "controller.log"
    with log_path.open("ab") as log:
        proc = _start_controller(config, log)
        try:
            wait_until(lambda: backend.observe().job(first).state == "COMPLETED", 30, "the first job")
            assert slurm_cluster.devcluster("stop-ctld").returncode == 0
            t_stop = time.time()
            # the controller meets the outage: rounds fail, with longer and longer pauses between them
            wait_until(lambda: len(_logged(log_path, "backing off")) >= 4, 90, "four backoffs")
            assert proc.poll() is None, "the controller died while slurmctld was away"
            started = slurm_cluster.devcluster("start-ctld")
            assert started.returncode == 0, started.stderr
            second = submit_managed("bert__760M", tmp_path, done_file=done, sleep=1)
            wait_until(
                lambda: backend.observe().job(second).state == "COMPLETED", 60, "the job submitted after the outage"
            )
            assert proc.poll() is None
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    down = _logged(log_path, "slurm unavailable")
    backoffs = [ln["delay_s"] for ln in _logged(log_path, "backing off")]
    assert len(down) >= 4
    assert backoffs[:4] == [1.0, 2.0, 2.0, 2.0]  # doubling, capped at the interval
    # rounds during the outage were spaced by the backoff, not run back to back
    times = [datetime.fromisoformat(ln["time"].replace("Z", "+00:00")).timestamp() for ln in down[:4]]
    assert all(b - a >= d - 0.05 for (a, b), d in zip(pairwise(times), backoffs, strict=False)), (times, backoffs)
    with StateStore(tmp_path / "state.sqlite", readonly=True) as st:
        rounds = st.rounds(limit=1000)
        assert any(r["status"] == "slurm-unavailable" and r["started"] > t_stop for r in rounds)
        assert rounds[0]["status"] == "ok" or rounds[1]["status"] == "ok"
    assert sorted(done.read_text().split()) == sorted([first, second])


def test_daemon_starts_rounds_early_notifies_systemd_and_serves_metrics(slurm_cluster, tmp_path):
    """With a 60 s interval, a new job is placed within seconds (the watch
    sees it; with the watch off, touching the kick file does it); READY=1
    then WATCHDOG=1 + STATUS= reach NOTIFY_SOCKET; /metrics answers."""
    import socket
    import urllib.request

    backend = get_backend("cli")
    done = tmp_path / "done.txt"
    port = free_port()
    config = write_config(tmp_path / "c.toml", tmp_path / "state.sqlite", interval_s=60.0, watch_s=0.5, min_gap_s=0.5)
    config.write_text(config.read_text().replace("port = 0", f"port = {port}"))
    sock_path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock, (tmp_path / "controller.log").open("ab") as log:
        sock.bind(str(sock_path))
        sock.settimeout(30)
        env = {**os.environ, "NOTIFY_SOCKET": str(sock_path)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "slurm_ext", "controller", "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
        )
        try:
            assert sock.recv(4096).startswith(b"READY=1")
            first = sock.recv(4096).decode()  # after the first round
            assert first.startswith("WATCHDOG=1\nSTATUS=round 1: ok")
            job = submit_managed("gpt-350m", tmp_path, done_file=done, sleep=1)
            t0 = time.monotonic()
            wait_until(lambda: not backend.observe().job(job).held, 15, "the new job to be released")
            assert time.monotonic() - t0 < 10  # long before the 60 s interval
            placed = 'cellsched_actions_total{kind="place",result="ok"} 1'

            def scrape() -> str | None:  # the round counts its actions when it ends, after the release
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
                return body if placed in body else None

            body = wait_until(scrape, 15, "/metrics to count the placement")
            assert 'cellsched_rounds_total{status="ok"}' in body
            assert 'cellsched_gpus{gpu_type="v100",use="total"} 8' in body
            assert "cellsched_round_duration_seconds" in body and "cellsched_solve_seconds" in body
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
    # the watch off: only the kick file starts an early round
    config.write_text(
        config.read_text().replace("watch_s = 0.5", "watch_s = 1000.0").replace(f"port = {port}", "port = 0")
    )
    with (tmp_path / "controller.log").open("ab") as log:
        rounds_before = _finished_rounds(tmp_path)
        proc = _start_controller(config, log)
        try:
            wait_until(lambda: _finished_rounds(tmp_path) > rounds_before, 30, "the first round to end")
            early_before = _early_rounds(tmp_path / "controller.log")
            job2 = submit_managed("gpt-125m", tmp_path, done_file=done, sleep=1)
            (tmp_path / "kick").touch()
            wait_until(lambda: not backend.observe().job(job2).held, 10, "the kicked round to release the job")
            # the only early round since was the kick's: the new job alone started none (the watch is off)
            assert _early_rounds(tmp_path / "controller.log")[len(early_before) :] == ["kick"]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    wait_until(lambda: all(backend.observe().job(j).finished for j in (job, job2)), 30, "both jobs to finish")


def _logged(log_path: Path, msg: str) -> list[dict]:
    """The controller's JSON log lines with this message."""
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    return [ln for ln in lines if ln["msg"] == msg]


def _finished_rounds(tmp_path: Path) -> int:
    with StateStore(tmp_path / "state.sqlite", readonly=True) as st:
        return sum(r["status"] != "running" for r in st.rounds(limit=1000))


def _early_rounds(log_path: Path) -> list[str]:
    """The triggers of the early rounds the controller logged, in order."""
    return [ln["trigger"] for ln in _logged(log_path, "early round")]


def _rounds(tmp_path: Path) -> int:
    with StateStore(tmp_path / "state.sqlite", readonly=True) as st:
        return len(st.rounds(limit=1000))


def _children(pid: int) -> set[int]:
    """The pids of a process's children (e.g. a pending scontrol)."""
    return {int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()}


def test_sigterm_ends_the_daemon_within_5_s_while_a_slurm_call_hangs(slurm_cluster, tmp_path):
    """slurmctld stopped (SIGSTOP: calls hang until their timeout, up to
    slurm_timeout_s, 30 s here); SIGTERM during such a call ends the daemon
    within 5 s."""
    config = write_config(
        tmp_path / "c.toml", tmp_path / "state.sqlite", interval_s=1.0, watch_s=0.2, slurm_timeout_s=30.0
    )
    log_path = tmp_path / "controller.log"
    ctld = int((slurm_cluster.lab / "run" / "slurmctld.pid").read_text())
    with log_path.open("ab") as log:
        proc = _start_controller(config, log)
        try:
            wait_until(lambda: '"msg":"round"' in log_path.read_text(), 60, "a first round")
            os.kill(ctld, signal.SIGSTOP)
            seen: dict[int, float] = {}

            def hanging() -> bool:  # a Slurm command that has been waiting for a second
                now, kids = time.monotonic(), _children(proc.pid)
                for kid in kids:
                    seen.setdefault(kid, now)
                return any(now - seen[k] >= 1.0 for k in kids)

            wait_until(hanging, 30, "a Slurm call to hang", interval=0.05)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=30)
            took = time.monotonic() - t0
        finally:
            os.kill(ctld, signal.SIGCONT)
            if proc.poll() is None:
                proc.kill()
    assert rc == 0 and took < 5.0, (rc, took, log_path.read_text()[-2000:])
    wait_until(lambda: get_backend("cli").observe() is not None, 60, "slurmctld to answer again")


#: the daemon, with one fake: every read of a progress file hangs, as on a hung network or FUSE mount
HUNG_READ = """
import sys, threading
from slurm_ext.controller import userfiles
never = threading.Event()
userfiles.read_owned_file = lambda path, uid, max_bytes: never.wait()
from slurm_ext.cli import main
main(["controller", "run", "--config", sys.argv[1]])
"""


def _progress_notes(log_path: Path, job: str) -> list[str]:
    """Why the controller did not use the job's progress file, as it logged each change."""
    return [ln["why"] for ln in _logged(log_path, "progress not used") if ln.get("job") == job]


def test_sigterm_ends_the_daemon_within_5_s_while_a_progress_read_hangs(slurm_cluster, tmp_path):
    """A running job's progress read never returns: it is abandoned after
    read_timeout_s, a later round goes on without reading the file again (no
    second thread on the hung path), and SIGTERM ends the daemon within 5 s.
    The test waits for each of these in the controller's log, not for time."""
    config = write_config(tmp_path / "c.toml", tmp_path / "state.sqlite", interval_s=0.5, watch_s=0.2)
    job = submit_managed("gpt-350m", tmp_path, done_file=tmp_path / "done.txt", sleep=300)
    script = tmp_path / "hung_read.py"
    script.write_text(HUNG_READ)
    log_path = tmp_path / "controller.log"
    hung = "progress file not read: no answer within 0.50 s"
    again = "progress file not read: an earlier read of it has not returned"
    with log_path.open("ab") as log:
        proc = subprocess.Popen([sys.executable, str(script), str(config)], stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_until(lambda: hung in _progress_notes(log_path, job), 120, "the job's progress read to hang")
            wait_until(lambda: again in _progress_notes(log_path, job), 120, "a later round to meet the hung read")
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=30)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
            subprocess.run(["scancel", job], check=False, timeout=30)
    assert rc == 0 and took < 5.0, (rc, took, log_path.read_text()[-2000:])
    notes = _progress_notes(log_path, job)
    assert notes.index(hung) < notes.index(again), notes  # the later round did not read the hung path again
