"""What one round did: its RoundReport (also what `cellsched
plan` prints and what the simulator counts)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from slurm_ext.state import JobStatus, RoundStatus


@dataclass(frozen=True)
class RoundReport:
    """What one round did (also what `cellsched plan` prints)."""

    round_id: int | None
    status: RoundStatus
    started: float
    observe_s: float = 0.0
    solve_s: float = 0.0
    apply_s: float = 0.0
    total_s: float = 0.0
    solver_status: str = ""
    objective: float = 0.0
    num_jobs: int = 0
    actions: tuple[dict, ...] = ()
    jobs: tuple[JobStatus, ...] = ()
    placements: Mapping[str, dict] = field(default_factory=dict)
    error: str = ""
    dry_run: bool = False

    @property
    def acted_on(self) -> frozenset[str]:
        """The jobs its actions were on (what the round itself changed in Slurm)."""
        return frozenset(a["job"] for a in self.actions if "job" in a)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["jobs"] = [dataclasses.asdict(j) for j in self.jobs]
        return d
