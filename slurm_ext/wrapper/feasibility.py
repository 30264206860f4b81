"""Can the job ever run here? Its GPU types and partitions exist, enough GPUs
of one type (or two, as a mixed cell) can be had, and the model fits a cell."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping

from slurm_ext.records import ClusterSnapshot
from slurm_ext.wrapper.options import Setting, WrapperError
from slurm_ext.wrapper.values import field_name
from solver.contract.jobspec import JobSpec


def check_against_cluster(
    spec: JobSpec,
    snapshot: ClusterSnapshot,
    settings: Mapping[str, Setting],
    fits: Callable[[JobSpec, ClusterSnapshot], str | None] | None = None,
) -> None:
    """GPU types and partitions exist; the job fits some cell of the cluster
    (`fits`, fits_some_cell by default, says why not)."""

    def where(name: str) -> str:
        return field_name(name, settings[name]) if name in settings else name

    known_types = sorted({n.gpu_type for n in snapshot.nodes if n.gpu_type and n.gpus_total > 0})
    has = f"it has: {', '.join(known_types) or 'none'}"
    for t in spec.gpu_types or ():
        if t not in known_types:
            raise WrapperError(where("gpu-types"), f"no {t!r} GPUs in this cluster; {has}")
    if spec.requested_gpu_type is not None and spec.requested_gpu_type not in known_types:
        raise WrapperError(where("gpu-type"), f"no {spec.requested_gpu_type!r} GPUs in this cluster; {has}")
    known_parts = {p.name: p for p in snapshot.partitions}
    for p in spec.partitions or ():
        if p not in known_parts:
            raise WrapperError(where("partition"), f"no partition {p!r}; partitions: {', '.join(sorted(known_parts))}")
    capacity: dict[str, int] = {}
    for node in snapshot.nodes:
        if not node.gpu_type or node.gpus_total <= 0:
            continue
        if spec.gpu_types is not None and node.gpu_type not in spec.gpu_types:
            continue
        if spec.partitions is not None and not any(
            p in node.partitions or node.name in known_parts[p].nodes for p in spec.partitions
        ):
            continue
        capacity[node.gpu_type] = capacity.get(node.gpu_type, 0) + node.gpus_total
    scope = "the allowed GPU types" + (" in the chosen partitions" if spec.partitions else "")
    if not capacity:
        field = where("gpu-types") if spec.gpu_types else where("partition") if spec.partitions else "gpu-types"
        raise WrapperError(field, f"{scope} have no GPU nodes")
    largest = max(capacity.values())
    mixed = sum(sorted(capacity.values())[-2:]) if len(capacity) > 1 else 0  # two types as one cell (solver.mixed)
    if largest < spec.min_gpus <= mixed:
        pass
    elif spec.min_gpus > largest:
        detail = ", ".join(f"{t}: {n}" for t, n in sorted(capacity.items()))
        raise WrapperError(
            where("min-gpus"),
            f"{spec.min_gpus} GPUs of one type can never be had: {scope} have at most {largest} ({detail})",
        )
    if spec.requested_gpus is not None and spec.requested_gpus > largest:
        raise WrapperError(
            where("gpus"), f"{spec.requested_gpus} GPUs of one type can never be had: {scope} have at most {largest}"
        )
    if spec.requested_gpu_type is not None and spec.requested_gpus is not None:
        of_type = capacity.get(spec.requested_gpu_type, 0)
        if spec.requested_gpus > of_type:
            raise WrapperError(
                where("gpus"),
                f"{spec.requested_gpus} {spec.requested_gpu_type} GPUs can never be had: {scope} have {of_type}",
            )
    reason = (fits or fits_some_cell)(spec, snapshot)
    if reason:
        raise WrapperError(where("model"), reason)


def fits_some_cell(spec: JobSpec, snapshot: ClusterSnapshot) -> str | None:
    """None when the model fits at least one cell of the cluster (or when
    that cannot be known: a GPU type without specs); else why not.

    Uses the cell enumeration and the estimator's memory model with the
    profile store in $CELLSCHED_PROFILES when that file exists, else the
    shipped profiles and GPU specs (in memory).
    """
    from slurm_ext.view import to_cluster_view
    from solver.cells import enumerate_cells
    from solver.contract.profiles.seed import open_store
    from solver.contract.profiles.store import ENV_VAR
    from solver.estimator import Estimator
    from solver.mixed import MixedEstimator
    from solver.types import EstimateSource, JobRequest, SolverConfig

    model = spec.model_spec()
    job = JobRequest.from_spec(spec, "new")
    cells = enumerate_cells(job, to_cluster_view(snapshot, ()), SolverConfig())
    if not cells:
        return f"no cell of this cluster can hold {model.name} with min-gpus={spec.min_gpus} on one GPU type"
    env_path = os.environ.get(ENV_VAR)
    store = open_store(env_path if env_path and os.path.isfile(env_path) else ":memory:")
    try:
        single = Estimator(store)
        estimator = MixedEstimator(single)
        notes: list[str] = []
        for cell in sorted(cells, key=lambda c: (-c.num_gpus, c.num_nodes, c.pp, c.gpu_type)):
            est = estimator.estimate(job, cell)
            if (
                est.feasible
                or not math.isfinite(single.mem_limit_gb(cell.gpu_type))
                or est.source == EstimateSource.NONE
            ):
                return None
            notes.append(f"{cell.key()}: {est.note}")
    finally:
        store.close()
    return (
        f"{model.name} with global batch {spec.global_batch} fits no cell of this cluster "
        f"({len(cells)} tried, largest first: {'; '.join(notes[:2])})"
    )
