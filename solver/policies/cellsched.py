"""cellsched: joint cell choice and placement of all managed jobs.

Per job: enumerate its cells, estimate each, prune dominated ones, value the
rest (solver.placement.objective); then one CP-SAT model picks at most one
cell per job for all jobs together and the node pass names the nodes.
Running elastic jobs may be resized or moved when the gain pays the restart
penalty; with `elastic=False` ("cellsched-static") or config.allow_resize
false, running jobs keep their placement, and so does a job whose current
run is younger than config.min_run_s (the restart governor,
placement.candidates.governed). With config.preemption "priority", a
pending job of higher rank that the plan leaves without GPUs may take
those of lower-ranked jobs, running ones preempted to zero
(solver.placement.preempt; ScheduleReply.preempted). Each running job
that keeps its placement gets a note saying why (solver.placement.explain;
ScheduleReply.notes).

With `contention_aware` (and a cluster whose NICs are known), sharing is
priced in a round where two multi-node jobs on one network card or rack
uplink cost one of them at least MIN_SHARED_LOSS of its speed
(`shared_loss`): now (the previous plan and the running jobs), or in the
plan made as if every job were alone on its links (then solved again).
Each multi-node option then carries what sharing a card would cost it
(`pick_costs`), and the joint model charges for each card shared
(model.py). Elsewhere the round is the one without contention_aware. The
node pass puts multi-node jobs on the least shared cards first.

With config.state_sharding false, every job is estimated with replicated
optimizer state only (JobRequest.state_sharding cleared for the round).

Jobs of the same shape (model, batch, constraints) share one enumeration and
estimation; the result is memoised across rounds while the cluster's shape,
the estimator and the cell settings stay the same (a pure function's cache:
the plan depends only on the request). A calibrated estimator's factors
are applied per job on top of the shape's uncalibrated estimates, so a
calibration that moves every round costs a factor per cell, not an estimate.

Mixed-type cells (solver.mixed): those a job needs are among its cells;
the others that may pay are estimated once per shape (the
max_mixed_cells best kept) and offered in a round only when the job could
get it now and it is faster than the fastest single-type cell the job could
get now (`FreeNow`: the GPUs no other job holds, plus its own), in the same
joint model; at most MIXED_OFFERS of them per job and round (the fastest
first: multi-type options make the joint model slower to solve).

A site policy (ScheduleRequest.site, docs/site-policy.md) binds the round
(solver.placement.siterules): partition access trims a job's partitions,
GPU limits are rows of the joint model (and checks of its greedy plan),
reserved nodes are marked in the node classes and kept from the options
of jobs that would not end before the reservation opens, moves that would
make a job miss its time limit are not offered, fair share weighs values
and costs each account's shortfall of its entitlement, and pending plain
sbatch jobs of higher priority are placed first as stand-ins whose GPUs
stay free. Each job left pending gets a reason in solver.site's forms.
An empty SitePolicy leaves the round as it was.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence

from solver.cells import cap, enumerate_cells, frontier, optional_mixed_cells
from solver.contention import duty, nic_by_type
from solver.estimator.protocol import EstimatorLike
from solver.placement import Space, objective, place_jobs, split_fixed
from solver.placement.candidates import (
    Option,
    Pick,
    fits,
    make_options,
    option_picks,
    partial_round,
    resumable,
    staying,
)
from solver.placement.explain import stay_notes
from solver.placement.joint import Result
from solver.placement.preempt import Preempted, preempt
from solver.placement.siterules import (
    UNMANAGED_PREFIX,
    SiteRules,
    all_partitions,
    allowed_partitions,
    claim_jobs,
    claiming,
)
from solver.policies.common import reply
from solver.site import reason_no_cell, reason_outbid, reason_partition, reason_settling, reason_unmanaged
from solver.types import (
    Cell,
    ClusterView,
    Estimate,
    JobRequest,
    ParallelPlan,
    Placement,
    ScheduleReply,
    ScheduleRequest,
    SolverConfig,
)

_MEMO_MAX = 4096
#: sharing a link is priced only where it would cost a job at least this share of its speed
#: (`shared_loss`): less is within the solver's stop gap (relative_gap_limit's default)
MIN_SHARED_LOSS = 0.01
#: at most this many mixed cells that pay are offered per job and round
MIXED_OFFERS = 1
#: (reference, pruned estimates, their utilities, mixed estimates that may pay, their utilities) of a job shape
_Shape = tuple[Estimate | None, list[Estimate], list[float], list[Estimate], list[float]]
#: (frontier per GPU type, the feasible estimates of fewest GPUs) of a job shape's uncalibrated estimates
_Frontier = tuple[list[list[Estimate]], list[Estimate]]
#: a round's plan: (result, the options offered, reasons of jobs held by the site's rules, stand-ins' claims)
_Solved = tuple[Result, Mapping[str, Sequence[Option]], dict[str, str], Mapping[str, Sequence[Option]]]
#: a hashable key of what something depends on (a job's shape, a round's context)
_Key = tuple[object, ...]
#: the duties of one job shape on one cluster's NICs: (cell, plan) -> duty
_ShapeDuties = dict[tuple[Cell, ParallelPlan | None], float]
#: (NICs by type, job shape) -> that shape's duties
DutyMemo = dict[_Key, _ShapeDuties]
#: duty_of(job, cell, plan, known) -> (known, duty) (see _duties)
_DutyOf = Callable[[JobRequest, Cell, ParallelPlan | None, _ShapeDuties | None], tuple[_ShapeDuties, float]]


def _shape(job: JobRequest) -> _Key:
    """What a job's cells and estimates depend on."""
    return (
        job.model.signature,
        job.global_batch,
        job.gpu_types,
        job.min_gpus,
        job.max_gpus,
        job.requested_gpus,
        job.excluded_cells,
        job.partitions,
        job.virtual_workers,
        job.state_sharding,
        job.runtime,
        job.move_pins,
    )


