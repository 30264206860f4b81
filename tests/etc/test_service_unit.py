"""The controller's systemd unit, slurm_ext/admin/cellsched-controller.service,
and the fail-safe's, slurm_ext/admin/cellsched-failsafe.service with its timer.

- `systemd-analyze verify` accepts it, with no unknown or ignored directive
  (verify exits 0 on those, so its output is read too).
- `systemd-analyze security --offline=yes` rates its exposure no worse than
  the number docs/controller.md gives, so that number cannot silently go stale.
- The same for the fail-safe's service and timer (verify; its exposure no
  worse than the documented one), and the timer runs the service's one check.
- The controller's code runs under its MemoryDenyWriteExecute=yes: a
  `cellsched simulate` run (the controller's rounds with the cellsched
  policy: CP-SAT, numpy) in a process with systemd's W^X seccomp filter.

systemd-analyze comes with Debian's `systemd` package (contrib/setup.sh
--test installs it); without it the first two are skipped.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADMIN = ROOT / "slurm_ext" / "admin"
UNIT = ADMIN / "cellsched-controller.service"
FAILSAFE = ADMIN / "cellsched-failsafe.service"
FAILSAFE_TIMER = ADMIN / "cellsched-failsafe.timer"
DOC = ROOT / "docs" / "controller.md"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze is missing (Debian package systemd; contrib/setup.sh --test installs it)"
)
#: docs/controller.md's sentences with the documented scores (the controller's, the fail-safe's)
DOCUMENTED = re.compile(r"overall\s+exposure\s+at\s+\*\*(\d+\.\d)\s+\(")
DOCUMENTED_FAILSAFE = re.compile(r"fail-safe's\s+exposure\s+at\s+\*\*(\d+\.\d)\s+\(")
EXPOSURE = re.compile(r"Overall exposure level for \S+: (\d+\.\d)")


def installed_copy(tmp_path: Path, unit: Path = UNIT) -> Path:
    """The unit under its own name, its ExecStart program replaced by this
    environment's `cellsched` (verify wants an executable that exists)."""
    exe = Path(sys.executable).with_name("cellsched")
    program = exe if exe.is_file() else Path(sys.executable)
    text = unit.read_text()
    templated, n = re.subn(r"(?m)^ExecStart=\S+", f"ExecStart={program}", text)
    assert n == 1, "the unit should have exactly one ExecStart= line"
    path = tmp_path / unit.name
    path.write_text(templated)
    return path


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ANALYZE), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "cat"},
    )


def verified(*units: Path) -> None:
    """`systemd-analyze verify` accepts the units, saying nothing about them."""
    proc = analyze("verify", *map(str, units))
    about_ours = [
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if any(u.name in line or str(u.parent) in line for u in units)
    ]
    assert proc.returncode == 0, proc.stderr
    assert not about_ours, "systemd-analyze verify complains about the unit:\n" + "\n".join(about_ours)


@needs_analyze
def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    verified(installed_copy(tmp_path))


@needs_analyze
def test_systemd_analyze_verify_accepts_the_failsafe_service_and_timer(tmp_path):
    timer = tmp_path / FAILSAFE_TIMER.name
    timer.write_text(FAILSAFE_TIMER.read_text())
    verified(installed_copy(tmp_path, FAILSAFE), timer)


def test_the_failsafe_timer_runs_one_check_of_the_failsafe_service():
    service = {line.strip() for line in FAILSAFE.read_text().splitlines()}
    timer = {line.strip() for line in FAILSAFE_TIMER.read_text().splitlines()}
    (exec_start,) = (line for line in service if line.startswith("ExecStart="))
    assert exec_start.split()[1:3] == ["failsafe", "--once"]
    assert {"Type=oneshot", "ProtectSystem=strict", "NoNewPrivileges=yes", "MemoryDenyWriteExecute=yes"} <= service
    assert not any(line.startswith(("ReadWritePaths=", "StateDirectory=")) for line in service)  # reads only
    assert {f"Unit={FAILSAFE.name}", "OnUnitActiveSec=1min", "WantedBy=timers.target"} <= timer


def exposure(tmp_path: Path, unit: Path, documented_re: re.Pattern[str]) -> tuple[float, float, str]:
    """(the documented score of the unit, systemd-analyze's, what it marks bad)."""
    documented = documented_re.findall(DOC.read_text())
    assert len(documented) == 1, f"{DOC.name} should give {unit.name}'s exposure once ({documented_re.pattern})"
    proc = analyze("security", "--offline=yes", "--no-pager", str(installed_copy(tmp_path, unit)))
    if proc.returncode != 0 and "offline" in proc.stderr:
        pytest.skip(f"this systemd-analyze has no --offline (systemd < 250): {proc.stderr.strip()[:200]}")
    found = EXPOSURE.search(proc.stdout + proc.stderr)
    assert found, f"no exposure level in systemd-analyze's output:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    bad = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("✗"))
    return float(documented[0]), float(found.group(1)), bad


