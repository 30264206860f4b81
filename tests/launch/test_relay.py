"""The launcher reading a framework's output for progress (launch.relay,
launch.progress, launch.cli.supervise): the output passes unchanged, the
child never waits on the progress file, hostile output is passed on and not
believed; and which task reads, and how signals reach the child."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from framework_logs import MEGATRON_LINES, TITAN_LINES
from srun_local import REPO, task_envs

from launch.progress import ProgressWriter
from launch.relay import Lines, Reporter, StepRelay
from launch.steplog import MAX_LINE, MEGATRON, TORCHTITAN
from slurm_ext.controller.progress import read_progress_file
from solver.contract import PROGRESS_FILE

MEGA = [line for line, _ in MEGATRON_LINES]  # iterations 1, 10, 20, 123456
TITAN_STEP = TITAN_LINES[0][0]  # step 7


def _pieces(data: bytes, seed: int = 0) -> list[bytes]:
    """DATA cut at random places (1 byte to 3000 bytes a piece)."""
    rnd, out, i = random.Random(seed), [], 0
    while i < len(data):
        n = rnd.randint(1, 3000)
        out.append(data[i : i + n])
        i += n
    return out


# --- Lines: a byte stream cut into bounded lines


def test_lines_are_whole_whatever_the_chunks():
    text = b"".join(line.encode() + b"\n" for line in MEGA) + b"tail without newline"
    lines = Lines()
    got = [line for piece in _pieces(text) for line in lines.feed(piece)] + lines.end()
    assert got == [line.encode() for line in MEGA] + [b"tail without newline"]


def test_a_line_longer_than_the_limit_is_dropped_whole():
    lines = Lines(limit=10)
    assert lines.feed(b"0123456789\n") == [b"0123456789"]  # exactly the limit: kept
    assert lines.feed(b"0123456789") == [] and lines.feed(b"A") == []  # one byte over, in another chunk
    assert lines.feed(b"BCDEF" * 1000) == []  # nothing of it is kept meanwhile
    assert not lines.partial
    assert lines.feed(b"ghij\nnext\n") == [b"next"]  # its tail is dropped with it
    assert lines.feed(b"x" * 11) == [] and lines.end() == []  # an overlong last line too
    assert lines.feed(b"y\n") == [b"y"]


# --- StepRelay in this process, over real pipes


def _relay_through(data: bytes, log, tmp_path: Path, reporter: Reporter | None = None) -> tuple[bytes, StepRelay]:
    """DATA written in pieces into a pipe, relayed into a file; -> (the file's bytes, the relay)."""
    src_r, src_w = os.pipe()
    out = tmp_path / "out"
    with open(out, "wb") as dst:
        relay = StepRelay(src_r, dst.fileno(), log, reporter or Reporter(str(tmp_path / "ck"))).start()
        for piece in _pieces(data):
            os.write(src_w, piece)
        os.close(src_w)
        relay.finish(grace_s=30)
    return out.read_bytes(), relay


def test_relay_passes_everything_on_and_reports_megatrons_steps(tmp_path):
    garbage = bytes(range(256)) * 50 + b"\n"
    long_line = b"x" * (3 * MAX_LINE) + MEGA[2].encode() + b"\n"  # a step line inside an overlong line: no step
    data = b"".join(
        [
            b"> building GPT model ...\n",
            MEGA[0].encode() + b"\n",
            garbage,
            MEGA[1].encode() + b"\r\n",
            long_line,
            MEGA[0].encode() + b"\n",  # iteration 1 again: goes back, not counted
            MEGA[2].encode() + b"\n",
            "µ ünïcode\n".encode(),
            MEGA[1].encode() + b"\n",  # 10 again
        ]
    )
    t0 = time.time()
    out, relay = _relay_through(data, MEGATRON, tmp_path)
    assert out == data
    assert (relay.last, relay.reports) == (20, 3)
    raw = json.loads((tmp_path / "ck" / PROGRESS_FILE).read_text())
    assert raw["step"] == raw["iterations_done"] == 20
    assert t0 <= raw["first_step_at"] <= raw["time"] <= time.time()
    # the third line of the run is Megatron's own figure (settled): 312.4 ms
    assert raw["iter_time_s"] == pytest.approx(0.3124)
    p = read_progress_file(str(tmp_path / "ck"))  # what the controller reads of it
    assert p is not None and (p.iterations_done, p.iter_time_s) == (20.0, pytest.approx(0.3124))


def test_megatrons_first_two_times_are_not_its_speed(tmp_path):
    """Its first line times the first iteration, its second averages from the
    start: before its third the speed is measured from when lines arrive."""
    writer_seen = []

    class Seen(Reporter):
        def offer(self, step, seen_at, iter_time_s):
            writer_seen.append((step.done, iter_time_s))
            super().offer(step, seen_at, iter_time_s)

    data = "".join(line + "\n" for line in MEGA).encode()
    _relay_through(data, MEGATRON, tmp_path, Seen(str(tmp_path / "ck")))
    assert writer_seen == [(1, None), (10, None), (20, pytest.approx(0.3124)), (123456, pytest.approx(1.043))]


def test_relay_reports_torchtitans_steps_and_measures_their_pace(tmp_path):
    """torchtitan prints no iteration time: it is the time between its lines."""
    src_r, src_w = os.pipe()
    with open(tmp_path / "out", "wb") as dst:
        relay = StepRelay(src_r, dst.fileno(), TORCHTITAN, Reporter(str(tmp_path / "ck"), min_interval_s=0)).start()
        written = []  # when each line went into the pipe (a loaded machine sleeps longer than asked)
        for step in (1, 2, 3, 4):
            written.append(time.time())
            os.write(src_w, TITAN_STEP.replace("step:  7", f"step:  {step}").encode() + b"\n")
            time.sleep(0.3)
        os.close(src_w)
        relay.finish(grace_s=30)
    raw = json.loads((tmp_path / "ck" / PROGRESS_FILE).read_text())
    assert raw["step"] == 4 and written[0] <= raw["first_step_at"] <= written[1]  # the first line's arrival
    pace = (written[-1] - written[0]) / 3  # three gaps of at least 0.3 s
    assert raw["iter_time_s"] == pytest.approx(pace, abs=0.05)  # and the relay's delays, a third of their difference


def test_the_pipe_is_drained_while_the_progress_file_cannot_be_written(tmp_path):
    """A file system that does not take the write (here a FIFO nobody reads,
    where the progress file's temporary file goes) never holds up the pipe:
    the relay copies 20 MB meanwhile; the newest step is written once it can."""
    ck = tmp_path / "ck"
    ck.mkdir()
    os.mkfifo(ck / f".{PROGRESS_FILE}.tmp.{os.getpid()}")  # where ProgressWriter writes first
    bulk = b"".join(b"%08d some output of the framework\n" % i for i in range(500_000))
    data = MEGA[0].encode() + b"\n" + bulk + MEGA[1].encode() + b"\n" + MEGA[2].encode() + b"\n"
    src_r, src_w = os.pipe()
    reporter = Reporter(str(ck), min_interval_s=0)

    def child() -> None:  # writes as a child does: blocked as soon as the relay stops reading
        for piece in _pieces(data):
            os.write(src_w, piece)
        os.close(src_w)

    with open(tmp_path / "out", "wb") as dst:
        relay = StepRelay(src_r, dst.fileno(), MEGATRON, reporter).start()
        started = time.monotonic()
        writer = threading.Thread(target=child, daemon=True)
        writer.start()
        writer.join(60)
        drained = time.monotonic() - started
        assert not writer.is_alive(), "the child was held up"
        relay._thread.join(60)
        assert not relay._thread.is_alive() and reporter._thread.is_alive()  # the file's writer is still stuck
    assert (tmp_path / "out").read_bytes() == data and relay.last == 20
    with open(ck / f".{PROGRESS_FILE}.tmp.{os.getpid()}", "rb") as fifo:  # the file system takes it now
        first = json.loads(fifo.read())
    relay.finish(grace_s=30)
    assert first["step"] == 1  # the write that waited
    assert json.loads((ck / PROGRESS_FILE).read_text())["step"] == 20  # and then the newest step
    print(f"20 MB relayed in {drained:.2f} s while the progress file was stuck")


def test_an_output_that_is_gone_is_said_once_and_the_pipe_still_drained(tmp_path, capfd):
    src_r, src_w = os.pipe()
    out_r, out_w = os.pipe()
    os.close(out_r)  # nobody reads the launcher's output any more: EPIPE
    relay = StepRelay(src_r, out_w, MEGATRON, Reporter(str(tmp_path / "ck"))).start()
    old = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        for _ in range(3):
            os.write(src_w, b"y" * 100_000 + b"\n" + MEGA[1].encode() + b"\n")
        os.close(src_w)
        relay.finish(grace_s=30)
    finally:
        signal.signal(signal.SIGPIPE, old)
        os.close(out_w)
    assert not relay._thread.is_alive() and relay.last == 10
    assert capfd.readouterr().err.count("cannot be passed on") == 1


# --- the progress record


def test_progress_writer_keeps_its_window_over_repeated_counts(tmp_path):
    """Lightning reports every batch of a gradient accumulation with the
    same global step: that is no restart, the speed stays measured."""
    w = ProgressWriter()
    for i, done in enumerate([1, 1, 2, 2, 3, 3, 4]):
        w.write(tmp_path, done, now=100.0 + 0.25 * i)
    raw = json.loads((tmp_path / PROGRESS_FILE).read_text())
    assert raw["step"] == 4 and raw["first_step_at"] == 100.0
    assert raw["iter_time_s"] == pytest.approx(0.5)  # steps 1 -> 4 in 1.5 s
    w.write(tmp_path, 2, now=200.0)  # a lower count: a new one, measured afresh
    assert "iter_time_s" not in json.loads((tmp_path / PROGRESS_FILE).read_text())
    w.write(tmp_path, 3, now=201.0, iter_time_s=0.75)  # the framework's own figure wins
    raw = json.loads((tmp_path / PROGRESS_FILE).read_text())
    assert raw["iter_time_s"] == 0.75 and raw["first_step_at"] == 100.0


# --- through the launcher, as srun runs it

CHILD = r"""
import os, sys, time
from pathlib import Path
data = Path(sys.argv[1]).read_bytes()
i, n = 0, 1
while i < len(data):
    os.write(1, data[i:i + n])
    i += n
    n = n * 7 % 65521 + 1
os.write(2, b"stderr is the child's own\n")
print(os.getpid(), os.getppid(), file=sys.stderr)
"""


def _launch(
    tmp_path: Path, runtime: str, rank: int, ntasks: int, cmd: list[str], extra: dict | None = None, **kw
) -> subprocess.Popen:
    """Task RANK of NTASKS under the launcher, the plan's runtime RUNTIME, its checkpoint folder tmp_path/ck."""
    plan = {"dp": ntasks, "runtime": runtime, "checkpoint_dir": str(tmp_path / "ck")}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CELLSCHED_", "CUDA_"))}
    env.update(task_envs(ntasks)[rank])
    env.update({"CELLSCHED_PLAN": json.dumps(plan), "PYTHONPATH": str(REPO), **(extra or {})})
    return subprocess.Popen([sys.executable, "-m", "launch", "--", *cmd], env=env, cwd=REPO, **kw)


def test_a_flooding_child_gets_its_output_through_unchanged(tmp_path):
    """About 15 MB of hostile output (binary, overlong lines, lying step lines,
    every write a different size) through the launcher: byte for byte the
    same on its stdout, stderr untouched, only the real steps counted."""
    rnd = random.Random(1)
    parts = []
    for i in range(400):
        parts.append(rnd.randbytes(rnd.randint(0, 60_000)))
        parts.append(b"\n" + MEGA[1].replace("iteration       10/", f"iteration {i + 1:8d}/").encode() + b"\n")
        parts.append(b"z" * rnd.randint(MAX_LINE - 10, MAX_LINE + 10) + b"\n")
        parts.append(MEGA[1].replace("(ms): 731.9", "(ms): nan").replace("   10/", "99999/").encode() + b"\n")
    data = b"".join(parts) + b"no newline at the end"
    (tmp_path / "data").write_bytes(data)
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    started = time.monotonic()
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = _launch(
            tmp_path, "megatron", 0, 1, [sys.executable, "-c", CHILD, str(tmp_path / "data")], stdout=o, stderr=e
        )
        assert proc.wait(timeout=120) == 0
    took = time.monotonic() - started
    assert hashlib.sha256(out.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    lines = err.read_text().splitlines()
    assert lines[0] == "stderr is the child's own" and len(lines) == 2
    child_pid, parent = map(int, lines[1].split())
    assert parent == proc.pid  # supervised: the launcher is its parent
    p = read_progress_file(str(tmp_path / "ck"))
    assert p is not None and p.iterations_done == 400  # the lying lines (nan time, 99999 > 500) not counted
    print(f"{len(data) / 1e6:.0f} MB through the launcher in {took:.2f} s")


ORDER = r"""
import sys, time
for i in range(5):
    print(f"out {i}", flush=True)
    time.sleep(0.1)
    print(f"err {i}", file=sys.stderr, flush=True)
    time.sleep(0.1)
"""


def test_stdout_and_stderr_keep_their_order_in_one_file(tmp_path):
    """Slurm's -o file holds both streams: the relayed stdout lands where it would have."""
    with open(tmp_path / "both", "wb") as f:
        proc = _launch(tmp_path, "torchtitan", 0, 1, [sys.executable, "-c", ORDER], stdout=f, stderr=f)
        assert proc.wait(timeout=60) == 0
    want = [f"{s} {i}" for i in range(5) for s in ("out", "err")]
    assert (tmp_path / "both").read_text().splitlines() == want


WHO = r"""
import os, sys
print(sys.argv[1], flush=True)
print(os.getpid(), os.getppid(), file=sys.stderr)
"""


@pytest.mark.parametrize(("runtime", "reader"), [("torchtitan", 0), ("megatron", 1)])
def test_only_the_task_that_prints_the_steps_reads_them(tmp_path, runtime, reader):
    """torchtitan: rank 0 is read, the other ranks are exec'd as before;
    Megatron: its last rank is read, every rank supervised (its signal bridge)."""
    line = TITAN_STEP if runtime == "torchtitan" else MEGA[1]
    seen = {}
    for rank in (0, 1):
        (tmp_path / "ck" / PROGRESS_FILE).unlink(missing_ok=True)
        proc = _launch(
            tmp_path,
            runtime,
            rank,
            2,
            [sys.executable, "-c", WHO, line],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and out.decode() == line + "\n", err
        pid, ppid = map(int, err.split())
        seen[rank] = (pid == proc.pid, ppid == proc.pid, (tmp_path / "ck" / PROGRESS_FILE).exists())
    supervised_other = runtime == "megatron"
    other = 1 - reader
    assert seen[reader] == (False, True, True)  # a child of the launcher, its steps read
    assert seen[other] == (not supervised_other, supervised_other, False)


TITAN_LIKE = r"""
import os, signal, sys, time
from pathlib import Path
blocked = signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, [])
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
Path(os.environ["READY"]).write_text("x")
time.sleep(0.5)  # the launcher's SIGUSR1 waits, pending, until the bridge unblocks it
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
deadline = time.monotonic() + 60
while not got and time.monotonic() < deadline:
    time.sleep(0.01)
print(blocked, got, flush=True)
os._exit(75)
"""


def test_torchtitans_reading_task_passes_the_signal_on_as_it_came(tmp_path):
    """Under torchtitan the launcher is no bridge: its child's own bridge
    answers SIGUSR1 (blocked until it unblocks it) and exits 75, which the
    launcher passes through."""
    env_ready = tmp_path / "ready"
    proc = _launch(
        tmp_path,
        "torchtitan",
        0,
        1,
        [sys.executable, "-c", TITAN_LIKE],
        {"READY": str(env_ready)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not env_ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert out.split() == ["True", f"[{int(signal.SIGUSR1)}]"]


def test_relay_threads_do_not_outlive_a_child_that_leaves_the_pipe_open(tmp_path):
    """A process the child leaves behind holding its stdout: the launcher
    still ends (after a grace), with the child's exit status."""
    child = (
        "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(15)']); print('x')"
    )
    started = time.monotonic()
    proc = _launch(tmp_path, "megatron", 0, 1, [sys.executable, "-c", child], stdout=subprocess.PIPE)
    code = proc.wait(timeout=25)
    assert code == 0 and time.monotonic() - started < 12
