"""A simulated Slurm: the Backend protocol (slurm_ext.backends.base) over a
simulated cluster (``SimBackend``, the ``sim`` backend). It only fakes
Slurm: the cluster's nodes and jobs, Slurm's scheduler, the jobs' runs and
the clock are the world's (slurm_ext.sim.world), what became of each job
the accounting's (slurm_ext.sim.accounting), and Arena's rounds
slurm_ext.sim.quantum's.

It shows what the cli backend shows of a real Slurm 22.05
(tests/slurm_ext/backends/ check the same behaviour on a real one):

* nodes ``<type>-<NNN>`` with typed GRES ``gpu:<type>:N``,
  ``Features=<type>``, 4 CPUs per GPU; one partition per GPU type plus
  ``all`` (the default);
* ``submit`` with ``hold`` gives a PENDING job with reason JobHeldUser; an
  unknown partition is refused as sbatch refuses it;
* ``hold`` an admin hold (JobHeldAdmin); ``hold`` and ``release`` of a job
  that is not pending are refused ("Job is no longer pending execution");
* updates apply to pending jobs only (on any other job only AdminComment
  sticks, the rest is refused with "Job is no longer pending execution");
  an unknown partition or node name is refused with Slurm's message and
  leaves the field as it was; a ReqNodeList outside the job's partition is
  accepted and reported through `update_mismatches`, like the cli backend
  does (the job would pend forever with BadConstraints);
* a released job starts as soon as its ReqNodeList nodes (else any nodes of
  its partition with its features) have its GPUs free (the world's
  scheduler);
* ``requeue`` of a running or finished job: PENDING again (held with
  ``hold``: JobHeldUser), not eligible until its begin time (reason
  BeginTime; `start_soon` in an update lifts it at once: a simulated job
  has no credential to revoke); a pending job's is refused;
* ``signal(USR1|TERM, target="steps"|"all")`` to a running elastic job: the
  launcher checkpoints (the world's `checkpoint`: the job ends FAILED with
  exit code 75). Otherwise TERM, KILL and INT end the job (FAILED, exit
  143, 137, 130) and other signals do nothing (a non-elastic job ignores
  USR1). A job that is not running is refused;
* a node set down (SimWorld.set_node_state) shows ``down``, its jobs
  NODE_FAIL and requeued (reason BeginTime), and a job that still requires
  it pends with ReqNodeNotAvail; a drained one shows the DRAIN flag;
* finished jobs vanish from observe() `min_job_age_s` after they end
  (Slurm's MinJobAge);
* with a site policy (the cluster file's ``[site]``, slurm_ext.sim.site) a
  released job that fits but would put its account, user or QOS over a GPU
  limit stays pending with Slurm's reason (AssocGrpGRES, QOSGrpGRES,
  QOSMaxGRESPerUser, QOSMaxGRESPerJob) until it would not;
* with a QOS that preempts (slurm_ext.sim.preempt) a job Slurm preempts
  shows its PreemptTime (``preempted_at``) while it runs out its grace
  time, and after it as Slurm 22.05 does: FAILED exit 75 (checkpointed in
  its grace time, PreemptTime kept), PENDING not held with reason
  BeginTime and Restarts + 1 (REQUEUE), or PREEMPTED (CANCEL).
"""

from __future__ import annotations

import signal as signals
from typing import Any

from slurm_ext.backends.base import (
    ALL,
    BATCH,
    STEPS,
    JobUpdate,
    OneAtATime,
    SlurmCommandError,
    SubmitRequest,
    UpdateNotApplied,
    check_job_id,
    check_signal,
    check_signal_target,
    update_mismatches,
)
from slurm_ext.parse.values import minutes
from slurm_ext.records import ClusterSnapshot, SlurmJob, SlurmNode, SlurmPartition
from slurm_ext.sim.clusterspec import arena_cluster
from slurm_ext.sim.types import ClusterSpec
from slurm_ext.sim.world import SimJob, SimNode, SimWorld
from slurm_ext.site import SiteReading
from solver.contract import CHECKPOINT_SIGNALS
from solver.contract.jobspec import JobSpec, JobSpecError

#: the launcher's checkpoint signals, by name and by number (as scancel takes them)
_CHECKPOINT_SIGNALS = frozenset(CHECKPOINT_SIGNALS) | {
    str(signals.Signals[f"SIG{n}"].value) for n in CHECKPOINT_SIGNALS
}
_KILL_SIGNALS = {"TERM": 143, "15": 143, "KILL": 137, "9": 137, "INT": 130, "2": 130}
#: the JobUpdate fields that only a pending job takes
_PENDING_ONLY = (
    "partition",
    "features",
    "num_nodes",
    "req_nodes",
    "exc_nodes",
    "gres_per_node",
    "num_tasks",
    "tasks_per_node",
    "start_soon",
)