@needs_analyze
@pytest.mark.parametrize(
    ("unit", "documented_re"), [(UNIT, DOCUMENTED), (FAILSAFE, DOCUMENTED_FAILSAFE)], ids=["controller", "failsafe"]
)
def test_security_exposure_is_at_most_the_documented_score(tmp_path, unit, documented_re):
    documented, rated, bad = exposure(tmp_path, unit, documented_re)
    version = analyze("--version").stdout.splitlines()[0]
    assert rated <= documented, (
        f"{version} rates {unit.name} {rated}, worse than the {documented} {DOC.name} says:\n{bad}"
    )


def test_the_unit_sandbox_settings_stay():
    """What the docs and the tests rely on; a line dropped by mistake shows here."""
    lines = {line.strip() for line in UNIT.read_text().splitlines()}
    for want in (
        "Type=notify",
        "WatchdogSec=300",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        "PrivateTmp=yes",
        "MemoryDenyWriteExecute=yes",
        "CapabilityBoundingSet=CAP_DAC_READ_SEARCH",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "SystemCallFilter=@system-service",
        "SystemCallErrorNumber=EPERM",
    ):
        assert want in lines, want


#: Installs what systemd's MemoryDenyWriteExecute=yes installs
#: (src/shared/seccomp-util.c, seccomp_memory_deny_write_execute), then execs
#: argv[1:]: mmap with PROT_WRITE|PROT_EXEC, mprotect / pkey_mprotect adding
#: PROT_EXEC and shmat with SHM_EXEC fail with EPERM (x86_64 numbers).
W_XOR_X = r"""
import ctypes, mmap, os, sys

LD, JEQ, JSET, AND, RET = 0x20, 0x15, 0x45, 0x54, 0x06
ALLOW, DENY = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
ARCH, NR, ARG2 = 4, 0, 16 + 8 * 2  # offsets in struct seccomp_data (args[2], low 32 bits)
prog = [  # (code, jump if true, jump if false, k); jumps name a label
    (LD, 0, 0, ARCH), (JEQ, 0, "allow", 0xC000003E),  # AUDIT_ARCH_X86_64
    (LD, 0, 0, NR),
    (JEQ, "mmap", 0, 9), (JEQ, "prot", 0, 10), (JEQ, "prot", 0, 329), (JEQ, "shmat", 0, 30),
    (RET, 0, 0, ALLOW),
    "mmap", (LD, 0, 0, ARG2), (AND, 0, 0, 0x6), (JEQ, "deny", "allow", 0x6),
    "prot", (LD, 0, 0, ARG2), (JSET, "deny", "allow", 0x4),
    "shmat", (LD, 0, 0, ARG2), (JSET, "deny", "allow", 0o100000),  # SHM_EXEC
    "deny", (RET, 0, 0, DENY),
    "allow", (RET, 0, 0, ALLOW),
]
labels, insns = {}, []
for item in prog:
    if isinstance(item, str):
        labels[item] = len(insns)
    else:
        insns.append(item)


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


def rel(i, j):
    return labels[j] - i - 1 if isinstance(j, str) else j


code = (SockFilter * len(insns))(*[SockFilter(c, rel(i, t), rel(i, f), k) for i, (c, t, f, k) in enumerate(insns)])
fprog = SockFprog(len(insns), code)
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
    sys.exit(f"PR_SET_NO_NEW_PRIVS: {os.strerror(ctypes.get_errno())}")
if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
    sys.exit(f"PR_SET_SECCOMP: {os.strerror(ctypes.get_errno())}")
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    sys.exit("the W^X filter is not in force: a writable and executable mapping was made")
except PermissionError:
    pass
assert ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(lambda x: x + 1)(41) == 42  # libffi closures
os.execv(sys.argv[1], sys.argv[1:])
"""

#: the simulator tests' small trace and cluster
SIM_DATA = ROOT / "tests" / "slurm_ext" / "sim" / "data"


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64", reason="the W^X filter is written for x86_64 Linux"
)
def test_controller_rounds_run_without_writable_executable_memory(tmp_path):
    (tmp_path / "trace.csv").write_text((SIM_DATA / "small_trace.csv").read_text())
    (tmp_path / "cluster.toml").write_text((SIM_DATA / "small_cluster.toml").read_text())
    argv = [sys.executable, "-m", "slurm_ext", "simulate", "--trace", "trace.csv", "--cluster", "cluster.toml"]
    argv += ["--policy", "cellsched", "--out", "out", "--json", "--no-plots", "--workers", "1", "--interval", "30"]
    proc = subprocess.run(
        [sys.executable, "-c", W_XOR_X, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "6/6 jobs finished" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64", reason="the W^X filter is written for x86_64 Linux"
)
def test_the_failsafe_check_runs_without_writable_executable_memory(tmp_path):
    """Its unit's MemoryDenyWriteExecute=yes: every module a check imports loads under the filter."""
    import time

    from slurm_ext.state import RoundStatus, StateStore

    state = tmp_path / "state.sqlite"
    with StateStore(state) as st:
        st.finish_round(st.begin_round(time.time()), status=RoundStatus.OK, duration_s=0.1)
    config = tmp_path / "c.toml"
    config.write_text(f'[controller]\nstate_path = "{state}"\n')
    argv = [sys.executable, "-m", "slurm_ext", "failsafe", "--once", "--config", str(config)]
    proc = subprocess.run(
        [sys.executable, "-c", W_XOR_X, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '"acted": false' in proc.stdout, proc.stdout
