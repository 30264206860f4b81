"""cellsched's in-job runtime: srun wrapper, parallel groups, elastic training.

Importing the package stays light (the launcher runs on this path); the
torch-based parts load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launch.hook import on_checkpoint
from solver.contract.extras import require

if TYPE_CHECKING:
    from launch.parallel import ParallelContext, init_parallel
    from launch.trainer import Trainer
    from launch.workload import StageSpec, Workload

__all__ = ["ParallelContext", "StageSpec", "Trainer", "Workload", "init_parallel", "on_checkpoint"]
_HOME = {"ParallelContext": "parallel", "init_parallel": "parallel", "Trainer": "trainer"}


def __getattr__(name: str) -> Any:
    if name in __all__:
        require("torch")  # one line naming the extra, not "No module named 'torch'"
        import importlib

        return getattr(importlib.import_module(f"launch.{_HOME.get(name, 'workload')}"), name)
    raise AttributeError(f"module 'launch' has no attribute {name!r}")
