"""A controller round's reads of its state file, against how much the file has kept.

A site's state file grows by every job its controller ever ran (the simulated
month's, read back from its checkpoint after 2.6 simulated days: 3,885 jobs,
49,644 history events, 12,908 plans, 5,359 speed rows); a round asks it only
about the jobs Slurm lists now. This makes state files holding `--open`
unfinished jobs and, beside them, the history of N finished jobs for each N of
`--history`, every job with the month's mix of history (about 3 plans
released, 2 moves of signal, requeue and resume, 1.5 "trained" events, one
"finished", 1.4 speed rows), and times the reads one round makes (those of
slurm_ext/controller/round.py and reports.py, listed in `round_reads`, asked
for the open jobs as the round asks them) with its write of the open jobs'
speeds (``record_speeds``: since the state store keeps the newest speed rows
between reads, brought up to date by its writes, the read of them costs a
round that upkeep instead).

Prints one JSON line per N: ``history_jobs``, ``open_jobs``,
``cell_history_rows``, ``reads_ms`` (the median over `--repeat` rounds of
all the reads), ``ratio`` (over the first N's, in the same run), and
``by_read_ms`` (each read's median); then a line with when, the command,
the commit and the machine. ``--state FILE`` times an existing state file
(read only; its unfinished jobs are the round's), e.g. a simulation's
checkpoint (``CHECKPOINT.state/state-cellsched.sqlite``).

    python benchmarks/state_reads.py --history 4000 --history 40000
    python benchmarks/state_reads.py --state /path/to/state-cellsched.sqlite
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from realistic_matrix import commit, cpu_model  # beside this script: the tree's commit, as the fair race records it

from slurm_ext.controller.speeds import CALIBRATION_ROWS
from slurm_ext.state import HistoryEvent, JobStatus, PlanStatus, SpeedRow, StateStore

SPEC = '{"global_batch":64,"iterations":1000,"model":"gpt-350m","version":1}'
CELLS = ("a100:1x4:pp1", "a100:2x8:pp1", "v100:1x8:pp1")


def add_job(st: StateStore, job_id: str, i: int, now: float) -> None:
    """One job's history, the month's mix: (i % 5) moves, as many plans
    again plus one, a "trained" event per plan but every other one after
    the first, one or two speed rows."""
    st.accept_spec(job_id, f"user{i % 40}", SPEC, "comment", now)
    moves = i % 5
    for k in range(moves + 1):
        cell = CELLS[(i + k) % len(CELLS)]
        plan = st.begin_plan(job_id, None, cell, (("n1", 4),), "all", "{}", "{}", now + k)
        st.set_plan_status(plan, PlanStatus.RELEASED, now + k)
        if k == 0 or k % 2:
            st.add_history(job_id, HistoryEvent.TRAINED, now + k + 0.5, cell=cell)
        if k < moves:
            st.add_history(job_id, HistoryEvent.SIGNALLED, now + k + 0.6, cell=cell)
            st.add_history(job_id, HistoryEvent.REQUEUED, now + k + 0.7, cell=cell)
            st.add_history(job_id, HistoryEvent.RESUMED, now + k + 0.9, cell=cell, value=30.0 + k)
    types = ("a100", "v100")[: 1 + i % 2]
    st.record_speeds(
        SpeedRow(job_id, t, f"user{i % 40}", "gpt-350m", CELLS[0], 1.0, 1.1, 1.1, 3, 1.1, now + moves) for t in types
    )


def make_state(path: Path, history: int, open_jobs: int) -> StateStore:
    """A state file with `history` finished jobs, then `open_jobs` unfinished ones."""
    st = StateStore(path)
    total = history + open_jobs
    with st.batch():
        for i in range(total):
            add_job(st, str(i + 1), i, float(i))
        finished = [str(i + 1) for i in range(history)]
        st.save_statuses(
            (
                JobStatus(j, "user", "COMPLETED", "finished", "completed", 0.0, 1.0, 2.0, 0, None, None, True)
                for j in finished
            ),
            float(total),
        )
        for j in finished:
            st.add_history(j, HistoryEvent.FINISHED, float(total))
    return st


def round_reads(st: StateStore, ids: list[str]) -> dict[str, Callable[[], object]]:
    """The reads of one controller round (round.py, reports.py), for the jobs
    `ids`, and (a file not read only) its write of their speeds."""
    clock = itertools.count(10**9)

    def record_speeds() -> None:
        now = float(next(clock))
        st.record_speeds(SpeedRow(j, "a100", "u", "gpt-350m", CELLS[0], 1.0, 1.1, 1.1, 3, 1.1, now) for j in ids)

    writes = {} if st.readonly else {"record_speeds": record_speeds}
    return {
        **writes,
        "jobs": lambda: st.jobs(job_ids=ids),
        "released": lambda: st.released(ids),
        "parked": lambda: st.parked(ids),
        "yielding": lambda: st.yielding(ids),
        "open_plans": st.open_plans,
        "newest_plan_times": lambda: st.newest_plan_times(ids),
        "run_failures": lambda: st.run_failures(ids),
        "trained_or_parked_at": lambda: st.trained_or_parked_at(ids),
        "trained_cells": lambda: st.trained_cells(ids),
        "cell_failures": lambda: st.cell_failures(ids),
        "restart_costs": lambda: st.restart_costs(ids),
        "pending_restarts": lambda: st.pending_restarts(ids),
        "preemptions": lambda: st.preemptions(ids),
        "restart_counts": lambda: st.restart_counts(ids),
        "event_values": lambda: st.event_values(HistoryEvent.SLURM_PREEMPTED, ids),
        "speeds": lambda: st.speeds(limit=CALIBRATION_ROWS),
        "open_jobs": lambda: st.jobs(include_finished=False),  # what mark_vanished reads
    }


def time_reads(st: StateStore, repeat: int) -> tuple[float, dict[str, float]]:
    """(median ms of a round's reads, median ms of each read) over `repeat` rounds."""
    ids = sorted(st.jobs(include_finished=False))
    reads = round_reads(st, ids)
    per: dict[str, list[float]] = {name: [] for name in reads}
    totals = []
    for _ in range(repeat):
        total = 0.0
        for name, read in reads.items():
            t0 = time.process_time()
            read()
            dt = (time.process_time() - t0) * 1000
            per[name].append(dt)
            total += dt
        totals.append(total)
    return statistics.median(totals), {k: round(statistics.median(v), 3) for k, v in per.items()}


def rows(st: StateStore, table: str) -> int:
    return int(st._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])  # a count for the report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--history", type=int, action="append", help="finished jobs kept (repeatable; default 4000, 40000)")
    ap.add_argument("--open", type=int, default=150, help="unfinished jobs, the round's (default 150)")
    ap.add_argument("--repeat", type=int, default=15, help="rounds of reads timed per file (default 15)")
    ap.add_argument("--state", type=Path, help="time this existing state file instead (read only)")
    args = ap.parse_args(argv)
    first = None
    with tempfile.TemporaryDirectory() as tmp:
        if args.state is not None:
            cases = [(None, StateStore(args.state, readonly=True))]
        else:
            cases = [(n, None) for n in (args.history or [4000, 40000])]
        for n, st in cases:
            if st is None:
                st = make_state(Path(tmp) / f"state-{n}.sqlite", n, args.open)
            open_jobs = len(st.jobs(include_finished=False))
            ms, by = time_reads(st, args.repeat)
            first = first or ms
            line = {
                "history_jobs": rows(st, "jobs") - open_jobs,
                "open_jobs": open_jobs,
                "cell_history_rows": rows(st, "cell_history"),
                "reads_ms": round(ms, 3),
                "ratio": round(ms / first, 3),
                "by_read_ms": by,
            }
            if args.state is not None:
                line["state"] = str(args.state)
            print(json.dumps(line), flush=True)
            st.close()
    print(
        json.dumps(
            {
                "made": datetime.now(UTC).isoformat(timespec="seconds"),
                "command": " ".join(["python", "benchmarks/state_reads.py", *sys.argv[1:]]),
                "commit": commit(),
                "python": platform.python_version(),
                "cpu": cpu_model(),
                "timing": "CPU time of this process (time.process_time), per read",
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
