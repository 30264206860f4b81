"""Preemption to zero GPUs (SolverConfig.preemption = "priority";
docs/scheduling.md#preemption).

**Rank.** A job's preemption rank is (the PriorityTier of its partition,
SitePolicy.tier; its QOS's priority, SitePolicy.qos_priority; 1 when its
account's decayed usage is below its fair share, SitePolicy.usage against
.shares, else 0), compared in that order, as Slurm orders them: a job of a
partition of a higher tier outranks any job of a lower one, an urgent QOS
outranks a normal one whatever the accounts, and between two jobs of one QOS
a job of an account below its share outranks one of an account at or above
its own. The tier is where the job is or would be: a placed job's is the
highest tier among the partitions it may use that hold its nodes; a
preemptor's, against one victim, the highest among the partitions it may use
that hold the victim's nodes (so a job of a high-tier and a low-tier
partition preempts on the high-tier partition's nodes only, by tier); a job
waiting for a place ranks with the highest tier it may use. Slurm's age and
size factors are left out: they grow with every second and every GPU, and
would make nearly any older job a preemptor of a younger one. Without
tiers, QOS priorities and shares every job has the same rank and nothing is
preempted.

**The pass** (`preempt`) runs on a round's plan, after the joint model and
the site's rules. Each pending job the plan leaves without GPUs, the
highest rank first (then the longest waiting), looks for a cell of its own
(single GPU type; its partitions; no reserved node that does not admit it;
within its GPU limits once its victims' GPUs are given back) on GPUs that
are free in the plan or held in it by jobs of lower rank:

* a pending job placed this round loses its placement (it waits; nothing
  restarts);
* a running job is preempted to zero (ScheduleReply.preempted: the
  controller asks it to checkpoint and requeues it held, to be placed again
  later), only when it is elastic and movable now (JobRequest.elastic,
  .movable: the controller may signal it), its current run is at least
  min_run_s old (the restart governor), it was not preempted in the last
  preemption_backoff_s, and it never preempted the job now asking (A
  preempts B, then B never preempts A).

Victims are taken pending placements first, then running jobs of the
lowest rank, the fewest GPUs, the youngest run, until the cell fits on
enough nodes; then each one the cell does not need is given back. Of the
job's cells, the one that takes the fewest GPUs from running jobs wins,
then the fewest victims, the fewest GPUs, the fastest.

Before the pass, a running job that the joint model left without a
placement gets its own back (the controller never takes a running job's
GPUs without a preemption), and a pending placement that no longer fits
beside it is dropped, in the controller's own order (`honest`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from solver.cells import in_partitions
from solver.limits import held_in
from solver.placement.nodes import RESERVED
from solver.placement.siterules import UNMANAGED_PREFIX, SiteRules
from solver.site import SitePolicy, reason_no_cell, reason_preempted, reason_preempting
from solver.types import Cell, Estimate, JobRequest, NodeView, Placement, ScheduleRequest

#: a job's preemption rank: (its partition's PriorityTier, its QOS's priority,
#: 1 when its account is below its fair share else 0)
Rank = tuple[int, float, int]


def rank(job: JobRequest, site: SitePolicy, tier: int = 1) -> Rank:
    """The job's preemption rank (module doc) in a partition of PriorityTier `tier`."""
    share = site.shares.get(job.account)
    below = share is not None and site.usage.get(job.account, 0.0) < share
    return (tier, float(site.qos_priority.get(job.qos, 0.0)), 1 if below else 0)


def tier_on(job: JobRequest, nodes: Iterable[str] | None, request: ScheduleRequest) -> int:
    """The highest PriorityTier among the partitions `job` may use that hold
    one of `nodes` (None: any node); 1 (Slurm's default) when none has one."""
    site, cluster = request.site, request.cluster
    if not site.priority_tiers:
        return 1
    wanted = None if nodes is None else set(nodes)
    held = [n for n in cluster.nodes if wanted is None or n.name in wanted]
    # a partition not named in priority_tiers has tier 1: only the named ones can raise it
    names = site.priority_tiers if job.partitions is None else job.partitions
    return max((site.tier(p) for p in names if any(in_partitions(n, (p,), cluster) for n in held)), default=1)


