"""Slurm's own view of the cluster as typed records, and hostlist helpers (over solver.contract.hostlist).

These are richer than the solver's capacity view (solver.types.ClusterView);
slurm_ext.view maps them onto it in one place. Every parser and backend
produces these records, whatever Slurm version or interface it reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.contract import hostlist
from solver.contract.hostlist import compress_hostlist  # noqa: F401  (re-exported: records are where callers look)

#: node base states / flags under which no new work can start on a node
UNAVAILABLE_STATES = frozenset({"down", "inval", "fail", "future", "unknown"})
UNAVAILABLE_FLAGS = frozenset(
    {
        "DRAIN",
        "DRAINED",
        "DRAINING",
        "NOT_RESPONDING",
        "FAIL",
        "INVALID",
        "INVALID_REG",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "MAINTENANCE",
        "REBOOT_ISSUED",
    }
)

#: job states in which a job holds its nodes' resources
HOLDS_RESOURCES = frozenset(
    {"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"}
)
#: job states after which a job will not run again (unless requeued)
FINISHED = frozenset(
    {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
)
#: state flags (Slurm 23.02+ JSON) of a job that Slurm is requeueing: it runs again, so no end state
#: of it is final (docs/preemption.md)
REQUEUE_FLAGS = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT"})


@dataclass(frozen=True)
class SlurmNode:
    """One node. `state` is the lower-case base state ("idle", "mixed",
    "allocated", "down", ...); `flags` the upper-case state flags ("DRAIN",
    "NOT_RESPONDING", ...). GPU counts come from the typed gpu GRES."""

    name: str
    address: str = ""
    port: int | None = None
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    gpu_type: str | None = None
    gpus_total: int = 0
    gpus_alloc: int = 0
    cpus_total: int = 0
    cpus_alloc: int = 0
    memory_mb: int = 0
    state: str = "unknown"
    flags: tuple[str, ...] = ()
    reason: str = ""

    @property
    def available(self) -> bool:
        """True when new work may start here (not down, drained, failed,
        not responding or invalid)."""
        return self.state not in UNAVAILABLE_STATES and not (set(self.flags) & UNAVAILABLE_FLAGS)

    @property
    def gpus_free(self) -> int:
        return max(0, self.gpus_total - self.gpus_alloc)


@dataclass(frozen=True)
class SlurmPartition:
    """One partition; `max_time` in minutes, None = unlimited."""

    name: str
    nodes: tuple[str, ...] = ()
    state: str = "UP"
    default: bool = False
    max_time: int | None = None


@dataclass(frozen=True)
class SlurmJob:
    """One job as Slurm reports it.

    `state` is the upper-case base state ("PENDING", "RUNNING", ...);
    `gpus_per_node` / `gpu_type` are what the job requests per node
    (gpu_type None = an untyped request); `nodes` the expanded allocation.
    Times are epoch seconds (None = not set / unknown); `end_time` of a job
    that has not finished is Slurm's expected end (None when unlimited);
    `eligible_time` is when a pending job may start (its BeginTime). `uid`:
    the numeric id of `user` (None = not reported).
    `exit_code` is the process exit status, 128+N when killed by signal N,
    and None until the job has finished. `time_limit` in minutes (None =
    unlimited). `num_tasks` / `tasks_per_node` are the requested task counts
    (None = not set); `work_dir` the job's working directory. `account`,
    `qos`, `priority` (Slurm's, 0 while held; None: not reported) and
    `reservation` ("" = none) are what the site's policy sees of the job
    (slurm_ext.site). `state_flags`: the upper-case flags of its state
    (Slurm 23.02+ JSON lists them: "REQUEUED", "COMPLETING", ...);
    `preempted_at`: when Slurm chose to preempt it (its PreemptTime; None:
    it was not, or Slurm does not say). Slurm resets it when it requeues the
    job (docs/preemption.md).
    """

    job_id: str
    name: str = ""
    user: str = ""
    uid: int | None = None
    state: str = "PENDING"
    reason: str = ""
    partition: str = ""
    nodes: tuple[str, ...] = ()
    num_nodes: int = 0
    gpus_per_node: int | None = None
    gpu_type: str | None = None
    held: bool = False
    features: str = ""
    required_nodes: tuple[str, ...] = ()
    excluded_nodes: tuple[str, ...] = ()
    comment: str = ""
    admin_comment: str = ""
    submit_time: float | None = None
    start_time: float | None = None
    eligible_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    time_limit: int | None = None
    batch_host: str = ""
    num_tasks: int | None = None
    tasks_per_node: int | None = None
    work_dir: str = ""
    account: str = ""
    qos: str = ""
    priority: int | None = None
    reservation: str = ""
    state_flags: tuple[str, ...] = ()
    preempted_at: float | None = None

    @property
    def holds_resources(self) -> bool:
        """Running, or ending: a state of HOLDS_RESOURCES, or any state while
        Slurm 23.02+ flags it COMPLETING (a job Slurm requeues is
        `PENDING,COMPLETING` until its processes have ended)."""
        return self.state in HOLDS_RESOURCES or "COMPLETING" in self.state_flags

    @property
    def finished(self) -> bool:
        """Ended for good: an end state (PREEMPTED included) of a job that
        Slurm is not requeueing (`REQUEUE_FLAGS`)."""
        return self.state in FINISHED and not (set(self.state_flags) & REQUEUE_FLAGS)

    @property
    def preempted(self) -> bool:
        """Slurm preempted the job: it runs out its grace time, or it ended
        so (PREEMPTED, or another end state with its PreemptTime set)."""
        return self.preempted_at is not None or self.state == "PREEMPTED"

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"


@dataclass(frozen=True)
class ClusterSnapshot:
    """Nodes, partitions and jobs observed at `taken_at` (epoch seconds)."""

    nodes: tuple[SlurmNode, ...]
    partitions: tuple[SlurmPartition, ...]
    jobs: tuple[SlurmJob, ...]
    taken_at: float

    def node(self, name: str) -> SlurmNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def job(self, job_id: str) -> SlurmJob:
        for j in self.jobs:
            if j.job_id == job_id:
                return j
        raise KeyError(job_id)

    def partition(self, name: str) -> SlurmPartition:
        for p in self.partitions:
            if p.name == name:
                return p
        raise KeyError(name)


# --- hostlists -----------------------------------------------------------


def expand_hostlist(text: str | None) -> tuple[str, ...]:
    """``n[1-3,5]`` -> (n1, n2, n3, n5) (solver.contract.hostlist); "", None and
    Slurm's "(null)" / "None" / "N/A" -> ()."""
    if not text or text.strip() in ("(null)", "None", "N/A"):
        return ()
    try:
        return hostlist.expand_hostlist(text)
    except hostlist.HostlistError as exc:
        raise ValueError(f"hostlist {text!r}: {exc}") from None
