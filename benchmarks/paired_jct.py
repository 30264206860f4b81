"""Two simulation runs of the same jobs, compared job by job.

An average JCT is decided by the longest jobs; when two runs of one trace
and seed differ by a policy option (e.g. ``cellsched`` against
``cellsched:calibrate=false``), pairing each job's JCT by its id shows what
most jobs feel. Each argument is a ``cellsched simulate --json`` results
file (``results.json``) or the folder holding it, optionally ``:POLICY``
when the file holds several runs. Prints one JSON line: the jobs both
finished, the geometric mean of B's JCT over A's, how many jobs B ran
slower and faster (by more than 0.1%), and the ratios of the averages and
medians.

    python benchmarks/paired_jct.py RUN_A[:POLICY] RUN_B[:POLICY]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path


def load_jobs(arg: str) -> tuple[str, dict[str, float]]:
    """(policy, JCT by job id of its finished jobs) of one results file or folder."""
    # folder names hold colons too ("cellsched:hesrpt=true"): the path is the shortest prefix that exists
    cuts = [i for i, c in enumerate(arg) if c == ":"] + [len(arg)]
    path = next((arg[:i] for i in cuts if Path(arg[:i]).exists()), None)
    if path is None:
        raise SystemExit(f"{arg}: no such results file or folder")
    policy = arg[len(path) + 1 :]
    file = Path(path) / "results.json" if Path(path).is_dir() else Path(path)
    runs = json.loads(file.read_text(encoding="utf-8"))["runs"]
    if not policy:
        if len(runs) != 1:
            raise SystemExit(f"{file} holds {len(runs)} runs ({', '.join(runs)}): name one as {arg}:POLICY")
        policy = next(iter(runs))
    if policy not in runs:
        raise SystemExit(f"{file} holds no run of {policy!r} (it has {', '.join(runs)})")
    return policy, {j["job_id"]: j["jct"] for j in runs[policy]["jobs"] if j["finished"]}


def compare(a: dict[str, float], b: dict[str, float]) -> dict:
    """B against A over the jobs both finished."""
    ids = sorted(a.keys() & b.keys())
    if not ids:
        raise SystemExit("the two runs finished no job in common")
    ratios = [b[i] / a[i] for i in ids]
    ja, jb = [a[i] for i in ids], [b[i] for i in ids]
    return {
        "jobs_common": len(ids),
        "geomean_jct_ratio": round(math.exp(statistics.fmean(math.log(r) for r in ratios)), 4),
        "jobs_slower": sum(r > 1.001 for r in ratios),
        "jobs_faster": sum(r < 0.999 for r in ratios),
        "avg_jct_ratio": round(statistics.fmean(jb) / statistics.fmean(ja), 4),
        "median_jct_ratio": round(statistics.median(jb) / statistics.median(ja), 4),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a", help="the reference run: results.json or its folder, [:POLICY]")
    ap.add_argument("run_b", help="the run compared with it")
    args = ap.parse_args(argv)
    (pa, a), (pb, b) = load_jobs(args.run_a), load_jobs(args.run_b)
    print(json.dumps({"a": pa, "b": pb, **compare(a, b)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
