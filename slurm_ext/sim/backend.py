"""A simulated Slurm: the Backend protocol over an in-memory cluster and a
simulated clock (``SimBackend``).

It mirrors what the cli backend shows of a real Slurm 22.05 (see
reference/slurm-22.05/NOTES.md and tests/slurm_ext/backends/):

* nodes ``<type>-<NNN>`` with typed GRES ``gpu:<type>:N`` and
  ``Features=<type>``; one partition per GPU type plus ``all`` (the default);
* ``submit`` with ``hold`` gives a PENDING job with reason JobHeldUser;
  ``hold`` an admin hold (JobHeldAdmin); updates apply to pending jobs only
  (on any other job only AdminComment sticks, the rest is refused with
  "Job is no longer pending execution"); a ReqNodeList outside the job's
  partition is accepted and reported through `update_mismatches`, like the
  cli backend does (the job would pend forever with BadConstraints);
* a released job starts as soon as its ReqNodeList nodes (else any nodes of
  its partition with its features) have its GPUs free, after
  `start_delay_s` (Slurm's own scheduler);
* ``requeue`` of a running or finished job: PENDING again (held with
  ``hold``: JobHeldUser), not eligible for `requeue_delay_s` (reason
  BeginTime; `start_soon` in an update lifts it at once: a simulated job
  has no credential to revoke), restart count + 1;
  progress falls back to the last checkpoint;
* ``signal(USR1|TERM, target="steps"|"all")`` to a running elastic job: the
  launcher checkpoints; after `checkpoint_s` the job ends FAILED with exit
  code 75 (the launch runtime's "checkpointed" convention) keeping the whole
  iterations done at the signal. A non-elastic job ignores USR1 (TERM, KILL
  end it);
* ``set_node_state(name, "down")`` ends the jobs running there NODE_FAIL and
  requeues them at once, as Slurm does with JobRequeue=1 (its default): they
  come back PENDING, NOT held, reason BeginTime (``node_fail_requeue=False``
  leaves them NODE_FAIL). Their progress falls back to the last checkpoint.
  A job that still requires the down node pends with ReqNodeNotAvail;
* finished jobs vanish from observe() `min_job_age_s` after they end
  (Slurm's MinJobAge).

Not modelled: COMPLETING (a requeue is instantaneous), CPUs and memory as
limits, priorities (eligible jobs start in submit order, each as soon as it
fits, like backfill without reservations), time limits.

Progress: a running job progresses at ``speed(spec, gpu_type, num_nodes,
gpus_per_node, plan)`` seconds per iteration (times ``speed_factor(job id,
GPU type)`` when given: noise on the truth) after a restart stall of
``restart_cost(spec, gpus, first_start)`` seconds, and completes (exit 0)
after its iterations. With `quantum_s` set (Arena-compatible rounds) the
backend schedules no completions itself: the engine calls `settle(now)` at
each round start, which accounts the round and completes the jobs whose work
is done then (see `settle`).

Each run is counted by its kind of cell (`run_kinds`: single-type, mixed
data-parallel, mixed pipeline, state-sharded), in the job's account.

Contention (`network`, slurm_ext.sim.network; not in quantum mode): a
multi-node job runs at its speed carried to its nodes' NICs, and the jobs
that communicate over one NIC or rack uplink at once slow each other; their
speeds (and completions) change whenever one of them starts, ends, leaves
its restart stall or begins a checkpoint.
"""

from __future__ import annotations

import heapq
import math
import signal as signals
from collections.abc import Callable
from dataclasses import dataclass, field

