"""The trace's jobs as the Slurm jobs a user would submit (slurm_ext.sim.engine):
each trace job's spec (its iterations, or its duration turned into
iterations at its requested cell's speed) submitted held through the
simulated Slurm, as `cellsched sbatch` submits, with the maps between
trace and Slurm job ids; a job whose spec cannot be made is not submitted,
with why. A job of a `plain` QOS of the site (slurm_ext.sim.preempt) is a
plain sbatch job instead: its requested GPUs on the fewest nodes of its
type, not held, so that Slurm starts it when it fits; its spec is only what
it runs (it does not checkpoint)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Protocol

from slurm_ext.backends.base import SubmitRequest
from slurm_ext.records import ClusterSnapshot
from slurm_ext.sim.backend import SimBackend
from slurm_ext.sim.site import SiteUsage
from slurm_ext.sim.types import ClusterSpec, TraceJob
from slurm_ext.sim.world import SimJob, SimWorld
from slurm_ext.wrapper.submission import provisional_gres
from solver.contract.jobspec import JobSpec
from solver.contract.plan import JobPlan


class SpecOptions(Protocol):
    """What every trace job's spec takes from the simulation's options (slurm_ext.sim.engine.SimOptions)."""

    @property
    def elastic(self) -> bool: ...

    @property
    def min_gpus(self) -> int: ...

    @property
    def max_gpus(self) -> int: ...

    @property
    def rigid(self) -> bool: ...


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
        self,
        backend: SimBackend,
        cluster: ClusterSpec,
        options: SpecOptions,
        speed: Speed,
        site: SiteUsage | None,
        world: SimWorld,
        runtimes: Mapping[str, str],
        declared: Callable[[TraceJob, int], int],
    ) -> None:
        """`world`: the one `backend` shows, where plain jobs are submitted (module doc);
        `runtimes`: each trace job's runtime, `declared(job, true iterations)`
        its declared ones (slurm_ext.sim.workload)."""
        self.backend, self.cluster, self.options, self.speed, self.site_usage = backend, cluster, options, speed, site
        self.world, self.runtimes, self.declared = world, runtimes, declared
        qos = cluster.site.qos if cluster.site is not None else ()
        self._qos = {q.name for q in qos}  # a job of one of them is submitted with it (-q)
        self._plain = {q.name for q in qos if q.plain}
        self._nodes_snapshot: ClusterSnapshot = backend.observe()
        self.slurm_ids: dict[str, str] = {}  # trace job id -> Slurm job id
        self.trace_ids: dict[str, str] = {}  # Slurm job id -> trace job id
        self.skipped: dict[str, str] = {}  # trace jobs never submitted: why

    def spec(self, job: TraceJob, iterations: int) -> JobSpec | str:
        """The spec its user submits for `iterations` true ones (declaring
        `declared`), or why there is none: elastic within the options' GPU
        range, or rigid at its requested GPUs (SpecOptions.rigid)."""
        o, asked = self.options, job.requested_gpus
        try:
            return JobSpec(
                model=job.model,
                global_batch=job.global_batch,
                iterations=self.declared(job, iterations),
                elastic=o.elastic and not o.rigid,
                min_gpus=asked if o.rigid else o.min_gpus,
                max_gpus=asked if o.rigid else max(o.max_gpus, asked),
                requested_gpus=job.requested_gpus,
                requested_gpu_type=job.requested_gpu_type,
                runtime=self.runtimes[job.job_id],
            )
        except ValueError as exc:
            return str(exc)

    def iterations(self, job: TraceJob) -> int | str:
        """The iterations the job really runs: the trace's, or its duration at
        its requested cell's speed; or why there are none."""
        iterations = job.iterations
        if iterations is None:
            if job.duration_s is None:
                return "no iterations and no duration"
            layout = best_layout(self.cluster, job.requested_gpu_type, job.requested_gpus)
            t = None
            if layout is not None:
                probe = JobSpec(
                    model=job.model, global_batch=job.global_batch, iterations=1, runtime=self.runtimes[job.job_id]
                )
                t = self.speed(probe, layout[0], layout[1], layout[2], None)
            if not t:
                return "its requested cell has no speed to turn its duration into iterations"
            iterations = max(1, round(job.duration_s / t))
        return iterations

    def submit(self, job: TraceJob) -> None:
        truth = self.iterations(job)
        spec = truth if isinstance(truth, str) else self.spec(job, truth)
        if isinstance(spec, str):
            self.skipped[job.job_id] = spec
            return
        assert isinstance(truth, int)
        if job.qos in self._plain:
            self._submit_plain(job, spec, truth)
            return
        req = SubmitRequest(
            script="sim-job.sh",
            job_name=None,
            gres_per_node=provisional_gres(spec, self._nodes_snapshot),
            nodes=1,
            hold=True,
            comment=spec.to_comment(),
            qos=job.qos if job.qos in self._qos else None,
            time_limit=None if job.time_limit_s is None else math.ceil(job.time_limit_s / 60),
        )
        sid = self.backend.submit(req)
        self.world.jobs[sid].work = float(truth)  # what it really runs; its spec says what its user declared
        self._submitted(job, sid)

    def _submitted(self, job: TraceJob, sid: str, plain: bool = False) -> None:
        self.slurm_ids[job.job_id] = sid
        self.trace_ids[sid] = job.job_id
        if self.site_usage is not None:
            self.site_usage.register(sid, job, plain)

    def _submit_plain(self, job: TraceJob, spec: JobSpec, truth: int) -> None:
        """A plain sbatch job (module doc), registered before Slurm may start it."""
        layout = best_layout(self.cluster, job.requested_gpu_type, job.requested_gpus)
        if layout is None:
            self.skipped[job.job_id] = "a plain job whose requested GPUs fit no node group"
            return
        gpu_type, nodes, per = layout
        w = self.world
        sid, seq = w.new_job_id()
        self._submitted(job, sid, plain=True)
        w.submit(
            SimJob(
                job_id=sid,
                seq=seq,
                name=f"plain-{job.job_id}",
                user=w.user,
                submit_time=w.now,
                partition=gpu_type,
                gres=per,
                num_nodes=nodes,
                features=gpu_type,
                begin_time=w.now,
                spec=dataclasses.replace(spec, elastic=False),
                work=float(truth),
                qos=job.qos,
            )
        )
