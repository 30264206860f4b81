"""Moving profiles between stores: a JSON-lines export of every record, and
an import that recognises that format or an Arena profile file.

The export's first line is a header ``{"format": "cellsched-profiles",
"version": 1}``; every other line is one record: ``{"record": "cell" | "layer"
| "comm" | "gpu", ...the record's fields}``.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, asdict, fields
from typing import IO, Any

from solver.contract.errors import SolverError
from solver.contract.profiles.arena import ArenaFormatError
from solver.contract.profiles.arena_import import ImportReport, import_arena_data
from solver.contract.profiles.records import CellRecord, CommRecord, GpuSpec, LayerRecord
from solver.contract.profiles.store import InvalidRecordError, ProfileStore

FORMAT = "cellsched-profiles"
VERSION = 1
KINDS: dict[str, type] = {"cell": CellRecord, "layer": LayerRecord, "comm": CommRecord, "gpu": GpuSpec}


class ProfileFileError(ValueError, SolverError):
    """A profile file cannot be read (the message names the file and line)."""


def export_jsonl(store: ProfileStore, out: IO[str]) -> int:
    """Write every record of `store` to `out` as JSON lines; returns the record count."""
    out.write(json.dumps({"format": FORMAT, "version": VERSION}) + "\n")
    n = 0

    def emit(kind: str, rec: Any) -> None:
        nonlocal n
        out.write(json.dumps({"record": kind, **asdict(rec)}) + "\n")
        n += 1

    for cell in store.cells():
        emit("cell", cell)
    for sig in store.layer_models():
        for gpu, tp, mb in store.layer_keys(sig):
            for layer in store.layers(sig, gpu, tp, mb):
                emit("layer", layer)
    for link, op in store.comm_keys():
        for comm in store.comm(link, op):
            emit("comm", comm)
    for spec in store.gpus().values():
        emit("gpu", spec)
    return n


def _record(obj: Any, where: str) -> tuple[str, Any]:
    if not isinstance(obj, dict):
        raise ProfileFileError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    kind = obj.get("record")
    if kind not in KINDS:
        raise ProfileFileError(f"{where}: field 'record' must be one of {sorted(KINDS)}, got {kind!r}")
    cls = KINDS[kind]
    names = {f.name for f in fields(cls)}
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    extra = set(obj) - names - {"record"}
    if extra:
        raise ProfileFileError(f"{where}: unknown field(s) {sorted(extra)} for a {kind} record")
    missing = sorted(required - set(obj))
    if missing:
        raise ProfileFileError(f"{where}: {kind} record lacks field {missing[0]!r}")
    return kind, cls(**{k: v for k, v in obj.items() if k != "record"})


def import_jsonl_text(store: ProfileStore, text: str, path: str = "<text>") -> ImportReport:
    """Import our JSON-lines export; all records or none (one transaction)."""
    batches: dict[str, list[tuple[str, Any]]] = {k: [] for k in KINDS}  # kind -> (where, record)
    header_seen = False
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ProfileFileError(f"{where}: not valid JSON: {exc.msg} (column {exc.colno})") from None
        if not header_seen:
            if not isinstance(obj, dict) or obj.get("format") != FORMAT:
                raise ProfileFileError(
                    f'{where}: first line must be the header {{"format": "{FORMAT}", "version": {VERSION}}}'
                )
            if obj.get("version") != VERSION:
                raise ProfileFileError(
                    f"{where}: field 'version' is {obj.get('version')!r}; this cellsched reads version {VERSION}"
                )
            header_seen = True
            continue
        kind, rec = _record(obj, where)
        batches[kind].append((where, rec))
    if not header_seen:
        raise ProfileFileError(f"{path}: empty file")
    n = 0
    with store.transaction():
        for kind, items in batches.items():
            for where, rec in items:
                try:
                    if kind == "cell":
                        n += store.put_cells([rec])
                    elif kind == "layer":
                        n += store.put_layers([rec])
                    elif kind == "comm":
                        n += store.put_comm([rec])
                    else:
                        store.put_gpu(rec)
                        n += 1
                except InvalidRecordError as exc:
                    raise ProfileFileError(f"{where}: {exc}") from None
    return ImportReport(path, FORMAT, n, {})


def import_file(store: ProfileStore, path: str | os.PathLike[str]) -> ImportReport:
    """Import a file by its shape: our JSON-lines export, or an Arena
    profile file (profiles_optimal.json / profiles_plans_estimated.json)."""
    name = str(path)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except UnicodeDecodeError:
        raise ProfileFileError(f"{name}: not a text file") from None
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    try:
        head = json.loads(first)
    except json.JSONDecodeError:
        head = None
    if isinstance(head, dict) and head.get("format") == FORMAT:
        return import_jsonl_text(store, text, name)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileFileError(f"{name}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    try:
        return import_arena_data(store, data, name)
    except (ArenaFormatError, InvalidRecordError) as exc:
        raise ProfileFileError(str(exc)) from None
