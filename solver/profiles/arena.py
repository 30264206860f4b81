"""Arena's public profile data: import into a store, and loaders for the
shipped files the simulator and baseline policies read.

Two profile files are recognised by their shape:

* ``profiles_optimal.json`` -> cell records of source ``arena-optimal``
  (best plan, plan unknown; OOM -> ``iter_time_s None``; times are kept as
  they are, including those over one 300 s scheduling interval).
* ``profiles_plans_estimated.json`` -> per-plan records of source
  ``arena-estimated``. Only entries with ``comm_profile_prefix == num_nodes``
  are used (the simulator's convention); unlabelled infeasible entries are
  skipped; of a plan listed twice, ``dup_index`` 0 is kept.
"""

from __future__ import annotations

import collections
import importlib.resources
import json
import os
import pathlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from solver.profiles.records import CellRecord, ProfileSource

if TYPE_CHECKING:
    from solver.profiles.store import ProfileStore

OPTIMAL_FILE = "profiles_optimal.json"
ESTIMATED_FILE = "profiles_plans_estimated.json"
TRACE_FILE = "traces/simulate_trace_philly.csv"


class ArenaFormatError(ValueError):
    """An Arena file does not have the expected shape (the message names
    the file, the record and the field)."""


@dataclass(frozen=True)
class ImportReport:
    """What one import did: records written, and records skipped by reason."""

    path: str
    kind: str
    imported: int
    skipped: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items())) or "none"
        return f"{self.path}: {self.kind}: imported {self.imported}, skipped {skipped}"


# ---- shipped files -----------------------------------------------------------

def shipped_path(name: str) -> pathlib.Path:
    """Path of a file shipped in solver/data/arena (e.g. ``dp_mem.json``,
    ``traces/simulate_trace_philly.csv``)."""
    path = pathlib.Path(str(importlib.resources.files("solver").joinpath("data", "arena", *name.split("/"))))
    if not path.is_file():
        raise FileNotFoundError(f"shipped Arena file {name!r} not found at {path}")
    return path


def _load_json(path: str | os.PathLike | None, default: str) -> Any:
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


def load_device_specs(path: str | os.PathLike | None = None) -> dict:
    """Arena's device_specs.json as a dict (``simulator_gpu_specs``, ...)."""
    return _load_json(path, "device_specs.json")


def load_dp_mem(path: str | os.PathLike | None = None) -> dict[tuple[str, int], dict[int, float | None]]:
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


