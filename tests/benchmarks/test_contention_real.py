"""benchmarks/contention_real.py measures real links: a job alone moves its
bytes at the rate `tc` sets, two jobs on one link share it, and nothing of
the namespaces it makes outlives it (a finished run or one stopped by
SIGTERM). Needs root and iproute2 (`ip netns`); skipped where namespaces
cannot be made, or while another run of the benchmark holds the machine.

The oracles are physics, not the benchmark's arithmetic: a two-rank ring
all-reduce sends its message once each way, so alone its network seconds are
bytes-on-the-wire / rate; two jobs together can never move more than the
link carries."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
from support import ROOT

SCRIPT = ROOT / "benchmarks" / "contention_real.py"
PREFIX = "cscr-"
EXIT_BUSY, EXIT_NO_NETNS = 3, 4
#: payload bytes -> bytes tbf counts: 1448-byte TCP segments in 1514-byte frames
WIRE = 1514 / 1448


def _benchmark() -> ModuleType:
    """The script as a module (no namespaces are made by importing it)."""
    spec = importlib.util.spec_from_file_location("contention_real", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["contention_real"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_the_maxmin_variant_is_solver_network_where_rates_are_equal() -> None:
    cr = _benchmark()
    case = cr.CASES["ring4"]  # three jobs, all NICs 100 Mbit/s
    inputs = {"ring": (0.45, 0.4), "left": (0.28, 0.18), "right": (0.49, 0.18)}
    model, variant = cr.model_times(case, inputs), cr.maxmin_times(case, inputs)
    for got, want in zip(variant, model, strict=True):
        assert got == pytest.approx(want, rel=1e-6)


def test_the_maxmin_variant_lets_a_slow_nic_job_take_only_its_rate() -> None:
    """On n0's 100 Mbit/s NIC a job paced by a 25 Mbit/s NIC takes 25 and the
    other 75: the slow job is never slowed, the fast one by 100/75 while they
    overlap (half of the slow one's time), so its network seconds grow by 1/6."""
    cr = _benchmark()
    case = cr.CASES["unequal-nics"]
    alone, loaded = cr.maxmin_times(case, {"fast": (1.0, 0.5), "slow": (1.0, 0.5)})
    assert alone == pytest.approx({"fast": 1.0, "slow": 1.0})
    assert loaded["slow"] == pytest.approx(1.0)
    assert loaded["fast"] == pytest.approx(1.0 + 0.5 * (0.5 * (100 / 75 - 1)))


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=False)
    return [line.split()[0] for line in out.stdout.splitlines() if line.startswith(PREFIX)]


def _skip_unless_ran(proc: subprocess.CompletedProcess[str]) -> None:
    if proc.returncode == EXIT_NO_NETNS:
        pytest.skip(f"network namespaces cannot be made here: {proc.stderr.strip()}")
    if proc.returncode == EXIT_BUSY:
        pytest.skip("another run of benchmarks/contention_real.py holds the machine")


@pytest.fixture(scope="module")
def two_busy(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    if os.geteuid() != 0:
        pytest.skip("needs root (ip netns, tc)")
    out = tmp_path_factory.mktemp("contention") / "rows.jsonl"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--cases", "two-busy", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    _skip_unless_ran(proc)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.slow
def test_a_job_alone_runs_at_the_configured_link_rate(two_busy: list[dict]) -> None:
    jobs = [r for r in two_busy if "job" in r]
    assert len(jobs) == 2
    for r in jobs:
        rate = min(r["nic_mbit"].values()) * 1e6 / 8  # bytes/s
        wire = r["message_bytes"] * WIRE  # a two-rank ring sends the message once each way
        assert r["alone_net_s"] == pytest.approx(wire / rate, rel=0.15), r
        # what the node's NIC counted per iteration: the message, its headers and the ACKs of the other way
        assert wire <= r["tx_bytes_per_iter"] <= wire * 1.1, r
        assert r["alone_net_s"] / r["alone_s"] > 0.7, "the link, not the compute phase, must dominate"


@pytest.mark.slow
def test_two_jobs_on_one_link_share_it(two_busy: list[dict]) -> None:
    jobs = [r for r in two_busy if "job" in r]
    rate = min(jobs[0]["nic_mbit"].values()) * 1e6 / 8
    # Together they cannot move more than the link carries: the wire seconds per
    # second of the two jobs add up to at most one (with the timing's slack) ...
    used = sum(r["message_bytes"] * WIRE / rate / r["loaded_s"] for r in jobs)
    assert used <= 1.05, jobs
    # ... and each needs nearly the whole link alone, so each is slowed by far more than noise.
    for r in jobs:
        assert r["measured_slowdown"] > 0.5, r
    summary = two_busy[-1]
    assert summary["summary"] and summary["jobs"] == 2 and summary["cases"] == 1


@pytest.mark.slow
def test_nothing_outlives_a_run_or_a_sigterm(two_busy: list[dict]) -> None:
    assert two_busy, "the run above finished"
    assert _namespaces() == []
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--quick", "--cases", "two-busy"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        end = time.monotonic() + 90
        while not any(n.startswith(PREFIX + "n") for n in _namespaces()):  # the nodes exist: ranks are starting
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < end, "the benchmark made no namespace in 90 s"
            time.sleep(0.2)
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    if rc == EXIT_BUSY:
        pytest.skip("another run of benchmarks/contention_real.py holds the machine")
    assert rc == 128 + signal.SIGTERM
    assert _namespaces() == []
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert str(Path(SCRIPT)) + " --worker" not in ps, "a rank outlived the run"
