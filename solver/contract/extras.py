"""Optional dependencies (cellsched's extras) and the one-line error when one is missing.

Every lazy import of an optional package goes through `require`, so a command
that needs one says which extra to install instead of showing a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from solver.contract.errors import SolverError

#: optional top-level module -> (what it is called in messages, the extra that installs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "torch": ("PyTorch", "torch"),
    "matplotlib": ("matplotlib", "sim"),
    "pyslurm": ("pyslurm built for this Slurm", "pyslurm"),
}


def install_hint(extra: str) -> str:
    """The pip command that installs `extra`."""
    return f"pip install 'cellsched[{extra}]'"


class MissingExtra(ImportError, SolverError):
    """An optional dependency is not installed (or does not import); str() is one line naming the extra."""

    def __init__(self, module: str, detail: str | None = None) -> None:
        what, self.extra = EXTRAS[module]
        if detail is None:
            text = f"needs {what}; install it with: {install_hint(self.extra)}"
        else:
            text = f"needs {what}, which is installed but does not import ({detail}); reinstall it with: " + (
                install_hint(self.extra)
            )
        super().__init__(text, name=module)


def require(module: str) -> ModuleType:
    """Import `module` (or a submodule, e.g. ``"matplotlib.figure"``) of an optional
    package; MissingExtra when the package is absent or its import fails."""
    top = module.partition(".")[0]
    if top not in EXTRAS:
        raise ValueError(f"{top!r} is not an optional dependency of cellsched")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if importlib.util.find_spec(top) is None:
            raise MissingExtra(top) from None
        first = str(exc).strip().splitlines()
        raise MissingExtra(top, first[0] if first else type(exc).__name__) from exc
