"""Reports of simulated runs: per-policy summary numbers, a markdown table,
results.json and PNG plots. Everything is computed from SimRun alone.

Conventions:

* JCT = end - submit over FINISHED jobs; median and p95 interpolate
  linearly between ranks (numpy's default); queueing = first start -
  submit over jobs that started; makespan = last end - first submit.
* The samples form a piecewise-constant timeline (a sample holds until the
  next one; before the first sample nothing runs). Time-weighted means run
  from the first submit to the last end (the last sample's time when no
  job ended): avg_throughput, gpu_util_by_type (GPUs used / GPUs of that
  type). peak_throughput = the largest sample.
* avg_throughput_arena = Arena's convention (the mean over rounds whose
  throughput is above 100 samples/s), taken time-weighted over the periods
  above 100 samples/s; with one sample per equal-length round (arena-compat
  mode) that is exactly Arena's per-round mean.
* Statistics that have no data (e.g. no job finished) are None (null in JSON).
* restarts: every job's starts after its first, summed; restarts_mean and
  restarts_p99 the mean and 99th percentile per job over all the run's jobs
  (finished or not).
* cell_kinds: per kind of cell (slurm_ext.sim.types.CELL_KINDS: single-type,
  mixed data-parallel, mixed pipeline, and state-sharded, which overlaps the
  others), the runs that began in one (placements), the jobs that had such a
  run, and the hours those runs held their GPUs (job_hours, gpu_hours;
  restart stalls included, runs still going at the end not).
"""

from __future__ import annotations

import functools
import json
import math
import pathlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, cast

from slurm_ext.sim.types import CELL_KINDS, Sample, SimRun
from solver.contract.extras import require

ARENA_MIN_THROUGHPUT = 100.0
PLOTS = ("jct_cdf.png", "queue_length.png", "throughput.png", "gpu_use_by_type.png")


@dataclass(frozen=True)
class PolicyResult:
    """One policy's summary (seconds; throughput in samples/s)."""

    policy: str
    jobs_total: int
    jobs_finished: int
    avg_jct_s: float | None
    median_jct_s: float | None
    p95_jct_s: float | None
    avg_queue_s: float | None
    makespan_s: float | None
    avg_throughput: float | None
    peak_throughput: float | None
    avg_throughput_arena: float | None
    gpu_util_by_type: Mapping[str, float] = field(default_factory=dict)
    restarts: int = 0
    #: restarts per job over all the run's jobs: mean and 99th percentile (None: no job)
    restarts_mean: float | None = None
    restarts_p99: float | None = None
    round_mean_s: float | None = None
    round_max_s: float | None = None
    solve_mean_s: float | None = None
    rounds: int = 0
    wall_s: float = 0.0
    #: avg JCT over the jobs that every policy of the comparison finished (None: not compared)
    avg_jct_common_s: float | None = None
    jobs_common: int | None = None
    #: kind of cell -> {"placements", "jobs", "job_hours", "gpu_hours"} (module doc), every kind
    cell_kinds: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: seconds the jobs' runs lost to shared network links, summed (contention; 0 without)
    contended_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gpu_util_by_type"] = dict(self.gpu_util_by_type)
        d["cell_kinds"] = {k: dict(v) for k, v in self.cell_kinds.items()}
        return d