def load_cluster_spec(path: str | os.PathLike | None = None) -> dict[str, tuple[int, int]]:
    """Arena's simulated cluster: gpu_type -> (node_num, gpus_per_node)."""
    data = _load_json(path, "cluster_spec.json")
    cluster = _section(data, "cluster", path or "cluster_spec.json")
    try:
        return {gpu: (int(c["node_num"]), int(c["gpus_per_node"])) for gpu, c in cluster.items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise ArenaFormatError(f"{path or 'cluster_spec.json'}: cluster entry lacks {exc}") from None


def load_sim_constants(path: str | os.PathLike | None = None) -> dict:
    """Arena's simulator constants (SCHEDULING_INTERVAL, overheads, scale factors)."""
    return dict(_section(_load_json(path, "sim_constants.json"), "constants", path or "sim_constants.json"))


# ---- profile files -> cell records -------------------------------------------

def arena_kind(data: Any) -> str | None:
    """``arena-optimal`` / ``arena-estimated`` for an Arena profile file's
    parsed JSON, None when it is neither."""
    if not isinstance(data, dict) or not isinstance(data.get("records"), list) or not data["records"]:
        return None
    first = data["records"][0]
    if not isinstance(first, dict):
        return None
    if "comm_profile_prefix" in first and "dup_index" in first:
        return ProfileSource.ARENA_ESTIMATED
    if "is_best_locality" in first or (first.get("raw_key") or [None])[0] == "optimal":
        return ProfileSource.ARENA_OPTIMAL
    return None


def arena_records(data: Any, path: str = "<data>") -> tuple[str, list[CellRecord], dict[str, int]]:
    """Turn a parsed Arena profile file into (kind, cell records, skipped by reason)."""
    kind = arena_kind(data)
    if kind is None:
        raise ArenaFormatError(
            f"{path}: not an Arena profile file (expected {OPTIMAL_FILE} or {ESTIMATED_FILE} shape: "
            "an object with a non-empty 'records' list)")
    skipped: collections.Counter[str] = collections.Counter()
    recs: list[CellRecord] = []
    for i, raw in enumerate(data["records"]):
        get = _getter(raw, f"{path}: records[{i}]")
        if kind == ProfileSource.ARENA_ESTIMATED:
            if get("comm_profile_prefix", int) != get("num_nodes", int):
                skipped["comm_profile_prefix != num_nodes"] += 1
                continue
            if raw.get("pp") is None:
                skipped["unlabelled infeasible"] += 1
                continue
            if get("dup_index", int) != 0:
                skipped["duplicate plan (dup_index > 0)"] += 1
                continue
        status = get("status", str)
        t = raw.get("iter_time_s")
        if status == "oom":
            t = None
        elif not isinstance(t, (int, float)) or isinstance(t, bool) or t <= 0:
            raise ArenaFormatError(f"{path}: records[{i}]: field 'iter_time_s' must be a positive number "
                                   f"for status {status!r}, got {t!r}")
        plan = (get("pp", int), get("dp", int), get("tp", int)) if kind == ProfileSource.ARENA_ESTIMATED else (None, None, None)
        recs.append(CellRecord(
            model=get("trace_model_name", str), global_batch=get("batch_size", int), gpu_type=get("gpu_type", str),
            num_nodes=get("num_nodes", int), gpus_per_node=get("gpus_per_node", int),
            iter_time_s=None if t is None else float(t), pp=plan[0], dp=plan[1], tp=plan[2], source=kind))
    return kind, recs, dict(skipped)


def _getter(raw: Any, where: str):
    if not isinstance(raw, dict):
        raise ArenaFormatError(f"{where}: expected an object, got {type(raw).__name__}")

    def get(name: str, typ: type) -> Any:
        if name not in raw:
            raise ArenaFormatError(f"{where}: missing field {name!r}")
        value = raw[name]
        if not isinstance(value, typ) or isinstance(value, bool):
            raise ArenaFormatError(f"{where}: field {name!r} must be {typ.__name__}, got {value!r}")
        return value

    return get


def import_arena_data(store: ProfileStore, data: Any, path: str = "<data>") -> ImportReport:
    """Import an already parsed Arena profile file."""
    kind, recs, skipped = arena_records(data, path)
    return ImportReport(path, kind, store.put_cells(recs), skipped)


def import_arena(store: ProfileStore, path: str | os.PathLike) -> ImportReport:
    """Import one Arena profile file (optimal or per-plan estimates) into `store`."""
    with open(path, encoding="utf-8") as fh:
        try:
            data = json.load(fh)
        except json.JSONDecodeError as exc:
            raise ArenaFormatError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}, "
                                   f"column {exc.colno}") from None
    return import_arena_data(store, data, str(path))


def seed_store(store: ProfileStore) -> str:
    """Fill a new store with the shipped Arena profiles and the default GPU
    specs; returns a one-line description of what was seeded."""
    from solver.profiles.gpus import default_gpu_specs

    reports = [import_arena(store, shipped_path(name)) for name in (OPTIMAL_FILE, ESTIMATED_FILE)]
    gpus = default_gpu_specs(load_device_specs()["simulator_gpu_specs"])
    for spec in gpus.values():
        store.put_gpu(spec)
    parts = [f"{r.kind}={r.imported}" for r in reports] + [f"gpus={len(gpus)}"]
    return "shipped arena data: " + " ".join(parts)