from slurm_ext.backends.base import (
    ALL,
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
from slurm_ext.jobspec import JobSpec, JobSpecError
from slurm_ext.records import ClusterSnapshot, SlurmJob, SlurmNode, SlurmPartition
from slurm_ext.sim.network import Comm, NetworkTruth
from slurm_ext.sim.types import MIXED_DP, MIXED_PIPELINE, SINGLE, STATE_SHARDED, ClusterSpec, KindUse
from solver.contract import CHECKPOINT_SIGNALS, EXIT_CHECKPOINTED, admin_comment_plan
from solver.plan import JobPlan

#: progress models in quantum (round) mode
EXECUTED_SECONDS, ITERATIONS = "executed-seconds", "iterations"

#: speed(spec, gpu_type, num_nodes, gpus_per_node, plan) -> seconds per iteration, None = infeasible
SpeedFn = Callable[[JobSpec, str, int, int, "JobPlan | None"], "float | None"]
#: restart_cost(spec, gpus, first_start) -> seconds before a (re)started job progresses
RestartCostFn = Callable[[JobSpec, int, bool], float]
#: listener(kind, job_id): "submit", "start", "stall-end", "end", "requeue", "node"
Listener = Callable[[str, str], None]

#: the launcher's checkpoint signals, by name and by number (as scancel takes them)
_CHECKPOINT_SIGNALS = frozenset(CHECKPOINT_SIGNALS) | {
    str(signals.Signals[f"SIG{n}"].value) for n in CHECKPOINT_SIGNALS
}
_KILL_SIGNALS = {"TERM": 143, "15": 143, "KILL": 137, "9": 137, "INT": 130, "2": 130}


def _no_cost(spec: JobSpec, gpus: int, first_start: bool) -> float:
    return 0.0


def cluster_nodes(spec: ClusterSpec) -> list[tuple[str, str, int]]:
    """(name, GPU type, GPUs) of the cluster's nodes (slurm_ext.sim.clusterspec naming)."""
    from slurm_ext.sim.clusterspec import node_names

    return node_names(spec)


@dataclass
class _Node:
    name: str
    gpu_type: str
    gpus: int
    alloc: int = 0
    down: bool = False
    drain: bool = False
    reason: str = ""
    record: SlurmNode | None = None

    @property
    def usable(self) -> bool:
        return not self.down and not self.drain


@dataclass
class SimJob:
    """One job as the simulated slurmctld keeps it, plus its simulated run
    (iterations done, the restart stall, the accounting the report reads)."""

    job_id: str
    seq: int
    name: str
    user: str
    submit_time: float
    partition: str
    gres: int
    num_nodes: int
    comment: str = ""
    admin_comment: str = ""
    features: str = ""
    state: str = "PENDING"
    held: bool = False
    hold_reason: str = ""
    required: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    num_tasks: int | None = None
    tasks_per_node: int | None = None
    work_dir: str = ""
    begin_time: float = 0.0
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    nodes: tuple[str, ...] = ()
    reason: str = ""
    # --- the simulated run
    spec: JobSpec | None = None
    iter_time: float | None = None
    comm: Comm | None = None  # its network use alone (contention); None: one node or not modelled
    complete_at: float = math.inf  # when its pending completion event is due (continuous mode)
    done: float = 0.0  # iterations done (strict model; continuous mode)
    exec_s: float = 0.0  # seconds executed (Arena's executed-seconds model)
    ckpt_done: float = 0.0  # progress at the last checkpoint / start
    ckpt_exec_s: float = 0.0
    accrue_from: float = 0.0  # progress accrues from here (after the stall)
    penalty_left: float = 0.0  # quantum mode: seconds of progress the restart costs
    stall_until: float = 0.0
    checkpointing: bool = False
    epoch: int = 0  # bumps on every start / end: stale events are dropped
    restarts: int = 0  # Slurm's restart count (requeues)
    starts: int = 0
    first_start: float | None = None
    gpu_seconds: float = 0.0
    cells: list[str] = field(default_factory=list)
    run_kinds: tuple[str, ...] = ()  # the kinds of cell of its current run (`run_kinds`)
    kinds: dict[str, KindUse] = field(default_factory=dict)
    infeasible: bool = False
    record: SlurmJob | None = None

    @property
    def gpus(self) -> int:
        return self.gres * len(self.nodes)

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def finished(self) -> bool:
        return self.state not in ("PENDING", "RUNNING")


@dataclass(frozen=True)
class JobAccount:
    """What became of one job: its first start; its end when it completed;
    its restarts (starts after the first); GPU-seconds held; the cells it
    ran in, in order (a cell repeated back to back once); its runs by kind
    of cell (`run_kinds`)."""

    first_start: float | None
    end_time: float | None
    completed: bool
    restarts: int
    gpu_seconds: float
    cells: tuple[str, ...]
    kinds: dict[str, KindUse] = field(default_factory=dict)


def run_kinds(gpu_types: list[str] | tuple[str, ...], plan: JobPlan | None) -> tuple[str, ...]:
    """The kinds of cell (slurm_ext.sim.types.CELL_KINDS) a run on nodes of
    `gpu_types` with `plan` counts under: SINGLE, MIXED_DP or MIXED_PIPELINE
    (plan pp > 1), plus STATE_SHARDED when the plan shards the optimizer
    state ("even" or "memory"; state_shares alone mean "memory")."""
    pp = plan.pp if plan is not None else 1
    kinds = [SINGLE if len(set(gpu_types)) < 2 else (MIXED_PIPELINE if pp > 1 else MIXED_DP)]
    if plan is not None and (
        plan.state_sharding in ("even", "memory") or (plan.state_sharding is None and plan.state_shares)
    ):
        kinds.append(STATE_SHARDED)
    return tuple(kinds)


class SimBackend(OneAtATime):
    """The Backend protocol over a simulated cluster; the engine drives its
    clock with `advance` (and `settle` in quantum mode)."""

    name = "sim"

    def __init__(
        self,
        cluster: ClusterSpec,
        *,
        speed: SpeedFn | None = None,
        restart_cost: RestartCostFn | None = None,
        checkpoint_s: float = 5.0,
        start_delay_s: float = 0.0,
        min_job_age_s: float = 300.0,
        requeue_delay_s: float = 120.0,
        node_fail_requeue: bool = True,
        quantum_s: float | None = None,
        progress_model: str = EXECUTED_SECONDS,
        start_time: float = 0.0,
        user: str = "sim",
        listener: Listener | None = None,
        speed_factor: Callable[[str, str], float] | None = None,
        network: NetworkTruth | None = None,
    ) -> None:
        for name, value in (
            ("checkpoint_s", checkpoint_s),
            ("start_delay_s", start_delay_s),
            ("min_job_age_s", min_job_age_s),
            ("requeue_delay_s", requeue_delay_s),
        ):
            if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                raise ValueError(f"SimBackend: {name} must be a number >= 0, got {value!r}")
        if quantum_s is not None and not quantum_s > 0:
            raise ValueError(f"SimBackend: quantum_s must be > 0, got {quantum_s!r}")
        if progress_model not in (EXECUTED_SECONDS, ITERATIONS):
            raise ValueError(
                f"SimBackend: progress_model must be {EXECUTED_SECONDS!r} or {ITERATIONS!r}, got {progress_model!r}"
            )
        self.speed = speed
        self.restart_cost = restart_cost or _no_cost
        self.speed_factor = speed_factor  # (job id, GPU type) -> factor on the speed's time (noise)
        if network is not None and quantum_s is not None:
            raise ValueError("SimBackend: contention (network) is not modelled in quantum (arena-compat) mode")
        self.network = network
        self.checkpoint_s = float(checkpoint_s)
        self.start_delay_s = float(start_delay_s)
        self.min_job_age_s = float(min_job_age_s)
        self.requeue_delay_s = float(requeue_delay_s)
        self.node_fail_requeue = node_fail_requeue
        self.quantum_s = quantum_s
        self.progress_model = progress_model
        self.user = user
        self.listener = listener
        self.now = float(start_time)
        self.nodes: dict[str, _Node] = {}
        for name, gpu_type, gpus in cluster_nodes(cluster):
            self.nodes[name] = _Node(name, gpu_type, gpus)
        types = sorted({n.gpu_type for n in self.nodes.values()})
        if "all" in types:
            raise ValueError("SimBackend: a GPU type may not be called 'all' (the partition of every node)")
        self.partitions: dict[str, tuple[str, ...]] = {
            t: tuple(n for n, x in self.nodes.items() if x.gpu_type == t) for t in types
        }
        self.partitions["all"] = tuple(self.nodes)
        self._node_partitions = {n: (x.gpu_type, "all") for n, x in self.nodes.items()}
        self._partition_records = tuple(SlurmPartition(p, ns, "UP", p == "all") for p, ns in self.partitions.items())
        self.jobs: dict[str, SimJob] = {}  # what observe() shows
        self.all_jobs: dict[str, SimJob] = {}  # every job ever submitted (the engine's accounting)
        self.eligible: dict[str, SimJob] = {}  # pending, not held (waiting for resources or their begin time)
        self.running: dict[str, SimJob] = {}
        self._next_id = 1
        self._events: list[tuple[float, int, str, str, int]] = []
        self._seq = 0
        self._sched_at: float | None = None
        self._sched_times: set[float] = set()  # begin times with a scheduler pass queued
        self.infeasible_starts = 0
        self.observe_calls = 0

    # --- the clock -----------------------------------------------------------

    def next_event_time(self) -> float:
        """When the next job event (start, stall end, completion, checkpoint) is due; inf when none."""
        while self._events and not self._live(self._events[0]):
            heapq.heappop(self._events)
        return self._events[0][0] if self._events else math.inf

    def advance(self, until: float) -> None:
        """Process every event due at or before `until`, in time order; the clock ends at `until`."""
        while True:
            t = self.next_event_time()
            if t > until:
                break
            when, _, kind, job_id, _epoch = heapq.heappop(self._events)
            self.now = max(self.now, when)
            self._fire(kind, job_id)
        self.now = max(self.now, until)

    def due_now(self) -> bool:
        """Are events due at the current time (e.g. a checkpoint of 0 s)?"""
        return self.next_event_time() <= self.now

    def _push(self, when: float, kind: str, job_id: str = "", epoch: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, kind, job_id, epoch))

    def _live(self, ev: tuple[float, int, str, str, int]) -> bool:
        when, _, kind, job_id, epoch = ev
        if kind == "sched":
            return True
        job = self.jobs.get(job_id)
        if job is None or job.epoch != epoch:
            return False
        return kind != "complete" or self.quantum_s is not None or when == job.complete_at

    def _fire(self, kind: str, job_id: str) -> None:
        if kind == "sched":
            self._sched_times.discard(self.now)
            if self._sched_at is not None and self._sched_at <= self.now:
                self._sched_at = None
            self._schedule()
            return
        job = self.jobs[job_id]
        if kind == "stall-end":
            self._rerate(job)
            self._notify("stall-end", job_id)
        elif kind == "complete":
            self._accrue(job, self.now)
            job.done = float(job.spec.iterations) if job.spec else job.done
            self._end(job, "COMPLETED", 0)
        elif kind == "checkpoint":
            self._end(job, "FAILED", EXIT_CHECKPOINTED)

    def _notify(self, kind: str, job_id: str) -> None:
        if self.listener is not None:
            self.listener(kind, job_id)

    # --- reading ---------------------------------------------------------------

    def observe(self) -> ClusterSnapshot:
        self.observe_calls += 1
        self._purge()
        nodes = tuple(self._node_record(n) for n in self.nodes.values())
        jobs = tuple(self._job_record(j) for j in self.jobs.values())
        return ClusterSnapshot(nodes=nodes, partitions=self._partition_records, jobs=jobs, taken_at=self.now)

    def job(self, job_id: str) -> SlurmJob:
        return self._job_record(self._get(job_id))

    def _purge(self) -> None:
        limit = self.now - self.min_job_age_s
        old = [j for j in self.jobs.values() if j.finished and j.end_time is not None and j.end_time <= limit]
        for j in old:
            del self.jobs[j.job_id]

    def _node_record(self, n: _Node) -> SlurmNode:
        if n.record is None:
            if n.down:
                state = "down"
            else:
                state = "idle" if n.alloc == 0 else ("allocated" if n.alloc >= n.gpus else "mixed")
            n.record = SlurmNode(
                name=n.name,
                address="127.0.0.1",
                partitions=self._node_partitions[n.name],
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

    def _job_record(self, j: SimJob) -> SlurmJob:
        if j.record is None:
            j.record = SlurmJob(
                job_id=j.job_id,
                name=j.name,
                user=j.user,
                state=j.state,
                reason=self._reason(j),
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
                time_limit=None,
                batch_host=j.nodes[0] if j.running and j.nodes else "",
                num_tasks=j.num_tasks,
                tasks_per_node=j.tasks_per_node,
                work_dir=j.work_dir,
            )
        return j.record

    def _reason(self, j: SimJob) -> str:
        if j.state == "PENDING":
            if j.held:
                return j.hold_reason
            if j.begin_time > self.now:
                return "BeginTime"
            return j.reason or "Resources"
        if j.state == "FAILED":
            return "NonZeroExitCode"
        if j.state == "NODE_FAIL":
            return "NodeDown"
        return ""

    def _get(self, job_id: str) -> SimJob:
        check_job_id(job_id)
        job = self.jobs.get(job_id)
        if job is None:
            raise SlurmCommandError(["sim", job_id], 1, "Invalid job id specified")
        return job

    def _changed(self, job: SimJob) -> None:
        job.record = None

    # --- progress --------------------------------------------------------------

    def iterations_done(self, job_id: str) -> float | None:
        """The job's exact iterations done now (None for an unknown job)."""
        job = self.jobs.get(job_id)
        if job is None:
            return None
        return self._progress(job, self.now)

    def first_step_at(self, job_id: str) -> float | None:
        """When the first iteration after the job's last (re)start ended
        (None before that): what the launcher writes as first_step_at."""
        job = self.jobs.get(job_id)
        if job is None or job.start_time is None or not job.iter_time:
            return None
        t = job.stall_until + job.iter_time
        return t if t <= self.now else None

    def iter_time(self, job_id: str) -> float | None:
        """The seconds per iteration the job runs at now, once it has made one
        step of its current run (what its launcher reports); else None."""
        job = self.running.get(job_id)
        if job is None or job.checkpointing or not job.iter_time:
            return None
        return job.iter_time if self.now >= job.stall_until + job.iter_time else None

    def _progress(self, job: SimJob, t: float) -> float:
        if self.quantum_s is not None and self.progress_model == EXECUTED_SECONDS:
            if not job.iter_time:
                return 0.0
            done = math.floor(job.exec_s / job.iter_time)
        else:
            done = job.done
            if (
                job.running
                and not job.checkpointing
                and job.iter_time
                and self.quantum_s is None
                and t > job.accrue_from
            ):
                done += (t - job.accrue_from) / job.iter_time
        return float(min(done, job.spec.iterations)) if job.spec else float(done)

    def _accrue(self, job: SimJob, t: float) -> None:
        """Add the progress made up to `t` (a running job out of its stall)."""
        if not job.running or job.checkpointing or not job.iter_time or t <= job.accrue_from:
            return
        dt = t - job.accrue_from
        job.accrue_from = t
        if job.penalty_left > 0:
            skip = min(dt, job.penalty_left)
            job.penalty_left -= skip
            dt -= skip
        job.exec_s += dt
        job.done += dt / job.iter_time

    def settle(self, now: float) -> list[str]:
        """Quantum mode, at a round start: account the round for every
        running job and complete those whose work is done (they end now, at
        the round boundary where the completion is detected). Returns the
        ids completed."""
        if self.quantum_s is None:
            raise RuntimeError("settle() is for quantum (arena-compat) mode")
        self.advance(now)
        ended = []
        for job in list(self.running.values()):
            self._accrue(job, now)
            if job.spec is None or job.checkpointing or not job.iter_time:
                continue
            if self.progress_model == EXECUTED_SECONDS:
                remaining = job.spec.iterations - math.floor(job.exec_s / job.iter_time)
            else:
                remaining = job.spec.iterations - job.done
            if remaining <= 0:
                job.done = float(job.spec.iterations)
                self._end(job, "COMPLETED", 0)
                ended.append(job.job_id)
        return ended

    def throughput(self) -> float:
        """Samples/s of the running jobs out of their restart stall."""
        total = 0.0
        for j in self.running.values():
            if j.iter_time and not j.checkpointing and self.now >= j.stall_until and j.spec is not None:
                total += j.spec.global_batch / j.iter_time
        return total

    def round_throughput(self, start: float) -> float:
        """Quantum mode: samples/s of the running jobs over the round
        [start, start + quantum_s), as Arena counts it: each job at its
        speed, less its restart stall's share of the round."""
        if self.quantum_s is None:
            raise RuntimeError("round_throughput() is for quantum (arena-compat) mode")
        q = self.quantum_s
        thr = 0.0
        for j in self.running.values():
            if j.iter_time and j.spec is not None and not j.checkpointing:
                stalled = min(q, max(0.0, j.stall_until - start))
                thr += j.spec.global_batch / j.iter_time * (1.0 - stalled / q)
        return thr

    def gpus_used(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.nodes.values():
            if n.alloc:
                out[n.gpu_type] = out.get(n.gpu_type, 0) + n.alloc
        return out

    # --- counts and accounting (what the engine samples and reports) -----------

    def num_pending(self) -> int:
        """Jobs pending (held or not)."""
        return sum(1 for j in self.jobs.values() if j.state == "PENDING")

    def num_running(self) -> int:
        return len(self.running)

    def has_active_jobs(self) -> bool:
        """Is a job running, or pending without a hold (it starts without the controller)?"""
        return bool(self.running or self.eligible)

    def is_completed(self, job_id: str) -> bool:
        """Did the job (any job ever submitted) complete?"""
        return self.all_jobs[job_id].state == "COMPLETED"

    def account(self, job_id: str) -> JobAccount:
        """What became of a job ever submitted (see JobAccount)."""
        j = self.all_jobs[job_id]
        cells: list[str] = []
        for c in j.cells:
            if not cells or cells[-1] != c:
                cells.append(c)
        done = j.state == "COMPLETED"
        return JobAccount(
            j.first_start,
            j.end_time if done else None,
            done,
            max(0, j.starts - 1),
            j.gpu_seconds,
            tuple(cells),
            dict(j.kinds),
        )

    # --- writing ---------------------------------------------------------------

    def submit(self, req: SubmitRequest) -> str:
        partition = req.partition or "all"
        for p in partition.split(","):
            if p not in self.partitions:
                raise SlurmCommandError(
                    ["sbatch", f"--partition={partition}"], 1, "sbatch: error: invalid partition specified: " + p
                )
        job_id = str(self._next_id)
        self._next_id += 1
        try:
            spec = JobSpec.from_comment(req.comment)
        except JobSpecError:
            spec = None
        job = SimJob(
            job_id=job_id,
            seq=self._next_id,
            name=req.job_name or req.script.rsplit("/", 1)[-1],
            user=self.user,
            submit_time=self.now,
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
            begin_time=self.now,
            spec=spec,
        )
        self.jobs[job_id] = self.all_jobs[job_id] = job
        if not job.held:
            self.eligible[job_id] = job
            self._kick()
        self._notify("submit", job_id)
        return job_id

    def update(self, job_id: str, change: JobUpdate) -> SlurmJob:
        job = self._get(job_id)
        failures: list[str] = []
        if job.state != "PENDING":
            if change.admin_comment is not None:
                job.admin_comment = change.admin_comment
            others = any(
                getattr(change, f) not in (None, False)
                for f in (
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
            )
            if others:
                failures.append(f"Job is no longer pending execution for job {job_id}")
        else:
            if change.partition is not None:
                if change.partition in self.partitions:
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
                    unknown = [n for n in nodes if n not in self.nodes]
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
                job.begin_time = self.now
            self._kick()
        self._changed(job)
        rec = self._job_record(job)
        part_nodes = None
        if rec.required_nodes:
            part_nodes = {n for p in rec.partition.split(",") for n in self.partitions.get(p, ())}
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
        job.held, job.hold_reason = True, "JobHeldAdmin"
        self.eligible.pop(job_id, None)
        self._changed(job)

    def release(self, job_id: str) -> None:
        job = self._get(job_id)
        if job.state != "PENDING":
            raise SlurmCommandError(["scontrol", "release", job_id], 1, "Job is no longer pending execution")
        if job.held:
            job.held, job.hold_reason = False, ""
            self.eligible[job_id] = job
            self._changed(job)
            self._kick()

    def requeue(self, job_id: str, *, hold: bool = False) -> None:
        job = self._get(job_id)
        if job.state == "PENDING":
            raise SlurmCommandError(
                ["scontrol", "requeuehold" if hold else "requeue", job_id], 1, "Job is pending execution"
            )
        if job.running:
            self._end(job, "REQUEUED", None, notify=False)
        self._requeue(job, hold)
        self._kick()

    def _requeue(self, job: SimJob, hold: bool) -> None:
        job.state = "PENDING"
        job.nodes = ()
        job.start_time = job.end_time = job.exit_code = None
        job.restarts += 1
        job.begin_time = self.now + self.requeue_delay_s
        job.done, job.exec_s = job.ckpt_done, job.ckpt_exec_s
        job.held, job.hold_reason = hold, "JobHeldUser" if hold else ""
        if hold:
            self.eligible.pop(job.job_id, None)
        else:
            self.eligible[job.job_id] = job
        self._changed(job)
        self._notify("requeue", job.job_id)

    def cancel(self, job_id: str) -> None:
        job = self._get(job_id)
        if job.finished:
            return
        if job.running:
            self._end(job, "CANCELLED", 143)
        else:
            job.state, job.end_time, job.exit_code = "CANCELLED", self.now, 0
            self.eligible.pop(job_id, None)
            self._changed(job)
            self._notify("end", job_id)

    def signal(self, job_id: str, signal: str, *, target: str = "batch") -> None:
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
            if not job.checkpointing:
                self._accrue(job, self.now)
                job.checkpointing = True
                job.done = math.floor(job.done)
                job.ckpt_done, job.ckpt_exec_s = job.done, job.exec_s
                self._push(self.now + self.checkpoint_s, "checkpoint", job_id, job.epoch)
                self._rerate(job)
            return
        if sig in _KILL_SIGNALS:  # the launcher or the batch shell dies: so does the job
            self._end(job, "FAILED", _KILL_SIGNALS[sig])

    def set_node_state(self, name: str, state: str) -> None:
        """ "down" (its running jobs fail, and are requeued), "drain" (no new
        work) or "idle" (back in service)."""
        node = self.nodes.get(name)
        if node is None:
            raise ValueError(f"unknown node {name!r}")
        if state not in ("down", "drain", "idle"):
            raise ValueError(f"node state must be 'down', 'drain' or 'idle', got {state!r}")
        node.down, node.drain = state == "down", state == "drain"
        node.reason = "" if state == "idle" else f"sim: {state}"
        node.record = None
        if node.down:
            for job in [j for j in self.running.values() if name in j.nodes]:
                self._end(job, "NODE_FAIL", 1)
                if self.node_fail_requeue:
                    self._requeue(job, hold=False)
        self._notify("node", name)
        self._kick()

    # --- Slurm's scheduler -------------------------------------------------------

    def _kick(self) -> None:
        """Run the scheduler now (or after start_delay_s)."""
        if not self.eligible:
            return
        if self.start_delay_s <= 0:
            self._schedule()
            return
        when = self.now + self.start_delay_s
        if self._sched_at is None or self._sched_at > when:
            self._sched_at = when
            self._push(when, "sched")

    def _schedule(self) -> None:
        for job in sorted(self.eligible.values(), key=lambda j: j.seq):
            if job.begin_time > self.now:
                if job.begin_time not in self._sched_times:
                    self._sched_times.add(job.begin_time)
                    self._push(job.begin_time, "sched")
                continue
            nodes, why = self._fit(job)
            if nodes is None:
                if job.reason != why:
                    job.reason = why
                    self._changed(job)
                continue
            self._start(job, nodes)

    def _fit(self, job: SimJob) -> tuple[tuple[str, ...] | None, str]:
        allowed = {n for p in job.partition.split(",") for n in self.partitions.get(p, ())}
        wanted = set(filter(None, job.features.replace("&", "|").split("|")))
        need_all = "&" in job.features

        def ok_features(n: _Node) -> bool:
            if not wanted:
                return True
            return n.gpu_type in wanted if not need_all else wanted == {n.gpu_type}

        if any(r not in allowed or not ok_features(self.nodes[r]) for r in job.required):
            return None, "BadConstraints"
        if len(job.required) > job.num_nodes:
            return None, "BadConstraints"
        if any(not self.nodes[r].usable for r in job.required):
            return None, "ReqNodeNotAvail"
        gres = max(job.gres, 0)
        if any(self.nodes[r].gpus - self.nodes[r].alloc < gres for r in job.required):
            return None, "Resources"
        chosen = list(job.required)
        if len(chosen) < job.num_nodes:
            free = [
                n
                for name, n in self.nodes.items()
                if name in allowed
                and name not in chosen
                and name not in job.excluded
                and n.usable
                and ok_features(n)
                and n.gpus - n.alloc >= gres
            ]
            if gres and not any(self.nodes[n].gpus >= gres for n in allowed):
                return None, "BadConstraints"
            free.sort(key=lambda n: (n.gpus - n.alloc, n.name))  # best fit
            if len(free) < job.num_nodes - len(chosen):
                return None, "Resources"
            chosen += [n.name for n in free[: job.num_nodes - len(chosen)]]
        return tuple(chosen), ""

    def _start(self, job: SimJob, nodes: tuple[str, ...]) -> None:
        self.eligible.pop(job.job_id, None)
        for n in nodes:
            self.nodes[n].alloc += job.gres
            self.nodes[n].record = None
        job.state, job.nodes, job.start_time, job.reason = "RUNNING", nodes, self.now, ""
        job.end_time = job.exit_code = None
        job.epoch += 1
        first = job.starts == 0
        job.starts += 1
        if job.first_start is None:
            job.first_start = self.now
        job.ckpt_done, job.ckpt_exec_s = job.done, job.exec_s
        self.running[job.job_id] = job
        self._changed(job)
        types: list[str] = []
        for n in nodes:
            if self.nodes[n].gpu_type not in types:
                types.append(self.nodes[n].gpu_type)
        gpu_type = "+".join(types)  # several: a mixed-type cell (solver.mixed)
        job.cells.append(f"{gpu_type}:{len(nodes)}x{job.gres}")
        job.iter_time, job.run_kinds = None, ()
        if job.spec is not None:
            plan = admin_comment_plan(job.admin_comment, strict=False)
            t = self.speed(job.spec, gpu_type, len(nodes), job.gres, plan) if self.speed and job.gres else None
            if t is None or not (t > 0 and math.isfinite(t)):
                job.infeasible = True
                self.infeasible_starts += 1
                self._notify("start", job.job_id)
                self._end(job, "FAILED", 1)
                return
            job.iter_time = float(t) * (self.speed_factor(job.job_id, gpu_type) if self.speed_factor else 1.0)
            job.run_kinds = run_kinds(types, plan)
            for k in job.run_kinds:
                use = job.kinds.get(k, KindUse())
                job.kinds[k] = KindUse(use.placements + 1, use.seconds, use.gpu_seconds)
            job.comm = None
            if self.network is not None and len(nodes) > 1:
                job.comm = self.network.alone(job.spec, gpu_type, nodes, job.gres, plan, job.iter_time)
                job.iter_time = job.comm.alone_s
            cost = max(0.0, float(self.restart_cost(job.spec, job.gpus, first)))
            if self.quantum_s is None:
                job.penalty_left = 0.0
                job.stall_until = job.accrue_from = self.now + cost
                if cost > 0:
                    self._push(job.stall_until, "stall-end", job.job_id, job.epoch)
                self._schedule_completion(job)
            else:
                # Arena: a charge within one round only lowers that round's
                # throughput; a longer one costs the job one round of progress
                job.accrue_from = self.now
                job.penalty_left = self.quantum_s if cost > self.quantum_s else 0.0
                job.stall_until = self.now + min(cost, self.quantum_s)
                if job.stall_until > self.now:
                    self._push(job.stall_until, "stall-end", job.job_id, job.epoch)
            self._rerate(job)
        self._notify("start", job.job_id)

    def _schedule_completion(self, job: SimJob) -> None:
        """(Re)push the completion of a running job at its current speed."""
        assert job.spec is not None and job.iter_time
        left = max(0.0, job.spec.iterations - job.done)
        job.complete_at = max(job.accrue_from, self.now) + left * job.iter_time
        self._push(job.complete_at, "complete", job.job_id, job.epoch)

    def _communicating(self, job: SimJob) -> bool:
        return (
            job.comm is not None
            and job.comm.net_s > 0
            and job.running
            and not job.checkpointing
            and self.now >= job.stall_until
        )

    def _rerate(self, changed: SimJob) -> None:
        """Contention: the speeds of the communicating jobs after `changed`
        started, stopped or stopped communicating; completions follow."""
        if self.network is None or changed.comm is None or not changed.comm.net_s:
            return
        talking = {j.job_id: (j.nodes, j.comm) for j in self.running.values() if self._communicating(j)}
        times = self.network.times(talking)  # type: ignore[arg-type]
        for j in list(self.running.values()):
            if j.comm is None or not j.comm.net_s or j.checkpointing or j.spec is None:
                continue
            new = times.get(j.job_id, j.comm.alone_s)
            if new == j.iter_time:
                continue
            self._accrue(j, self.now)
            j.iter_time = new
            self._schedule_completion(j)

    def _end(self, job: SimJob, state: str, exit_code: int | None, notify: bool = True) -> None:
        """The job stops running (state "REQUEUED": about to be requeued)."""
        if job.running:
            self._accrue(job, self.now)
            for n in job.nodes:
                self.nodes[n].alloc -= job.gres
                self.nodes[n].record = None
            held = self.now - (self.now if job.start_time is None else job.start_time)
            job.gpu_seconds += job.gpus * held
            for k in job.run_kinds:
                use = job.kinds[k]
                job.kinds[k] = KindUse(use.placements, use.seconds + held, use.gpu_seconds + job.gpus * held)
            job.run_kinds = ()
            self.running.pop(job.job_id, None)
            if state == "COMPLETED":
                job.ckpt_done, job.ckpt_exec_s = job.done, job.exec_s
            elif not (state == "FAILED" and exit_code == EXIT_CHECKPOINTED):
                job.done, job.exec_s = job.ckpt_done, job.ckpt_exec_s  # back to the last checkpoint
        was_talking = job.comm is not None and bool(job.comm.net_s)
        job.checkpointing = False
        job.epoch += 1
        job.state, job.end_time, job.exit_code = state, self.now, exit_code
        if was_talking:
            self._rerate(job)
        self.eligible.pop(job.job_id, None)
        self._changed(job)
        if notify:
            self._notify("end", job.job_id)
        self._kick()
