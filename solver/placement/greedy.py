"""Greedy placement: the fallback when CP-SAT returns nothing usable, and the
warm start it is given.

1. Running jobs that may stay (current, with a pinned option) keep their
   GPUs: a plan must place them somewhere, since the controller never
   preempts.
   Then jobs with a preferred placement (the previous plan, the current
   one) try to keep it: the option on the same nodes first, then the same
   cell elsewhere.
2. All remaining (job, option) pairs by value per GPU, highest first: place
   the job if it has no placement yet and the cell fits (best fit).
3. One upgrade pass: each placed job, in value order, moves to a
   higher-value option if that fits once its own GPUs are released.
Every step checks exact node capacity, so the result is always placeable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from solver.placement.candidates import Option
from solver.placement.nodes import ClassKey, Ledger, partitions_of
from solver.placement.space import Space

if TYPE_CHECKING:
    from solver.placement.siterules import Tally
from solver.types import JobRequest, Placement

Chosen = dict[str, tuple[Option, tuple[tuple[str, int], ...], str | None]]
#: where try_place put an option: (node, GPUs) pairs and the partition
Placed = tuple[tuple[tuple[str, int], ...], str | None]


def try_place(
    space: Space,
    ledger: Ledger[ClassKey],
    job: JobRequest,
    opt: Option,
    nodes: tuple[str, ...] | None = None,
    spread: bool = False,
) -> Placed | None:
    """Place `opt` (on `nodes` when given) if it fits; returns (nodes, partition) or None."""
    cell = opt.cell
    if opt.pinned is not None:
        if any(ledger.free.get(n, -1) < g for n, g in opt.pinned):
            return None
        ok, part = space.partition_of(job, tuple(n for n, _ in opt.pinned))
        if not ok:
            return None
        for n, g in opt.pinned:
            ledger.take(n, g, cell.num_nodes > 1)
        return opt.pinned, part
    if nodes is None:
        names: list[str] | None = None
        for p in job.partitions if job.partitions is not None else (None,):
            # keep all nodes in one partition: try the job's partitions in order
            names = _pick_parts(space, ledger, job, opt, p, spread)
            if names is not None:
                break
        if names is None:
            return None
        nodes = tuple(names)
    elif (
        len(set(nodes)) != cell.num_nodes
        or any(ledger.free.get(n, -1) < cell.gpus_per_node for n in nodes)
        or not cell.holds_types([space.types.get(n, "") for n in nodes])
        or space.blocks(nodes, opt.blocked)
    ):
        return None
    ok, part = space.partition_of(job, nodes)
    if not ok:
        return None
    return ledger.place(cell, nodes), part


def _pick_parts(
    space: Space, ledger: Ledger[ClassKey], job: JobRequest, opt: Option, partition: str | None, spread: bool
) -> list[str] | None:
    """Nodes for each GPU type of the option's cell (within `partition` when given)."""
    cell = opt.cell
    names: list[str] = []
    for n_nodes, groups in space.part_classes(job, cell, opt.blocked):
        sub = [k for k in groups if partition is None or not partitions_of(k[2]) or partition in k[2]]
        got = ledger.pick(sub, n_nodes, cell.gpus_per_node, cell.num_nodes > 1, spread, exclude=names)
        if got is None:
            return None
        names += got
    return names


def release(ledger: Ledger[ClassKey], opt: Option, nodes: tuple[tuple[str, int], ...]) -> None:
    for name, g in nodes:
        ledger.give_back(name, g, opt.cell.num_nodes > 1)


