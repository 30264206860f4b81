"""What the SRSF baselines share (Wang, Shi, Wang, Chu 2020, "Communication
Contention Aware Scheduling of Multiple Deep Learning Training Jobs").

The paper schedules jobs shortest-remaining-service-first (SRSF: remaining
iterations x iteration time x GPUs) and places them least-workload-first
with a cap kappa on the jobs that share a link: SRSF(1) avoids contention,
SRSF(2) accepts two jobs per link, and AdaDUAL admits a second
communication task onto a busy link only when that finishes it sooner.

What we adapt:

- Non-preemptive. The paper's SRSF preempts; our controller never does, so
  running jobs keep their placements (as in FCFS) and only pending jobs are
  ordered. Pending jobs go by remaining service (the estimate of their
  best-locality DP-only cell on the requested GPU type and count), then
  submit time. A job that cannot start does not block the shorter-service
  ones behind it: the paper allocates GPUs job by job until none is left.
- A link is a node's network card; kappa counts the multi-node jobs on it
  (fixed ones and those placed this round, this one included). One-node
  jobs do not communicate and are never capped.
- Node choice per `SolverConfig.node_placement`: "lwf-kappa" (cards with the
  fewest multi-node jobs, then most free GPUs, then cluster order) or
  "first-fit" (cluster order); both respect the policy's cap.
- AdaDUAL at job level (`admit`): see there.
- Every job runs: one whose requested count fits in no layout (its
  data-parallel replica does not fit in memory, or it failed in each) runs
  at another count (`fallback_counts`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from solver.contention import loaded_times
from solver.estimator.protocol import EstimatorLike
from solver.placement import Space, split_fixed
from solver.placement.candidates import Option
from solver.placement.greedy import try_place
from solver.placement.nodes import ClassKey, Ledger
from solver.policies.common import Feasible, dp_estimate, heuristic_reply, layouts
from solver.policies.fcfs import requested
from solver.types import Cell, ClusterView, Estimate, JobRequest, Placement, ScheduleReply, ScheduleRequest

#: (job, placement, iteration time alone on its nodes) of a placed multi-node job
Comm = tuple[JobRequest, Placement, float]


@dataclass(frozen=True)
class Pending:
    """A pending job in SRSF order, with its feasible layouts (best locality first)."""

    job: JobRequest
    service: float
    estimates: tuple[Estimate, ...]


def fallback_counts(requested: int, total: int) -> list[int]:
    """The GPU counts a job is tried at, in order: the one it asked for,
    then, where none of its layouts fits (its data-parallel replica does not
    fit in memory, or it failed in each), the smallest larger power of two
    first (more GPUs hold more of the model), up to the type's `total`, then
    smaller ones from the largest down: the smallest plan that fits, as the
    papers' runtimes would run the job rather than never."""
    up = [n for n in (2**k for k in range(total.bit_length() + 1)) if requested < n <= total]
    down = [n for n in (2**k for k in range(requested.bit_length(), -1, -1)) if n < requested]
    return [requested, *up, *down]


def remaining_service(job: JobRequest, est: Estimate) -> float:
    """Remaining iterations x iteration time x GPUs (GPU-seconds)."""
    return job.remaining_iterations * est.iter_time_s * est.cell.num_gpus


def lwf_key(ledger: Ledger[ClassKey], name: str, multi: bool, rank: int) -> tuple[int, int, int]:
    """LWF-kappa's order of nodes: a multi-node job takes the cards with the
    least network workload (fewest multi-node jobs), then packs (fewest free
    GPUs that fit); a one-node job never communicates, so it packs too,
    busiest cards first, keeping whole nodes and quiet cards for the jobs
    that talk. (Balancing GPU load, most free GPUs first, split whole nodes
    and was 3-4% worse on the 64-GPU benchmark.)"""
    if multi:
        return ledger.links[name], ledger.free[name], rank
    return ledger.free[name], -ledger.links[name], rank


def pick_nodes(
    space: Space, ledger: Ledger[ClassKey], job: JobRequest, cell: Cell, cap: int, how: str, rank: Mapping[str, int]
) -> tuple[str, ...] | None:
    """Nodes for `cell` with room now, a multi-node cell only on cards that
    carry fewer than `cap` multi-node jobs; ordered per `how` (lwf-kappa,
    first-fit). All in one of the job's partitions; None when none fit."""
    multi = cell.num_nodes > 1
    for part in job.partitions if job.partitions is not None else (None,):
        names: list[str] = []
        for n_nodes, classes in space.part_classes(job, cell):
            cands = [
                name
                for k in classes
                if part is None or not k[2] or part in k[2]
                for name in space.classes[k]
                if name not in names
                and ledger.free[name] >= cell.gpus_per_node
                and (not multi or ledger.links[name] < cap)
            ]
            if how == "first-fit":
                cands.sort(key=rank.__getitem__)
            else:
                cands.sort(key=lambda n: lwf_key(ledger, n, multi, rank[n]))
            if len(cands) < n_nodes:
                break
            names += cands[:n_nodes]
        else:
            return tuple(names)
    return None


