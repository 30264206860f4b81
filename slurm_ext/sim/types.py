"""The simulator's plain data: what a trace holds, what a simulated cluster
is made of, and what one simulated run records (the report is computed from
a SimRun alone)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from solver.site import PartitionAccess


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace.

    `iterations` None: derive them from `duration_s` (a Slurm accounting
    export knows run times, not iterations) at the requested cell's speed.
    `requested_gpus` / `requested_gpu_type` are the static request (what
    FCFS gets; a hint to cellsched). `line` is the trace line, for errors.
    """

    job_id: str
    submit_time: float
    model: str
    global_batch: int
    iterations: int | None
    requested_gpus: int
    requested_gpu_type: str | None = None
    deadline: float | None = None
    duration_s: float | None = None
    user: str = "sim"
    line: int = 0
    #: its Slurm account and QOS ("": none given; the cluster file's site
    #: assigns Arena trace jobs an account by its rule, slurm_ext.sim.site)
    account: str = ""
    qos: str = ""
    #: when it really started, on the trace's clock (a sacct export's Start; None: not recorded)
    recorded_start: float | None = None
    #: its Slurm time limit in seconds (a sacct export's Timelimit; None: none), what
    #: Slurm's backfill plans with (slurm-multifactor); the simulated Slurm does not enforce it
    time_limit_s: float | None = None
    #: the runtime the trace says it ran ("": none said; slurm_ext.sim.workload gives it one)
    runtime: str = ""


@dataclass(frozen=True)
class NodeGroup:
    """`count` nodes of one GPU type with `gpus_per_node` GPUs each; their
    network cards (`nic_gbps`, Gb/s; None: not modelled) and rack."""

    gpu_type: str
    count: int
    gpus_per_node: int
    mem_gb: float | None = None
    nic_gbps: float | None = None
    rack: str = ""


@dataclass(frozen=True)
class AccountSpec:
    """One Slurm account of a simulated site (the cluster file's
    ``[site.accounts.NAME]``): its raw fair share (normalised over the
    accounts of its parent), its GPU limit (GrpTRES=gres/gpu=N; None: none),
    each of its users' (a user association's GrpTRES; None: none), and, for
    traces without accounts, how many users its jobs are spread over and its
    weight in the assignment rule (slurm_ext.sim.site.assign_accounts). Its
    `parent` account ("": under root), whose Grp limits bind its jobs too;
    its GrpJobs (`jobs`: running jobs of it and its sub-accounts together)
    and MaxJobs (`user_jobs`: running jobs of each of its users; a
    sub-account without one takes its parent's, as slurmdbd copies it down)."""

    name: str
    share: float = 1.0
    gpus: int | None = None
    user_gpus: int | None = None
    users: int = 1
    trace_weight: float = 1.0
    parent: str = ""
    jobs: int | None = None
    user_jobs: int | None = None


@dataclass(frozen=True)
class QosSpec:
    """One QOS of a simulated site (``[site.qos.NAME]``): GrpTRES,
    MaxTRESPerUser and MaxTRESPerJob for gres/gpu (None: none), its
    Priority (the first part of a job's preemption rank,
    solver.placement.preempt, and of Slurm's choice of victims), and, for
    traces without a QOS, the share of their jobs given it
    (slurm_ext.sim.site.assign_accounts). Slurm's preemption
    (slurm_ext.sim.preempt): the QOS it preempts (Preempt=), its GraceTime
    (`grace_s`), and `plain`: a trace's jobs of it are submitted with plain
    sbatch (Slurm starts them on their requested GPUs), not through
    `cellsched sbatch`."""

    name: str
    gpus: int | None = None
    user_gpus: int | None = None
    job_gpus: int | None = None
    priority: float = 0.0
    trace_fraction: float = 0.0
    preempt: tuple[str, ...] = ()
    grace_s: float = 0.0
    plain: bool = False


