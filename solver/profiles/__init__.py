"""Cached, disaggregated profiles: cell-level times, layer-level profiles,
communication tables and GPU specs, in one SQLite store."""

from solver.profiles.records import CellRecord, CommRecord, GpuSpec, LayerRecord

__all__ = ["CellRecord", "CommRecord", "GpuSpec", "LayerRecord"]
