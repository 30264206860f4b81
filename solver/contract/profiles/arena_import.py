"""Arena's profile files -> cell records, imported into a profile store.

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
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from solver.contract.profiles.arena import ESTIMATED_FILE, OPTIMAL_FILE, ArenaFormatError
from solver.contract.profiles.records import CellRecord, ProfileSource

if TYPE_CHECKING:
    from solver.contract.profiles.store import ProfileStore


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
            "an object with a non-empty 'records' list)"
        )
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
            raise ArenaFormatError(
                f"{path}: records[{i}]: field 'iter_time_s' must be a positive number for status {status!r}, got {t!r}"
            )
        plan = (
            (get("pp", int), get("dp", int), get("tp", int))
            if kind == ProfileSource.ARENA_ESTIMATED
            else (None, None, None)
        )
        recs.append(
            CellRecord(
                model=get("trace_model_name", str),
                global_batch=get("batch_size", int),
                gpu_type=get("gpu_type", str),
                num_nodes=get("num_nodes", int),
                gpus_per_node=get("gpus_per_node", int),
                iter_time_s=None if t is None else float(t),
                pp=plan[0],
                dp=plan[1],
                tp=plan[2],
                source=kind,
            )
        )
    return kind, recs, dict(skipped)


def _getter(raw: Any, where: str) -> Callable[[str, type], Any]:
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


def import_arena(store: ProfileStore, path: str | os.PathLike[str]) -> ImportReport:
    """Import one Arena profile file (optimal or per-plan estimates) into `store`."""
    with open(path, encoding="utf-8") as fh:
        try:
            data = json.load(fh)
        except json.JSONDecodeError as exc:
            raise ArenaFormatError(
                f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
            ) from None
    return import_arena_data(store, data, str(path))
