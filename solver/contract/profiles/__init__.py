"""Cached, disaggregated profiles: cell-level times, layer-level profiles,
communication tables and GPU specs, in one SQLite store."""

from solver.contract.profiles.records import CellRecord, CommRecord, GpuSpec, LayerRecord
from solver.contract.profiles.store import ProfileStore

__all__ = ["CellRecord", "CommRecord", "GpuSpec", "LayerRecord", "ProfileStore"]
