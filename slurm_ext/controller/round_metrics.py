"""The controller's metrics: their declaration, and what a round records
(its durations and status, the managed jobs by phase, the GPUs in use)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from slurm_ext.controller import inputs as inp
from slurm_ext.controller import metrics as mx
from slurm_ext.controller.report import RoundReport
from slurm_ext.records import ClusterSnapshot
from slurm_ext.state import restart_stats


def declare_metrics(m: mx.Metrics) -> None:
    for name, kind, text in (
        ("round_duration_seconds", "gauge", "Duration of the last round"),
        ("round_phase_seconds", "gauge", "Duration of the last round's phases (observe, solve, apply)"),
        ("solve_seconds", "gauge", "Solver time of the last round"),
        ("last_round_timestamp_seconds", "gauge", "When the last round ended"),
        ("rounds_total", "counter", "Rounds by status"),
        ("jobs", "gauge", "Managed jobs by phase"),
        ("gpus", "gauge", "GPUs by type and use (total, used, managed)"),
        ("actions_total", "counter", "Actions by kind and result"),
        ("errors_total", "counter", "Errors by kind"),
        (
            "job_restarts",
            "gauge",
            "Restarts per managed job Slurm lists (requeues by the controller: moves, resizes, preemptions, "
            "runs placed again), by statistic (mean, p99, max)",
        ),
    ):
        m.declare(name, kind, text)


def record_round(m: mx.Metrics, r: RoundReport, clock: Callable[[], float]) -> None:
    """A round's status and durations, and when it was recorded (`clock`: the controller's)."""
    m.inc("rounds_total", labels={"status": r.status})
    m.set("round_duration_seconds", r.total_s)
    for phase in ("observe", "solve", "apply"):
        m.set("round_phase_seconds", getattr(r, f"{phase}_s"), {"phase": phase})
    m.set("solve_seconds", r.solve_s)
    m.set("last_round_timestamp_seconds", clock())


def record_cluster(m: mx.Metrics, snap: ClusterSnapshot, jobs: tuple[inp.ManagedJob, ...]) -> None:
    """The managed jobs by phase; the GPUs by type: total, used, used by managed jobs."""
    shown = (
        inp.Phase.HELD,
        inp.Phase.LOOSE,
        inp.Phase.RELEASED,
        inp.Phase.RUNNING,
        inp.Phase.UNPLANNED,
        inp.Phase.OPERATOR_HOLD,
        inp.Phase.PARKED,
        inp.Phase.SLURM_REQUEUED,
        inp.Phase.BAD,
    )
    phases: dict[mx.Labels, float] = {(("phase", p),): 0.0 for p in shown}
    for j in jobs:
        if j.phase != inp.Phase.FINISHED:
            key: mx.Labels = (("phase", j.phase),)
            phases[key] = phases.get(key, 0.0) + 1
    m.replace("jobs", phases)
    gpus: dict[mx.Labels, float] = {}
    managed = {j.job_id for j in jobs}
    for n in snap.nodes:
        if n.gpu_type:
            for use, v in (("total", n.gpus_total), ("used", n.gpus_alloc)):
                key = (("gpu_type", n.gpu_type), ("use", use))
                gpus[key] = gpus.get(key, 0.0) + v
    types = {n.name: n.gpu_type for n in snap.nodes}
    for job in snap.jobs:
        if job.job_id in managed and job.holds_resources and job.gpus_per_node:
            for name in job.nodes:
                key = (("gpu_type", types.get(name) or "unknown"), ("use", "managed"))
                gpus[key] = gpus.get(key, 0.0) + job.gpus_per_node
    m.replace("gpus", gpus)


def record_restarts(m: mx.Metrics, counts: Mapping[str, int]) -> None:
    """Restarts per job (StateStore.restart_counts of the round's managed jobs): mean, p99, max."""
    m.replace("job_restarts", {(("stat", k),): v for k, v in restart_stats(counts.values()).items()})