# ---- numbers ---------------------------------------------------------------------


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def percentile(xs: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between closest ranks; None when empty."""
    v = sorted(xs)
    if not v:
        return None
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def timeline(run: SimRun) -> tuple[float, float] | None:
    """(first submit, last end) of the run; None when it has neither jobs nor samples."""
    submits = [j.submit_time for j in run.jobs]
    ends = [j.end_time for j in run.jobs if j.end_time is not None]
    times = [s.time for s in run.samples]
    start = min(submits) if submits else (min(times) if times else None)
    end = max(ends) if ends else (max(times) if times else None)
    return None if start is None or end is None else (start, end)


def segments(samples: Sequence[Sample], t0: float, t1: float) -> list[tuple[float, Sample]]:
    """(duration, sample) of each sample's piece of the timeline inside [t0, t1]."""
    ordered = sorted(samples, key=lambda s: s.time)
    out = []
    for i, s in enumerate(ordered):
        until = ordered[i + 1].time if i + 1 < len(ordered) else t1
        dur = min(until, t1) - max(s.time, t0)
        if dur > 0:
            out.append((dur, s))
    return out


def _gpus_used(s: Sample, gpu_type: str) -> float:
    return s.gpus_used.get(gpu_type, 0)


def _gpu_share(s: Sample, gpu_type: str, total: int) -> float:
    """The share of the `total` GPUs of `gpu_type` in use at `s`."""
    return s.gpus_used.get(gpu_type, 0) / total if total else 0.0


def _weighted(pieces: list[tuple[float, Sample]], value: Callable[[Sample], float], span: float) -> float | None:
    return sum(d * value(s) for d, s in pieces) / span if span > 0 else None


def cell_kinds(run: SimRun) -> dict[str, dict[str, float]]:
    """How often each kind of cell was chosen in the run (module doc)."""
    out: dict[str, dict[str, float]] = {}
    for kind in CELL_KINDS:
        uses = [j.kinds[kind] for j in run.jobs if kind in j.kinds and j.kinds[kind].placements]
        out[kind] = {
            "placements": sum(u.placements for u in uses),
            "jobs": len(uses),
            "job_hours": sum(u.seconds for u in uses) / 3600.0,
            "gpu_hours": sum(u.gpu_seconds for u in uses) / 3600.0,
        }
    return out


def summarize(run: SimRun) -> PolicyResult:
    """The summary numbers of one run (see the module doc)."""
    jcts = [j.jct for j in run.jobs if j.jct is not None]
    queues = [j.queueing for j in run.jobs if j.queueing is not None]
    span = timeline(run)
    pieces = segments(run.samples, *span) if span else []
    length = span[1] - span[0] if span else 0.0
    above = [(d, s) for d, s in pieces if s.throughput > ARENA_MIN_THROUGHPUT]
    above_time = sum(d for d, _ in above)
    util = {
        t: (_weighted(pieces, functools.partial(_gpus_used, gpu_type=t), length) or 0.0) / n
        for t, n in sorted(run.gpus_total.items())
        if n > 0
    }
    ends = [j.end_time for j in run.jobs if j.end_time is not None]
    known = not run.meta.get("recorded")  # a recorded run has no throughput (slurm_ext.sim.recorded)
    return PolicyResult(
        policy=run.policy,
        jobs_total=len(run.jobs),
        jobs_finished=len(jcts),
        avg_jct_s=_mean(jcts),
        median_jct_s=percentile(jcts, 50),
        p95_jct_s=percentile(jcts, 95),
        avg_queue_s=_mean(queues),
        makespan_s=max(ends) - min(j.submit_time for j in run.jobs) if ends else None,
        avg_throughput=_weighted(pieces, lambda s: s.throughput, length) if known else None,
        peak_throughput=max((s.throughput for s in run.samples), default=None) if known else None,
        avg_throughput_arena=(sum(d * s.throughput for d, s in above) / above_time) if above_time > 0 else None,
        gpu_util_by_type=util,
        restarts=sum(j.restarts for j in run.jobs),
        restarts_mean=_mean([j.restarts for j in run.jobs]),
        restarts_p99=percentile([j.restarts for j in run.jobs], 99),
        round_mean_s=_mean([r.total_s for r in run.rounds]),
        round_max_s=max((r.total_s for r in run.rounds), default=None),
        solve_mean_s=_mean([r.solve_s for r in run.rounds]),
        rounds=len(run.rounds),
        wall_s=run.wall_s,
        cell_kinds=cell_kinds(run),
        contended_s=sum(j.contended_s for j in run.jobs),
    )


def summaries(runs: Sequence[SimRun]) -> list[PolicyResult]:
    """`summarize` of each run, plus the avg JCT over the jobs every run
    finished when some run left jobs unfinished (e.g. Gavel and Sia never
    start models without DP-memory data under --arena-compat): averages
    over different job sets do not compare."""
    results = [summarize(r) for r in runs]
    if len(runs) < 2 or all(r.jobs_finished == r.jobs_total for r in results):
        return results
    done = [{j.job_id: j.jct for j in run.jobs if j.jct is not None} for run in runs]
    common = set.intersection(*(set(d) for d in done))
    return [
        replace(r, avg_jct_common_s=_mean([d[j] for j in sorted(common)]), jobs_common=len(common))
        for r, d in zip(results, done, strict=True)
    ]


def against_recorded(runs: Sequence[SimRun]) -> dict[str, Any] | None:
    """With a recorded run among `runs` (slurm_ext.sim.recorded): per run,
    its mean and median wait (first start - submit), mean JCT, GPU-hours
    (the GPU-seconds its jobs held) and each account's fraction of them;
    and per simulated run its per-job wait error against the record: for
    each job both started, simulated wait - recorded wait (`wait_err_s`),
    their mean absolute value and median (`mean_abs_wait_err_s`,
    `median_abs_wait_err_s`), and |simulated - recorded| mean wait over the
    recorded mean wait, both over those jobs (`mean_wait_err_pct`). None
    without a recorded run."""
    rec = next((r for r in runs if r.meta.get("recorded")), None)
    if rec is None:
        return None
    rec_wait = {j.job_id: j.queueing for j in rec.jobs if j.queueing is not None}
    out: dict[str, Any] = {}
    for run in runs:
        waits = {j.job_id: j.queueing for j in run.jobs if j.queueing is not None}
        jcts = [j.jct for j in run.jobs if j.jct is not None]
        site = cast(Mapping[str, Mapping[str, float]], run.meta.get("site", {}))  # SiteUsage.summary's
        row: dict[str, Any] = {
            "mean_wait_s": _mean(list(waits.values())),
            "median_wait_s": percentile(waits.values(), 50),
            "mean_jct_s": _mean(jcts),
            "gpu_hours": sum(j.gpu_seconds for j in run.jobs) / 3600.0,
            "account_gpu_frac": {a: v["used_frac"] for a, v in site.items()},
        }
        if run is not rec:
            both = [j for j in rec_wait if j in waits]
            err = {j: waits[j] - rec_wait[j] for j in both}
            sim_mean, rec_mean = _mean([waits[j] for j in both]), _mean([rec_wait[j] for j in both])
            row |= {
                "jobs_compared": len(err),
                "mean_abs_wait_err_s": _mean([abs(e) for e in err.values()]),
                "median_abs_wait_err_s": percentile((abs(e) for e in err.values()), 50),
                "mean_wait_err_pct": (
                    abs(sim_mean - rec_mean) / rec_mean * 100 if sim_mean is not None and rec_mean else None
                ),
                "wait_err_s": err,
            }
        out[run.policy] = row
    return out


def recorded_table(comparison: Mapping[str, Mapping[str, Any]]) -> str:
    """`against_recorded` as a Markdown table: one row per run, then one
    column per account (its fraction of the GPU-hours)."""
    accounts = sorted({a for row in comparison.values() for a in row["account_gpu_frac"]})
    head = [
        "policy",
        "mean wait s",
        "median wait s",
        "mean JCT s",
        "GPU-h",
        "wait err vs recorded: mean % / mean abs s",
    ]
    head += [f"{a} GPU-h share" for a in accounts]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for policy, row in comparison.items():
        err = (
            "-"
            if "jobs_compared" not in row
            else (f"{_num(row['mean_wait_err_pct'], 1)} / {_num(row['mean_abs_wait_err_s'], 1)}")
        )
        cells = [policy, _num(row["mean_wait_s"], 1), _num(row["median_wait_s"], 1), _num(row["mean_jct_s"], 1)]
        cells += [_num(row["gpu_hours"], 2), err]
        cells += [_num(row["account_gpu_frac"].get(a), 3) for a in accounts]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---- text ------------------------------------------------------------------------


def _num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def markdown_table(results: Sequence[PolicyResult]) -> str:
    """One row per policy; with an fcfs row, a column of avg JCT / fcfs's."""
    fcfs = next((r.avg_jct_s for r in results if r.policy == "fcfs"), None)
    ratio = fcfs is not None and fcfs > 0
    head = [
        "policy",
        "finished",
        "avg JCT s",
        "median JCT s",
        "p95 JCT s",
        "avg queue s",
        "makespan s",
        "avg thr",
        "Arena avg thr",
        "peak thr",
        "restarts",
        "restarts per job mean/p99",
        "round mean/max s",
        "solve mean s",
    ]
    common = next((r.jobs_common for r in results if r.jobs_common is not None), None)
    if ratio:
        head.insert(3, "JCT vs fcfs")
    if common is not None:
        head.insert(3, f"avg JCT s, {common} jobs all finished")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        row = [
            r.policy,
            f"{r.jobs_finished}/{r.jobs_total}",
            _num(r.avg_jct_s),
            _num(r.median_jct_s),
            _num(r.p95_jct_s),
            _num(r.avg_queue_s),
            _num(r.makespan_s),
            _num(r.avg_throughput, 1),
            _num(r.avg_throughput_arena, 1),
            _num(r.peak_throughput, 1),
            str(r.restarts),
            f"{_num(r.restarts_mean, 2)}/{_num(r.restarts_p99, 1)}",
            f"{_num(r.round_mean_s, 3)}/{_num(r.round_max_s, 3)}",
            _num(r.solve_mean_s, 3),
        ]
        if ratio:
            row.insert(3, "-" if r.avg_jct_s is None or fcfs is None else f"{r.avg_jct_s / fcfs:.2f}x")
        if common is not None:
            row.insert(3, _num(r.avg_jct_common_s))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def kinds_table(results: Sequence[PolicyResult]) -> str:
    """One row per policy: per kind of cell, its placements, jobs and job-hours."""
    head = ["policy", *(f"{k}: placements / jobs / job-h" for k in CELL_KINDS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        row = [r.policy]
        for k in CELL_KINDS:
            c = r.cell_kinds.get(k, {})
            row.append(f"{c.get('placements', 0):.0f} / {c.get('jobs', 0):.0f} / {_num(c.get('job_hours', 0.0), 1)}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def write_report(
    runs: Sequence[SimRun],
    out_dir: str | pathlib.Path,
    *,
    plots: bool = True,
    meta: Mapping[str, Any] | None = None,
    results: Sequence[PolicyResult] | None = None,
) -> dict[str, pathlib.Path]:
    """Write results.json, results.md and (with plots) the PNGs into
    out_dir; returns {file name: path}. `results`: the runs' `summaries`
    when the caller has them already."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = summaries(runs) if results is None else results
    doc = {
        "meta": dict(meta or {}),
        "summary": {r.policy: r.to_dict() for r in results},
        **({"recorded": comparison} if (comparison := against_recorded(runs)) is not None else {}),
        "runs": {
            run.policy: {
                "meta": dict(run.meta),
                "gpus_total": dict(run.gpus_total),
                "jobs": [_outcome(j) for j in run.jobs],
            }
            for run in runs
        },
    }
    written = {"results.json": out / "results.json", "results.md": out / "results.md"}
    written["results.json"].write_text(json.dumps(doc, indent=1, default=str, allow_nan=False) + "\n")
    lines = ["# Simulation results", ""]
    lines += [f"- {k}: {v}" for k, v in (meta or {}).items()] + ([""] if meta else [])
    lines += [markdown_table(results), "Cells chosen, by kind (state-sharded overlaps the others):", ""]
    lines += [kinds_table(results)]
    if comparison is not None:
        lines += ["Against the recorded run (the site's own Slurm):", "", recorded_table(comparison)]
    written["results.md"].write_text("\n".join(lines))
    if plots:
        written.update(write_plots(runs, out))
    return written


def _outcome(j) -> dict[str, Any]:
    d = asdict(j)
    d["cells"] = list(j.cells)
    d["kinds"] = {k: asdict(u) for k, u in j.kinds.items()}
    d["jct"] = j.jct
    d["queueing"] = j.queueing
    return d


# ---- plots -----------------------------------------------------------------------


def write_plots(runs: Sequence[SimRun], out_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    """The four PNGs (matplotlib, Agg canvas, imported here only). Time axes
    are hours since the earliest submit of all runs; a plot with nothing to
    show says so instead of failing."""
    Figure = require("matplotlib.figure").Figure  # lazy: MissingExtra without the `sim` extra

    spans = [s for s in (timeline(r) for r in runs) if s is not None]
    origin = min((s[0] for s in spans), default=0.0)
    hours = lambda t: (t - origin) / 3600.0  # noqa: E731
    written: dict[str, pathlib.Path] = {}

    def save(fig, name: str) -> None:
        fig.tight_layout()
        written[name] = out_dir / name
        fig.savefig(written[name], dpi=110)

    def note(ax, text: str) -> None:
        ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")

    # JCT CDF
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    shown, smallest = 0, math.inf
    for run in runs:
        jcts = sorted(j.jct / 3600.0 for j in run.jobs if j.jct is not None)
        if jcts:
            fracs = [(i + 1) / len(jcts) for i in range(len(jcts))]
            ax.step([jcts[0], *jcts], [0.0, *fracs], where="post", label=run.policy)
            shown += 1
            smallest = min(smallest, jcts[0])
    if shown:
        ax.legend()
        if smallest > 0:  # JCTs span hours to months: a log axis shows them all
            ax.set_xscale("log")
    else:
        note(ax, "no finished job")
    ax.set(xlabel="JCT (h)", ylabel="fraction of finished jobs", ylim=(0, 1.02), title="Job completion time CDF")
    save(fig, "jct_cdf.png")

    # queue length and throughput over time
    for name, value, label in (
        ("queue_length.png", lambda s: s.queued, "jobs queued"),
        ("throughput.png", lambda s: s.throughput, "throughput (samples/s)"),
    ):
        fig = Figure(figsize=(8, 4.5))
        ax = fig.add_subplot()
        shown = 0
        for run in runs:
            pts = _step_points(run, value)
            if pts:
                ax.step([hours(t) for t, _ in pts], [v for _, v in pts], where="post", label=run.policy)
                shown += 1
        if shown:
            ax.legend()
        else:
            note(ax, "no samples")
        ax.set(xlabel="time since first submit (h)", ylabel=label, title=label.capitalize() + " over time")
        save(fig, name)

    # GPU use by type: one panel per policy, one line per GPU type
    fig = Figure(figsize=(8, 2.6 * max(len(runs), 1) + 0.6))
    axes = fig.subplots(max(len(runs), 1), 1, sharex=True, squeeze=False)[:, 0]
    if not runs:
        note(axes[0], "no runs")
    for ax, run in zip(axes, runs, strict=False):  # one panel even without runs
        shown = 0
        for gpu, total in sorted(run.gpus_total.items()):
            pts = _step_points(run, functools.partial(_gpu_share, gpu_type=gpu, total=total))
            if pts:
                ax.step([hours(t) for t, _ in pts], [v for _, v in pts], where="post", label=f"{gpu} ({total})")
                shown += 1
        if shown:
            ax.legend(loc="upper right", fontsize="small")
        else:
            note(ax, "no samples")
        ax.set(ylabel="GPUs in use (fraction)", ylim=(-0.02, 1.05), title=run.policy)
    axes[-1].set_xlabel("time since first submit (h)")
    save(fig, "gpu_use_by_type.png")
    return written


def _step_points(run: SimRun, value: Callable[[Sample], float]) -> list[tuple[float, float]]:
    """The run's piecewise-constant timeline as step points, closed at its end."""
    span = timeline(run)
    if span is None or not run.samples:
        return []
    ordered = sorted(run.samples, key=lambda s: s.time)
    pts = [(s.time, float(value(s))) for s in ordered]
    end = max(span[1], ordered[-1].time)
    return pts + [(end, pts[-1][1])]
