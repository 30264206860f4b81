"""A simulation's checkpoint: its Simulator and Controller between two
steps, in one file, so that a run of hours can stop and go on later (in
another process, another day) to the same result.

Everything is pickled as it is, the state DB with its content
(``StateStore.__getstate__``); what no pickle holds is rebuilt fresh: locks
(no step holds one between steps) and events (with whether they were set).
The file is written next to its final name and renamed into place, so a
run killed while saving leaves the previous checkpoint whole. It holds two
pickles: a header (the format's `VERSION` and the run's ``key``), then the
payload, so that a checkpoint of another format or another run is refused
before its payload is read. A checkpoint of another version of the
simulator (its classes changed) is refused, not continued: the run starts
over.
"""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path
from typing import Any

from slurm_ext.errors import CellschedError

#: the file's format (4: the solver's contract floor, estimator stages and the simulator's submitter;
#: 3: a header, then the payload; the simulator as world, clock, accounting and backend;
#: 2: the payload holds the wall time spent); a checkpoint of another version is not continued
VERSION = 4
_LOCKS = {type(threading.Lock()): "lock", type(threading.RLock()): "rlock"}


class CheckpointError(CellschedError):
    """The file is not a checkpoint of this run (or of this cellsched)."""


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        # id(obj) while pickling: one lock held in several places comes back as one
        kind = _LOCKS.get(type(obj))
        if kind is not None:
            return (kind, id(obj))
        if isinstance(obj, threading.Event):
            return ("event", id(obj), obj.is_set())
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._made: dict[tuple[str, int], Any] = {}

    def persistent_load(self, pid: Any) -> Any:
        made = self._made.get(pid[:2])
        if made is None:
            made = self._made[pid[:2]] = self._make(pid)
        return made

    @staticmethod
    def _make(pid: Any) -> Any:
        if pid[0] == "lock":
            return threading.Lock()
        if pid[0] == "rlock":
            return threading.RLock()
        if pid[0] == "event":
            event = threading.Event()
            if pid[2]:
                event.set()
            return event
        raise pickle.UnpicklingError(f"unknown persistent object {pid[0]!r}")


def save(path: str | Path, key: str, payload: Any) -> None:
    """Write `payload` (e.g. ``(simulator, controller)``) as run `key`'s checkpoint at `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            pickler = _Pickler(f, protocol=pickle.HIGHEST_PROTOCOL)
            pickler.dump({"version": VERSION, "key": key})
            pickler.dump(payload)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def load(path: str | Path, key: str) -> Any:
    """The payload of run `key`'s checkpoint at `path` (CheckpointError: another run's, or not one)."""
    unreadable = (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError)
    try:
        with Path(path).open("rb") as f:
            unpickler = _Unpickler(f)
            header = unpickler.load()
            if not isinstance(header, dict) or header.get("version") != VERSION:
                found = header.get("version") if isinstance(header, dict) else None
                raise CheckpointError(
                    f"{path} is not a version-{VERSION} simulation checkpoint"
                    + (f" (it is version {found!r}, of another cellsched: remove it to start over)" if found else "")
                )
            if header.get("key") != key:
                raise CheckpointError(f"{path} holds another run ({header.get('key')!r}), not {key!r}")
            return unpickler.load()
    except unreadable as exc:
        raise CheckpointError(
            f"{path} is not a simulation checkpoint this cellsched can read"
            f" (one of another cellsched version is not continued: remove it to start over): {exc}"
        ) from None