def ranks(request: ScheduleRequest, jobs: Iterable[JobRequest], plan: Mapping[str, Placement]) -> dict[str, Rank]:
    """Each job's rank where it is in `plan` (its placement's nodes), or, not
    placed, with the highest tier it may use (module doc)."""
    return {
        j.job_id: rank(j, request.site, tier_on(j, p.node_names if (p := plan.get(j.job_id)) else None, request))
        for j in jobs
    }


def outranks_why(a: Rank, b: Rank, qa: JobRequest, qb: JobRequest) -> str:
    """Why `qa` (rank `a`) outranks `qb` (rank `b`), in words (the reason's parenthesis)."""
    if a[0] != b[0]:
        return f"partition PriorityTier {a[0]} > {b[0]}"
    pa, pb = a[1], b[1]
    if pa != pb:
        return f"qos {qa.qos or '-'} priority {pa:g} > qos {qb.qos or '-'} priority {pb:g}"
    return f"account {qa.account or '-'} below its fair share, account {qb.account or '-'} not"


def running_now(job: JobRequest, now: float) -> bool:
    """Does the job hold GPUs now: a placement and a run that has started
    (a job only released has a placement and no run yet)?"""
    return job.current is not None and job.running_since is not None and job.running_since <= now


def victim_problem(victim: JobRequest, preemptor: JobRequest, now: float, min_run_s: float, backoff_s: float) -> str:
    """Why the running `victim` may not be preempted for `preemptor` ("": it may)."""
    if not (victim.elastic and victim.movable):
        return "not movable now"
    since = victim.running_since
    if since is None or now - since < min_run_s:
        return "younger than min_run_s"
    if victim.preempted_at is not None and now - victim.preempted_at < backoff_s:
        return "preempted within preemption_backoff_s"
    if victim.job_id in preemptor.preempted_by:
        return "it preempted this job before"
    return ""


@dataclass
class Preempted:
    """The plan after the pass and what it did."""

    placements: dict[str, Placement]
    #: running job -> the job it gives its GPUs to
    preempted: dict[str, str] = field(default_factory=dict)
    #: jobs left without GPUs by the pass (victims, displaced pending jobs, running jobs' conflicts) -> why
    reasons: dict[str, str] = field(default_factory=dict)
    #: preemptor -> "preempting job ..." (ScheduleReply.notes)
    notes: dict[str, str] = field(default_factory=dict)


def honest(request: ScheduleRequest, plan: Mapping[str, Placement]) -> Preempted:
    """The plan as the controller carries it out: a running job left without
    a placement keeps its own, and the pending placements that no longer fit
    beside it are dropped (in job id order, as the controller admits them)."""
    by_name = {n.name: n for n in request.cluster.nodes}
    out = Preempted(dict(plan))
    kept = [j for j in request.jobs if j.job_id not in plan and running_now(j, request.now)]
    if not kept:
        return out
    for j in kept:
        assert j.current is not None
        out.placements[j.job_id] = j.current
    by_id = {j.job_id: j for j in request.jobs}
    used: dict[str, int] = {}
    pending = sorted(jid for jid in out.placements if _pending(by_id.get(jid)))
    later = set(pending)
    for jid in [jid for jid in out.placements if jid not in later] + pending:
        p = out.placements[jid]
        if jid in later and any(used.get(n, 0) + g > _cap(by_name, n) for n, g in p.nodes):
            holder = next((k.job_id for k in kept if set(out.placements[k.job_id].node_names) & set(p.node_names)), "")
            del out.placements[jid]
            out.reasons[jid] = reason_no_cell(f"running job {holder} keeps its GPUs" if holder else "no free GPUs")
            continue
        for n, g in p.nodes:
            used[n] = used.get(n, 0) + g
    return out


def _pending(job: JobRequest | None) -> bool:
    return job is not None and job.current is None


def _cap(by_name: Mapping[str, NodeView], name: str) -> int:
    node = by_name.get(name)
    return node.gpus_free if node is not None else 0


@dataclass(frozen=True)
class _Choice:
    """A preemptor's placement and the jobs it displaces."""

    key: tuple[object, ...]
    placement: Placement
    victims: tuple[str, ...]


