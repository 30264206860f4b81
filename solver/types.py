"""The types the solver reasons about: a capacity view of the cluster, job
requests, cells, estimates, placements, and the request/reply of a policy.

Everything here is a frozen dataclass of plain values, so a schedule request
is data in and a reply is data out (no Slurm, no clock, no I/O).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from solver.contract.models import ModelSpec
from solver.contract.runtimes import ANY_CHANGE, Change, Checkpoint, Layout, get_runtime, move_problem
from solver.network import Network
from solver.site import SitePolicy

if TYPE_CHECKING:
    from solver.contract.jobspec import JobSpec

_T = TypeVar("_T")


def knob(default: _T, doc: str) -> _T:
    """A config field and its documentation, kept at its declaration
    (``metadata["doc"]``: `cellsched`'s config page, docs/config.md, is
    generated from it)."""
    return field(default=default, metadata={"doc": doc})


def knob_factory(factory: Callable[[], _T], doc: str) -> _T:
    """`knob` for a default made by `factory` (a mutable one)."""
    return field(default_factory=factory, metadata={"doc": doc})


@dataclass(frozen=True)
class NodeView:
    """One node as the solver sees it.

    `gpus_free` is what the solver may hand out: the node's GPUs minus those
    held by jobs it does not manage (0 when the node is down or drained).
    GPUs held by managed running jobs count as free here; those jobs carry
    their current placement and the solver decides whether they keep it.
    """

    name: str
    gpu_type: str
    gpus_total: int
    gpus_free: int
    partitions: tuple[str, ...] = ()
    #: its network card, Gb/s (0: not known; the network is not modelled there)
    nic_gbps: float = 0.0
    #: its rack ("": none named)
    rack: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.gpus_free <= self.gpus_total:
            raise ValueError(f"node {self.name}: gpus_free={self.gpus_free} not in [0, {self.gpus_total}]")
        if not self.nic_gbps >= 0:
            raise ValueError(f"node {self.name}: nic_gbps={self.nic_gbps} must be >= 0")


@dataclass(frozen=True)
class ClusterView:
    """The nodes and partitions the solver may place managed jobs on, and the
    network between the nodes (their NICs, racks and rack uplinks, Gb/s)."""

    nodes: tuple[NodeView, ...]
    partitions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    uplink_gbps: Mapping[str, float] = field(default_factory=dict)

    @functools.cached_property
    def network(self) -> Network:
        """The network of solver.network: the nodes' NICs, racks and uplinks."""
        return Network(
            {n.name: n.nic_gbps for n in self.nodes if n.nic_gbps > 0},
            {n.name: n.rack for n in self.nodes if n.rack},
            dict(self.uplink_gbps),
        )

    @functools.cached_property
    def node_partitions(self) -> Mapping[str, tuple[str, ...]]:
        """Each node's partitions, sorted: its own and those the partition map
        lists it in (computed once: a round's model, node classes and site
        checks each ask)."""
        out = {n.name: set(n.partitions) for n in self.nodes}
        for part, names in self.partitions.items():
            for name in names:
                if name in out:
                    out[name].add(part)
        return {k: tuple(sorted(v)) for k, v in out.items()}

    @functools.cached_property
    def _by_type(self) -> dict[str, tuple[NodeView, ...]]:
        """GPU type -> its nodes (computed once: policies ask per job and cell)."""
        out: dict[str, list[NodeView]] = {}
        for n in self.nodes:
            out.setdefault(n.gpu_type, []).append(n)
        return {t: tuple(ns) for t, ns in sorted(out.items())}

    def gpu_types(self) -> tuple[str, ...]:
        return tuple(self._by_type)

    def nodes_of(self, gpu_type: str) -> tuple[NodeView, ...]:
        return self._by_type.get(gpu_type, ())

    @functools.cached_property
    def _sizes(self) -> dict[str, tuple[tuple[int, int], ...]]:
        out = {}
        for t, nodes in self._by_type.items():
            counts: dict[int, int] = {}
            for n in nodes:
                counts[n.gpus_total] = counts.get(n.gpus_total, 0) + 1
            out[t] = tuple(sorted(counts.items(), reverse=True))
        return out

    def node_sizes(self, gpu_type: str) -> tuple[tuple[int, int], ...]:
        """(GPUs per node, how many nodes) of a GPU type, largest first."""
        return self._sizes.get(gpu_type, ())

    def node(self, name: str) -> NodeView:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