class SimBackend(OneAtATime):
    """The Backend protocol over a simulated cluster (module doc), and
    nothing else: whoever drives the world moves its clock.

    ``SimBackend(world)`` shows `world`; ``SimBackend(cluster, **options)``
    one of its own, ``SimWorld(cluster, **options)``, whose clock nobody
    moves (what ``get_backend("sim")`` gives)."""

    name = "sim"

    def __init__(self, world: SimWorld | ClusterSpec, **options: Any) -> None:
        if isinstance(world, ClusterSpec):
            world = SimWorld(world, **options)
        elif options:
            raise TypeError(f"SimBackend: options {sorted(options)} are for a world of its own, not a given one")
        self._world = world
        self._node_partitions = {n: (x.gpu_type, "all") for n, x in world.nodes.items()}
        self._partitions = tuple(SlurmPartition(p, ns, "UP", p == "all") for p, ns in world.partitions.items())

    # --- reading ---------------------------------------------------------------

    def observe(self) -> ClusterSnapshot:
        w = self._world
        w.observe_calls += 1
        w.purge()
        nodes = tuple(_node_record(n, self._node_partitions[n.name]) for n in w.nodes.values())
        jobs = tuple(_job_record(j, w.now) for j in w.jobs.values())
        return ClusterSnapshot(nodes=nodes, partitions=self._partitions, jobs=jobs, taken_at=w.now)

    def read_site(self) -> SiteReading:
        """None to read: a simulation's site policy (slurm_ext.sim.site) reaches the policies with each request."""
        return SiteReading()

    def _get(self, job_id: str) -> SimJob:
        check_job_id(job_id)
        job = self._world.jobs.get(job_id)
        if job is None:
            raise SlurmCommandError(["sim", job_id], 1, "Invalid job id specified")
        return job

    # --- writing ---------------------------------------------------------------

    def submit(self, req: SubmitRequest) -> str:
        w = self._world
        partition = req.partition or "all"
        for p in partition.split(","):
            if p not in w.partitions:
                raise SlurmCommandError(
                    ["sbatch", f"--partition={partition}"], 1, "sbatch: error: invalid partition specified: " + p
                )
        job_id, seq = w.new_job_id()
        try:
            spec: JobSpec | None = JobSpec.from_comment(req.comment)
        except JobSpecError:
            spec = None
        w.submit(
            SimJob(
                job_id=job_id,
                seq=seq,
                name=req.job_name or req.script.rsplit("/", 1)[-1],
                user=w.user,
                submit_time=w.now,
                partition=partition,
                gres=req.gres_per_node,
                num_nodes=req.nodes or 1,
                comment=req.comment or "",
                features=req.constraint or "",
                held=req.hold,
                hold_reason="JobHeldUser" if req.hold else "",
                work_dir=req.workdir or "",
                num_tasks=None if req.ntasks_per_node is None else req.ntasks_per_node * (req.nodes or 1),
                tasks_per_node=req.ntasks_per_node,
                begin_time=w.now,
                spec=spec,
                qos=req.qos or "",
                time_limit=minutes(req.time_limit) if req.time_limit is not None else None,
            )
        )
        return job_id

    def update(self, job_id: str, change: JobUpdate) -> SlurmJob:
        w = self._world
        job = self._get(job_id)
        failures: list[str] = []
        if job.state != "PENDING":
            if change.admin_comment is not None:
                job.admin_comment = change.admin_comment
            if any(getattr(change, f) not in (None, False) for f in _PENDING_ONLY):
                failures.append(f"Job is no longer pending execution for job {job_id}")
        else:
            if change.partition is not None:
                if change.partition in w.partitions:
                    job.partition = change.partition
                else:
                    failures.append("Invalid partition name specified")
            if change.features is not None:
                job.features = change.features
            if change.num_nodes is not None:
                job.num_nodes = change.num_nodes
            for name, attr in (("req_nodes", "required"), ("exc_nodes", "excluded")):
                nodes = getattr(change, name)
                if nodes is not None:
                    unknown = [n for n in nodes if n not in w.nodes]
                    if unknown:
                        failures.append(f"Invalid node name specified ({unknown[0]})")
                    else:
                        setattr(job, attr, tuple(sorted(nodes)))
            if change.gres_per_node is not None:
                job.gres = change.gres_per_node
            if change.num_tasks is not None:
                job.num_tasks = change.num_tasks
            if change.tasks_per_node is not None:
                job.tasks_per_node = change.tasks_per_node
            if change.admin_comment is not None:
                job.admin_comment = change.admin_comment
            if change.start_soon:
                job.begin_time = w.now
            w.kick()
        w.changed(job)
        rec = _job_record(job, w.now)
        part_nodes = None
        if rec.required_nodes:
            part_nodes = {n for p in rec.partition.split(",") for n in w.partitions.get(p, ())}
        bad = update_mismatches(rec, change, part_nodes)
        detail = "; ".join(failures)
        if bad:
            raise UpdateNotApplied(job_id, bad, rec, detail)
        if failures:
            raise SlurmCommandError(["scontrol", "update", f"JobId={job_id}"], 1, detail)
        return rec

    def hold(self, job_id: str) -> None:
        job = self._get(job_id)
        if job.state != "PENDING":
            raise SlurmCommandError(["scontrol", "hold", job_id], 1, "Job is no longer pending execution")
        self._world.hold(job, "JobHeldAdmin")

    def release(self, job_id: str) -> None:
        job = self._get(job_id)
        if job.state != "PENDING":
            raise SlurmCommandError(["scontrol", "release", job_id], 1, "Job is no longer pending execution")
        self._world.release(job)

    def requeue(self, job_id: str, *, hold: bool = False) -> None:
        job = self._get(job_id)
        if job.state == "PENDING":
            raise SlurmCommandError(
                ["scontrol", "requeuehold" if hold else "requeue", job_id], 1, "Job is pending execution"
            )
        self._world.requeue(job, hold)

    def cancel(self, job_id: str) -> None:
        self._world.cancel(self._get(job_id))

    def signal(self, job_id: str, signal: str, *, target: str = BATCH) -> None:
        job = self._get(job_id)
        check_signal(signal)
        check_signal_target(target)
        sig = signal.upper().removeprefix("SIG")
        if job.state == "PENDING":
            raise SlurmCommandError(["scancel", f"--signal={signal}", job_id], 1, "Job is pending execution")
        if not job.running:
            raise SlurmCommandError(
                ["scancel", f"--signal={signal}", job_id], 1, "Job/step already completing or completed"
            )
        to_launcher = target in (STEPS, ALL)
        elastic = job.spec is not None and job.spec.elastic
        if to_launcher and sig in _CHECKPOINT_SIGNALS and elastic:
            self._world.checkpoint(job)
            return
        if sig in _KILL_SIGNALS:  # the launcher or the batch shell dies: so does the job
            self._world.end(job, "FAILED", _KILL_SIGNALS[sig])


