"""A profile store as cellsched uses it: seeded, when new, with the shipped
Arena profiles and the default GPU specs (a ``meta`` row records that, so a
store emptied on purpose stays empty)."""

from __future__ import annotations

import os

from solver.contract.profiles.arena import ESTIMATED_FILE, OPTIMAL_FILE, load_device_specs, shipped_path
from solver.contract.profiles.arena_import import import_arena
from solver.contract.profiles.gpus import default_gpu_specs
from solver.contract.profiles.store import ProfileStore


def seed_store(store: ProfileStore) -> str:
    """Fill a store with the shipped Arena profiles and the default GPU specs;
    returns a one-line description of what was seeded."""
    reports = [import_arena(store, shipped_path(name)) for name in (OPTIMAL_FILE, ESTIMATED_FILE)]
    gpus = default_gpu_specs(load_device_specs()["simulator_gpu_specs"])
    for spec in gpus.values():
        store.put_gpu(spec)
    parts = [f"{r.kind}={r.imported}" for r in reports] + [f"gpus={len(gpus)}"]
    return "shipped arena data: " + " ".join(parts)


def open_store(path: str | os.PathLike[str] | None = None) -> ProfileStore:
    """The store at `path` (None: the default path), seeded when it is new."""
    return ProfileStore(path, on_create=seed_store)
