"""The simulated world apart from the scheduler's view of it: the truth (how
fast jobs really run), the estimates (what the policy believes), noise on
the truth, and the restart cost every policy pays.

* truth: ``arena`` (Arena's measured optimal-plan table, the default),
  ``arena-filled`` (that table, and where its lookup finds no entry, our
  estimator over it: solver.arena.estimates), a path to an Arena
  ``profiles_optimal.json``, or a profile-store SQLite file (our estimator
  over it).
* estimates: ``truth`` (the truth's own table, so estimation error costs
  nothing), ``arena-estimated`` (Arena's profiler estimates,
  solver.arena.estimates), or ``store`` (our estimator over the
  truth's store when the truth is one, else the default profile store).
* noise: sigma of a seeded multiplicative factor on the truth of each job,
  exp(sigma z_job + sigma / 2 z_job,type): a part that travels with the job
  on every GPU type and a smaller part per type (median 1). Same seed, same
  factors, whatever the policy.
* restart: `RestartModel`, a constant or checkpoint size over storage
  bandwidth plus start-up.
* realistic (`realistic`): arena-estimated estimates, the filled measured
  truth, noise 0.1 and the restart model, for every policy.
* mixed-type cells (solver.mixed; every mode but arena-compat, see
  `speed_and_estimator`): the truth of a mixed cell is composed from the
  truth of its parts by the composition the policies' estimator uses:
  solver.mixed.MixedEstimator over the truth as an estimator (`TableTruth`
  over a table, the truth estimator itself over a profile store). The job
  runs the batch shares of its plan, not the truth's best ones: each part's
  compute is its plan samples at its true speed (`mixed_time`). A pipeline
  across types is priced from the truth's per-layer costs: a profile
  store's, or for Arena's tables (which have none) ours put type by type on
  the table's scale (``layer_scale``, solver.arena.estimates), at
  the truth's best plan, as a single-type cell's truth is the table's best
  plan; its memory is our model's. The noise is the one of any cell
  (`speed_factor`: its slowest part's). A mixed cell whose parts have no
  truth has none either: its job fails at start, as in an unknown
  single-type cell.
"""

from __future__ import annotations

import math
import pathlib
import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from slurm_ext.errors import CellschedError
from slurm_ext.sim.clusterspec import node_type
from slurm_ext.sim.world import SpeedFn
from solver.contract.jobspec import JobSpec
from solver.contract.plan import JobPlan
from solver.contract.runtimes import ADAPTIVE
from solver.estimator.protocol import CostModel, EstimatorBase, EstimatorLike
from solver.mixed import MixedEstimator, parse_key
from solver.types import Cell, Estimate, EstimateSource, JobRequest, ParallelPlan

if TYPE_CHECKING:
    from solver.estimator import Estimator


class Table(Protocol):
    """A table of true iteration times (ArenaTable, ArenaEstimates): a cell's
    time with the whole global batch (None: it does not run there), and the
    cost model its mixed cells are composed with (None: none)."""

    def iter_time(self, model: str, batch: int, gpu_type: str, num_nodes: int, gpus_per_node: int) -> float | None: ...

    @property
    def cost_model(self) -> CostModel | None: ...


TRUTHS = ("arena", "arena-filled")
ESTIMATES = ("truth", "arena-estimated", "store")

#: bytes of training state per parameter a checkpoint holds (fp32 weights and Adam's two moments)
STATE_BYTES_PER_PARAM = 12.0
#: start-up of a restarted job on the dev cluster: requeue, begin time, Python and torch, the first step
#: (measured: see docs/elasticity.md, "Restart cost")
DEV_CLUSTER_STARTUP_S = 8.1
#: storage bandwidth (GB/s) a job's checkpoint is written and read at
STORAGE_GBPS = 2.0


class ConditionsError(ValueError, CellschedError):
    """A condition that cannot be set up (the message names it)."""


