"""Arena's simulator speed model: the iteration time its simulator gives a
job of model M, batch B on a cell (GPU type T, num_nodes x gpus_per_node),
read from ``profiles_optimal.json`` (see data/arena/README.md, "How the
simulator turns this into the iteration time").

Lookup, in this order (the first step whose entry EXISTS decides; an
existing entry that is OOM or over 300 s makes the cell infeasible, it does
not fall through to the next step, as in Arena's querier):

1. the exact entry (M, B, T, layout);
2. the entry at T's best locality (fewest nodes of Arena's node size:
   A100 4, V100 16, A40 2, A10 2 GPUs/node), throughput x
   LOCALITY_SCALE_FACTOR ** log2(best_gpus_per_node // gpus_per_node);
3. the next larger ``param_num`` of M's family (order of Arena's
   ``supported_model_cfgs``) with an entry for the SAME B and the SAME
   requested layout, throughput x PARAM_NUM_SCALE_FACTOR ** (size steps).
   No locality factor here: Arena's step 3 only looks up the requested
   layout, so the two factors never combine;
4. otherwise infeasible.

Throughput = round(B / t, 3) of the entry's time t (valid only when
0 < t <= 300 s), then scaled; the iteration time is round(B / throughput, 3).

Conventions chosen where Arena has none: a layout denser than Arena's node
size (gpus_per_node > the best locality's) uses the best-locality entry
unscaled (Arena would crash on it); GPU types and models Arena never
profiled are infeasible. Arena's time has no pipeline dimension, so only
pp == 1 cells are feasible; their plan is shown as pure data parallelism,
though the time is that of Arena's (unrecorded) best plan. For a job with V
virtual workers that plan must keep dp = N <= V (V dividing B), and the time
is scaled by the busiest rank's ceil(V / N) x N / V (1 when N divides V).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from collections.abc import Callable, Iterable

from solver.contract.models import aliases
from solver.contract.profiles.arena import (
    OPTIMAL_FILE,
    ArenaFormatError,
    load_device_specs,
    load_dp_mem,
    load_sim_constants,
    shipped_path,
)
from solver.contract.profiles.arena_import import arena_records
from solver.contract.profiles.records import CellRecord, ProfileSource
from solver.contract.runtimes import refusal
from solver.estimator.protocol import EstimatorBase
from solver.types import Cell, Estimate, EstimateSource, JobRequest, ParallelPlan

MAX_ITER_TIME_S = 300.0
#: how a lookup that found no entry at all begins its note (not an out-of-memory entry)
NO_PROFILE = "no Arena profile"
PREC = 3

_Key = tuple[str, int, str, int, int]  # model, batch, gpu type, nodes, gpus per node


class ArenaTable(EstimatorBase):
    """Arena's optimal-plan iteration times as an estimator (EstimatorLike;
    no cost model: the table has no layers, links or memory figures)."""

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, records: Iterable[CellRecord] | None = None
    ) -> None:
        """Arena's ``profiles_optimal.json`` at `path` (default: the shipped
        one), or `records` of best-plan times (one per cell)."""
        if records is None:
            src = shipped_path(OPTIMAL_FILE) if path is None else pathlib.Path(path)
            try:
                data = json.loads(pathlib.Path(src).read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise ArenaFormatError(f"{src}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
            kind, recs, _ = arena_records(data, str(src))
            if kind != ProfileSource.ARENA_OPTIMAL:
                raise ArenaFormatError(f"{src}: expected Arena's {OPTIMAL_FILE} (optimal-plan records), got {kind}")
        else:
            recs = list(records)
        #: None = OOM (-1 in Arena's database)
        self._times: dict[_Key, float | None] = {
            (r.model, r.global_batch, r.gpu_type.lower(), r.num_nodes, r.gpus_per_node): r.iter_time_s for r in recs
        }
        #: lower-case preset alias (``moe-2.4b``) -> Arena trace name (``moe__2.4B``)
        self._names: dict[str, str] = {a.lower(): m for m in {k[0] for k in self._times} for a in aliases(m)}
        consts = load_sim_constants()
        self.locality_factor = float(consts["LOCALITY_SCALE_FACTOR"])
        self.param_factor = float(consts["PARAM_NUM_SCALE_FACTOR"])
        specs = load_device_specs()
        self.node_capacity: dict[str, int] = {
            k.lower(): int(v) for k, v in specs["node_capacity_gpus_per_node"].items()
        }
        self.param_order: dict[str, list[str]] = {
            fam: list(cfg["param_num"]) for fam, cfg in specs["supported_model_cfgs"].items()
        }
        self._cache: dict[_Key, tuple[float | None, str]] = {}

    def __len__(self) -> int:
        return len(self._times)

    # ---- the simulator's truth ---------------------------------------------------

    def iter_time(self, model: str, batch: int, gpu_type: str, num_nodes: int, gpus_per_node: int) -> float | None:
        """Arena's iteration time (s) of the job on this layout, None when
        infeasible. `model` is a trace name or one of its preset aliases."""
        return self.lookup(model, batch, gpu_type, num_nodes, gpus_per_node)[0]

    def model_name(self, model: str) -> str:
        """The table's name of `model` (a trace name or one of its preset aliases)."""
        return self._names.get(model.lower(), model)

    def lookup(
        self, model: str, batch: int, gpu_type: str, num_nodes: int, gpus_per_node: int
    ) -> tuple[float | None, str]:
        """(iteration time or None, a note saying which step decided and why)."""
        model = self.model_name(model)
        key = (model, int(batch), gpu_type.lower(), int(num_nodes), int(gpus_per_node))
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._lookup(key)
        return hit

    def _lookup(self, key: _Key) -> tuple[float | None, str]:
        model, batch, gpu, nodes, per = key
        if key in self._times:
            return self._time(self._times[key], batch, 1.0, f"exact {nodes}x{per}")
        cap = self.node_capacity.get(gpu)
        if cap is not None:
            n = nodes * per
            best = (1, n) if n <= cap else (n // cap, cap)
            best_key = (model, batch, gpu, *best)
            if best_key in self._times:
                steps = int(math.log2(best[1] // per)) if best[1] // per >= 1 else 0
                return self._time(
                    self._times[best_key],
                    batch,
                    self.locality_factor**steps,
                    f"best locality {best[0]}x{best[1]} x{self.locality_factor}^{steps}",
                )
        family, _, size = model.partition("__")
        sizes = self.param_order.get(family, [])
        if size in sizes:
            idx = sizes.index(size)
            for j in range(idx + 1, len(sizes)):
                grown = (f"{family}__{sizes[j]}", batch, gpu, nodes, per)
                if grown in self._times:
                    steps = j - idx
                    return self._time(
                        self._times[grown],
                        batch,
                        self.param_factor**steps,
                        f"from {grown[0]} x{self.param_factor}^{steps}",
                    )
        return None, f"{NO_PROFILE} for {model} B={batch} on {gpu} {nodes}x{per}"

    @staticmethod
    def _time(t: float | None, batch: int, factor: float, how: str) -> tuple[float | None, str]:
        if t is None:
            return None, f"{how}: out of memory"
        if not 0 < t <= MAX_ITER_TIME_S:
            return None, f"{how}: {t:.3f} s exceeds one {MAX_ITER_TIME_S:g} s scheduling interval"
        thr = round(batch / t, PREC) * factor
        if thr <= 0:
            return None, f"{how}: zero throughput"
        return round(batch / thr, PREC), how

    # ---- EstimatorLike -------------------------------------------------------------

    def estimate(self, job: JobRequest, cell: Cell) -> Estimate:
        """The cell's Arena time; infeasible for pp > 1 (Arena has no per-plan times)."""
        if cell.pp != 1:
            return Estimate(
                cell,
                None,
                math.inf,
                0.0,
                EstimateSource.ARENA_TABLE,
                f"Arena's table has no pipeline dimension: only pp=1 cells, got pp={cell.pp}",
            )
        vw = job.virtual_workers
        types = [t for t, _ in cell.by_type()]
        why = refusal(job.runtime, job.model.num_layers, job.global_batch, vw, tp=1, dp=cell.num_gpus, gpu_types=types)
        if why:  # the plan shown is data parallelism over the cell's GPUs
            return Estimate(cell, None, math.inf, 0.0, EstimateSource.ARENA_TABLE, why)
        t, how = self.lookup(job.model.name, job.global_batch, cell.gpu_type, cell.num_nodes, cell.gpus_per_node)
        if t is None:
            return Estimate(cell, None, math.inf, 0.0, EstimateSource.ARENA_TABLE, how)
        if vw is not None and vw % cell.num_gpus:
            f = -(-vw // cell.num_gpus) * cell.num_gpus / vw  # the busiest rank's k x dp / V
            t, how = t * f, f"{how}; x{f:.4g} for V={vw} over dp={cell.num_gpus}"
        return Estimate(
            cell,
            ParallelPlan(1, cell.num_gpus, 1),
            t,
            0.0,
            EstimateSource.ARENA_TABLE,
            f"{how}; real plan is Arena's unrecorded best plan, shown as DP",
        )


def arena_dp_feasible(
    dp_mem: str | os.PathLike[str] | None = None, device_specs: str | os.PathLike[str] | None = None
) -> Callable[[JobRequest, Cell], bool]:
    """Arena's baseline memory test (data/arena/README.md, "Feasibility") as a `Feasible`.

    (M, B, T, N) is infeasible when (M, B) is absent from dp_mem.json, N is
    not one of its GPU counts, the value is -1, or
    1.2 x value > pre_alloc_fraction (0.8) x max_mem_gb(T). Unknown GPU types
    are infeasible.
    """
    table = load_dp_mem(dp_mem)
    specs = load_device_specs(device_specs)
    frac = float(specs.get("pre_alloc_memory_fraction_for_xla", 0.8))
    max_mem = {k.lower(): float(v["max_mem_gb"]) for k, v in specs["simulator_gpu_specs"].items()}

    def feasible(job: JobRequest, cell: Cell) -> bool:
        by_n = table.get((job.model.name, job.global_batch))
        if by_n is None or cell.num_gpus not in by_n:
            return False
        v = by_n[cell.num_gpus]
        mem = max_mem.get(cell.gpu_type.lower())
        if v is None or mem is None:
            return False
        return not (v != 0 and 1.2 * v > frac * mem)

    return feasible
