"""The trace's jobs as the Slurm jobs a user would submit (slurm_ext.sim.engine):
each trace job's spec (its iterations, or its duration turned into
iterations at its requested cell's speed) submitted held through the
simulated Slurm, as `cellsched sbatch` submits, with the maps between
trace and Slurm job ids; a job whose spec cannot be made is not submitted,
with why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from slurm_ext.backends.base import SubmitRequest
from slurm_ext.records import ClusterSnapshot
from slurm_ext.sim.backend import SimBackend
from slurm_ext.sim.site import SiteUsage
from slurm_ext.sim.types import ClusterSpec, TraceJob
from slurm_ext.wrapper.submission import provisional_gres
from solver.contract.jobspec import JobSpec
from solver.contract.plan import JobPlan


class SpecOptions(Protocol):
    """What every trace job's spec takes from the simulation's options (slurm_ext.sim.engine.SimOptions)."""

    @property
    def runtime(self) -> str: ...

    @property
    def elastic(self) -> bool: ...

    @property
    def min_gpus(self) -> int: ...

    @property
    def max_gpus(self) -> int: ...


#: speed(spec, gpu type, nodes, GPUs per node, plan) -> seconds per iteration (None: no speed)
Speed = Callable[[JobSpec, str, int, int, "JobPlan | None"], "float | None"]


def best_layout(cluster: ClusterSpec, gpu_type: str | None, gpus: int) -> tuple[str, int, int] | None:
    """(type, nodes, GPUs per node) of the fewest nodes holding `gpus` GPUs."""
    for g in sorted(cluster.groups, key=lambda g: -g.gpus_per_node):
        if gpu_type is not None and g.gpu_type != gpu_type:
            continue
        per = min(g.gpus_per_node, gpus)
        while per > 1 and gpus % per:
            per -= 1
        if gpus // per <= sum(x.count for x in cluster.groups if x.gpu_type == g.gpu_type and x.gpus_per_node >= per):
            return g.gpu_type, gpus // per, per
    return None


class Submitter:
    """Submits trace jobs to the simulated Slurm (module doc)."""

    def __init__(
        self, backend: SimBackend, cluster: ClusterSpec, options: SpecOptions, speed: Speed, site: SiteUsage | None
    ) -> None:
        self.backend, self.cluster, self.options, self.speed, self.site_usage = backend, cluster, options, speed, site
        self._nodes_snapshot: ClusterSnapshot = backend.observe()
        self.slurm_ids: dict[str, str] = {}  # trace job id -> Slurm job id
        self.trace_ids: dict[str, str] = {}  # Slurm job id -> trace job id
        self.skipped: dict[str, str] = {}  # trace jobs never submitted: why

    def spec(self, job: TraceJob) -> JobSpec | str:
        iterations = job.iterations
        if iterations is None:
            if job.duration_s is None:
                return "no iterations and no duration"
            layout = best_layout(self.cluster, job.requested_gpu_type, job.requested_gpus)
            t = None
            if layout is not None:
                probe = JobSpec(
                    model=job.model, global_batch=job.global_batch, iterations=1, runtime=self.options.runtime
                )
                t = self.speed(probe, layout[0], layout[1], layout[2], None)
            if not t:
                return "its requested cell has no speed to turn its duration into iterations"
            iterations = max(1, round(job.duration_s / t))
        try:
            return JobSpec(
                model=job.model,
                global_batch=job.global_batch,
                iterations=iterations,
                elastic=self.options.elastic,
                min_gpus=self.options.min_gpus,
                max_gpus=max(self.options.max_gpus, job.requested_gpus),
                requested_gpus=job.requested_gpus,
                requested_gpu_type=job.requested_gpu_type,
                runtime=self.options.runtime,
            )
        except ValueError as exc:
            return str(exc)

    def submit(self, job: TraceJob) -> None:
        spec = self.spec(job)
        if isinstance(spec, str):
            self.skipped[job.job_id] = spec
            return
        req = SubmitRequest(
            script="sim-job.sh",
            job_name=None,
            gres_per_node=provisional_gres(spec, self._nodes_snapshot),
            nodes=1,
            hold=True,
            comment=spec.to_comment(),
        )
        self.slurm_ids[job.job_id] = sid = self.backend.submit(req)
        self.trace_ids[sid] = job.job_id
        if self.site_usage is not None:
            self.site_usage.register(sid, job)
