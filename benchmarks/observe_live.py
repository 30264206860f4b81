"""A round's reads on a running Slurm: the cli backend's `observe()` against a
real slurmctld holding `--jobs` queued jobs.

    DEVCLUSTER_SLURM=24.11 DEVCLUSTER_MAX_JOBS=20000 contrib/dev-cluster/devcluster.sh up
    DEVCLUSTER_SLURM=24.11 contrib/dev-cluster/devcluster.sh exec -- \\
        python benchmarks/observe_live.py --fill --jobs 10000 [--rounds 5]

`--fill` first tops the cluster up to `--jobs` jobs with plain ``sbatch``
calls, `--workers` at a time (one process a job; no job arrays: squeue lists a
pending array as one record): one running job over each node's GPUs, then
`--pending` plain GPU jobs that wait for them (reason Resources or Priority),
a `--managed` share submitted as ``cellsched sbatch`` submits them (held, its
Comment and GPU request: the wrapper's own ``--dry-run`` settings for a few
models), and plain held jobs for the rest. The cluster needs a MaxJobCount
above `--jobs` (DEVCLUSTER_MAX_JOBS). The jobs are left queued; ``scancel
--user=$USER`` or ``devcluster.sh down`` ends them.

Then `--rounds` observes each way, alternating: `observe_s`, the round's reads
as the backend makes them (one ``squeue --Format`` of every job, whole JSON
records of the few whose text does not say all; one backend for all rounds, as
the controller keeps: `first_s` is its first round, which parses every job,
later ones parse what changed), and `full_s`, every job's whole JSON record
(``squeue --json --states=all``: the read before). One JSON line: `jobs`,
`observe_s` (median), `first_s`, `full_s` (median), `slurm` (version), the
parts of a compact round (each command's wall time, median; `parse`: the rest,
in this process), the whole records read, and `same`: whether a compact
snapshot and the full one after it agree on every field of every job that did
not change meanwhile (slurm_ext.parse.squeue_fields).
Exit status 1 when observe_s is over `--target` (default 1 s) or they differ.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from slurm_ext.backends.cli import CliBackend
from slurm_ext.parse import squeue_fields
from slurm_ext.records import ClusterSnapshot
from solver.contract.jobspec import is_managed_comment

ROOT = Path(__file__).resolve().parents[1]
#: models of the managed jobs (the wrapper's presets), taken in turn
MODELS = ("gpt-1.3b", "gpt-760m", "gpt-350m", "gpt-125m")
SCRIPT = "#!/bin/sh\nsleep 3600\n"


def sh(args: list[str]) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def managed_args(script: str) -> list[list[str]]:
    """sbatch options of managed jobs: what ``cellsched sbatch --dry-run`` would submit."""
    out = []
    for k, model in enumerate(MODELS):
        dry = sh(
            ["cellsched", "sbatch", "--dry-run", "--model", model, "--iterations", str(1000 * (k + 1))]
            + ["--global-batch", "256", "--max-gpus", str(2 ** (k + 1)), script]
        )
        sb = json.loads(dry)["sbatch"]
        args = [f"--comment={sb['comment']}", f"--nodes={sb['nodes']}", f"--gres=gpu:{sb['gres_per_node']}"]
        out.append(args + (["--hold"] if sb.get("hold") else []))
    return out


def fill(target: int, managed: float, pending: int, workers: int, script: str) -> dict[str, int]:
    """Submit jobs until Slurm lists `target`; how many of each kind were submitted."""
    have = len(sh(["squeue", "--noheader", "--states=all", "--format=%i"]).split())
    todo: list[list[str]] = []
    for line in sh(["sinfo", "--noheader", "--Node", "--format=%N %G"]).splitlines():
        node, gres = line.split()
        parts = gres.split("(")[0].split(":")  # gpu:a100:4
        if len(parts) == 3 and f"--nodelist={node}" not in {a[-1] for a in todo}:
            todo.append([f"--gres=gpu:{parts[1]}:{parts[2]}", f"--nodelist={node}"])
    todo += [["--gres=gpu:1"]] * pending
    kinds = {"running": len(todo) - pending, "pending": pending}
    left = max(0, target - have - len(todo))
    n_managed = round(managed * (target - have)) if left else 0
    shapes = managed_args(script)
    todo += [shapes[k % len(shapes)] for k in range(min(n_managed, left))]
    kinds["managed"] = min(n_managed, left)
    kinds["held"] = left - kinds["managed"]
    todo += [["--hold", "--gres=gpu:1"]] * kinds["held"]
    todo = todo[: max(0, target - have)]

    def submit(args: list[str]) -> None:
        sh(["sbatch", "--parsable", "--output=/dev/null", "--job-name=observe-live", *args, script])

    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(submit, todo))
    kinds["submit_s"] = round(time.perf_counter() - t)
    return kinds


class Timed:
    """subprocess.run, keeping each command's wall time by its first two words."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.whole = 0  # job ids asked for whole (squeue --json --jobs=...)

    def __call__(self, args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        self.whole += sum(a.count(",") + 1 for a in args if a.startswith("--jobs="))
        t = time.perf_counter()
        try:
            return subprocess.run(args, **kw)  # type: ignore[call-overload,no-any-return]
        finally:
            key = " ".join(a for a in args[:3] if not a.startswith("--") or a in ("--json", "--noheader"))
            key = "squeue --json --jobs" if any(a.startswith("--jobs=") for a in args) else key
            self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - t


def rounds(n: int) -> tuple[list[float], list[float], dict[str, list[float]], list[ClusterSnapshot]]:
    """`n` rounds each way, alternating. The compact reads go through one backend, as the
    controller's (its first round parses every job; later ones only the jobs that changed);
    each full read is a fresh one (it keeps nothing)."""
    compact_s: list[float] = []
    full_s: list[float] = []
    parts: dict[str, list[float]] = {}
    snaps: list[ClusterSnapshot] = []
    timed = Timed()
    backend = CliBackend(compact=True, run=timed, timeout=60.0)
    backend.version()  # cached by a long-lived backend: not a round's read
    for _ in range(n):
        for compact in (True, False):
            if compact:
                timed.times.clear()
                timed.whole = 0
                t = time.perf_counter()
                snaps.append(backend.observe())
                took = time.perf_counter() - t
                compact_s.append(took)
                for k, v in timed.times.items():
                    parts.setdefault(k, []).append(v)
                parts.setdefault("parse", []).append(took - sum(timed.times.values()))
                parts.setdefault("whole_records", []).append(timed.whole)
            else:
                full = CliBackend(compact=False, timeout=600.0)  # 10,000 whole records: tens of seconds
                full.version()
                t = time.perf_counter()
                snaps.append(full.observe())
                full_s.append(time.perf_counter() - t)
    return compact_s, full_s, parts, snaps


def agree(before: ClusterSnapshot, full: ClusterSnapshot, after: ClusterSnapshot) -> list[str]:
    """Where a compact snapshot differs from the full one taken after it in what the
    controller reads: every field of a SlurmJob but state_flags (squeue_fields), for
    the jobs that did not change meanwhile (the same in the compact read after it)."""
    if before.nodes != full.nodes or before.partitions != full.partitions:
        return ["nodes or partitions"]
    whole = {j.job_id: j for j in full.jobs}
    again = {j.job_id: j for j in after.jobs}
    bad = []
    if [j.job_id for j in before.jobs] != sorted(whole, key=int):
        bad.append("job ids")
    for j in before.jobs:
        o = whole.get(j.job_id)
        if o is None:
            bad.append(f"{j.job_id}: only in the compact read")
            continue
        diff = [f for f in squeue_fields.COMPACT if getattr(j, f) != getattr(o, f)]
        if diff and again.get(j.job_id) == j:
            bad.append(f"{j.job_id}: " + ", ".join(f"{f} {getattr(j, f)!r} != {getattr(o, f)!r}" for f in diff))
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000, help="jobs the cluster should hold (--fill)")
    ap.add_argument("--fill", action="store_true", help="submit jobs up to --jobs first")
    ap.add_argument("--managed", type=float, default=0.1, help="share of the submitted jobs that are managed")
    ap.add_argument("--pending", type=int, default=500, help="plain GPU jobs left pending behind the running ones")
    ap.add_argument("--workers", type=int, default=3, help="sbatch calls at a time")
    ap.add_argument("--rounds", type=int, default=5, help="rounds each way (at least 2)")
    ap.add_argument("--target", type=float, default=1.0, help="observe_s must be at most this (seconds)")
    args = ap.parse_args()
    submitted = {}
    if args.fill:
        script = ROOT / ".observe_live.sh"
        script.write_text(SCRIPT)
        os.chmod(script, 0o755)
        try:
            submitted = fill(args.jobs, args.managed, args.pending, args.workers, str(script))
        finally:
            script.unlink()
    compact_s, full_s, parts, snaps = rounds(args.rounds)
    bad = agree(snaps[-4], snaps[-3], snaps[-2]) if len(snaps) >= 4 else ["--rounds must be at least 2"]
    snap = snaps[-2]
    version = sh(["sinfo", "--version"]).split()[-1]
    row = {
        "jobs": len(snap.jobs),
        "observe_s": round(statistics.median(compact_s), 3),
        "first_s": round(compact_s[0], 3),
        "full_s": round(statistics.median(full_s), 3),
        "slurm": version,
        "parts_s": {k: round(statistics.median(v), 3) for k, v in parts.items() if k != "whole_records"},
        "whole_records": statistics.median(parts["whole_records"]),
        "managed": sum(is_managed_comment(j.comment) for j in snap.jobs),
        "pending": sum(j.pending and not j.held for j in snap.jobs),
        "held": sum(j.held for j in snap.jobs),
        "running": sum(j.holds_resources for j in snap.jobs),
        "rounds": args.rounds,
        "same": not bad,
        **({"submitted": submitted} if submitted else {}),
    }
    print(json.dumps(row), flush=True)
    for b in bad[:20]:
        print(f"differs: {b}", file=sys.stderr)
    return 0 if row["observe_s"] <= args.target and not bad else 1


if __name__ == "__main__":
    sys.exit(main())
