"""The LP relaxation first against CP-SAT on the whole model, on a simulation's own rounds.

Runs ``cellsched simulate`` in this process (by default the 4x Philly run of
``--realistic`` on Arena's cluster, policy ``cellsched``) and, on every
`--every`-th round whose cluster takes the node-class model (more than
``exact_node_model_max_nodes`` nodes) and that has at most `--max-jobs`
jobs with options, solves that round's joint placement two more times,
beside the simulation: CP-SAT on the whole model, warm-started by the greedy
plan (``lp_first_min_jobs`` above the round's jobs: the rule below 200 jobs
before 2026-11-30), and the LP relaxation first with CP-SAT on the jobs it
leaves fractional (``lp_first_min_jobs = 0``). The simulation itself goes on
with its own configuration, unchanged by the two extra solves (they build
their own models and greedy plan from the round's inputs). It stops once
`--rounds` rounds are compared.

Prints one JSON line per compared round (``round``: the node-class round's
number, ``jobs``, ``cols``: the model's columns, ``hint``: the greedy plan's
value, ``lpbound``: the LP's optimum, ``cp``/``lpf``: the two plans' values,
``cp_s``/``lpf_s``: their wall times, model build included, and statuses)
and a summary line (``summary``): rounds where each way is better, the
largest and mean relative gain of the LP first, total solving times, and
the same over rounds of at least 80 jobs, with the command, the commit, the
machine's CPU and when it ran. Values are the model's objective (scaled
integers, the same model both ways) of the plan each way's solve returns,
before ``place_jobs`` puts it on nodes and, where the plan is further than
``relative_gap_limit`` from the bound, takes the greedy plan instead if that
is better.

    python benchmarks/lp_first_rounds.py --out benchmarks/results/lp_first_rounds.jsonl
    python benchmarks/lp_first_rounds.py --rounds 8 --every 3   # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from realistic_matrix import commit, cpu_model  # beside this script: the tree's commit, as the fair race records it

from solver.placement import joint
from solver.placement.greedy import greedy, value_of
from solver.placement.lp import solve_lp
from solver.placement.model import build
from solver.placement.siterules import Tally

#: the command simulated when none is given after ``--``
DEFAULT_SIM = ["--realistic", "--seed", "0", "--arrival-rate", "4", "--policy", "cellsched"]


class _Enough(BaseException):
    """Raised from inside the simulation once enough rounds are compared (a
    BaseException: the controller's own error handling must not catch it)."""


def _timed_solve(space: Any, jobs: Sequence[Any], options: Mapping[str, Any], config: Any, warm: Callable, rules: Any):
    t0 = time.perf_counter()
    solved = joint._solve(space, jobs, options, config, warm, False, rules)
    return solved, time.perf_counter() - t0


def compare_round(
    space: Any, jobs: Sequence[Any], options: Mapping[str, Any], config: Any, preferred: Mapping[str, Any], rules: Any
) -> dict[str, Any]:
    """One round solved both ways (module doc), on its own model and greedy plan."""
    n = sum(1 for j in jobs if options.get(j.job_id))
    plan = greedy(space, jobs, options, preferred, Tally(rules) if rules is not None else None)
    hint = value_of(plan, space.links)
    m = build(space, jobs, options, False, rules)
    lp = solve_lp(m, config.time_limit_s)
    whole, whole_s = _timed_solve(
        space, jobs, options, dataclasses.replace(config, lp_first_min_jobs=n + 1), lambda: plan, rules
    )
    first, first_s = _timed_solve(
        space, jobs, options, dataclasses.replace(config, lp_first_min_jobs=0), lambda: plan, rules
    )
    return {
        "jobs": n,
        "cols": len(m.ub),
        "hint": hint,
        "lpbound": lp.bound,
        "cp": whole.objective,
        "cp_s": round(whole_s, 4),
        "cp_status": str(whole.status),
        "lpf": first.objective,
        "lpf_s": round(first_s, 4),
        "lpf_status": str(first.status),
    }


def summary(rows: Sequence[dict[str, Any]], big: int = 80) -> dict[str, Any]:
    """The comparison over `rows` (module doc)."""
    gains = [(r["lpf"] - r["cp"]) / r["cp"] for r in rows if r["cp"]]
    large = [r for r in rows if r["jobs"] >= big]
    return {
        "summary": "LP first against CP-SAT on the whole model, the same rounds",
        "rounds": len(rows),
        "jobs_range": [min((r["jobs"] for r in rows), default=0), max((r["jobs"] for r in rows), default=0)],
        "lp_first_better": sum(r["lpf"] > r["cp"] for r in rows),
        "whole_better": sum(r["cp"] > r["lpf"] for r in rows),
        "equal": sum(r["cp"] == r["lpf"] for r in rows),
        "whole_returned_hint": sum(r["cp"] == r["hint"] for r in rows),
        "max_gain_pct": round(100 * max(gains, default=0.0), 3),
        "mean_gain_pct": round(100 * sum(gains) / len(gains), 3) if gains else 0.0,
        "max_loss_pct": round(max(0.0, -100 * min(gains, default=0.0)), 3),
        "cp_s": round(sum(r["cp_s"] for r in rows), 2),
        "lpf_s": round(sum(r["lpf_s"] for r in rows), 2),
        f"rounds_of_{big}_jobs_or_more": len(large),
        f"cp_s_{big}_or_more": round(sum(r["cp_s"] for r in large), 2),
        f"lpf_s_{big}_or_more": round(sum(r["lpf_s"] for r in large), 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Arguments after -- are `cellsched simulate`'s (default: " + " ".join(DEFAULT_SIM) + ").",
    )
    ap.add_argument("--rounds", type=int, default=64, help="rounds to compare (default: 64)")
    ap.add_argument("--every", type=int, default=9, help="compare every N-th node-class round (default: 9)")
    ap.add_argument("--max-jobs", type=int, default=199, help="only rounds of at most N jobs (default: 199)")
    ap.add_argument("--out", type=Path, help="also write the JSON lines to this file")
    args, rest = ap.parse_known_args(argv)
    sim = [a for a in rest if a != "--"] or DEFAULT_SIM
    if args.rounds < 1 or args.every < 1:
        ap.error("--rounds and --every must be at least 1")
    with contextlib.ExitStack() as stack:
        sinks: list[TextIO] = [sys.stdout]
        if args.out:
            sinks.append(stack.enter_context(args.out.open("w")))
        _run(args, sim, sinks)
    return 0


def _run(args: argparse.Namespace, sim: list[str], sinks: Sequence[TextIO]) -> None:
    """Simulate, compare the sampled rounds and write their lines and the summary to `sinks`."""
    rows: list[dict[str, Any]] = []
    seen = [0]
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    original = joint.place_jobs

    def watched(space, jobs, options, config, preferred={}, use_cpsat=True, rules=None):  # noqa: B006 (place_jobs')
        n = sum(1 for j in jobs if options.get(j.job_id))
        if use_cpsat and space.num_nodes > config.exact_node_model_max_nodes and 0 < n <= args.max_jobs:
            seen[0] += 1
            if seen[0] % args.every == 0:
                row = {"round": seen[0], **compare_round(space, jobs, options, config, preferred, rules)}
                rows.append(row)
                for s in sinks:
                    print(json.dumps(row), file=s, flush=True)
                if len(rows) >= args.rounds:
                    raise _Enough
        return original(space, jobs, options, config, preferred, use_cpsat, rules)

    from slurm_ext.cli import main as cli
    from solver.policies import cellsched, sia

    for mod in (cellsched, sia):
        mod.place_jobs = watched  # type: ignore[attr-defined]  # the policies' own name for it
    try:
        with tempfile.TemporaryDirectory(prefix="lp-first-rounds-") as tmp:  # the simulation's own results: not kept
            cli(["simulate", *sim, "--workers", "1", "--no-plots", "--out", tmp], standalone_mode=False)
    except _Enough:
        pass
    finally:
        for mod in (cellsched, sia):
            mod.place_jobs = original  # type: ignore[attr-defined]
    line = {
        **summary(rows),
        "simulate": sim,
        "commit": commit(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "every": args.every,
        "max_jobs": args.max_jobs,
        "started": started,
        "ended": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    for s in sinks:
        print(json.dumps(line), file=s, flush=True)


if __name__ == "__main__":
    sys.exit(main())