@dataclass(frozen=True, order=True)
class Cell:
    """A job's deterministic resources (Crius): one GPU type, a uniform node
    layout (num_nodes x gpus_per_node) and a fixed pipeline-stage count.

    A *mixed* cell (solver.mixed) spans several GPU types as data-parallel
    groups: `parts` holds (GPU type, nodes) per type, `gpu_type` is the
    types joined by "+", and every node gives gpus_per_node GPUs.
    """

    gpu_type: str
    num_nodes: int
    gpus_per_node: int
    pp: int = 1
    parts: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.num_nodes < 1 or self.gpus_per_node < 1 or self.pp < 1:
            raise ValueError(f"invalid cell {self}")
        if self.num_gpus % self.pp:
            raise ValueError(f"cell {self}: pp={self.pp} does not divide {self.num_gpus} GPUs")
        if self.parts and (
            len(self.parts) < 2
            or len({t for t, _ in self.parts}) != len(self.parts)
            or any(n < 1 for _, n in self.parts)
            or sum(n for _, n in self.parts) != self.num_nodes
            or self.gpu_type != "+".join(t for t, _ in self.parts)
        ):
            raise ValueError(f"invalid mixed cell {self}")

    @property
    def mixed(self) -> bool:
        return bool(self.parts)

    def by_type(self) -> tuple[tuple[str, int], ...]:
        """(GPU type, nodes) of each type the cell uses."""
        return self.parts or ((self.gpu_type, self.num_nodes),)

    def holds_types(self, node_types: list[str] | tuple[str, ...]) -> bool:
        """True when nodes of these types (one entry per node) are the cell's."""
        want = dict(self.by_type())
        return len(node_types) == self.num_nodes and all(node_types.count(t) == n for t, n in want.items())

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def layout(self) -> str:
        return f"{self.num_nodes}x{self.gpus_per_node}"

    def key(self) -> str:
        """Stable text form, e.g. ``a100:2x4:pp2``; mixed ``a40x2+a10x1:3x2:pp1``."""
        name = "+".join(f"{t}x{n}" for t, n in self.parts) if self.parts else self.gpu_type
        return f"{name}:{self.layout}:pp{self.pp}"

    def size_key(self) -> str:
        """The cell's key without its node layout, e.g. ``a100:8gpus:pp2``:
        what fits in a GPU's memory depends on it, not on the layout."""
        return size_key_of(self.key()) or ""


def size_key_of(cell_key: str) -> str | None:
    """``a100:2x4:pp2`` -> ``a100:8gpus:pp2``; None for text that is not a cell key."""
    try:
        name, layout, pp = cell_key.split(":")
        nodes, per_node = (int(v) for v in layout.split("x"))
    except ValueError:
        return None
    return f"{name}:{nodes * per_node}gpus:{pp}"