def component(cluster: ClusterView, nodes: Sequence[str], comm: Mapping[str, Comm]) -> list[Comm]:
    """The placed multi-node jobs that share a link with a job on `nodes`,
    directly or through one another (all that its contention couples)."""
    net = cluster.network
    links_of = {jid: {link for link, _ in net.links(p.node_names)} for jid, (_, p, _) in comm.items()}
    frontier = {link for link, _ in net.links(nodes)}
    seen, members = set(frontier), []
    while frontier:
        grown: set[str] = set()
        for jid, links in links_of.items():
            if jid not in members and links & frontier:
                members.append(jid)
                grown |= links - seen
        seen |= grown
        frontier = grown
    return [comm[jid] for jid in members]


def clean_start(
    cluster: ClusterView,
    ledger: Ledger[ClassKey],
    space: Space,
    ends: Sequence[tuple[float, Placement]],
    cells: Sequence[Cell],
) -> float:
    """The earliest time (s from now) at which one of `cells` fits on cards
    that carry no multi-node job, as the placed jobs end (`ends`: when each
    ends, and where it runs); inf when never. Partitions are not looked at."""
    free = {n.name: ledger.free.get(n.name, 0) for n in cluster.nodes}
    links = {n.name: ledger.links.get(n.name, space.links.get(n.name, 0)) for n in cluster.nodes}
    types = {n.name: n.gpu_type for n in cluster.nodes}

    def fits() -> bool:
        for cell in cells:
            ok = [
                n
                for n in free
                if types[n] == cell.gpu_type and free[n] >= cell.gpus_per_node and (cell.num_nodes < 2 or not links[n])
            ]
            if len(ok) >= cell.num_nodes:
                return True
        return False

    if fits():
        return 0.0
    for t, p in sorted(ends, key=lambda e: e[0]):
        for name, g in p.nodes:
            free[name] = free.get(name, 0) + g
            links[name] = max(0, links.get(name, 0) - int(p.cell.num_nodes > 1))
        if fits():
            return t
    return math.inf


def admit(
    cluster: ClusterView, mine: Comm, comm: Mapping[str, Comm], clean_s: float = math.inf
) -> tuple[bool, float, float]:
    """AdaDUAL at job level: (admit, summed completion if sharing, if
    waiting), s from now, over the new job and the jobs it would slow.

    AdaDUAL admits a communication task onto a busy link when that lowers
    the completion times of the tasks there. Sharing: every job coupled to
    the new one's cards (time-averaged, solver.network) runs at its shared
    speed until the new job or it is done; the survivors run at their own
    speed after (the new job alone, the others as now). Waiting: the new job
    starts when the last job on its cards finishes, or earlier on other
    cards free of multi-node jobs (`clean_s`, `clean_start`), then runs
    alone; the others are untouched. Admitted when sharing gives the
    smaller sum.
    """
    job, placement, alone = mine
    nodes = set(placement.node_names)
    others = [c for c in comm.values() if nodes & set(c[1].node_names)]
    before = component(cluster, placement.node_names, comm)
    now = loaded_times(before, cluster)
    with_me = loaded_times([*before, mine], cluster)

    def finish(left: float, slow: float, fast: float, until: float) -> float:
        """`left` iterations at `slow` s each until `until`, at `fast` after."""
        return left * slow if left * slow <= until else until + (left - until / slow) * fast

    wait = min(clean_s, max((c[0].remaining_iterations * now[c[0].job_id] for c in others), default=0.0))
    last_other = max((c[0].remaining_iterations * with_me[c[0].job_id] for c in before), default=0.0)
    mine_s = job.remaining_iterations * with_me[job.job_id]
    share = finish(job.remaining_iterations, with_me[job.job_id], alone, last_other)
    waited = wait + job.remaining_iterations * alone
    for other, _, _ in before:
        left, fast = other.remaining_iterations, now[other.job_id]
        waited += left * fast
        share += finish(left, with_me[other.job_id], fast, mine_s)
    return share < waited, share, waited


@dataclass
class RoundState:
    """One round's placing: the space and ledger, the node order, the placed
    multi-node jobs (`comm`) and when each placed job ends (`ends`, s from now)."""

    space: Space
    ledger: Ledger[ClassKey]
    how: str
    rank: Mapping[str, int]
    comm: dict[str, Comm]
    ends: list[tuple[float, Placement]]