@dataclass(frozen=True)
class RestartModel:
    """Seconds before a (re)started job progresses: `constant_s` when set,
    else start-up plus writing and reading the job's training state
    (STATE_BYTES_PER_PARAM x params) at `storage_gbps`; a first start pays
    start-up only."""

    constant_s: float | None = None
    startup_s: float = DEV_CLUSTER_STARTUP_S
    storage_gbps: float = STORAGE_GBPS

    @classmethod
    def parse(cls, text: str) -> RestartModel:
        """``model`` or a number of seconds."""
        if text == "model":
            return cls()
        try:
            v = float(text)
        except ValueError:
            raise ConditionsError(f"--restart-cost: expected 'model' or seconds, got {text!r}") from None
        if not (math.isfinite(v) and v >= 0):
            raise ConditionsError(f"--restart-cost: seconds must be >= 0, got {text!r}")
        return cls(constant_s=v)

    def cost(self, spec: JobSpec, gpus: int, first_start: bool) -> float:
        if self.constant_s is not None:
            return self.constant_s
        if first_start:
            return self.startup_s
        state = STATE_BYTES_PER_PARAM * spec.model_spec().params
        return self.startup_s + 2 * state / (self.storage_gbps * 1e9)

    def describe(self) -> str:
        if self.constant_s is not None:
            return f"{self.constant_s:g} s per (re)start, every policy"
        return (
            f"model: {self.startup_s:g} s start-up + {STATE_BYTES_PER_PARAM:g} B/param written and read "
            f"at {self.storage_gbps:g} GB/s, every policy"
        )


@dataclass(frozen=True)
class Conditions:
    """What a simulation's world is like (picklable; module doc)."""

    truth: str = "arena"
    estimates: str = "truth"
    noise: float = 0.0
    restart: RestartModel | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.estimates not in ESTIMATES:
            raise ConditionsError(f"--estimates: expected one of {', '.join(ESTIMATES)}, got {self.estimates!r}")
        if not (math.isfinite(self.noise) and 0 <= self.noise <= 2):
            raise ConditionsError(f"--noise: sigma must be in [0, 2], got {self.noise!r}")
        problem = truth_problem(self.truth)
        if problem:
            raise ConditionsError(f"--truth: {problem}")

    @classmethod
    def realistic(cls, **given: Any) -> Conditions:
        """The realistic mode, with `given` (not None) taking precedence."""
        base = cls(truth="arena-filled", estimates="arena-estimated", noise=0.1, restart=RestartModel())
        return replace(base, **{k: v for k, v in given.items() if v is not None})

    def speed_and_estimator(self, mixed: bool = True) -> tuple[SpeedFn, EstimatorLike]:
        """(truth speed, the estimator the policy decides with). `mixed`: the
        truth composes mixed-type cells (module doc); False (arena-compat:
        Arena has none) keeps the truth of single-type cells only. The
        estimator is returned as it is: the simulator wraps it for mixed cells."""
        kind = self.truth if self.truth in TRUTHS else truth_kind(self.truth)
        own: EstimatorLike
        if kind == "arena-filled":
            from solver.arena.estimates import ArenaEstimates

            filled = ArenaEstimates.filled_truth()
            speed, own = table_speed(filled, mixed), filled
        elif kind == "arena":
            from solver.arena.lookup import ArenaTable

            table = ArenaTable(None if self.truth == "arena" else self.truth)
            speed, own = table_speed(table, mixed), table
        else:
            from solver.contract.profiles.seed import open_store
            from solver.estimator import Estimator

            store_truth = Estimator(open_store(self.truth))
            speed, own = estimator_speed(store_truth, mixed), store_truth
        if self.estimates == "truth":
            return speed, own
        if self.estimates == "arena-estimated":
            from solver.arena.estimates import ArenaEstimates

            return speed, ArenaEstimates()
        if kind == "store":
            return speed, own
        from solver.contract.profiles.seed import open_store
        from solver.estimator import Estimator

        return speed, Estimator(open_store(None))

    def speed_factor(self, job_key: str, gpu_type: str) -> float:
        """The noise factor on the truth of job `job_key` (a trace job id) on
        `gpu_type` ("a+b" for a mixed cell: its slowest part's)."""
        if not self.noise:
            return 1.0
        z = random.Random(f"{self.seed}:{job_key}").gauss(0.0, 1.0)
        parts = [random.Random(f"{self.seed}:{job_key}:{t}").gauss(0.0, 1.0) for t in gpu_type.split("+")]
        return math.exp(self.noise * z + self.noise / 2 * max(parts))

    def describe(self) -> dict[str, object]:
        return {
            "truth": {
                "arena": "Arena's measured optimal-plan table",
                "arena-filled": "Arena's measured optimal-plan table, gaps filled by our estimator over it",
            }.get(self.truth, self.truth),
            "estimates": self.estimates,
            "noise_sigma": self.noise,
            "restart": self.restart.describe() if self.restart else None,
        }


