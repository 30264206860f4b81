"""Scheduling policies, one per module, all `schedule(request, estimator) -> ScheduleReply`.

get_policy(name, **opts): "cellsched", "cellsched-static", "fcfs",
"fcfs-backfill", "gavel", "sia", "slurm-multifactor" (Slurm's multifactor
priority with fair share, then backfill), and the communication-contention baselines
of Wang et al. 2020: "srsf-avoid", "srsf-accept", "ada-srsf". Baselines take
`feasible=(job, cell) -> bool`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from solver.estimator.protocol import EstimatorLike
from solver.types import ScheduleReply, ScheduleRequest


class Policy(Protocol):
    """One scheduling policy per module, all behind this signature."""

    name: str

    def schedule(self, request: ScheduleRequest, estimator: EstimatorLike) -> ScheduleReply: ...


def _cellsched(**opts: Any) -> Policy:
    from solver.policies.cellsched import CellschedPolicy

    return CellschedPolicy(**opts)


def _cellsched_static(**opts: Any) -> Policy:
    from solver.policies.cellsched import CellschedPolicy

    return CellschedPolicy(elastic=False, **opts)


def _fcfs(**opts: Any) -> Policy:
    from solver.policies.fcfs import FcfsPolicy

    return FcfsPolicy(**opts)


def _fcfs_backfill(**opts: Any) -> Policy:
    from solver.policies.fcfs import FcfsPolicy

    return FcfsPolicy(backfill=True, **opts)


def _gavel(**opts: Any) -> Policy:
    from solver.policies.gavel import GavelPolicy

    return GavelPolicy(**opts)


def _sia(**opts: Any) -> Policy:
    from solver.policies.sia import SiaPolicy

    return SiaPolicy(**opts)


def _slurm_multifactor(**opts: Any) -> Policy:
    from solver.policies.slurm_multifactor import SlurmMultifactorPolicy

    return SlurmMultifactorPolicy(**opts)


def _srsf_avoid(**opts: Any) -> Policy:
    from solver.policies.srsf_avoid import SrsfAvoidPolicy

    return SrsfAvoidPolicy(**opts)


def _srsf_accept(**opts: Any) -> Policy:
    from solver.policies.srsf_accept import SrsfAcceptPolicy

    return SrsfAcceptPolicy(**opts)


def _ada_srsf(**opts: Any) -> Policy:
    from solver.policies.ada_srsf import AdaSrsfPolicy

    return AdaSrsfPolicy(**opts)


POLICIES: dict[str, Callable[..., Policy]] = {
    "cellsched": _cellsched,
    "cellsched-static": _cellsched_static,
    "fcfs": _fcfs,
    "fcfs-backfill": _fcfs_backfill,
    "gavel": _gavel,
    "sia": _sia,
    "slurm-multifactor": _slurm_multifactor,
    "srsf-avoid": _srsf_avoid,
    "srsf-accept": _srsf_accept,
    "ada-srsf": _ada_srsf,
}


def get_policy(name: str, **opts: Any) -> Policy:
    """The policy registered under `name`, built with `opts`."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    return factory(**opts)


__all__ = ["POLICIES", "get_policy"]