class _Pass:
    """One round's preemption pass (module doc)."""

    def __init__(
        self,
        request: ScheduleRequest,
        jobs: Sequence[JobRequest],
        plan: Preempted,
        estimates: Mapping[str, Sequence[Estimate]],
        rules: SiteRules | None,
        claimed: Mapping[str, Placement],
    ) -> None:
        self.request, self.site, self.now, self.cfg = request, request.site, request.now, request.config
        self.plan, self.estimates, self.rules = plan, estimates, rules
        self.by_id = {j.job_id: j for j in request.jobs} | {j.job_id: j for j in jobs}
        self.rank = ranks(request, self.by_id.values(), plan.placements)
        self.by_name = {n.name: n for n in request.cluster.nodes}
        self.used: dict[str, int] = {}
        for p in [*plan.placements.values(), *claimed.values()]:
            for n, g in p.nodes:
                self.used[n] = self.used.get(n, 0) + g
        self.placed_now: set[str] = set()

    def run(self, waiting: list[JobRequest]) -> None:
        while waiting:
            waiting.sort(key=lambda j: (tuple(-x for x in self.rank[j.job_id]), j.submit_time, j.job_id))
            job = waiting.pop(0)
            choice = self._best(job)
            if choice is not None:
                waiting += self._take(job, choice)

    def _best(self, job: JobRequest) -> _Choice | None:
        best: _Choice | None = None
        for est in self.estimates.get(job.job_id, ()):
            cell = est.cell
            if cell.mixed or est.plan is None or not est.feasible or job.excludes(cell):
                continue
            if self.rules is not None and self.rules.job_cap(job, cell) is not None:
                continue
            nodes = self._nodes(job, cell.gpu_type)
            if len(nodes) < cell.num_nodes:
                continue
            got = self._victims(job, nodes, cell.gpus_per_node, cell.num_nodes)
            if got is None or not self._within_limits(job, cell, got[1]):
                continue
            chosen, victims = got
            running = [v for v in victims if not _pending(self.by_id[v])]
            taken = sum(self.plan.placements[v].cell.num_gpus for v in running)
            key = (taken, len(victims), cell.num_gpus, est.iter_time_s, cell.key())
            if best is None or key < best.key:
                p = Placement(
                    job.job_id, cell, tuple((n, cell.gpus_per_node) for n in chosen), est.plan, est.iter_time_s
                )
                best = _Choice(key, p, victims)
        return best

    def _nodes(self, job: JobRequest, gpu_type: str) -> list[str]:
        """The nodes of `gpu_type` the job may use: its partitions, and no
        reservation that does not admit it."""
        out = []
        for n in self.request.cluster.nodes_of(gpu_type):
            if job.partitions is not None and not in_partitions(n, job.partitions, self.request.cluster):
                continue
            if self.rules is not None and any(
                m.startswith(RESERVED)
                and (r := self.rules.reservations.get(m[len(RESERVED) :])) is not None
                and not r.admits(job.account, job.user, job.reservation)
                for m in self.rules.marks.get(n.name, ())
            ):
                continue
            out.append(n.name)
        return out

    def _candidates(self, job: JobRequest, nodes: set[str]) -> list[str]:
        """The jobs of the plan that may give `job` their GPUs on `nodes`, the cheapest first."""
        out = []
        for jid, p in self.plan.placements.items():
            if jid.startswith(UNMANAGED_PREFIX) or jid in self.placed_now or not set(p.node_names) & nodes:
                continue
            other = self.by_id.get(jid)
            if other is None or self.rank[jid] >= self._rank_on(job, jid):
                continue
            if not _pending(other):
                if not running_now(other, self.now) or victim_problem(
                    other, job, self.now, self.cfg.min_run_s, self.cfg.preemption_backoff_s
                ):
                    continue
            out.append(jid)

        def cost(jid: str) -> tuple[object, ...]:
            other = self.by_id[jid]
            since = other.running_since or 0.0
            return (not _pending(other), self.rank[jid], self.plan.placements[jid].cell.num_gpus, -since, jid)

        return sorted(out, key=cost)

    def _rank_on(self, job: JobRequest, victim: str) -> Rank:
        """`job`'s rank on the nodes `victim` holds in the plan (module doc)."""
        return rank(job, self.site, tier_on(job, self.plan.placements[victim].node_names, self.request))

    def _victims(
        self, job: JobRequest, nodes: list[str], per_node: int, count: int
    ) -> tuple[list[str], tuple[str, ...]] | None:
        """(the nodes, the victims) of the cheapest way found to give `job`
        `per_node` GPUs on `count` of `nodes`; None when there is none."""
        free = {n: max(0, _cap(self.by_name, n) - self.used.get(n, 0)) for n in nodes}

        def fits(victims: Sequence[str]) -> list[str] | None:
            avail = dict(free)
            for v in victims:
                for n, g in self.plan.placements[v].nodes:
                    if n in avail:
                        avail[n] += g
            ok = [n for n in nodes if avail[n] >= per_node]
            if len(ok) < count:
                return None
            # the victims' nodes first (the others were free before), then the best fit
            return sorted(ok, key=lambda n: (avail[n] == free[n], avail[n] - per_node, n))[:count]

        chosen: list[str] = []
        got = fits(chosen)
        if got is None:
            for v in self._candidates(job, set(nodes)):
                chosen.append(v)
                got = fits(chosen)
                if got is not None:
                    break
            if got is None:
                return None
        for v in reversed(list(chosen)):  # give back the victims the cell does not need
            rest = [x for x in chosen if x != v]
            if fits(rest) is not None:
                chosen = rest
        nodes_used = fits(chosen)
        assert nodes_used is not None
        return nodes_used, tuple(chosen)

    def _within_limits(self, job: JobRequest, cell: Cell, victims: Sequence[str]) -> bool:
        """Does the job's cell keep its GPU limits once the victims' GPUs are given back?"""
        if self.rules is None:
            return True
        kept = {
            jid: p
            for jid, p in self.plan.placements.items()
            if jid not in victims and not jid.startswith(UNMANAGED_PREFIX)
        }
        loads = self.rules.loads(kept, self.rules.allowed)
        return loads.fits(self.rules.groups(job.job_id), held_in(cell))

    def _take(self, job: JobRequest, choice: _Choice) -> list[JobRequest]:
        """Place `job` as chosen; the victims lose their placements. The
        pending ones displaced (they may displace others in turn)."""
        displaced = []
        running = []
        for v in choice.victims:
            why = outranks_why(self._rank_on(job, v), self.rank[v], job, self.by_id[v])
            p = self.plan.placements.pop(v)
            for n, g in p.nodes:
                self.used[n] -= g
            other = self.by_id[v]
            self.plan.reasons[v] = reason_preempted(job.job_id, why)
            if _pending(other):
                displaced.append(other)
            else:
                running.append(v)
                self.plan.preempted[v] = job.job_id
        p = choice.placement
        self.plan.placements[job.job_id] = p
        for n, g in p.nodes:
            self.used[n] = self.used.get(n, 0) + g
        self.plan.reasons.pop(job.job_id, None)
        self.placed_now.add(job.job_id)
        if running:
            self.plan.notes[job.job_id] = reason_preempting(tuple(running))
        return displaced


def preempt(
    request: ScheduleRequest,
    jobs: Sequence[JobRequest],
    plan: Mapping[str, Placement],
    estimates: Mapping[str, Sequence[Estimate]],
    rules: SiteRules | None = None,
    claimed: Mapping[str, Placement] | None = None,
) -> Preempted:
    """The plan after the preemption pass (module doc): `jobs` the round's
    jobs as the policy saw them (their partitions as the site allows), `plan`
    the round's placements (the jobs that keep theirs included), `estimates`
    each pending job's feasible estimates, `rules` the round's site rules,
    `claimed` the GPUs pending plain sbatch jobs claim (their stand-ins'
    placements, siterules.claim_jobs): never taken."""
    out = honest(request, plan)
    ranked = ranks(request, request.jobs, out.placements)
    if len(set(ranked.values())) < 2:
        return out
    lowest = min(ranked[jid] for jid in out.placements if jid in ranked) if out.placements else None
    waiting = [
        j
        for j in jobs
        if j.current is None
        and j.job_id not in out.placements
        and estimates.get(j.job_id)
        and (lowest is None or ranked[j.job_id] > lowest)
    ]
    if waiting:
        _Pass(request, jobs, out, estimates, rules, claimed or {}).run(waiting)
    return out