def _context(cluster: ClusterView, estimator: EstimatorLike, cfg: SolverConfig) -> _Key:
    nodes = sorted({(n.gpu_type, n.gpus_total, n.partitions) for n in cluster.nodes})
    counts = tuple((k, sum(1 for n in cluster.nodes if (n.gpu_type, n.gpus_total, n.partitions) == k)) for k in nodes)
    return (
        estimator,  # itself, not id(): an id outlives its object (and a checkpoint) and may come back on another
        counts,
        tuple(sorted(cluster.partitions.items())),
        cfg.max_pp,
        cfg.max_cells_per_job,
        cfg.fairness_p,
        cfg.mixed_cells,
        cfg.max_mixed_cells,
        cfg.max_mixed_types,
    )


class CellschedPolicy:
    def __init__(self, elastic: bool = True) -> None:
        self.elastic = elastic
        self.name = "cellsched" if elastic else "cellsched-static"
        self._memo_ctx: _Key | None = None
        self._memo: dict[tuple[_Key, _Key], _Shape] = {}  # (shape, calibration) -> _cells
        self._base: dict[tuple[_Key, str], _Frontier] = {}  # (shape, kind) -> uncalibrated frontier (``_frontier``)
        self._duties: DutyMemo = {}  # NICs by type, shape -> (cell, plan) -> duty

    def __getstate__(self) -> dict[str, bool]:
        """Pickled (a simulation's checkpoint) without its memos: caches, rebuilt on use."""
        return {"elastic": self.elastic}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(bool(state["elastic"]))  # type: ignore[misc]

    def _cells(self, job: JobRequest, cluster: ClusterView, estimator: EstimatorLike, cfg: SolverConfig) -> _Shape:
        """(reference estimate, pruned estimates, their utilities, the mixed
        estimates that may pay and their utilities) of the job's shape, as
        adjusted for it (the estimator's ``job_key``: without it in the
        key a shape kept the calibration of the first job seen with it)."""
        key = (_shape(job), estimator.job_key(job))
        hit = self._memo.get(key)
        if hit is None:
            scale = estimator.adjust
            groups, smallest = self._frontier(job, "cells", cluster, estimator, cfg)
            ref = objective.reference(job, scale(job, smallest))
            kept = cap([scale(job, g) for g in groups], cfg)
            optional: list[Estimate] = []
            if ref is not None:
                extra, _ = self._frontier(job, "mixed", cluster, estimator, cfg)
                optional = sorted(
                    cap([scale(job, g) for g in extra], cfg),
                    key=lambda e: (e.iter_time_s * e.cell.num_gpus, e.cell.key()),
                )[: cfg.max_mixed_cells]
            hit = (
                ref,
                kept,
                objective.utilities(job, kept, ref, cfg.fairness_p) if ref else [0.0] * len(kept),
                optional,
                objective.utilities(job, optional, ref, cfg.fairness_p) if ref else [],
            )
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            self._memo[key] = hit
        return hit

    def _frontier(
        self, job: JobRequest, kind: str, cluster: ClusterView, estimator: EstimatorLike, cfg: SolverConfig
    ) -> _Frontier:
        """The shape's estimates of the job's cells (`kind` "cells") or of
        the mixed cells that may pay ("mixed"), before the job's own
        calibration (the estimator's ``estimate_shape``), memoised by shape: their
        frontier (solver.cells.frontier) among the plans a job with a
        checkpoint can resume it with (candidates.resumable; the shape holds
        what its runtime keeps fixed: JobRequest.move_pins) and the feasible
        ones of fewest GPUs (where the reference is). Calibration scales a job's times by one
        factor per GPU type, which keeps both, so a job whose factors move
        every round (each round brings it samples) costs a factor per cell
        of these, not a fresh estimate or pruning of every cell (once 5/6 of
        a simulated round on Arena's cluster, then a third)."""
        key = (_shape(job), kind)
        hit = self._base.get(key)
        if hit is None:
            cells = enumerate_cells(job, cluster, cfg) if kind == "cells" else optional_mixed_cells(job, cluster, cfg)
            base = [e for e in (estimator.estimate_shape(job, c) for c in cells) if e.feasible]
            fewest = min((e.cell.num_gpus for e in base), default=0)
            hit = (frontier(resumable(job, base)), [e for e in base if e.cell.num_gpus == fewest])
            if len(self._base) >= _MEMO_MAX:
                self._base.clear()
            self._base[key] = hit
        return hit

    def schedule(self, request: ScheduleRequest, estimator: EstimatorLike) -> ScheduleReply:
        t0 = time.perf_counter()
        cfg, cluster = request.config, request.cluster
        fixed, jobs, reasons = split_fixed(cluster, _configured(request.jobs, cfg), self.elastic, cfg, request.now)
        stayed: list[str] = []  # the running jobs a partial round keeps where they are
        if not request.replan_all:
            fixed, jobs, stayed = partial_round(cluster, fixed, jobs)
        rules = None
        if not request.site.empty:
            rules = SiteRules(request.site, cluster, request.jobs, fixed, request.now)
            jobs = _with_access(jobs, request, reasons)
        used: dict[str, int] = {}
        for p in fixed.values():
            for n, g in p.nodes:
                used[n] = used.get(n, 0) + g
        ctx = _context(cluster, estimator, cfg)
        if ctx != self._memo_ctx:
            self._memo_ctx, self._memo, self._base, self._duties = ctx, {}, {}, {}
        ests, refs, utils = {}, {}, {}
        free_now: FreeNow | None = None
        settling: dict[str, str] = {}  # the jobs offered only cells near the fastest of their size (settle_limits)
        for job in jobs:
            refs[job.job_id], kept, u, optional, opt_u = self._cells(job, cluster, estimator, cfg)
            if optional:
                if free_now is None:
                    free_now = FreeNow(cluster, used, jobs)
                pays = free_now.paying(job, kept, optional)
                if pays:
                    kept, u = kept + [optional[i] for i in pays], u + [opt_u[i] for i in pays]
            current = job.current
            if current is not None and all(e.cell != current.cell for e in kept):
                cur = staying(job, estimator.estimate(job, current.cell))
                ref = refs[job.job_id]
                if cur.feasible and ref is not None:
                    kept, u = kept + [cur], u + [objective.utility(job, cur, ref, cfg.fairness_p)]
            limits = objective.settle_limits(job, kept, request.now, cfg)
            slow = [e.iter_time_s > limits.get(e.cell.num_gpus, math.inf) for e in kept] if limits else []
            if any(slow):
                size = min(e.cell.num_gpus for e, no in zip(kept, slow, strict=True) if no)
                best = min((e for e in kept if e.cell.num_gpus == size), key=lambda e: e.iter_time_s)
                settling[job.job_id] = reason_settling(request.now - job.submit_time, best.cell.key())
                kept, u = (
                    [e for e, no in zip(kept, slow, strict=True) if not no],
                    [x for x, no in zip(u, slow, strict=True) if not no],
                )
            ests[job.job_id], utils[job.job_id] = kept, u
        weights = objective.job_weights(jobs, refs, request.now, cfg)
        if rules is not None and rules.fair:
            weights = {j.job_id: weights[j.job_id] * rules.fair_weight(j) for j in jobs}
        picks, mults = {}, {}
        by_name = {n.name: n for n in cluster.nodes}
        for job in jobs:
            ref = refs[job.job_id]
            if ref is None:
                why = "no feasible cell (every cell out of memory or without data)"
                if rules is None:
                    reasons[job.job_id] = why
                else:
                    reasons.setdefault(job.job_id, reason_no_cell(why))
                continue
            stay = job.current is not None and fits(by_name, job.current, used)
            mults[job.job_id] = objective.restart_factor(
                job,
                cfg,
                remaining_s=_remaining_s(job),
                stayed_s=_stayed_s(job, request.now),
                age_s=request.now - job.submit_time,
            )
            picks[job.job_id] = option_picks(
                job,
                ests[job.job_id],
                ref,
                weights[job.job_id],
                cfg.fairness_p,
                mults[job.job_id],
                stay,
                cfg.max_cells_per_job,
                utils[job.job_id],
            )
        by_id = {j.job_id: j for j in jobs}

        def build(costed: bool) -> dict[str, list[Option]]:
            costs = pick_costs(jobs, ests, picks, cluster, self._duties) if costed else None
            return {
                jid: make_options(by_id[jid], ests[jid], ps, costs[jid] if costs is not None else None)
                for jid, ps in picks.items()
            }

        preferred = {**request.previous, **{j.job_id: j.current for j in jobs if j.current}}

        def solve(options: dict[str, list[Option]]) -> _Solved:
            if rules is None:
                return place_jobs(Space.of(cluster, fixed), jobs, options, cfg, preferred=preferred), options, {}, {}
            allowed, held = rules.options(jobs, options, cfg)
            stand_ins, claims = claim_jobs(claiming(request.site, request.jobs), cluster, rules.penalty_unit(allowed))
            space = Space.of(cluster, fixed, rules.marks)
            jobs_in = [*jobs, *stand_ins]
            return (
                place_jobs(space, jobs_in, {**allowed, **claims}, cfg, preferred=preferred, rules=rules),
                allowed,
                held,
                claims,
            )

        priced = cfg.contention_aware and cluster.network.modelled
        everyone = {j.job_id: j for j in request.jobs}

        def shared(placements: Mapping[str, Placement]) -> bool:
            return shared_loss(cluster, placements, everyone, self._duties) >= MIN_SHARED_LOSS

        shared_now = priced and shared({**preferred, **fixed})
        options = build(shared_now)
        t1 = time.perf_counter()
        result, allowed, held, claims = solve(options)
        if priced and not shared_now and shared({**fixed, **result.placements}):
            result, allowed, held, claims = solve(build(True))
        offered = sum(len(v) for v in allowed.values())
        if rules is None:
            for job in jobs:
                if job.job_id not in result.placements and job.job_id not in reasons:
                    reasons[job.job_id] = settling.get(
                        job.job_id, "waiting: the GPUs are worth more to other jobs this round"
                    )
            out, claimed = reply(fixed, result, offered, reasons, t1 - t0), {}
        else:
            reasons.update(held)
            with_claims = {**fixed, **result.placements}
            claimed = {jid: p for jid, p in result.placements.items() if jid in claims}
            result = _without_stand_ins(result, claims)
            site_reasons(rules, jobs, allowed, with_claims, claims, reasons)
            for jid, why in settling.items():
                reasons.setdefault(jid, why)
            out = reply(fixed, result, offered, reasons, t1 - t0, request)
        if cfg.preemption != "off":
            out = _preempted(out, preempt(request, jobs, out.placements, ests, rules, claimed))
        cells = {jid: {o.cell for o in opts} for jid, opts in allowed.items()}
        notes = stay_notes(
            request.jobs, out.placements, fixed, ests, refs, mults, cells, self.elastic, cfg, request.now, stayed
        )
        return dataclasses.replace(out, notes={**notes, **out.notes})


