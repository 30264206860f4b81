"""The simulated cluster: its nodes and jobs as a simulated slurmctld keeps
them, Slurm's own scheduler, and each running job's simulated run
(``SimWorld``). slurm_ext.sim.backend.SimBackend shows it to the controller
through the Backend protocol; the engine (slurm_ext.sim.engine) moves its
clock (slurm_ext.sim.clock) and reads its counts; observers
(slurm_ext.sim.accounting, the engine) are told what happens to its jobs.

Slurm's side:

* nodes ``<type>-<NNN>`` (slurm_ext.sim.clusterspec naming); one partition
  per GPU type plus ``all``;
* an eligible job (pending, not held) starts as soon as its required nodes
  (else any nodes of its partition with its features) have its GPUs free,
  `start_delay_s` after it became eligible (Slurm's own scheduler); eligible
  jobs start in submit order, each as soon as it fits, like backfill without
  reservations; a job not yet at its begin time waits for it;
* a requeued job is PENDING again, not eligible for `requeue_delay_s`
  (its begin time), its restart count + 1, its progress back to its last
  checkpoint;
* `set_node_state(name, "down")` ends the jobs running there NODE_FAIL and
  requeues them at once, as Slurm does with JobRequeue=1 (its default):
  PENDING, NOT held (``node_fail_requeue=False`` leaves them NODE_FAIL);
* finished jobs leave the visible jobs (`purge`) `min_job_age_s` after they
  end (Slurm's MinJobAge); `all_jobs` keeps every job ever submitted;
* with a `preemption` (slurm_ext.sim.preempt: a QOS that preempts others)
  an eligible job of a QOS that preempts goes first, and when it does not
  fit it preempts running jobs of the QOS it preempts as Slurm's
  preempt/qos does (their PreemptTime, a checkpoint within their grace
  time, else killed at its end: requeued or PREEMPTED); without one the
  QOS of a job plays no part.

Not modelled: COMPLETING (a requeue is instantaneous), CPUs and memory as
limits, priorities (but a preempting QOS's), time limits.

The simulated run: a running job progresses at ``speed(spec, gpu_type,
num_nodes, gpus_per_node, plan)`` seconds per iteration (times
``speed_factor(job id, GPU type)`` when given: noise on the truth) after a
restart stall of ``restart_cost(spec, gpus, first_start)`` seconds, and
completes (exit 0) after its iterations; a job without a speed in its cell
(infeasible) fails at start (exit 1). A checkpoint (`checkpoint`) takes
`checkpoint_s`, after which the job ends FAILED with exit code 75 (the
launch runtime's "checkpointed" convention) keeping the whole iterations
done when it began. With a `quantum` (slurm_ext.sim.quantum, Arena's rounds)
the world schedules no completions itself: see QuantumMode.settle.

Contention (`network`, slurm_ext.sim.network; not in quantum mode): a
multi-node job runs at its speed carried to its nodes' NICs, and the jobs
that communicate over one NIC or rack uplink at once slow each other; their
speeds (and completions) change whenever one of them starts, ends, leaves
its restart stall or begins a checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from slurm_ext.records import SlurmJob, SlurmNode
from slurm_ext.sim.clock import Event, EventClock
from slurm_ext.sim.clusterspec import node_names
from slurm_ext.sim.network import Comm, NetworkTruth
from slurm_ext.sim.preempt import SlurmPreemption
from slurm_ext.sim.types import ClusterSpec
from solver.contract import EXIT_CHECKPOINTED, admin_comment_plan
from solver.contract.jobspec import JobSpec
from solver.contract.plan import JobPlan

#: speed(spec, gpu_type, num_nodes, gpus_per_node, plan) -> seconds per iteration, None = infeasible
SpeedFn = Callable[[JobSpec, str, int, int, "JobPlan | None"], "float | None"]
#: restart_cost(spec, gpus, first_start) -> seconds before a (re)started job progresses
RestartCostFn = Callable[[JobSpec, int, bool], float]


def _no_cost(spec: JobSpec, gpus: int, first_start: bool) -> float:
    return 0.0


@dataclass
class SimNode:
    """One node as the simulated slurmctld keeps it. `record` caches its
    SlurmNode (the backend's view; None whenever the node changed)."""

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
    (iterations done, the restart stall, its speed). `record` caches its
    SlurmJob (the backend's view; None whenever the job changed)."""

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
    restarts: int = 0  # Slurm's restart count (requeues)
    qos: str = ""
    time_limit: int | None = None  # minutes, as Slurm shows it (not enforced: slurm_ext.sim.types.TraceJob)
    preempt_at: float | None = None  # its PreemptTime: Slurm preempts it (slurm_ext.sim.preempt)
    # --- the simulated run
    spec: JobSpec | None = None
    work: float | None = None  # the iterations it really runs (None: its spec's; slurm_ext.sim.workload)
    iter_time: float | None = None
    comm: Comm | None = None  # its network use alone (contention); None: one node or not modelled
    contended_s: float = 0.0  # seconds of its runs lost to sharing links: slower than it ran alone
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
    starts: int = 0  # its runs so far (the first one may be charged differently)
    record: SlurmJob | None = None

    @property
    def gpus(self) -> int:
        return self.gres * len(self.nodes)

    @property
    def total(self) -> float:
        """The iterations after which it completes: its true work, else its spec's (0: no spec)."""
        if self.work is not None:
            return self.work
        return float(self.spec.iterations) if self.spec else 0.0

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def finished(self) -> bool:
        return self.state not in ("PENDING", "RUNNING")


class Rounds(Protocol):
    """Arena's rounds as the world uses them (slurm_ext.sim.quantum.QuantumMode,
    which drives the world through the rest)."""

    def charge(self, job: SimJob, cost: float, now: float) -> None:
        """A (re)start of `job` at `now` that costs `cost` seconds."""

    def iterations_done(self, job: SimJob) -> float:
        """The job's iterations done as of the last settlement."""


class Observer:
    """Told what happens to the world's jobs and nodes, as it happens; every
    hook does nothing here (an observer overrides those it needs)."""

    def submitted(self, job: SimJob) -> None:
        """The job was submitted."""

    def started(self, job: SimJob, cell: str) -> None:
        """The job got its nodes (cell: ``<type>[+<type>...]:<nodes>x<GPUs per node>``)."""

    def running(self, job: SimJob, gpu_types: tuple[str, ...], plan: JobPlan | None) -> None:
        """Its run began at its speed on nodes of `gpu_types`, with `plan` (its AdminComment's)."""

    def infeasible(self, job: SimJob) -> None:
        """Its cell has no speed: it fails at once."""

    def stall_ended(self, job: SimJob) -> None:
        """Its restart stall is over: it progresses."""

    def stopped(self, job: SimJob, held_s: float) -> None:
        """It left its nodes after `held_s` seconds (`ended`, `requeued` or both follow)."""

    def ended(self, job: SimJob) -> None:
        """It ended (not told for a job about to be requeued)."""

    def requeued(self, job: SimJob) -> None:
        """It is pending again."""

    def node_changed(self, name: str) -> None:
        """The node went down, was drained or came back."""


class SimWorld:
    """The simulated cluster (module doc), on its own clock."""

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
        quantum: Rounds | None = None,
        start_time: float = 0.0,
        user: str = "sim",
        observers: Sequence[Observer] = (),
        speed_factor: Callable[[str, str], float] | None = None,
        network: NetworkTruth | None = None,
        gate: Callable[[SimJob], str] | None = None,
        preemption: SlurmPreemption | None = None,
    ) -> None:
        """`gate(job)`: Slurm's limits at a start (slurm_ext.sim.site): the
        reason a job that fits may not start now (AssocGrpGRES, ...), or "".
        `preemption`: Slurm's own (slurm_ext.sim.preempt; None: no QOS preempts)."""
        for name, value in (
            ("checkpoint_s", checkpoint_s),
            ("start_delay_s", start_delay_s),
            ("min_job_age_s", min_job_age_s),
            ("requeue_delay_s", requeue_delay_s),
        ):
            if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                raise ValueError(f"SimWorld: {name} must be a number >= 0, got {value!r}")
        if network is not None and quantum is not None:
            raise ValueError("SimWorld: contention (network) is not modelled in quantum (arena-compat) mode")
        if preemption is not None and quantum is not None:
            raise ValueError("SimWorld: Slurm's preemption is not modelled in quantum (arena-compat) mode")
        self.speed = speed
        self.restart_cost = restart_cost or _no_cost
        self.speed_factor = speed_factor  # (job id, GPU type) -> factor on the speed's time (noise)
        self.network = network
        self.gate = gate
        self.preemption = preemption
        self.checkpoint_s = float(checkpoint_s)
        self.start_delay_s = float(start_delay_s)
        self.min_job_age_s = float(min_job_age_s)
        self.requeue_delay_s = float(requeue_delay_s)
        self.node_fail_requeue = node_fail_requeue
        self.quantum = quantum
        self.user = user  # who every submitted job runs as
        self.observers = list(observers)
        self.clock = EventClock(start_time)
        self.nodes: dict[str, SimNode] = {}
        for name, gpu_type, gpus in node_names(cluster):
            self.nodes[name] = SimNode(name, gpu_type, gpus)
        types = sorted({n.gpu_type for n in self.nodes.values()})
        if "all" in types:
            raise ValueError("SimWorld: a GPU type may not be called 'all' (the partition of every node)")
        #: partition -> its nodes: one per GPU type, and "all" (the default)
        self.partitions: dict[str, tuple[str, ...]] = {
            t: tuple(n for n, x in self.nodes.items() if x.gpu_type == t) for t in types
        }
        self.partitions["all"] = tuple(self.nodes)
        self.jobs: dict[str, SimJob] = {}  # what Slurm shows (until `purge`)
        self.all_jobs: dict[str, SimJob] = {}  # every job ever submitted
        self.eligible: dict[str, SimJob] = {}  # pending, not held (waiting for resources or their begin time)
        self.running: dict[str, SimJob] = {}
        self.observe_calls = 0  # how often the backend was asked for the cluster (the run's meta)
        self._next_id = 1
        self._sched_at: float | None = None
        self._sched_times: set[float] = set()  # begin times with a scheduler pass queued

    @property
    def now(self) -> float:
        return self.clock.now

    # --- the clock -----------------------------------------------------------

    def next_event_time(self) -> float:
        """When the next job event (start, stall end, completion, checkpoint) is due; inf when none."""
        return self.clock.next_time(self._live)

    def advance(self, until: float) -> None:
        """Process every event due at or before `until`, in time order; the clock ends at `until`."""
        while self.next_event_time() <= until:
            _, _, kind, job_id, _epoch = self.clock.pop()
            self._fire(kind, job_id)
        self.clock.move_to(until)

    def due_now(self) -> bool:
        """Are events due at the current time (e.g. a checkpoint of 0 s)?"""
        return self.next_event_time() <= self.now

    def _live(self, ev: Event) -> bool:
        when, _, kind, job_id, epoch = ev
        if kind == "sched":
            return True
        job = self.jobs.get(job_id)
        if job is None or job.epoch != epoch:
            return False
        return kind != "complete" or when == job.complete_at

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
            for o in self.observers:
                o.stall_ended(job)
        elif kind == "complete":
            self.accrue(job, self.now)
            job.done = job.total if job.spec else job.done
            self.end(job, "COMPLETED", 0)
        elif kind == "checkpoint":
            self.end(job, "FAILED", EXIT_CHECKPOINTED)
        elif kind == "grace-over":
            self._grace_over(job)

    # --- what Slurm is asked to do ----------------------------------------------

    def new_job_id(self) -> tuple[str, int]:
        """The next job's id and its place in the submit order."""
        job_id = str(self._next_id)
        self._next_id += 1
        return job_id, self._next_id

    def submit(self, job: SimJob) -> None:
        """A new job (with an id from `new_job_id`), eligible unless held."""
        self.jobs[job.job_id] = self.all_jobs[job.job_id] = job
        if not job.held:
            self.eligible[job.job_id] = job
            self.kick()
        for o in self.observers:
            o.submitted(job)

    def changed(self, job: SimJob) -> None:
        """The job changed: its SlurmJob is shown anew."""
        job.record = None

    def hold(self, job: SimJob, reason: str) -> None:
        """A pending job held (`reason`: JobHeldUser, JobHeldAdmin)."""
        job.held, job.hold_reason = True, reason
        self.eligible.pop(job.job_id, None)
        self.changed(job)

    def release(self, job: SimJob) -> None:
        """A held pending job released (it starts when it fits)."""
        if job.held:
            job.held, job.hold_reason = False, ""
            self.eligible[job.job_id] = job
            self.changed(job)
            self.kick()

    def requeue(self, job: SimJob, hold: bool) -> None:
        """A running or finished job pending again (held with `hold`)."""
        if job.running:
            self.end(job, "REQUEUED", None, notify=False)
        self._requeue(job, hold)
        self.kick()

    def _requeue(self, job: SimJob, hold: bool) -> None:
        job.state = "PENDING"
        job.nodes = ()
        job.start_time = job.end_time = job.exit_code = None
        job.restarts += 1
        job.preempt_at = None  # Slurm resets the PreemptTime of a job it requeues
        job.begin_time = self.now + self.requeue_delay_s
        job.done, job.exec_s = job.ckpt_done, job.ckpt_exec_s
        job.held, job.hold_reason = hold, "JobHeldUser" if hold else ""
        if hold:
            self.eligible.pop(job.job_id, None)
        else:
            self.eligible[job.job_id] = job
        self.changed(job)
        for o in self.observers:
            o.requeued(job)

    def cancel(self, job: SimJob) -> None:
        """A job that has not finished ends CANCELLED."""
        if job.finished:
            return
        if job.running:
            self.end(job, "CANCELLED", 143)
        else:
            job.state, job.end_time, job.exit_code = "CANCELLED", self.now, 0
            self.eligible.pop(job.job_id, None)
            self.changed(job)
            for o in self.observers:
                o.ended(job)

    def checkpoint(self, job: SimJob) -> None:
        """A running job begins its checkpoint (once): it keeps its whole
        iterations done now and ends `checkpoint_s` later (module doc)."""
        if job.checkpointing:
            return
        self.accrue(job, self.now)
        job.checkpointing = True
        job.done = math.floor(job.done)
        job.ckpt_done, job.ckpt_exec_s = job.done, job.exec_s
        self.clock.push(self.now + self.checkpoint_s, "checkpoint", job.job_id, job.epoch)
        self._rerate(job)

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
                self.end(job, "NODE_FAIL", 1)
                if self.node_fail_requeue:
                    self._requeue(job, hold=False)
        for o in self.observers:
            o.node_changed(name)
        self.kick()

    def purge(self) -> None:
        """Jobs that ended `min_job_age_s` ago or more leave the visible jobs (Slurm's MinJobAge)."""
        limit = self.now - self.min_job_age_s
        old = [j for j in self.jobs.values() if j.finished and j.end_time is not None and j.end_time <= limit]
        for j in old:
            del self.jobs[j.job_id]

    # --- Slurm's scheduler -------------------------------------------------------

    def kick(self) -> None:
        """Run the scheduler now (or after start_delay_s)."""
        if not self.eligible:
            return
        if self.start_delay_s <= 0:
            self._schedule()
            return
        when = self.now + self.start_delay_s
        if self._sched_at is None or self._sched_at > when:
            self._sched_at = when
            self.clock.push(when, "sched")

    def _order(self, job: SimJob) -> tuple[bool, int]:
        """A job's place in a scheduler pass: submit order, a job that may preempt first."""
        return (self.preemption is None or not self.preemption.preempts_any(job.qos), job.seq)

    def _schedule(self) -> None:
        for job in sorted(self.eligible.values(), key=self._order):
            if job.begin_time > self.now:
                if job.begin_time not in self._sched_times:
                    self._sched_times.add(job.begin_time)
                    self.clock.push(job.begin_time, "sched")
                continue
            nodes, why = _fit(self, job)
            if nodes is None and why == "Resources":
                why = self._preempt_for(job) or why
            if nodes is not None and self.gate is not None:
                why = self.gate(job)
                nodes = None if why else nodes
            if nodes is None:
                if job.reason != why:
                    job.reason = why
                    self.changed(job)
                continue
            self._start(job, nodes)

    def _preempt_for(self, job: SimJob) -> str:
        """Slurm's preemption for an eligible job that does not fit
        (slurm_ext.sim.preempt); the reason it waits with when a limit keeps
        it from preempting (Slurm does not preempt past one), else ""."""
        p = self.preemption
        if p is None or not p.preempts_any(job.qos):
            return ""
        why = self.gate(job) if self.gate is not None else ""
        if not why:
            for job_id in p.victims(job.qos, tuple(self.running.values()), lambda freed: _fit(self, job, freed)[0]):
                self._preempt(self.running[job_id], p.grace(self.running[job_id].qos))
        return why

    def _preempt(self, job: SimJob, grace: float) -> None:
        """Slurm preempts a running job: its PreemptTime, and SIGTERM: a
        managed elastic job whose checkpoint fits in its grace time
        checkpoints; any other runs out its grace time (`_grace_over`)."""
        job.preempt_at = self.now
        self.changed(job)
        if job.spec is not None and job.spec.elastic and self.checkpoint_s <= grace:
            self.checkpoint(job)
        else:
            self.clock.push(self.now + grace, "grace-over", job.job_id, job.epoch)

    def _grace_over(self, job: SimJob) -> None:
        """Killed at the end of its grace time: requeued, not held, its
        SubmitTime moved to the requeue (REQUEUE), or PREEMPTED (CANCEL)."""
        if self.preemption is not None and self.preemption.mode == "CANCEL":
            self.end(job, "PREEMPTED", 0)
        else:
            job.submit_time = self.now
            self.requeue(job, hold=False)

    # --- the simulated run ---------------------------------------------------------

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
        job.ckpt_done, job.ckpt_exec_s = job.done, job.exec_s
        self.running[job.job_id] = job
        self.changed(job)
        types: list[str] = []
        for n in nodes:
            if self.nodes[n].gpu_type not in types:
                types.append(self.nodes[n].gpu_type)
        gpu_type = "+".join(types)  # several: a mixed-type cell (solver.mixed)
        for o in self.observers:
            o.started(job, f"{gpu_type}:{len(nodes)}x{job.gres}")
        job.iter_time = None
        if job.spec is not None:
            plan = admin_comment_plan(job.admin_comment, strict=False)
            t = self.speed(job.spec, gpu_type, len(nodes), job.gres, plan) if self.speed and job.gres else None
            if t is None or not (t > 0 and math.isfinite(t)):
                for o in self.observers:
                    o.infeasible(job)
                self.end(job, "FAILED", 1)
                return
            job.iter_time = float(t) * (self.speed_factor(job.job_id, gpu_type) if self.speed_factor else 1.0)
            for o in self.observers:
                o.running(job, tuple(types), plan)
            job.comm = None
            if self.network is not None and len(nodes) > 1:
                job.comm = self.network.alone(job.spec, gpu_type, nodes, job.gres, plan, job.iter_time)
                job.iter_time = job.comm.alone_s
            cost = max(0.0, float(self.restart_cost(job.spec, job.gpus, first)))
            if self.quantum is None:
                job.penalty_left = 0.0
                job.stall_until = job.accrue_from = self.now + cost
                if cost > 0:
                    self.clock.push(job.stall_until, "stall-end", job.job_id, job.epoch)
                self._schedule_completion(job)
            else:
                self.quantum.charge(job, cost, self.now)
                if job.stall_until > self.now:
                    self.clock.push(job.stall_until, "stall-end", job.job_id, job.epoch)
            self._rerate(job)

    def _schedule_completion(self, job: SimJob) -> None:
        """(Re)push the completion of a running job at its current speed."""
        assert job.spec is not None and job.iter_time
        left = max(0.0, job.total - job.done)
        job.complete_at = max(job.accrue_from, self.now) + left * job.iter_time
        self.clock.push(job.complete_at, "complete", job.job_id, job.epoch)

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
            self.accrue(j, self.now)
            j.iter_time = new
            self._schedule_completion(j)

    def end(self, job: SimJob, state: str, exit_code: int | None, notify: bool = True) -> None:
        """The job stops running (state "REQUEUED": about to be requeued, and
        `notify` False: the observers are told of the requeue instead)."""
        if job.running:
            self.accrue(job, self.now)
            for n in job.nodes:
                self.nodes[n].alloc -= job.gres
                self.nodes[n].record = None
            held = self.now - (self.now if job.start_time is None else job.start_time)
            for o in self.observers:
                o.stopped(job, held)
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
        self.changed(job)
        if notify:
            for o in self.observers:
                o.ended(job)
        self.kick()

    def accrue(self, job: SimJob, t: float) -> None:
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
        if job.comm is not None and job.iter_time > job.comm.alone_s:
            job.contended_s += dt * (1.0 - job.comm.alone_s / job.iter_time)

    # --- what the launcher would report ----------------------------------------------

    def iterations_done(self, job_id: str) -> float | None:
        """The job's exact iterations done now (None for a job not shown)."""
        job = self.jobs.get(job_id)
        if job is None:
            return None
        if self.quantum is not None:
            return self.quantum.iterations_done(job)
        done = job.done
        if job.running and not job.checkpointing and job.iter_time and self.now > job.accrue_from:
            done += (self.now - job.accrue_from) / job.iter_time
        return float(min(done, job.total)) if job.spec else float(done)

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

    # --- counts (what the engine samples) ----------------------------------------------

    def throughput(self) -> float:
        """Samples/s of the running jobs out of their restart stall."""
        total = 0.0
        for j in self.running.values():
            if j.iter_time and not j.checkpointing and self.now >= j.stall_until and j.spec is not None:
                total += j.spec.global_batch / j.iter_time
        return total

    def gpus_used(self) -> dict[str, int]:
        """GPUs allocated, by GPU type (types with none left out)."""
        out: dict[str, int] = {}
        for n in self.nodes.values():
            if n.alloc:
                out[n.gpu_type] = out.get(n.gpu_type, 0) + n.alloc
        return out

    def num_pending(self) -> int:
        """Jobs pending (held or not)."""
        return sum(1 for j in self.jobs.values() if j.state == "PENDING")

    def num_running(self) -> int:
        return len(self.running)

    def has_active_jobs(self) -> bool:
        """Is a job running, or pending without a hold (it starts without the controller)?"""
        return bool(self.running or self.eligible)


def _fit(world: SimWorld, job: SimJob, freed: Mapping[str, int] | None = None) -> tuple[tuple[str, ...] | None, str]:
    """The nodes Slurm starts `job` on now (best fit), else None and why
    (Resources, BadConstraints, ReqNodeNotAvail); `freed`: node -> GPUs
    counted free besides those free now (what a preemption would free)."""
    nodes, partitions = world.nodes, world.partitions
    extra = freed or {}
    allowed = {n for p in job.partition.split(",") for n in partitions.get(p, ())}
    wanted = set(filter(None, job.features.replace("&", "|").split("|")))
    need_all = "&" in job.features

    def ok_features(n: SimNode) -> bool:
        if not wanted:
            return True
        return n.gpu_type in wanted if not need_all else wanted == {n.gpu_type}

    def free_gpus(name: str) -> int:
        return nodes[name].gpus - nodes[name].alloc + extra.get(name, 0)

    if any(r not in allowed or not ok_features(nodes[r]) for r in job.required):
        return None, "BadConstraints"
    if len(job.required) > job.num_nodes:
        return None, "BadConstraints"
    if any(not nodes[r].usable for r in job.required):
        return None, "ReqNodeNotAvail"
    gres = max(job.gres, 0)
    if any(free_gpus(r) < gres for r in job.required):
        return None, "Resources"
    chosen = list(job.required)
    if len(chosen) < job.num_nodes:
        free = [
            n
            for name, n in nodes.items()
            if name in allowed
            and name not in chosen
            and name not in job.excluded
            and n.usable
            and ok_features(n)
            and free_gpus(name) >= gres
        ]
        if gres and not any(nodes[n].gpus >= gres for n in allowed):
            return None, "BadConstraints"
        free.sort(key=lambda n: (free_gpus(n.name), n.name))  # best fit
        if len(free) < job.num_nodes - len(chosen):
            return None, "Resources"
        chosen += [n.name for n in free[: job.num_nodes - len(chosen)]]
    return tuple(chosen), ""
