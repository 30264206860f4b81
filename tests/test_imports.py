"""The shape of the packages: imports point down (solver <- slurm_ext, launch)
and no file imports itself back through others. Read from the source: every
import statement of a file counts, also inside functions (lazy) and under
``if TYPE_CHECKING:`` (a type a file names is a dependency too, even if it
is not loaded at run time)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from support import ROOT

PACKAGES = ("solver", "slurm_ext", "launch")
#: package -> ours it may import
ALLOWED = {"solver": {"solver"}, "slurm_ext": {"slurm_ext", "solver"}, "launch": {"launch", "solver"}}


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Our modules that module `name` imports (the module itself when it is
    one, else the package it comes from)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_reader_sees_imports():
    g = graph()
    assert "solver.contract.plan" in g["solver.contract"] and "solver.contract" in g["launch.cli"]
    assert "solver.contract.profiles.store" in g["solver.contract.profiles"]  # a package's __init__ counts as a module
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_lazy_and_type_checking_imports_count(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.b import B\n"
        "def f():\n    import pkg.c\n"
        "from . import d\n"
    )
    known = {name: path for name in ("pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d")}
    assert imports_of("pkg.a", path, known) == {"pkg.b", "pkg.c", "pkg.d"}


def test_no_import_cycles():
    """Between files (a package's __init__ is one), lazy and TYPE_CHECKING imports included."""
    assert cycles(graph()) == []


def test_the_backend_table_names_no_simulator():
    """slurm_ext.backends lists Slurm's own backends; the simulator declares its
    own in the cellsched.backends entry-point group (pyproject.toml)."""
    path = ROOT / "slurm_ext" / "backends" / "__init__.py"
    assert not [t for t in imports_of("slurm_ext.backends", path, modules()) if _under(t, "slurm_ext.sim")]
    assert "slurm_ext.sim" not in path.read_text(encoding="utf-8")  # not by name either


def test_imports_point_down():
    wrong = sorted(
        f"{m} imports {t}"
        for m, ts in graph().items()
        for t in ts
        if t.partition(".")[0] not in ALLOWED[m.partition(".")[0]]
    )
    assert wrong == []


#: the contract floor: what the controller and every rank share (docs/development.md)
CONTRACT = "solver.contract"


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_launch_stands_on_the_contract_floor_only():
    wrong = sorted(
        f"{m} imports {t}"
        for m, ts in graph().items()
        if _under(m, "launch")
        for t in ts
        if _under(t, "solver") and not _under(t, CONTRACT)
    )
    assert wrong == []


def test_the_contract_floor_imports_only_itself_and_the_standard_library():
    """solver.contract is stdlib-only (every rank imports it, fast) and
    stands on nothing of the optimizer above it."""
    known = modules()
    wrong = []
    for name, path in known.items():
        if not _under(name, CONTRACT):
            continue
        wrong += [f"{name} imports {t}" for t in imports_of(name, path, known) if not _under(t, CONTRACT)]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops = [a.name.partition(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                tops = [(node.module or "").partition(".")[0]]
            else:
                continue
            wrong += [
                f"{name} imports {top}"
                for top in tops
                if top not in sys.stdlib_module_names and top not in ("__future__", "solver")
            ]
    assert wrong == []


def test_the_optimizer_imports_the_contract_floor():
    """The pure optimizer stands on the same floor (one definition of a job's spec, plan and runtime)."""
    g = graph()
    optimizer = [m for m in g if _under(m, "solver") and not _under(m, CONTRACT)]
    assert any(_under(t, CONTRACT) for m in optimizer for t in g[m])