def _preempted(out: ScheduleReply, done: Preempted) -> ScheduleReply:
    """The reply with the preemption pass's plan (solver.placement.preempt)."""
    reasons = {k: v for k, v in {**out.reasons, **done.reasons}.items() if k not in done.placements}
    return dataclasses.replace(
        out, placements=done.placements, reasons=reasons, preempted=done.preempted, notes={**out.notes, **done.notes}
    )


def pick_costs(
    jobs: Sequence[JobRequest],
    estimates: Mapping[str, Sequence[Estimate]],
    picks: Mapping[str, Sequence[Pick]],
    cluster: ClusterView,
    memo: DutyMemo | None = None,
) -> dict[str, list[int]]:
    """Each pick's nic_cost (0 on one node), from the estimates the picks
    index: what a multi-node option loses when a network card of its nodes
    carries another multi-node job. With duty d (its share of the iteration
    on the cards alone, on this cluster's NICs) next to a job of duty d',
    its transfers take 1 + d' times as long, its iteration 1 + d d' times,
    and it loses 1 - 1 / (1 + d d') of its value; d' is the mean duty of
    this round's multi-node picks. `memo` (the caller keeps it across
    rounds) holds the duties computed so far, per NICs and job shape, per
    (cell, plan): a duty depends on nothing else."""
    duty_of = _duties(cluster, memo)
    by_id = {j.job_id: j for j in jobs}
    duties: dict[str, list[float | None]] = {}
    total, count = 0.0, 0
    for jid, ps in picks.items():
        known: _ShapeDuties | None = None
        row: list[float | None] = []
        for i, _, _ in ps:
            e = estimates[jid][i]
            if e.cell.num_nodes > 1:
                known, d = duty_of(by_id[jid], e.cell, e.plan, known)
                total, count = total + d, count + 1
                row.append(d)
            else:
                row.append(None)
        duties[jid] = row
    other = total / count if count else 0.0
    return {
        jid: [
            0 if d is None else round(v * (1 - 1 / (1 + d * other)))
            for (_, v, _), d in zip(ps, duties[jid], strict=True)
        ]
        for jid, ps in picks.items()
    }


