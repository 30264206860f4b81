"""Every exception class of ours has its layer's base (solver.contract.errors.SolverError,
slurm_ext.errors.CellschedError, launch.errors.LauncherError), and no two
share a name, so that an ``except`` names one error only."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

from launch.errors import LauncherError
from slurm_ext.errors import CellschedError
from solver.contract.errors import SolverError

BASES: dict[str, type[Exception]] = {"solver": SolverError, "slurm_ext": CellschedError, "launch": LauncherError}


def our_modules() -> list[ModuleType]:
    out = []
    for pkg in BASES:
        root = importlib.import_module(pkg)
        out.append(root)
        for info in pkgutil.walk_packages(root.__path__, f"{pkg}."):
            if info.name.endswith("__main__"):
                continue  # __main__ runs its command on import
            out.append(importlib.import_module(info.name))
    return out


def our_errors() -> list[type[BaseException]]:
    """The exception classes defined in our modules (not those they import)."""
    found = {
        obj
        for mod in our_modules()
        for obj in vars(mod).values()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == mod.__name__
    }
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


ERRORS = our_errors()


def test_some_errors_are_found():
    names = {c.__name__ for c in ERRORS}
    assert {"HostlistError", "PlanError", "PlacementError", "SlurmError", "LayoutError"} <= names


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_error_has_its_layer_base(cls):
    base = BASES[cls.__module__.split(".")[0]]
    assert issubclass(cls, base), f"{cls.__qualname__} does not derive from {base.__qualname__}"


def test_builtin_bases_are_kept():
    from launch.scontrol import ScontrolError
    from slurm_ext.backends.base import SlurmUnavailable
    from solver.contract.extras import MissingExtra
    from solver.contract.hostlist import HostlistError

    assert issubclass(HostlistError, ValueError) and issubclass(HostlistError, SolverError)
    assert issubclass(MissingExtra, ImportError) and issubclass(MissingExtra, SolverError)
    assert issubclass(ScontrolError, RuntimeError) and issubclass(ScontrolError, LauncherError)
    assert issubclass(SlurmUnavailable, RuntimeError) and issubclass(SlurmUnavailable, CellschedError)


def test_error_names_are_distinct():
    by_name: dict[str, list[str]] = {}
    for cls in ERRORS:
        by_name.setdefault(cls.__name__, []).append(cls.__module__)
    assert {n: m for n, m in by_name.items() if len(m) > 1} == {}


def test_a_plan_error_is_not_a_placement_error():
    from solver.contract.plan import PlanError
    from solver.placement import PlacementError

    assert PlanError is not PlacementError
    assert not issubclass(PlanError, PlacementError) and not issubclass(PlacementError, PlanError)
