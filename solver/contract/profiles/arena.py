"""Arena's public data as shipped in solver/data/arena: where the files are,
and loaders for those the simulator and the baseline policies read (device
specs, dp memory, Arena's cluster, the simulator's constants). Importing
Arena's profile files into a store is ``solver.contract.profiles.arena_import``'s.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import pathlib
from typing import Any

from solver.contract.errors import SolverError

OPTIMAL_FILE = "profiles_optimal.json"
ESTIMATED_FILE = "profiles_plans_estimated.json"
TRACE_FILE = "traces/simulate_trace_philly.csv"


class ArenaFormatError(ValueError, SolverError):
    """An Arena file does not have the expected shape (the message names
    the file, the record and the field)."""


def shipped_path(name: str) -> pathlib.Path:
    """Path of a file shipped in solver/data/arena (e.g. ``dp_mem.json``,
    ``traces/simulate_trace_philly.csv``)."""
    path = pathlib.Path(str(importlib.resources.files("solver").joinpath("data", "arena", *name.split("/"))))
    if not path.is_file():
        raise FileNotFoundError(f"shipped Arena file {name!r} not found at {path}")
    return path


def _load_json(path: str | os.PathLike[str] | None, default: str) -> Any:
    path = shipped_path(default) if path is None else pathlib.Path(path)
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise ArenaFormatError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None


def _section(data: Any, key: str, path: object) -> Any:
    if not isinstance(data, dict) or key not in data:
        raise ArenaFormatError(f"{path}: missing top-level field {key!r}")
    return data[key]


def load_device_specs(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Arena's device_specs.json as a dict (``simulator_gpu_specs``, ...)."""
    specs: dict[str, Any] = _load_json(path, "device_specs.json")
    return specs


def load_dp_mem(path: str | os.PathLike[str] | None = None) -> dict[tuple[str, int], dict[int, float | None]]:
    """Per-GPU memory (GB) of pure data parallelism, by (model, batch) then
    GPU count; ``None`` where Arena recorded -1 (out of memory)."""
    data = _load_json(path, "dp_mem.json")
    out: dict[tuple[str, int], dict[int, float | None]] = {}
    for i, rec in enumerate(_section(data, "records", path or "dp_mem.json")):
        where = f"{path or 'dp_mem.json'}: records[{i}]"
        try:
            by_n = rec["dp_mem_gb_by_num_gpus"]
            key = (str(rec["trace_model_name"]), int(rec["batch_size"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ArenaFormatError(f"{where}: missing or bad field {exc}") from None
        out[key] = {int(n): (None if v is None or v < 0 else float(v)) for n, v in by_n.items()}
    return out


def load_cluster_spec(path: str | os.PathLike[str] | None = None) -> dict[str, tuple[int, int]]:
    """Arena's simulated cluster: gpu_type -> (node_num, gpus_per_node)."""
    data = _load_json(path, "cluster_spec.json")
    cluster = _section(data, "cluster", path or "cluster_spec.json")
    try:
        return {gpu: (int(c["node_num"]), int(c["gpus_per_node"])) for gpu, c in cluster.items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise ArenaFormatError(f"{path or 'cluster_spec.json'}: cluster entry lacks {exc}") from None


def load_sim_constants(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Arena's simulator constants (SCHEDULING_INTERVAL, overheads, scale factors)."""
    return dict(_section(_load_json(path, "sim_constants.json"), "constants", path or "sim_constants.json"))