def shared_loss(
    cluster: ClusterView,
    placements: Mapping[str, Placement],
    jobs: Mapping[str, JobRequest],
    memo: DutyMemo | None = None,
) -> float:
    """The most a multi-node job of `placements` loses to another on one of
    its network cards or rack uplinks (solver.network.Network.links), as a
    share of its speed: 1 - 1 / (1 + d d') for the two largest duties d, d'
    (`pick_costs`) on one link; 0 when no link carries two. Placements of
    jobs not in `jobs` (a previous plan's jobs that have ended) and stand-ins
    of plain sbatch jobs (they hold GPUs, not a plan's links) are left out."""
    duty_of = _duties(cluster, memo)
    on: dict[str, list[float]] = {}
    for jid, p in placements.items():
        job = jobs.get(jid)
        if p.cell.num_nodes < 2 or job is None:
            continue
        d = duty_of(job, p.cell, p.plan, None)[1]
        for link, _ in cluster.network.links(n for n, _ in p.nodes):
            on.setdefault(link, []).append(d)
    worst = 0.0
    for ds in on.values():
        if len(ds) > 1:
            a, b = sorted(ds)[-2:]
            worst = max(worst, 1 - 1 / (1 + a * b))
    return worst


def _duties(cluster: ClusterView, memo: DutyMemo | None) -> _DutyOf:
    """duty_of(job, cell, plan, known) -> (known, duty): the duty of a
    multi-node cell, memoised per NICs and job shape (`known`: that
    shape's table, looked up once per job)."""
    nics = nic_by_type(cluster)
    table: DutyMemo = {} if memo is None else memo
    nic_key = tuple(sorted(nics.items()))

    def duty_of(
        job: JobRequest, cell: Cell, plan: ParallelPlan | None, known: _ShapeDuties | None
    ) -> tuple[_ShapeDuties, float]:
        if known is None:
            known = table.setdefault((nic_key, _shape(job)), {})
        d = known.get((cell, plan))
        if d is None:
            nic = min((nics[t] for t, _ in cell.by_type() if t in nics), default=None)
            d = known[(cell, plan)] = duty(job, cell, plan, nic)
        return known, d

    return duty_of


