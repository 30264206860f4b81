"""A cell's candidate plans, as the plan search finds them and the
estimator's per-model tables keep them (``solver.estimator.search``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from solver.types import EstimateSource, ParallelPlan


class Cand(NamedTuple):
    """One candidate plan of a cell (pp is the cell's).

    `layers`: the trainer's layers per stage of its split; `twin`: for a
    plan with sharded optimizer state, the index of the same plan with
    replicated state (-1: this plan's state is replicated); `state_bytes`:
    its optimizer state per GPU at the stage of peak memory (-1: not worked
    out yet, see PlanSearch.state_gb)."""

    dp: int
    tp: int
    m: int
    time_s: float
    mem_bytes: float
    layers: tuple[int, ...] = ()
    twin: int = -1
    state_bytes: float = 0.0


@dataclass(frozen=True)
class Found:
    """The candidate plans of a cell under one model source.

    `best`: index of the best plan that fits in memory (`pick_sharded`),
    `fastest`: of the fastest plan with replicated state at all (None when
    there are no candidates). Plans with sharded state come after all the
    others, so a replicated plan has the same index with or without them."""

    source: EstimateSource
    plans: tuple[Cand, ...]
    best: int | None
    fastest: int | None

    def plan(self, i: int, pp: int) -> ParallelPlan:
        c = self.plans[i]
        return ParallelPlan(
            pp, c.dp, c.tp, c.m, stage_layers=c.layers if pp > 1 else (), state_shares=(1.0,) if c.twin >= 0 else ()
        )
