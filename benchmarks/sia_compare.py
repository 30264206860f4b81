"""Two runs of the Sia artifact's simulator side by side, model by model and
GPU type by GPU type (issue 56): where one policy's average JCT is won or
lost against another's, and what each did with the GPUs.

Each run is named by its log (benchmarks/sia_artifact.py, ``--logs``),
beside which the driver wrote the run's jobs (``.jobs.csv``) and its
allocations round by round (``.rounds.jsonl``). A job's model is its name
without the trailing ``-N`` (the artifact's ``<model>-<n>``). An allocation
holds from its round to the next; the last round holds none.

Prints JSON lines:

* one per model: ``model``, ``jobs``, and for each run (``a``, ``b``):
  ``avg_jct_h``, ``restarts_per_job``, ``gpu_hours_per_job`` (from the jobs
  CSV), ``mean_gpus`` (GPUs held while unfinished, waiting as 0, time
  weighted), ``types`` (share of the unfinished time on each GPU type,
  ``none`` for waiting); then ``jct_ratio`` (b over a) and ``jct_diff_h``
  (the sum of b's JCTs less a's, hours);
* one per GPU type: ``gpu_type``, ``gpus``, and for each run ``mean_busy``
  (GPUs held, time weighted) and ``full_share`` (share of the time all of
  them were held);
* a last one: ``jobs``, ``avg_jct_h`` of each run, ``jct_ratio``.

    python benchmarks/sia_compare.py /tmp/sia-artifact-logs/saturn-workload-1-sia.log \\
        /tmp/sia-artifact-logs/saturn-workload-1-cellsched.log
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def model_of(job: str) -> str:
    """The artifact's model of a job named ``<model>-<n>``."""
    head, sep, tail = job.rpartition("-")
    return head if sep and tail.isdigit() else job


@dataclass
class Run:
    """One run's jobs (job -> (JCT s, restarts, GPU s)) and its rounds."""

    jobs: dict[str, tuple[float, int, float]]
    gpus: dict[str, int]
    rounds: list[tuple[float, list[tuple[str, str | None, int]]]] = field(default_factory=list)


def load(log: Path) -> Run:
    """The run whose log is `log` (its ``.jobs.csv`` and ``.rounds.jsonl``);
    ValueError naming the file when one is missing a field or has a job unfinished."""
    jobs: dict[str, tuple[float, int, float]] = {}
    path = log.with_suffix(".jobs.csv")
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if not row.get("jct_s"):
                raise ValueError(f"{path}: job {row.get('job')!r} did not finish")
            jobs[row["job"]] = (float(row["jct_s"]), int(row["restarts"]), float(row["gpu_s"]))
    path = log.with_suffix(".rounds.jsonl")
    with open(path) as f:
        head = json.loads(f.readline())
        run = Run(jobs, {str(k): int(v) for k, v in head["gpus"].items()})
        for line in f:
            rec = json.loads(line)
            run.rounds.append((float(rec["t"]), [(str(j), t, int(g)) for j, t, g in rec["jobs"]]))
    return run


def held(run: Run) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """(per model: GPU-seconds held, seconds unfinished, and seconds on each
    GPU type or ``none``; per GPU type: GPU-seconds held and seconds full)."""
    models: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    types: dict[str, dict[str, float]] = {t: defaultdict(float) for t in run.gpus}
    for (t, jobs), (nxt, _) in zip(run.rounds, run.rounds[1:], strict=False):
        dt = nxt - t
        used: dict[str, int] = defaultdict(int)
        for job, gpu_type, gpus in jobs:
            m = models[model_of(job)]
            m["gpu_s"] += gpus * dt
            m["live_s"] += dt
            m[f"type:{gpu_type if gpus else 'none'}"] += dt
            if gpus and gpu_type is not None:
                used[gpu_type] += gpus
        for gpu_type, total in run.gpus.items():
            types[gpu_type]["gpu_s"] += used[gpu_type] * dt
            types[gpu_type]["full_s"] += dt if used[gpu_type] >= total else 0.0
    return models, types


def compare(a: Run, b: Run) -> list[dict[str, Any]]:
    """The JSON lines of the module doc; ValueError when the runs' jobs differ."""
    if set(a.jobs) != set(b.jobs):
        raise ValueError(f"the runs' jobs differ: {sorted(set(a.jobs) ^ set(b.jobs))[:5]}")
    held_a, held_b = held(a), held(b)
    span = {id(r): r.rounds[-1][0] - r.rounds[0][0] if r.rounds else 0.0 for r in (a, b)}
    by_model: dict[str, list[str]] = defaultdict(list)
    for job in a.jobs:
        by_model[model_of(job)].append(job)

    def side(run: Run, models: Mapping[str, Mapping[str, float]], model: str, jobs: Sequence[str]) -> dict[str, Any]:
        n = len(jobs)
        m = models.get(model, {})
        live = m.get("live_s", 0.0)
        return {
            "avg_jct_h": round(sum(run.jobs[j][0] for j in jobs) / n / 3600, 4),
            "restarts_per_job": round(sum(run.jobs[j][1] for j in jobs) / n, 2),
            "gpu_hours_per_job": round(sum(run.jobs[j][2] for j in jobs) / n / 3600, 3),
            "mean_gpus": round(m.get("gpu_s", 0.0) / live, 2) if live else 0.0,
            "types": {k[5:]: round(v / live, 3) for k, v in sorted(m.items()) if k.startswith("type:") and live},
        }

    out: list[dict[str, Any]] = []
    for model, jobs in sorted(by_model.items()):
        sa, sb = side(a, held_a[0], model, jobs), side(b, held_b[0], model, jobs)
        ja, jb = sum(a.jobs[j][0] for j in jobs), sum(b.jobs[j][0] for j in jobs)
        out.append(
            {
                "model": model,
                "jobs": len(jobs),
                "a": sa,
                "b": sb,
                "jct_ratio": round(jb / ja, 4) if ja else None,
                "jct_diff_h": round((jb - ja) / 3600, 3),
            }
        )
    for gpu_type, total in sorted(a.gpus.items()):
        line: dict[str, Any] = {"gpu_type": gpu_type, "gpus": total}
        for name, run, (_, types) in (("a", a, held_a), ("b", b, held_b)):
            t = span[id(run)]
            got = types.get(gpu_type, {})
            line[name] = {
                "mean_busy": round(got.get("gpu_s", 0.0) / t, 2) if t else 0.0,
                "full_share": round(got.get("full_s", 0.0) / t, 3) if t else 0.0,
            }
        out.append(line)
    ta, tb = sum(v[0] for v in a.jobs.values()), sum(v[0] for v in b.jobs.values())
    n = len(a.jobs)
    out.append(
        {
            "jobs": n,
            "avg_jct_h": {"a": round(ta / n / 3600, 4), "b": round(tb / n / 3600, 4)},
            "jct_ratio": round(tb / ta, 4) if ta else None,
        }
    )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("a", type=Path, help="the first run's log (its .jobs.csv and .rounds.jsonl beside it)")
    ap.add_argument("b", type=Path, help="the second run's log")
    args = ap.parse_args(argv)
    try:
        lines = compare(load(args.a), load(args.b))
    except (OSError, ValueError, KeyError) as e:
        print(f"sia_compare: {e}", file=sys.stderr)
        return 2
    for line in lines:
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