class FreeNow:
    """The GPUs free now on each node: not held by a fixed job nor by a running
    one (the solver may still move those); per GPU type, sorted."""

    def __init__(self, cluster: ClusterView, used: Mapping[str, int], jobs: Sequence[JobRequest]) -> None:
        held = dict(used)
        for j in jobs:
            if j.current is not None:
                for n, g in j.current.nodes:
                    held[n] = held.get(n, 0) + g
        self.free = {n.name: max(0, n.gpus_free - held.get(n.name, 0)) for n in cluster.nodes}
        self.type_of = {n.name: n.gpu_type for n in cluster.nodes}
        by_type: dict[str, list[int]] = {}
        for node in cluster.nodes:
            by_type.setdefault(node.gpu_type, []).append(self.free[node.name])
        self.sorted = {t: sorted(v) for t, v in by_type.items()}

    def _lists(self, job: JobRequest) -> dict[str, list[int]]:
        """Per type, the free GPUs of its nodes plus what `job` holds there."""
        if job.current is None:
            return self.sorted
        mine = dict(job.current.nodes)
        out = dict(self.sorted)
        for t in {self.type_of[n] for n in mine if n in self.type_of}:
            out[t] = sorted(self.free[n] + mine.get(n, 0) for n, tt in self.type_of.items() if tt == t)
        return out

    @staticmethod
    def _fits(cell: Cell, lists: Mapping[str, list[int]]) -> bool:
        for t, n in cell.by_type():
            free = lists.get(t, [])
            if len(free) - bisect.bisect_left(free, cell.gpus_per_node) < n:
                return False
        return True

    def paying(self, job: JobRequest, kept: Sequence[Estimate], optional: Sequence[Estimate]) -> list[int]:
        """Indices of the `optional` mixed estimates the job could get now and
        that are faster than the fastest single-type cell in `kept` it could
        get now."""
        lists = self._lists(job)
        now = [e.iter_time_s for e in kept if not e.cell.mixed and self._fits(e.cell, lists)]
        best = min(now, default=math.inf)
        pays = [i for i, e in enumerate(optional) if e.iter_time_s < best and self._fits(e.cell, lists)]
        if len(pays) <= MIXED_OFFERS:
            return pays
        # the fastest, then the fewest GPUs (keeps the joint model's multi-type options few)
        first = min(pays, key=lambda i: (optional[i].iter_time_s, optional[i].cell.num_gpus))
        rest = sorted(
            (i for i in pays if i != first), key=lambda i: (optional[i].cell.num_gpus, optional[i].iter_time_s)
        )
        return sorted([first, *rest[: MIXED_OFFERS - 1]])