@dataclass(frozen=True)
class SiteSpec:
    """The site's policy of a simulated cluster (the cluster file's
    ``[site]``, docs/simulator.md): accounts (a tree, by their parents) with
    shares and limits, QOS, the QOS of a job that names none, Slurm's
    PriorityDecayHalfLife, and its PreemptMode (REQUEUE or CANCEL: what
    becomes of a job preempted by a QOS, slurm_ext.sim.preempt), and its
    PriorityCalcPeriod in seconds (the fair share the policies see is the usage
    as of the last such tick; 0: continuous)."""

    accounts: tuple[AccountSpec, ...]
    qos: tuple[QosSpec, ...] = ()
    default_qos: str = ""
    decay_half_life_s: float = 7 * 86400.0
    preempt_mode: str = "REQUEUE"
    #: who may use each partition (a site's `scontrol show partition`, slurm_ext.sim.sitefiles;
    #: the policies' SitePolicy.partition_access) and PriorityTiers other than 1
    partitions: Mapping[str, PartitionAccess] = field(default_factory=dict)
    priority_tiers: Mapping[str, int] = field(default_factory=dict)
    calc_period_s: float = 0.0

    def account(self, name: str) -> AccountSpec | None:
        return next((a for a in self.accounts if a.name == name), None)

    def above(self, name: str) -> tuple[str, ...]:
        """The accounts above `name`, its parent first (the file is checked: no cycle)."""
        out: list[str] = []
        a = self.account(name)
        while a is not None and a.parent and len(out) < len(self.accounts):
            out.append(a.parent)
            a = self.account(a.parent)
        return tuple(out)

    def below(self, name: str) -> frozenset[str]:
        """The accounts under `name`, at every depth."""
        return frozenset(a.name for a in self.accounts if name in self.above(a.name))

    def user_jobs(self, name: str) -> int | None:
        """The MaxJobs of each user of `name`: its own, else the nearest account's above it."""
        for n in (name, *self.above(name)):
            a = self.account(n)
            if a is not None and a.user_jobs is not None:
                return a.user_jobs
        return None


@dataclass(frozen=True)
class ClusterSpec:
    """A simulated cluster; node names are ``<gpu type>-<index>`` (1-based,
    zero-padded), with one partition per GPU type and ``all``. `uplink_gbps`:
    the racks whose uplink is oversubscribed, rack -> Gb/s. `site`: the
    site's accounts, shares and limits (None: no site policy)."""

    groups: tuple[NodeGroup, ...]
    name: str = ""
    uplink_gbps: Mapping[str, float] = field(default_factory=dict)
    site: SiteSpec | None = None

    @property
    def has_network(self) -> bool:
        """Does the spec give the nodes' network cards?"""
        return any(g.nic_gbps for g in self.groups)

    @property
    def total_gpus(self) -> int:
        return sum(g.count * g.gpus_per_node for g in self.groups)

    def gpus_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.gpu_type] = out.get(g.gpu_type, 0) + g.count * g.gpus_per_node
        return out


#: the kinds of cell a run is counted under: one GPU type; several (solver.mixed) with data
#: parallelism only; several with pipeline stages (pp > 1); and, on top of one of those, a plan
#: that shards the optimizer state (JobPlan.state_sharding)
SINGLE, MIXED_DP, MIXED_PIPELINE, STATE_SHARDED = "single", "mixed-dp", "mixed-pipeline", "state-sharded"
CELL_KINDS = (SINGLE, MIXED_DP, MIXED_PIPELINE, STATE_SHARDED)


@dataclass(frozen=True)
class KindUse:
    """A job's runs in one kind of cell: how many began, and the seconds
    and GPU-seconds they held their GPUs (restart stalls included)."""

    placements: int = 0
    seconds: float = 0.0
    gpu_seconds: float = 0.0


@dataclass(frozen=True)
class JobOutcome:
    """What became of one trace job. Times are simulated seconds; in
    arena-compat mode submit and end lie on the round grid. A run that
    fails at start for want of a truth (infeasible) is not in `kinds`."""

    job_id: str
    submit_time: float
    first_start: float | None
    end_time: float | None
    finished: bool
    restarts: int = 0
    gpu_seconds: float = 0.0
    cells: tuple[str, ...] = ()
    #: its runs by kind of cell (CELL_KINDS; STATE_SHARDED overlaps the others), kinds it never ran in left out
    kinds: Mapping[str, KindUse] = field(default_factory=dict)
    #: seconds its runs lost to network links shared with other jobs (contention; 0 without)
    contended_s: float = 0.0

    @property
    def jct(self) -> float | None:
        return None if self.end_time is None or not self.finished else self.end_time - self.submit_time

    @property
    def queueing(self) -> float | None:
        return None if self.first_start is None else self.first_start - self.submit_time


@dataclass(frozen=True)
class Sample:
    """The cluster just after `time`, unchanged until the next sample:
    jobs queued (submitted, not running) and running, throughput in
    samples/s (restart stalls count as 0), GPUs in use by type."""

    time: float
    queued: int
    running: int
    throughput: float
    gpus_used: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundStat:
    """One controller round: when (simulated), its solver and total wall
    seconds, and how many jobs it scheduled."""

    time: float
    solve_s: float
    total_s: float
    jobs: int
    actions: int = 0


@dataclass(frozen=True)
class SimRun:
    """Everything one policy's simulation recorded."""

    policy: str
    jobs: tuple[JobOutcome, ...]
    samples: tuple[Sample, ...]
    rounds: tuple[RoundStat, ...]
    gpus_total: Mapping[str, int]
    wall_s: float = 0.0
    meta: Mapping[str, object] = field(default_factory=dict)
