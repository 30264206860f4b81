"""What a user controls cannot stall or steer the controller, without Slurm:
the hardened read of a job's progress file (slurm_ext.controller.userfiles),
the checks on what the file says (progress.doubt), the bounded restart
cost, and a stop that never waits on a stuck read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from slurm_ext.controller import inputs as inp
from slurm_ext.controller import userfiles
from slurm_ext.controller.progress import JobProgress, ProgressFiles, collect_progress, doubt
from slurm_ext.controller.reconcile import Waiting
from slurm_ext.controller.userfiles import BoundedReader, Refused, read_owned_file
from slurm_ext.records import ClusterSnapshot, SlurmJob, SlurmNode, SlurmPartition
from solver.contract.jobspec import JobSpec
from solver.contract.plan import JobPlan

NOBODY = 65534
SPEC = JobSpec(model="gpt-350m", global_batch=64, iterations=100)


def test_a_regular_file_of_the_user_is_read(tmp_path):
    f = tmp_path / "progress.json"
    f.write_bytes(b'{"iterations_done": 3}')
    assert read_owned_file(str(f), os.getuid(), 100) == b'{"iterations_done": 3}'
    assert read_owned_file(str(tmp_path / "absent"), os.getuid(), 100) is None


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda p: os.mkfifo(p), "not a regular file"),  # opened without waiting for a writer, then refused
        (lambda p: os.symlink("/dev/zero", p), "a symbolic link"),
        (lambda p: os.symlink("/etc/shadow", p), "a symbolic link"),
        (lambda p: p.write_bytes(b"x" * 101), "101 bytes, more than 100"),
        (lambda p: os.mkdir(p), "not a regular file"),
    ],
)
def test_what_is_not_a_small_regular_file_is_refused_at_once(tmp_path, make, why):
    path = tmp_path / "progress.json"
    make(path)
    t0 = time.monotonic()
    with pytest.raises(Refused, match=why):
        read_owned_file(str(path), os.getuid(), 100)
    assert time.monotonic() - t0 < 1.0


def test_a_file_of_another_user_is_refused_unread(tmp_path):
    if os.getuid() != 0:
        pytest.fail("this test gives a file away (chown): run the suite as root, as the README says")
    f = tmp_path / "progress.json"
    f.write_bytes(b'{"iterations_done": 3}')
    os.chown(f, NOBODY, NOBODY)
    with pytest.raises(Refused, match=f"owned by uid {NOBODY}, not by the job's user \\(0\\)"):
        read_owned_file(str(f), 0, 100)
    # a symlinked directory leads to root's file: the owner check refuses it
    (tmp_path / "root-only").mkdir(mode=0o700)
    (tmp_path / "root-only" / "progress.json").write_bytes(b'{"iterations_done": 99}')
    (tmp_path / "link").symlink_to(tmp_path / "root-only")
    with pytest.raises(Refused, match="owned by uid 0"):
        read_owned_file(str(tmp_path / "link" / "progress.json"), NOBODY, 100)


def test_a_read_that_hangs_is_abandoned_and_not_tried_again_while_it_hangs(monkeypatch, tmp_path):
    release = threading.Event()

    def hang(path, uid, max_bytes):  # a read stuck in the kernel (a hung network or FUSE mount)
        if path.endswith("stuck"):
            release.wait(30)
        return b"{}"

    monkeypatch.setattr(userfiles, "read_owned_file", hang)
    reader = BoundedReader(timeout_s=0.2, budget_s=0.5)
    t0 = time.monotonic()
    assert reader.read("/x/stuck", 0).error == "no answer within 0.20 s"
    assert reader.read("/x/stuck", 0).error == "an earlier read of it has not returned"  # no second thread on it
    assert reader.read("/x/fine", 0).data == b"{}"
    assert time.monotonic() - t0 < 1.0
    reader.spent_s = 0.5
    assert reader.read("/x/fine", 0).error == "the round's time for reading users' files is spent"
    release.set()  # the mount answers again: once the stuck thread has ended, the path is read again
    deadline = time.monotonic() + 10
    while reader.read("/x/stuck", 0).error == "an earlier read of it has not returned" and time.monotonic() < deadline:
        reader.reset()
        time.sleep(0.01)
    reader.reset()
    assert reader.read("/x/stuck", 0).data == b"{}"


# --- what a progress file says ---------------------------------------------


def running_job(tmp_path, uid: int, start: float | None = 900.0) -> inp.ManagedJob:
    plan = JobPlan(
        dp=2,
        global_batch=64,
        gpu_types=("a40",),
        nodes=("n4",),
        gpus_per_node=2,
        cell="a40:1x2:pp1",
        job_id="5",
        iter_time_s=2.0,
        checkpoint_dir=str(tmp_path),
    )
    ac = json.dumps({"spec": json.loads(SPEC.to_json()), "plan": json.loads(plan.to_json())})
    job = SlurmJob(
        job_id="5",
        user="alice",
        uid=uid,
        state="RUNNING",
        partition="a40",
        nodes=("n4",),
        num_nodes=1,
        gpus_per_node=2,
        comment=SPEC.to_comment(),
        admin_comment=ac,
        start_time=start,
        submit_time=800.0,
    )
    nodes = (SlurmNode(name="n4", gpu_type="a40", gpus_total=2, gpus_alloc=2, state="allocated", partitions=("a40",)),)
    (m,) = inp.classify(ClusterSnapshot(nodes, (SlurmPartition("a40", ("n4",)),), (job,), 1000.0), {}, {})
    return m


@pytest.mark.parametrize(
    "report, prev, why",
    [
        (JobProgress(50), None, ""),  # 100 s at 2 s/iteration: 50, believed
        (JobProgress(150), None, "reports 150 iterations, beyond the job's 100"),
        (JobProgress(99), (10.0, 980.0), "more than 3 times its cell's estimate allows (41)"),  # 10 + 3 * 20 / 2 + 1
        (JobProgress(40), (10.0, 980.0), ""),
        (JobProgress(20, first_step_at=950.0), None, ""),
        (JobProgress(20, first_step_at=1e12), None, "its first step (1000000000000) lies outside its run"),
        (JobProgress(20, first_step_at=100.0), None, "its first step (100) lies outside its run"),
        (JobProgress(20), "never ran", "reports 20 iterations before it ever ran"),  # no count, no start time
    ],
)
def test_a_report_is_believed_only_within_reason(tmp_path, report, prev, why):
    m = running_job(tmp_path, os.getuid(), start=None if prev == "never ran" else 900.0)
    got = doubt(report, m, None if prev == "never ran" else prev, 1000.0, rate_factor=3.0)
    assert (why in got) if why else got == "", got


def write(tmp_path, record) -> None:
    (tmp_path / "progress.json").write_text(json.dumps(record))


def test_a_job_that_reports_nonsense_is_scheduled_on_the_estimate_and_gains_nothing(tmp_path):
    m = running_job(tmp_path, os.getuid())
    read, prev = ProgressFiles(), {"5": (10.0, 980.0)}
    write(tmp_path, {"iterations_done": 99, "first_step_at": 901.0})  # almost done: the short-job weight it would win
    got = collect_progress((m,), 1000.0, (), read, previous=prev, rate_factor=3.0)
    assert got.done == {"5": 20.0} and got.source == {"5": "estimate"}  # 10 + 20 s / 2 s, not 99
    assert got.first_step_at == {} and "progress file ignored: reports 99 iterations" in got.notes["5"]
    write(tmp_path, {"iterations_done": 4})  # backwards: the count never goes back
    assert collect_progress((m,), 1000.0, (), read, previous=prev, rate_factor=3.0).done == {"5": 10.0}
    write(tmp_path, {"iterations_done": 30})
    assert collect_progress((m,), 1000.0, (), read, previous=prev, rate_factor=3.0).source == {"5": "file"}


def test_a_file_the_controller_will_not_read_is_reported_in_the_status(tmp_path):
    m = running_job(tmp_path, os.getuid())
    os.mkfifo(tmp_path / "progress.json")
    got = collect_progress((m,), 1000.0, (), ProgressFiles())
    assert got.done == {"5": 50.0} and got.notes == {"5": "progress file not read: not a regular file"}
    other = running_job(tmp_path, NOBODY)  # a job of another user pointing at this directory
    (tmp_path / "progress.json").unlink()
    write(tmp_path, {"iterations_done": 7})
    note = collect_progress((other,), 1000.0, (), ProgressFiles()).notes["5"]
    assert note == f"progress file not read: owned by uid {os.getuid()}, not by the job's user ({NOBODY})"


def test_the_wait_for_a_checkpoint_ends_when_the_daemon_stops():
    stop = threading.Event()
    stop.set()
    assert Waiting(stopping=stop.is_set).stopping()


def test_a_stop_ends_the_process_after_the_grace_even_if_the_main_thread_hangs():
    """What SIGTERM starts (daemon.stop_within): the loop is asked to
    stop; a main thread stuck in a call is cut after the grace, exit 0."""
    code = (
        "import threading, time\n"
        "from slurm_ext.controller import logs\n"
        "from slurm_ext.controller.daemon import stop_within\n"
        "logs.setup('json')\n"
        "stop = threading.Event()\n"
        "threading.Thread(target=stop_within, args=(stop, 0.3), daemon=True).start()\n"
        "time.sleep(60)  # a call that hangs\n"
    )
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and time.monotonic() - t0 < 30, proc.stderr
    assert '"msg":"stopping now","grace_s":0.3' in proc.stderr


def test_a_job_moved_since_its_last_count_is_bounded_by_the_faster_cell(tmp_path):
    m = running_job(tmp_path, os.getuid())  # now in a cell of 2 s per iteration
    report = JobProgress(99)  # 89 in 20 s: 0.22 s per iteration, as in its earlier cell (0.2 s)
    assert "more than 3 times" in doubt(report, m, (10.0, 980.0), 1000.0, rate_factor=3.0)
    assert doubt(report, m, (10.0, 980.0), 1000.0, rate_factor=3.0, iter_s=0.2) == ""


def test_the_simulators_counts_are_taken_as_they_are(tmp_path):
    """An infinite rate factor (the simulator's executed-seconds counts): no checks, no floor."""
    m = running_job(tmp_path, os.getuid())
    write(tmp_path, {"iterations_done": 4})
    got = collect_progress((m,), 1000.0, (), ProgressFiles(), previous={"5": (10.0, 980.0)}, rate_factor=float("inf"))
    assert got.done == {"5": 4.0} and got.notes == {}


def test_the_state_keeps_when_a_count_was_taken(tmp_path):
    """progress_at moves only with a count (`updated` moves every round); a schema-2 state gains the column."""
    from slurm_ext.state import SCHEMA, JobStatus, StateStore

    def status(done):
        return JobStatus("5", "alice", "RUNNING", "running", "", 800.0, 900.0, None, None, done, "file", False)

    with StateStore(tmp_path / "s.sqlite") as st:
        st.accept_spec("5", "alice", SPEC.to_json(), "comment", 900.0)
        st.save_statuses([status(10.0)], 950.0)
        st.save_statuses([status(None)], 1000.0)  # a round without a count
        row = st.jobs()["5"]
        assert (row.iterations_done, row.progress_at, row.updated) == (10.0, 950.0, 1000.0)
        st._db.execute("ALTER TABLE jobs DROP COLUMN progress_at")
        st._db.execute("DROP TABLE speeds")
        st._db.execute("DELETE FROM meta WHERE key = 'schema_version'")  # as the files of schema 2 were
        st._db.execute("INSERT INTO meta VALUES ('schema', '2')")
    with StateStore(tmp_path / "s.sqlite") as st:
        assert dict(st._db.execute("SELECT key, value FROM meta")) == {"schema_version": str(SCHEMA.version)}
        assert st.jobs()["5"].progress_at is None and st.speeds() == []
        st.save_statuses([status(12.0)], 1100.0)
        assert st.jobs()["5"].progress_at == 1100.0