def _with_access(jobs: Sequence[JobRequest], request: ScheduleRequest, reasons: dict[str, str]) -> list[JobRequest]:
    """The jobs with only the partitions their account and QOS may use
    (SitePolicy.partition_access); a reason for those left with none."""
    out = []
    for job in jobs:
        parts = allowed_partitions(job, request.site, request.cluster)
        if parts != job.partitions:
            if parts is not None and not parts:
                asked = job.partitions if job.partitions is not None else all_partitions(request.cluster)
                reasons[job.job_id] = reason_partition(job.account, job.qos, tuple(asked))
            job = dataclasses.replace(job, partitions=parts)
        out.append(job)
    return out


def _without_stand_ins(result: Result, claims: Mapping[str, Sequence[Option]]) -> Result:
    """The plan without the stand-ins of pending plain sbatch jobs (their
    GPUs stay free for Slurm to start them) nor their worth."""
    if not claims:
        return result
    worth = 0.0
    for jid in claims:
        p = result.placements.get(jid)
        if p is not None:
            worth += next((o.value for o in claims[jid] if o.cell == p.cell), 0) / objective.SCALE
    kept = {jid: p for jid, p in result.placements.items() if jid not in claims}
    return dataclasses.replace(
        result,
        placements=kept,
        objective=result.objective - worth,
        bound=result.bound - worth,
        reasons={k: v for k, v in result.reasons.items() if k not in claims},
    )