def estimator_speed(estimator: Estimator, mixed: bool = False) -> SpeedFn:
    """A truth speed from an estimator with ``estimate_model`` (solver.estimator.Estimator):
    the estimated iteration time of the cell the job runs in (pp from its plan).
    `mixed`: a mixed-type cell's time is composed by `mixed_time` over the estimator
    (else the estimator is asked for the plan's mixed cell as it is)."""
    truth = MixedEstimator(estimator) if mixed else None

    def speed(spec: JobSpec, gpu_type: str, num_nodes: int, gpus_per_node: int, plan: JobPlan | None) -> float | None:
        if "+" in gpu_type and truth is not None:
            return mixed_time(truth, spec, gpu_type, num_nodes, gpus_per_node, plan)
        if "+" in gpu_type:  # a mixed-type cell: its key is in the plan
            cell = parse_key(plan.cell or "") if plan else None
            if cell is None:
                return None
        else:
            pp = plan.pp if plan and (num_nodes * gpus_per_node) % plan.pp == 0 else 1
            cell = Cell(gpu_type, num_nodes, gpus_per_node, pp)
        est = estimator.estimate_model(spec.model_spec(), spec.global_batch, cell)
        return est.iter_time_s if est.feasible else None

    return speed


def table_speed(table: Table, mixed: bool = False) -> SpeedFn:
    """A truth speed from an ``iter_time(model, batch, gpu_type, num_nodes, gpus_per_node)`` table (ArenaTable).
    `mixed`: a mixed-type cell's time is composed by `mixed_time` over `TableTruth(table)`."""
    return TableSpeed(table, MixedEstimator(TableTruth(table)) if mixed else None)


@dataclass(frozen=True)
class TableSpeed:
    """``table_speed``'s function (an object, so that a simulation's checkpoint can hold it)."""

    table: Table
    truth: MixedEstimator | None = None

    def __call__(
        self, spec: JobSpec, gpu_type: str, num_nodes: int, gpus_per_node: int, plan: JobPlan | None
    ) -> float | None:
        if "+" in gpu_type and self.truth is not None:
            return mixed_time(self.truth, spec, gpu_type, num_nodes, gpus_per_node, plan)
        return self.table.iter_time(spec.model, spec.global_batch, gpu_type, num_nodes, gpus_per_node)


class TableTruth(EstimatorBase):
    """A truth table as an estimator (EstimatorLike) of single-type pp-1
    cells, for MixedEstimator to compose mixed cells from: the table's time
    with the whole global batch, shown as data parallelism over the cell's
    GPUs (tp 1, one micro-batch), no memory figure (the table itself says
    where a cell does not fit: no time). The job's virtual workers are not
    looked at, as in `table_speed`. Its cost model is the table's (`Table`:
    ArenaEstimates offers ours, scaled to the table; ArenaTable none), from
    which MixedEstimator composes pipelines across types."""

    def __init__(self, table: Table) -> None:
        self.table = table

    @property
    def cost_model(self) -> CostModel | None:
        return self.table.cost_model

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        if cell.mixed or cell.pp != 1:
            return Estimate(cell, None, math.inf, 0.0, EstimateSource.NONE, "truth tables hold single-type pp-1 cells")
        t = self.table.iter_time(job.model.name, job.global_batch, cell.gpu_type, cell.num_nodes, cell.gpus_per_node)
        if t is None or not (t > 0 and math.isfinite(t)):
            return Estimate(cell, None, math.inf, 0.0, EstimateSource.NONE, "no truth for this cell")
        return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), float(t), 0.0, EstimateSource.MEASURED, "truth")