def sim_backend(*, cluster: ClusterSpec | None = None, **options: Any) -> SimBackend:
    """``get_backend("sim", ...)``: the ``cellsched.backends`` entry point
    (pyproject.toml). A world of its own on `cluster` (default: Arena's
    simulated cluster) with `options` (SimWorld's), whose clock nobody moves."""
    return SimBackend(arena_cluster() if cluster is None else cluster, **options)


# --- how Slurm shows the world's nodes and jobs (cached on them until they change) ---


def _node_record(n: SimNode, partitions: tuple[str, ...]) -> SlurmNode:
    if n.record is None:
        if n.down:
            state = "down"
        else:
            state = "idle" if n.alloc == 0 else ("allocated" if n.alloc >= n.gpus else "mixed")
        n.record = SlurmNode(
            name=n.name,
            address="127.0.0.1",
            partitions=partitions,
            features=(n.gpu_type,),
            gpu_type=n.gpu_type,
            gpus_total=n.gpus,
            gpus_alloc=n.alloc,
            cpus_total=4 * n.gpus,
            cpus_alloc=4 * n.alloc,
            state=state,
            flags=("DRAIN",) if n.drain else (),
            reason=n.reason,
        )
    return n.record


def _job_record(j: SimJob, now: float) -> SlurmJob:
    if j.record is None:
        j.record = SlurmJob(
            job_id=j.job_id,
            name=j.name,
            user=j.user,
            state=j.state,
            reason=_reason(j, now),
            partition=j.partition,
            nodes=j.nodes,
            num_nodes=len(j.nodes) if j.nodes else j.num_nodes,
            gpus_per_node=j.gres or None,
            gpu_type=None,
            held=j.held and j.state == "PENDING",
            features=j.features,
            required_nodes=j.required,
            excluded_nodes=j.excluded,
            comment=j.comment,
            admin_comment=j.admin_comment,
            submit_time=j.submit_time,
            start_time=j.start_time,
            eligible_time=j.begin_time if j.state == "PENDING" else None,
            end_time=j.end_time if j.finished else None,
            exit_code=j.exit_code if j.finished else None,
            time_limit=j.time_limit,
            batch_host=j.nodes[0] if j.running and j.nodes else "",
            num_tasks=j.num_tasks,
            tasks_per_node=j.tasks_per_node,
            work_dir=j.work_dir,
            preempted_at=j.preempt_at,
        )
    return j.record


def _reason(j: SimJob, now: float) -> str:
    if j.state == "PENDING":
        if j.held:
            return j.hold_reason
        if j.begin_time > now:
            return "BeginTime"
        return j.reason or "Resources"
    if j.state == "FAILED":
        return "NonZeroExitCode"
    if j.state == "NODE_FAIL":
        return "NodeDown"
    return ""