class SrsfPolicy:
    """SRSF with at most `kappa` multi-node jobs per network card; `adaptive`:
    AdaDUAL's admission for a second job on a card (then kappa is 2)."""

    name = "srsf"
    kappa = 1
    adaptive = False

    def __init__(self, feasible: Feasible = None) -> None:
        self.feasible = feasible

    def pending(
        self, cluster: ClusterView, jobs: Sequence[JobRequest], estimator: EstimatorLike, reasons: dict[str, str]
    ) -> tuple[list[Pending], int]:
        """The pending jobs that could ever start, shortest remaining service first; cells tried."""
        out, cells = [], 0
        for i, job in enumerate(jobs):
            gpu_type, gpus = requested(job, cluster.gpu_types())
            if gpu_type is None:
                reasons[job.job_id] = "no GPU type of the cluster is allowed"
                continue
            ests: list[Estimate] = []
            for n in fallback_counts(gpus, sum(g * k for g, k in cluster.node_sizes(gpu_type))):
                for cell in layouts(cluster, gpu_type, n):
                    cells += 1
                    est = dp_estimate(job, cell, estimator, self.feasible)
                    if est is not None:
                        ests.append(est)
                if ests:
                    break
            if not ests:
                reasons[job.job_id] = f"no feasible layout of {gpus} x {gpu_type} (nor of another GPU count)"
                continue
            out.append(((remaining_service(job, ests[0]), job.submit_time, i), job, tuple(ests)))
        out.sort(key=lambda t: t[0])
        return [Pending(job, key[0], ests) for key, job, ests in out], cells

    def schedule(self, request: ScheduleRequest, estimator: EstimatorLike) -> ScheduleReply:
        t0 = time.perf_counter()
        cluster, how = request.cluster, request.config.node_placement
        fixed, jobs, reasons = split_fixed(cluster, request.jobs, False, request.config)
        space = Space.of(cluster, fixed)
        ledger = space.ledger()
        rank = {n.name: i for i, n in enumerate(cluster.nodes)}
        by_id = {j.job_id: j for j in request.jobs}
        comm: dict[str, Comm] = {
            jid: (by_id[jid], p, p.iter_time_s)
            for jid, p in fixed.items()
            if p.cell.num_nodes > 1 and jid in by_id and p.iter_time_s > 0 and math.isfinite(p.iter_time_s)
        }
        ends = [
            (by_id[jid].remaining_iterations * p.iter_time_s, p)
            for jid, p in fixed.items()
            if jid in by_id and math.isfinite(p.iter_time_s)
        ]
        state = RoundState(space, ledger, how, rank, comm, ends)
        queue, cells = self.pending(cluster, jobs, estimator, reasons)
        placed: dict[str, Placement] = {}
        for item in queue:
            got, why = self._place(state, item)
            if got is None:
                reasons[item.job.job_id] = why
                continue
            placed[item.job.job_id] = got
            ends.append((item.job.remaining_iterations * got.iter_time_s, got))
            if got.cell.num_nodes > 1:
                comm[item.job.job_id] = (item.job, got, got.iter_time_s)
        return heuristic_reply(fixed, placed, cells, reasons, t0, request)

    def _place(self, state: RoundState, item: Pending) -> tuple[Placement | None, str]:
        """The job on its first layout that fits under the cap (adaptive: first
        alone on its cards, then sharing where AdaDUAL admits it), or why not."""
        space, ledger = state.space, state.ledger
        job = item.job
        cell = item.estimates[0].cell
        why = (
            f"waiting: {cell.num_gpus} {cell.gpu_type} GPUs do not fit now with at most {self.kappa} "
            "multi-node job(s) a network card (SRSF)"
        )
        caps = (1, 2) if self.adaptive else (self.kappa,)
        for cap in caps:
            for est in item.estimates:
                names = pick_nodes(space, ledger, job, est.cell, cap, state.how, state.rank)
                if names is None:
                    continue
                assert est.plan is not None  # dp_estimate's estimates are feasible
                opt = Option(job.job_id, est.cell, est.plan, est.iter_time_s, 0, None, est.source)
                pairs = tuple((n, est.cell.gpus_per_node) for n in names)
                if cap > 1 and self.adaptive and any(ledger.links[n] for n in names):
                    clean = clean_start(space.cluster, ledger, space, state.ends, [e.cell for e in item.estimates])
                    ok, share, wait = admit(
                        space.cluster, (job, opt.placement(pairs), est.iter_time_s), state.comm, clean
                    )
                    if not ok:
                        why = (
                            f"waiting: sharing a network card would finish it in {share:.0f} s, "
                            f"waiting in {wait:.0f} s (AdaDUAL)"
                        )
                        continue
                got = try_place(space, ledger, job, opt, names)
                if got is not None:
                    return opt.placement(*got), ""
        return None, why