def mixed_time(
    truth: MixedEstimator, spec: JobSpec, gpu_type: str, num_nodes: int, gpus_per_node: int, plan: JobPlan | None
) -> float | None:
    """The true iteration time of a job in the mixed-type cell of its plan
    (None: no truth, the job fails at start like in an unknown cell).

    `truth` (MixedEstimator over the truth) composes the cell; the job runs
    the batch shares of its plan (the policy's belief), not the truth's best
    ones, so a pp-1 cell is timed by the same composition at the plan's
    shares (``MixedEstimator.dp_time``): each part's compute at the samples
    its ranks run (its type's samples spread over the truth's ranks of the
    part) and micro-batches (with virtual workers, the plan's per virtual
    worker times the most a rank runs), one gradient sync, and the update;
    sharded as the plan says (each type's slices by its ranks' state
    weights). The cell is the plan's key; it must be the cell the job got
    (types, nodes, GPUs per node)."""
    cell = parse_key(plan.cell or "") if plan is not None else None
    types = sorted(gpu_type.split("+"))
    if cell is None or not cell.mixed or sorted(t for t, _ in cell.parts) != types:
        return None
    if (cell.num_nodes, cell.gpus_per_node) != (num_nodes, gpus_per_node):
        return None
    job = JobRequest("truth", spec.model_spec(), spec.global_batch, spec.iterations, runtime=ADAPTIVE)
    est = truth.estimate(job, cell)
    if not est.feasible or est.plan is None:
        return None
    assert plan is not None
    batch = spec.global_batch
    planned = plan_samples(plan, cell, batch)
    if planned is None or cell.pp != 1 or len(est.plan.shares) != len(cell.parts):
        return est.iter_time_s
    ranks = [n * cell.gpus_per_node // est.plan.tp for _, n in cell.parts]
    samples = [planned[t] / r for (t, _), r in zip(cell.parts, ranks, strict=True)]
    vw = plan.virtual_workers
    units = [1] * len(samples) if not vw else [max(1, math.ceil(s * vw / batch - 1e-9)) for s in samples]
    micro = [plan.micro_batches * u for u in units]
    weights = plan_state(plan, cell)
    slices = None if weights is None else [weights[t] / r for (t, _), r in zip(cell.parts, ranks, strict=True)]
    return truth.dp_time(job, cell, samples, micro, max(units), slices)


def _rank_types(plan: JobPlan, cell: Cell) -> list[str] | None:
    """The GPU type of each dp rank of a pp-1 plan of `cell` (the node of its
    first task: tasks node by node in the plan's node order, tp innermost);
    None when the plan does not lay out the cell."""
    g = cell.gpus_per_node
    if plan.pp != 1 or len(plan.nodes) != cell.num_nodes or plan.dp * plan.tp != cell.num_gpus:
        return None
    kinds = {t for t, _ in cell.parts}
    out = [node_type(plan.nodes[d * plan.tp // g]) for d in range(plan.dp)]
    return out if all(t in kinds for t in out) else None


def plan_samples(plan: JobPlan, cell: Cell, batch: int) -> dict[str, float] | None:
    """Samples per iteration on each GPU type of a pp-1 mixed cell under the
    plan: its dp ranks' batch shares (even without), each rank on the node of
    its first task (tasks node by node in the plan's node order, Megatron
    order: tp innermost). None when the plan does not lay out the cell."""
    types = _rank_types(plan, cell)
    if types is None:
        return None
    weights = plan.batch_shares or (1.0,) * plan.dp
    out = dict.fromkeys((t for t, _ in cell.parts), 0.0)
    total = float(sum(weights))
    for t, w in zip(types, weights, strict=False):
        out[t] += batch * w / total
    return out


def plan_state(plan: JobPlan, cell: Cell) -> dict[str, float] | None:
    """The fraction of the optimizer state each GPU type's ranks own under a
    plan that shards it (state_shares as weights per dp rank, even without);
    None when the plan keeps the state replicated or does not lay out the cell."""
    if (plan.state_sharding in (None, "none")) and not plan.state_shares:
        return None
    types = _rank_types(plan, cell)
    if types is None:
        return None
    weights = plan.state_shares if plan.state_shares and len(plan.state_shares) == plan.dp else (1.0,) * plan.dp
    out = dict.fromkeys((t for t, _ in cell.parts), 0.0)
    total = float(sum(weights))
    for t, w in zip(types, weights, strict=False):
        out[t] += w / total
    return out


def truth_problem(truth: str) -> str | None:
    """Why `truth` (a TRUTHS name or a profiles file) is none; None when it is one."""
    if truth in TRUTHS:
        return None
    if not pathlib.Path(truth).is_file():
        return f"expected {' or '.join(TRUTHS)} or a profiles file, no such file {truth!r}"
    if truth_kind(truth) is None:
        return f"{truth!r} is neither Arena's profiles JSON nor a profile-store SQLite file"
    return None


def truth_kind(path: str) -> str | None:
    """ "arena" (a JSON file), "store" (a SQLite file) or None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError:
        return None
    if head.startswith(b"SQLite format 3"):
        return "store"
    if head.lstrip()[:1] in (b"{", b"["):
        return "arena"
    return None


__all__ = [
    "Conditions",
    "ConditionsError",
    "RestartModel",
    "ESTIMATES",
    "truth_kind",
    "truth_problem",
    "table_speed",
    "estimator_speed",
    "mixed_time",
    "TableTruth",
]