@dataclass(frozen=True)
class ParallelPlan:
    """Degrees of one job's parallelism inside a cell; pp*dp*tp = GPUs.

    `stage_layers` and `state_shares` are empty when not set, so plans built
    without them (and their equality) stay as they were; `stage_layers` is
    left out of equality and hashing (it follows from the rest of the plan
    and the cell, so two plans differing only in it are the same choice).
    """

    pp: int
    dp: int
    tp: int
    micro_batches: int = 1
    #: mixed cells: samples per dp rank of each of the cell's parts (its GPU
    #: types, in order), so faster GPUs take more of the global batch
    shares: tuple[int, ...] = ()
    #: pp > 1: the model's layers (as the trainer counts them, ModelSpec.num_layers)
    #: per pipeline stage, in stage order: the split the estimate priced
    stage_layers: tuple[int, ...] = field(default=(), compare=False)
    #: optimizer state sharded over the dp ranks (ZeRO-1: launch.sharding):
    #: one positive weight per part of the cell (its GPU types, in order, as
    #: `shares`; one part for a single-type cell): each dp rank of part i owns
    #: a slice of the state proportional to state_shares[i] (equal weights:
    #: even slices). Empty: the state is replicated (not sharded).
    state_shares: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        for k in ("pp", "dp", "tp", "micro_batches"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be >= 1, got {getattr(self, k)}")
        if any(s < 1 for s in self.shares):
            raise ValueError(f"shares must be >= 1, got {self.shares}")
        if self.stage_layers and (len(self.stage_layers) != self.pp or min(self.stage_layers) < 1):
            raise ValueError(f"stage_layers must give {self.pp} stages of >= 1 layer, got {self.stage_layers}")
        if any(not w > 0 for w in self.state_shares):
            raise ValueError(f"state_shares must be > 0, got {self.state_shares}")

    @property
    def num_gpus(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def sharded(self) -> bool:
        """True when the plan shards the optimizer state over its dp ranks."""
        return bool(self.state_shares)


class EstimateSource(StrEnum):
    """Where an estimate's time comes from."""

    MEASURED = "measured"  # a measured (or Arena-optimal) cell time
    MEASURED_PP = "measured+pp"  # a measured cell's time carried to another pipeline-stage count
    COMPOSED = "composed"  # from layer profiles and communication tables
    ANALYTIC = "analytic"  # from GPU datasheet numbers
    ANALYTIC_CALIBRATED = "analytic+calibrated"  # analytic, scaled by the model's measured cells
    ARENA_TABLE = "arena-table"  # Arena's simulator lookup (solver.arena.lookup)
    MIXED = "mixed"  # a mixed-GPU-type cell, from its parts' estimates (solver.mixed)
    NONE = "none"  # no data: infeasible


@dataclass(frozen=True)
class Estimate:
    """The estimator's answer for one (job, cell): the best plan found inside
    the cell, its iteration time and per-GPU memory, and where it came from.

    `source` says where the time comes from (EstimateSource).
    An infeasible estimate (OOM, no data) has iter_time_s = inf.
    """

    cell: Cell
    plan: ParallelPlan | None
    iter_time_s: float
    mem_per_gpu_gb: float
    source: EstimateSource
    note: str = ""
    #: of mem_per_gpu_gb, the optimizer state (GB per GPU, at the stage of
    #: peak memory) that state sharding splits over dp ranks; for an
    #: unsharded plan all of it (0: not known)
    state_gb: float = 0.0

    @functools.cached_property
    def feasible(self) -> bool:
        """A plan and a finite, positive time (kept once asked: asked often, of many estimates)."""
        return self.plan is not None and math.isfinite(self.iter_time_s) and self.iter_time_s > 0

    def scaled(self, factor: float, note: str) -> Estimate:
        """This estimate with its iteration time times `factor` and `note` as
        its note (dataclasses.replace's result, built directly: calibration
        scales every cell of every job each round)."""
        return Estimate(
            self.cell, self.plan, self.iter_time_s * factor, self.mem_per_gpu_gb, self.source, note, self.state_gb
        )


@dataclass(frozen=True)
class Placement:
    """A job in a cell on concrete nodes: (node name, GPUs on it) pairs."""

    job_id: str
    cell: Cell
    nodes: tuple[tuple[str, int], ...]
    plan: ParallelPlan
    iter_time_s: float
    partition: str | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if sum(g for _, g in self.nodes) != self.cell.num_gpus:
            raise ValueError(f"placement of {self.job_id}: nodes {self.nodes} do not hold {self.cell.num_gpus} GPUs")

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.nodes)

    def same_resources(self, other: Placement | None) -> bool:
        """True when `other` uses the same cell on the same nodes."""
        return other is not None and self.cell == other.cell and sorted(self.nodes) == sorted(other.nodes)


def layout_of(cell: Cell, plan: ParallelPlan) -> Layout:
    """What of a plan in a cell a resume depends on (solver.contract.runtimes.Layout)."""
    return Layout(plan.pp, plan.dp, plan.tp, frozenset(t for t, _ in cell.by_type()))


@dataclass(frozen=True)
class JobRequest:
    """A managed job as the solver sees it.

    `current` is the placement of a running job (None when pending).
    `requested_gpus` / `requested_gpu_type` are what a static-parallelism user
    asked for; baselines such as FCFS use them, cellsched treats them as a hint.
    `excluded_cells` holds cell keys (or size keys, `Cell.size_key`: every
    layout of that size) the job must not be placed in again (e.g. it failed
    twice there); `excludes` tells.
    `virtual_workers` is the job's EasyScale V, fixed once accepted: any dp <=
    V runs it (dp rank d runs ``solver.contract.plan.virtual_worker_counts(V, dp)[d]``
    virtual workers of global_batch / V samples each, one after the other).
    None: not fixed yet, a placement picks dp freely (one worker per rank).
    `resumes_from` is the layout of the plan the job's checkpoint was
    written under (None: it has none yet): a job resumes only where its
    runtime allows that (`move_problem`).
    """

    job_id: str
    model: ModelSpec
    global_batch: int
    iterations: int
    iterations_done: float = 0.0
    user: str = ""
    gpu_types: tuple[str, ...] | None = None
    min_gpus: int = 1
    max_gpus: int | None = None
    elastic: bool = False
    submit_time: float = 0.0
    requested_gpus: int | None = None
    requested_gpu_type: str | None = None
    partitions: tuple[str, ...] | None = None
    current: Placement | None = None
    restart_cost_s: float | None = None
    #: when the job's current run started (Slurm's StartTime; None: pending or
    #: not known): how long it has stayed where it runs (objective.restart_factor)
    running_since: float | None = None
    #: how many times the job has restarted so far (moved, resized, requeued; 0: never)
    restarts: int = 0
    excluded_cells: frozenset[str] = frozenset()
    virtual_workers: int | None = None
    #: the job may run with its optimizer state sharded over dp ranks
    #: (launch.sharding); policies clear it when SolverConfig.state_sharding
    #: is false, and the estimator then prices replicated state only (but for
    #: a runtime that always shards it: solver.contract.runtimes.State.ZERO1)
    state_sharding: bool = True
    #: what the job's code can carry out (solver.contract.runtimes): the solver offers
    #: it no cell or plan outside that and prices its own sync and memory; always
    #: named (a submission's default is its spec's: solver.contract.runtimes.DEFAULT_RUNTIME)
    runtime: str = field(kw_only=True)
    #: False: a running job that may not be signalled, resized or moved (its
    #: runtime checkpoints only through a hook its script has not registered
    #: yet: solver.contract.runtimes.Checkpoint.HOOK); every policy keeps it where it
    #: runs (solver.placement.split_fixed / split_static)
    movable: bool = True
    #: the site's view of the job (solver.site): its Slurm account and QOS,
    #: Slurm's priority of it, its time limit (s; None: none) and the
    #: reservation it asked for
    account: str = ""
    qos: str = ""
    priority: float = 0.0
    time_limit_s: float | None = None
    reservation: str | None = None
    #: when cellsched last preempted the job to zero GPUs (None: never), and
    #: the jobs it was preempted for (solver.placement.preempt: its back-off
    #: and the rule against loops)
    preempted_at: float | None = None
    preempted_by: frozenset[str] = frozenset()
    #: the layout of the plan its checkpoint was written under (None: it has not
    #: trained): it moves only to plans its runtime resumes from that
    #: (solver.contract.runtimes.move_problem)
    resumes_from: Layout | None = None

    def __post_init__(self) -> None:
        get_runtime(self.runtime)  # UnknownRuntime naming the known ones
        if self.global_batch < 1:
            raise ValueError(f"job {self.job_id}: global_batch must be >= 1")
        if self.iterations < 1:
            raise ValueError(f"job {self.job_id}: iterations must be >= 1")
        if self.min_gpus < 1 or (self.max_gpus is not None and self.max_gpus < self.min_gpus):
            raise ValueError(f"job {self.job_id}: need 1 <= min_gpus <= max_gpus")
        v = self.virtual_workers
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ValueError(f"job {self.job_id}: virtual_workers must be an integer >= 1, got {v!r}")

    @classmethod
    def from_spec(cls, spec: JobSpec, job_id: str, **facts: Any) -> JobRequest:
        """The request of a job submitted with `spec` (solver.contract.jobspec):
        the one place a spec becomes a request. `facts` are what the shell
        knows besides the spec (progress, placement, the site's view, ...) and
        override the spec's own where both say (``elastic`` and
        ``virtual_workers`` as the controller decides them this round)."""
        fields: dict[str, Any] = {
            "model": spec.model_spec(),
            "global_batch": spec.global_batch,
            "iterations": spec.iterations,
            "gpu_types": spec.gpu_types,
            "min_gpus": spec.min_gpus,
            "max_gpus": spec.max_gpus,
            "elastic": spec.elastic,
            "requested_gpus": spec.requested_gpus,
            "requested_gpu_type": spec.requested_gpu_type,
            "partitions": spec.partitions,
            "virtual_workers": spec.virtual_workers,
            "runtime": spec.runtime,
        }
        return cls(job_id=job_id, **{**fields, **facts})

    def excludes(self, cell: Cell) -> bool:
        """Is `cell` (its key or its size) in `excluded_cells`? A mixed cell
        also is when one of its parts, as a single-type cell of the same
        nodes and stages, is: a job that failed before its first step on
        2 A10s is not sent to a cell that gives one of its parts 2 A10s."""
        if not self.excluded_cells:
            return False
        if cell.key() in self.excluded_cells or cell.size_key() in self.excluded_cells:
            return True
        # a part runs the whole model (pp 1: data parallel across types) or its share of the stages
        return any(
            self.excludes(Cell(t, n, cell.gpus_per_node, 1 if cell.pp == 1 else cell.pp * n // cell.num_nodes))
            for t, n in cell.parts
            if cell.pp == 1 or (cell.pp * n) % cell.num_nodes == 0
        )

    @property
    def moves_bound(self) -> bool:
        """Does the job's checkpoint bind its next plans (it has one, and its runtime does not resume any plan)?"""
        return self.resumes_from is not None and get_runtime(self.runtime).resumes != ANY_CHANGE

    @property
    def move_pins(self) -> tuple[tuple[str, str], ...]:
        """What of its checkpoint's layout binds the job's next plans: (change, value) of each
        change its runtime does not resume with (() when none binds it: `moves_bound`)."""
        if not self.moves_bound or self.resumes_from is None:
            return ()
        rt = get_runtime(self.runtime)
        return tuple((c.value, self.resumes_from.shown(c)) for c in Change if c not in rt.resumes)

    def move_problem(self, cell: Cell, plan: ParallelPlan) -> str | None:
        """Why the job cannot resume its checkpoint with `plan` in `cell`
        (solver.contract.runtimes.move_problem), or None when it can (or has none)."""
        if self.resumes_from is None:
            return None
        return move_problem(get_runtime(self.runtime), self.resumes_from, layout_of(cell, plan))

    @property
    def remaining_iterations(self) -> float:
        return max(0.0, self.iterations - self.iterations_done)

    @property
    def settles(self) -> bool:
        """Does the job keep the first placement it gets? A pending job that
        has not trained, whose runtime moves it only through a hook its script
        has not been seen to register (Checkpoint.HOOK): once it starts it is
        static (`movable` false) until its script registers one, which many
        scripts never do, so where it starts it may well end."""
        return (
            self.current is None
            and self.resumes_from is None
            and get_runtime(self.runtime).checkpoint == Checkpoint.HOOK
        )

    @property
    def running(self) -> bool:
        return self.current is not None


@dataclass(frozen=True)
class SolverConfig:
    """[solver]: the knobs of a scheduling round: its limits, its search,
    and the weights of its objective (solver.placement.objective; docs/scheduling.md,
    docs/config.md).

    Objective, per job j placed in cell c with throughput T(j,c) samples/s:
      w_throughput * (T(j,c)/T_ref(j))^p  ... see solver.placement.objective for the exact form.

    Each knob is documented at its field (``metadata["doc"]``); it is the
    ``[solver]`` section of the controller's config (docs/config.md).
    """

    time_limit_s: float = knob(
        1.0,
        "Wall-clock limit (s) of a round's solve (LP and CP-SAT): a safety net behind "
        "deterministic_time; hitting it can change the plan.",
    )
    workers: int = knob(2, "CP-SAT worker threads when deterministic is false (deterministic: one).")
    seed: int = knob(0, "CP-SAT's random seed.")
    fairness_p: float = knob(
        0.5,
        "Fairness exponent p: a job's value grows with (T(j,c) / T_ref(j)) ** p, its throughput "
        "relative to its smallest cell; with 0 < p < 1 extra GPUs give diminishing returns "
        "(see solver.placement.objective).",
    )
    w_throughput: float = knob(1.0, "Objective weight of (normalised) throughput (solver.placement.objective).")
    w_short_jobs: float = knob(
        0.5,
        "Objective weight of the bounded shortest-remaining-work bonus, on top of w_throughput "
        "(solver.placement.objective).",
    )
    restart_penalty: float = knob(
        1.0,
        "Weight of a move's restart cost: a running job that changes cell or nodes is worth "
        "1 - restart_penalty * restart cost / horizon of its value (see horizon_s).",
    )
    default_restart_cost_s: float = knob(
        60.0, "The restart cost (s) assumed for a job until its restart has been measured."
    )
    horizon_s: float = knob(300.0, "The horizon (s) a move's restart cost is spread over.")
    restart_history: bool = knob(
        False,
        "Weigh a move's restart cost over the job's average stay so far, (age + cost) / (restarts + 1), "
        "instead of horizon_s and horizon_remaining; a job younger than its restart cost moves free "
        "(see objective.restart_factor).",
    )
    restart_on_throughput: bool = knob(
        False,
        "Apply a move's restart factor to the job's throughput in its new cell, as Sia's factor applies to "
        "goodput (the value's multiplier is then factor ** fairness_p), instead of to its value "
        "(see objective.restart_factor).",
    )
    horizon_remaining: bool = knob(
        True,
        "Weigh a move's restart cost over the shorter of the job's remaining time and the time it has "
        "stayed where it runs, when that is longer than horizon_s (see objective.restart_factor).",
    )
    allow_resize: bool = knob(
        True,
        "Resize or move running elastic jobs when the gain pays their restart cost (measured per job "
        "after its first move; default_restart_cost_s before); false: a running job keeps its placement.",
    )
    max_cells_per_job: int = knob(24, "Search breadth: at most this many cells per job.")
    max_pp: int = knob(8, "The deepest pipeline (pipeline stages) a cell may have.")
    exact_node_model_max_nodes: int = knob(
        64,
        "Up to this many nodes, the placement model has every node; above, classes of alike nodes "
        "(solver.placement.model).",
    )
    w_age: float = knob(
        0.25, "Age bonus: a job's value is scaled by 1 + w_age * log2(1 + age / age_scale_s), age = now - submit_time."
    )
    age_scale_s: float = knob(3600.0, "Age (s) at which the age bonus reaches w_age.")
    deterministic_time: float = knob(
        5.0,
        "CP-SAT deterministic-time budget (solver work units); unlike time_limit_s it does not depend on machine load.",
    )
    deterministic: bool = knob(
        True, "Same input + seed -> same plan: one CP-SAT worker stopped by deterministic_time (workers then unused)."
    )
    relative_gap_limit: float = knob(
        0.01,
        "Stop once (bound - objective) / objective <= this (0: prove optimality); after the LP relaxation "
        "(lp_first_min_jobs), that of the jobs it leaves open.",
    )
    lp_first_min_jobs: int = knob(
        0,
        "Aggregated model with at least this many jobs: solve its LP relaxation first and leave CP-SAT "
        "only the jobs the LP does not place integrally (0: always; a huge number: never, CP-SAT gets "
        "the whole model).",
    )
    mixed_cells: bool = knob(
        True,
        "Offer mixed-GPU-type cells (solver.mixed: data-parallel groups with batch shares by speed, or "
        "pipelines whose stages each run on one type): to jobs that no single allowed type can hold, and "
        "wherever one is estimated faster than the best single-type cell the job could get now.",
    )
    max_mixed_cells: int = knob(8, "At most this many mixed cells per job.")
    max_mixed_types: int = knob(2, "The most GPU types one mixed cell may span (2..).")
    state_sharding: bool = knob(
        True,
        "Let the estimator shard the optimizer state over dp ranks (ZeRO-1, Cephalo's memory split: "
        "launch.sharding) where a cell fits only that way or runs clearly faster; false: replicated state only "
        "(but for a runtime that always shards it, megatron's distributed optimizer).",
    )
    calibrate: bool = knob(
        True,
        "Correct estimates by the iteration times jobs report in their progress.json, per job and GPU "
        "type, and per model and type across users (solver.calibration; the controller applies it).",
    )
    srpt_exponent: float = knob(
        0.0,
        "Weigh a job by (median remaining work / its remaining work) ** this (0: off; see solver.placement.objective).",
    )
    hesrpt: bool = knob(
        True,
        "Weigh jobs by heSRPT's share for their rank in remaining work (lowers average JCT under a "
        "queue; see solver.placement.objective).",
    )
    contention_aware: bool = knob(
        True,
        "Price the slowdown of multi-node jobs that share a NIC or rack uplink (solver.network; the "
        "[network] section) in the objective and the node choice, in the rounds where sharing costs a "
        "job 1% or more now or would in the plan made without it; false: every job is estimated as if "
        "alone on its links (the NICs' speed still counts in every estimate).",
    )
    settle_wait: bool = knob(
        False,
        "A pending job that will keep its first placement (JobRequest.settles: a ddp job whose script "
        "has not been seen to register its checkpoint hook) takes a cell slower than the fastest of the "
        "same number of GPUs (another GPU type or layout) only once it has waited as long as that cell "
        "would add to its remaining run (ski rental: it ends less than twice as late as hindsight's "
        "choice); false (the default: on the fair race's 88-GPU row it cost the other jobs more than it "
        "gained, docs/scheduling.md): any cell its value pays (see objective.settle_limits).",
    )
    min_run_s: float = knob(
        0.0,
        "The restart governor: a running job whose current run (since its start, or its last move or "
        "resize) is younger than this many seconds keeps its placement (no move, no resize, never a "
        "victim of preemption); 0: off (solver.placement.candidates.split_fixed).",
    )
    replan_interval_s: float = knob(
        0.0,
        "Partial rounds: a round re-plans every running job at least this many seconds after the last round that "
        "did; a round in between places the pending jobs and re-plans only the running jobs on nodes with idle GPUs, "
        "and every other running job keeps its placement (0: every round re-plans every job). A round then costs "
        "a fraction of a whole one on a busy cluster, and a grow, shrink or move may wait up to this long "
        "(docs/scheduling.md, partial rounds).",
    )
    preemption: str = knob(
        "off",
        'Preemption to zero GPUs: "off", or "priority": a pending job of higher preemption rank (its '
        "QOS's priority, then its account below its fair share against one above) that gets no GPUs "
        "this round takes them from running elastic jobs of lower rank, which checkpoint and are "
        "requeued held (solver.placement.preempt; bounded by min_run_s, preemption_backoff_s and no "
        "preemption back). Off by default, as Slurm's PreemptType=preempt/none: preempting throws "
        "away a victim's restart, and the site decides whether its priorities are worth that.",
    )
    preemption_backoff_s: float = knob(
        1800.0, "A job preempted to zero is not preempted again for this many seconds after (>= 0)."
    )
    node_placement: str = knob(
        "lwf-kappa",
        'How the SRSF baselines (srsf-avoid, srsf-accept, ada-srsf) pick nodes: "lwf-kappa" (the cards '
        'carrying the fewest multi-node jobs, then the fewest free GPUs that fit) or "first-fit" (cluster '
        "order); each keeps its own cap on multi-node jobs per card. cellsched ignores it.",
    )

    def __post_init__(self) -> None:
        if self.node_placement not in NODE_PLACEMENTS:
            raise ValueError(f"node_placement must be one of {', '.join(NODE_PLACEMENTS)}, got {self.node_placement!r}")
        if self.max_mixed_types < 2:
            raise ValueError(f"max_mixed_types must be >= 2, got {self.max_mixed_types}")
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(f"preemption must be one of {', '.join(PREEMPTION_MODES)}, got {self.preemption!r}")
        for name in ("min_run_s", "preemption_backoff_s", "replan_interval_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a number >= 0, got {v!r}")


#: The values of SolverConfig.node_placement.
NODE_PLACEMENTS = ("lwf-kappa", "first-fit")
#: The values of SolverConfig.preemption.
PREEMPTION_MODES = ("off", "priority")


@dataclass(frozen=True)
class ScheduleRequest:
    """Everything a policy needs for one round: state in, plan out."""

    cluster: ClusterView
    jobs: tuple[JobRequest, ...]
    previous: Mapping[str, Placement] = field(default_factory=dict)
    config: SolverConfig = field(default_factory=SolverConfig)
    now: float = 0.0
    #: the site's accounts, limits, shares and reservations (solver.site)
    site: SitePolicy = field(default_factory=SitePolicy)
    #: re-plan every running job; False: a partial round (SolverConfig.replan_interval_s): the running
    #: jobs with no idle GPU on their nodes keep their placements (candidates.partial_round)
    replan_all: bool = True


class SolverStatus(StrEnum):
    """How a round's placement was found: CP-SAT's (or the LP's) own status,
    the greedy plan, or why no solver ran."""

    OPTIMAL = "OPTIMAL"
    FEASIBLE = "FEASIBLE"
    INFEASIBLE = "INFEASIBLE"
    UNBOUNDED = "UNBOUNDED"
    MODEL_INVALID = "MODEL_INVALID"
    UNKNOWN = "UNKNOWN"  # stopped (time limit) before any solution
    NOT_SOLVED = "NOT_SOLVED"
    GREEDY = "GREEDY"  # the greedy plan won or stood in
    HEURISTIC = "HEURISTIC"  # a baseline policy's own placement (FCFS, Gavel, SRSF): no solver ran
    NOT_RUN = "NOT_RUN"
    ERROR = "ERROR"  # the solver raised (the reply's reasons say what)

    @property
    def solved(self) -> bool:
        return self in (SolverStatus.OPTIMAL, SolverStatus.FEASIBLE)


@dataclass(frozen=True)
class ScheduleReply:
    """A policy's decision: the placement of every job that should run now.

    Jobs absent from `placements` stay (or become) pending; `reasons` says why.
    `status` is the solver's status.
    """

    placements: Mapping[str, Placement]
    status: SolverStatus
    objective: float = 0.0
    bound: float = 0.0
    build_s: float = 0.0
    solve_s: float = 0.0
    num_cells: int = 0
    reasons: Mapping[str, str] = field(default_factory=dict)
    #: Seconds spent putting the chosen cells on concrete nodes (after the solver).
    place_s: float = 0.0
    #: running jobs preempted to zero GPUs (checkpointed and requeued held) -> the job they give them to
    preempted: Mapping[str, str] = field(default_factory=dict)
    #: why a placed job is where it is, where a policy says (a running job that stays: solver.site's
    #: "stays" and "governor" forms; a job that preempts others: "preempting")
    notes: Mapping[str, str] = field(default_factory=dict)

    @property
    def gap(self) -> float:
        if self.objective == 0:
            return 0.0 if self.bound == 0 else math.inf
        return abs(self.bound - self.objective) / abs(self.objective)
