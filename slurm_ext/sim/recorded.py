"""The recorded run as a policy of its own, `recorded` (docs/simulator.md#the-recorded-run):
what the site's Slurm really did with a sacct trace's jobs, each job's real
start (sacct's Start) and end (Start + its run time), told as a `SimRun`
so that the report puts it beside the simulated policies. Nothing is
simulated: it is no model at all, the one baseline that is not a
re-implementation.

Each job ran once, on the GPUs its AllocTRES gives, of its type where the
record types them (an untyped count is counted under the type "any"); its
GPU-seconds are those GPUs for its run time. The timeline samples the
queue (submitted, not started), the running jobs and the GPUs in use at
every start and end; the samples' throughput is 0, not known (a
record has no samples per second), and the summary gives none
(`SimRun.meta["recorded"]`). Per account (`meta["site"]`): the GPU-seconds
held and their fraction of all, and the most GPUs held at once, as a
simulated run with a site records them (slurm_ext.sim.site.SiteUsage).
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm_ext.errors import CellschedError
from slurm_ext.sim.types import SINGLE, ClusterSpec, JobOutcome, KindUse, Sample, SimRun, TraceJob

#: the label of the recorded run (`cellsched simulate --policy recorded`)
RECORDED = "recorded"
#: the type an untyped GPU count is counted under
ANY_TYPE = "any"


class RecordedError(ValueError, CellschedError):
    """A trace that does not record a run: ``<line>: <message>``."""


def recorded_run(trace: Sequence[TraceJob], cluster: ClusterSpec, label: str = RECORDED) -> SimRun:
    """The recorded run of `trace` (module doc); RecordedError names the
    first job whose start or run time the trace does not give."""
    outcomes, events = [], []
    for j in sorted(trace, key=lambda j: (j.submit_time, j.line, j.job_id)):
        if j.recorded_start is None or j.duration_s is None:
            raise RecordedError(f"line {j.line}: job {j.job_id} has no recorded Start and End (a sacct trace's)")
        end = j.recorded_start + j.duration_s
        kind = j.requested_gpu_type or ANY_TYPE
        gpu_s = j.requested_gpus * j.duration_s
        outcomes.append(
            JobOutcome(
                j.job_id,
                j.submit_time,
                j.recorded_start,
                end,
                True,
                gpu_seconds=gpu_s,
                cells=(f"{kind}:{j.requested_gpus}",),
                kinds={SINGLE: KindUse(1, j.duration_s, gpu_s)},
            )
        )
        events += [(j.submit_time, 0, j), (j.recorded_start, 1, j), (end, 2, j)]
    return SimRun(
        label,
        tuple(outcomes),
        _samples(events),
        (),
        dict(cluster.gpus_by_type()),
        meta={"recorded": True, "site": _accounts(trace)},
    )


def _samples(events: list[tuple[float, int, TraceJob]]) -> tuple[Sample, ...]:
    """One sample after each instant's submits, starts and ends."""
    queued = running = 0
    used: dict[str, int] = {}
    out: list[Sample] = []
    for t, what, j in sorted(events, key=lambda e: (e[0], -e[1])):  # ends before starts at one instant
        kind = j.requested_gpu_type or ANY_TYPE
        if what == 0:
            queued += 1
        elif what == 1:
            queued, running = queued - 1, running + 1
            used[kind] = used.get(kind, 0) + j.requested_gpus
        else:
            running -= 1
            used[kind] -= j.requested_gpus
        sample = Sample(t, queued, running, 0.0, {k: n for k, n in used.items() if n})
        if out and out[-1].time == t:
            out[-1] = sample  # the instant's last state
        else:
            out.append(sample)
    return tuple(out)


def _accounts(trace: Sequence[TraceJob]) -> dict[str, dict[str, float]]:
    """Per account: GPU-seconds held, their fraction of all, the most GPUs held at once."""
    held: dict[str, float] = {}
    changes: list[tuple[float, int, str]] = []
    for j in trace:
        if j.recorded_start is None or j.duration_s is None:
            continue
        held[j.account] = held.get(j.account, 0.0) + j.requested_gpus * j.duration_s
        changes += [
            (j.recorded_start, j.requested_gpus, j.account),
            (j.recorded_start + j.duration_s, -j.requested_gpus, j.account),
        ]
    now: dict[str, int] = {}
    peak: dict[str, int] = {}
    for _, n, a in sorted(changes, key=lambda c: (c[0], c[1])):  # ends first at one instant
        now[a] = now.get(a, 0) + n
        peak[a] = max(peak.get(a, 0), now[a])
    total = sum(held.values())
    return {
        a: {"gpu_s": round(s, 3), "used_frac": s / total if total else 0.0, "peak_gpus": peak.get(a, 0)}
        for a, s in sorted(held.items())
    }


__all__ = ["ANY_TYPE", "RECORDED", "RecordedError", "recorded_run"]
