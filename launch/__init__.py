"""cellsched's in-job runtime: srun wrapper, parallel groups, elastic training.

Importing the package stays light (the launcher runs on this path); the
torch-based parts load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launch.hook import on_checkpoint
from solver.extras import require

if TYPE_CHECKING:
    from launch.parallel import ParallelContext, init_parallel

__all__ = ["ParallelContext", "init_parallel", "on_checkpoint"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        require("torch")  # one line naming the extra, not "No module named 'torch'"
        from launch import parallel

        return getattr(parallel, name)
    raise AttributeError(f"module 'launch' has no attribute {name!r}")