def site_reasons(
    rules: SiteRules,
    jobs: Sequence[JobRequest],
    options: Mapping[str, Sequence[Option]],
    placed: Mapping[str, Placement],
    claims: Mapping[str, Sequence[Option]],
    reasons: dict[str, str],
) -> None:
    """The binding constraint of each job left pending (solver.site's reason
    forms): a limit its smallest option would break, a reservation that
    keeps it off nodes, its account past its fair share, a pending plain
    sbatch job that claims GPUs of its types, or the jobs that hold those
    GPUs and are worth more."""
    held = {jid: p for jid, p in placed.items() if not jid.startswith(UNMANAGED_PREFIX)}
    loads = rules.loads(held)
    by_account: dict[str, int] = {}
    accounts = {j.job_id: j.account for j in jobs} | rules.account_of
    for jid, p in held.items():
        a = accounts.get(jid, "")
        by_account[a] = by_account.get(a, 0) + p.cell.num_gpus
    top: dict[str, list[tuple[float, str]]] = {}  # GPU type -> the most valuable jobs on it (-value, job)
    for jid, p in held.items():
        v = next((o.value for o in options.get(jid, ()) if o.cell == p.cell), 0) / objective.SCALE
        for t, _ in p.cell.by_type():
            top.setdefault(t, []).append((-v, jid))
    top = {t: sorted(vs)[:3] for t, vs in top.items()}
    by_claim = {UNMANAGED_PREFIX + u.job_id: u for u in rules.site.unmanaged}
    claimed = {placed[cid].cell.gpu_type: by_claim[cid] for cid in claims if cid in placed}
    for job in jobs:
        jid = job.job_id
        if jid in placed or jid in reasons:
            continue
        opts = options.get(jid, ())
        smallest = min((o.cell for o in opts), key=lambda c: c.num_gpus, default=None)
        types = sorted({t for o in opts for t, _ in o.cell.by_type()})
        why = rules.limit_reason(job, loads, smallest) or rules.held_off.get(jid) or rules.fair_reason(job, by_account)
        u = next((claimed[t] for t in types if t in claimed), None)
        if why is None and u is not None:
            why = reason_unmanaged(u.job_id, u.priority, u.gpus, u.gpu_type)
        if why is None:
            rivals = sorted({r for t in types for r in top.get(t, ())})[:3]
            why = (
                reason_outbid(tuple((j, -v) for v, j in rivals))
                if rivals
                else reason_no_cell("no free GPUs of its types")
            )
        reasons[jid] = why


def _configured(jobs: Sequence[JobRequest], cfg: SolverConfig) -> Sequence[JobRequest]:
    """The jobs as this round's config lets them run: without state sharding
    when config.state_sharding is false (the estimator then prices replicated
    optimizer state only)."""
    if cfg.state_sharding:
        return jobs
    return [j if not j.state_sharding else dataclasses.replace(j, state_sharding=False) for j in jobs]


def _remaining_s(job: JobRequest) -> float | None:
    """Seconds the running job still needs in its current cell (None: not running)."""
    cur = job.current
    if cur is None or not cur.iter_time_s or not math.isfinite(cur.iter_time_s):
        return None
    return job.remaining_iterations * cur.iter_time_s


def _stayed_s(job: JobRequest, now: float) -> float | None:
    """Seconds the running job has stayed in its current run (None: not known)."""
    if job.current is None or job.running_since is None:
        return None
    return max(0.0, now - job.running_since)
