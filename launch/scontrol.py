"""The two questions the launcher asks Slurm, answered through ``scontrol``.

Every call takes an argument list and a timeout (scontrol hangs while
slurmctld is down). ``-o`` prints one record per line as ``Key=Value``
pairs, which is the format parsed here.
"""

from __future__ import annotations

import json
import re
import subprocess

from launch.errors import LauncherError
from solver.contract.plan import PlanError

#: Seconds one scontrol call may take.
TIMEOUT_S = 15.0


class ScontrolError(RuntimeError, LauncherError):
    """scontrol is missing, timed out or failed."""


def scontrol(*args: str, timeout: float = TIMEOUT_S) -> str:
    """Run ``scontrol ARGS`` and return its stdout."""
    argv = ["scontrol", *args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise ScontrolError("scontrol is not on PATH") from None
    except subprocess.TimeoutExpired:
        raise ScontrolError(f"'{' '.join(argv)}' did not answer within {timeout:g} s") from None
    if done.returncode != 0:
        msg = (done.stderr or done.stdout).strip().splitlines()
        raise ScontrolError(f"'{' '.join(argv)}' failed (exit {done.returncode}): {msg[0] if msg else 'no output'}")
    return done.stdout


def admin_comment_json(job_line: str) -> str | None:
    """The JSON text of the AdminComment in one ``scontrol show -o job`` line;
    None when it is empty. The JSON value runs to its own end, so spaces
    inside it are harmless; decoding it is ``solver.contract``'s."""
    m = re.search(r"(?:^|\s)AdminComment=", job_line)
    if not m:
        return None
    rest = job_line[m.end() :]
    if not rest or rest[0].isspace() or rest.startswith("(null)"):
        return None
    try:
        _, end = json.JSONDecoder().raw_decode(rest)
    except json.JSONDecodeError as e:
        raise PlanError(f"the AdminComment is not JSON ({e}): {rest.split()[0][:60]!r}") from None
    return rest[:end]


def job_admin_comment(job_id: str) -> str | None:
    """``scontrol show -o job JOB_ID`` -> the JSON text of its AdminComment."""
    return admin_comment_json(scontrol("show", "-o", "job", job_id))


def node_addr(node: str) -> str:
    """The address Slurm reaches NODE at (node names need not resolve)."""
    text = scontrol("show", "-o", "node", node)
    m = re.search(r"(?:^|\s)NodeAddr=(\S+)", text)
    if not m or m.group(1) in ("(null)", ""):
        raise ScontrolError(f"scontrol shows no NodeAddr for node {node!r}")
    return m.group(1)