def greedy(
    space: Space,
    jobs: Sequence[JobRequest],
    options: Mapping[str, Sequence[Option]],
    preferred: Mapping[str, Placement] = {},
    tally: Tally | None = None,
) -> Chosen:
    """A placeable choice of (option, nodes, partition) per job; with a
    `tally` (siterules), within the site's GPU limits: a running job that
    must stay keeps its GPUs over a limit only when no smaller option fits."""
    ledger = space.ledger()
    by_id = {j.job_id: j for j in jobs}
    chosen: Chosen = {}

    def place(job: JobRequest, o: Option, at: tuple[str, ...] | None = None) -> Placed | None:
        if tally is not None and not tally.fits(job.job_id, o.cell):
            return None
        got = try_place(space, ledger, job, o, at)
        if got is not None and tally is not None:
            tally.add(job.job_id, o.cell)
        return got

    for job in jobs:  # running jobs that may stay keep their GPUs first (the controller never preempts)
        if job.current is None:
            continue
        for o in options.get(job.job_id, ()):
            got = place(job, o) if o.pinned is not None else None
            if got is not None:
                chosen[job.job_id] = (o, *got)
                break
        if tally is None or job.job_id in chosen or not any(o.pinned for o in options.get(job.job_id, ())):
            continue
        # over a limit where it runs: its smallest option that fits, else where it runs anyway
        for o in sorted(options[job.job_id], key=lambda o: (o.cell.num_gpus, -o.value)) + [
            o for o in options[job.job_id] if o.pinned is not None
        ]:
            got = place(job, o)
            if got is None and o.pinned is not None:
                got = try_place(space, ledger, job, o)
                if got is not None:
                    tally.add(job.job_id, o.cell)
            if got is not None:
                chosen[job.job_id] = (o, *got)
                break
    for job in jobs:
        if job.job_id in chosen:
            continue
        pref = preferred.get(job.job_id)
        opts = options.get(job.job_id, ())
        if pref is None or not opts:
            continue
        same = [o for o in opts if o.cell == pref.cell]
        tries: list[tuple[Option, tuple[str, ...] | None]] = [
            (o, None) for o in same if o.pinned is not None and sorted(o.pinned) == sorted(pref.nodes)
        ]
        tries += [(o, pref.node_names) for o in same if o.pinned is None]
        tries += [(o, None) for o in same if o.pinned is None]
        for o, at in tries:
            got = place(job, o, at)
            if got is not None:
                chosen[job.job_id] = (o, *got)
                break
    order = {j.job_id: i for i, j in enumerate(jobs)}
    pairs = [o for jid, opts in options.items() if jid in by_id for o in opts]
    pairs.sort(key=lambda o: (-o.value / o.cell.num_gpus, -o.value, order[o.job_id]))
    for o in pairs:
        if o.job_id not in chosen:
            got = place(by_id[o.job_id], o)
            if got is not None:
                chosen[o.job_id] = (o, *got)
    for jid in sorted(chosen, key=lambda j: (-chosen[j][0].value, order[j])):
        cur, nodes, part = chosen[jid]
        for o in sorted(options[jid], key=lambda o: -o.value):
            if o.value <= cur.value:
                break
            release(ledger, cur, nodes)
            if tally is not None:
                tally.add(jid, cur.cell, -1)
            got = place(by_id[jid], o)
            if got is not None:
                chosen[jid] = (o, *got)
                break
            for name, g in nodes:
                ledger.take(name, g, cur.cell.num_nodes > 1)
            if tally is not None:
                tally.add(jid, cur.cell)
    return chosen


def value_of(chosen: Chosen, links: Mapping[str, int] = {}) -> int:
    """The plan's value: its options' values, less what shared network cards
    cost, as model.py counts it: on each node whose card carries k > 1
    multi-node jobs (chosen, or fixed: `links`), k - 1 times twice the mean
    nic_cost per node share of the chosen ones there."""
    total = sum(o.value for o, _, _ in chosen.values())
    users = dict(links)
    costs: dict[str, list[float]] = {}
    for o, nodes, _ in chosen.values():
        if o.multi_node:
            for n, _ in nodes:
                users[n] = users.get(n, 0) + 1
                costs.setdefault(n, []).append(o.nic_cost / o.cell.num_nodes)
    for n, cs in costs.items():
        if users[n] > 1 and any(cs):
            total -= round((users[n] - 1) * 2 * sum(cs) / len(cs))
    return total
