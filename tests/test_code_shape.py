"""The code's shape, as a newcomer who has to change one rule meets it
(docs/development.md): interfaces declared, not forwarded by
``__getattr__``; no class too long to hold in one's head; a runtime's
capabilities checked through `plan_problem` only where plans are generated
and at the two guards; the site's reading part of the Backend protocol.
Read from the source (ast), so the checks see every file, tested or not."""

from __future__ import annotations

import ast

from support import ROOT

PACKAGES = ("solver", "slurm_ext", "launch")
MAX_CLASS_LINES = 500
#: the files outside the contract floor that may call plan_problem: the controller's guard
#: (the plan validation it runs before applying) and the launcher's (its framework adapters)
GUARDS = {"solver/placement/validate.py", "launch/adapters/base.py"}


def sources(*packages: str) -> dict[str, ast.Module]:
    return {
        str(p.relative_to(ROOT)): ast.parse(p.read_text(encoding="utf-8"), str(p))
        for pkg in packages
        for p in sorted((ROOT / pkg).rglob("*.py"))
    }


def defined(tree: ast.Module, name: str) -> list[int]:
    """Lines where a function or method called `name` is defined."""
    return [
        n.lineno for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
    ]


def calls(tree: ast.Module, name: str) -> list[int]:
    """Lines where `name` (a bare name or an attribute) is called."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            f = n.func
            if (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name):
                out.append(n.lineno)
    return out


def long_classes(trees: dict[str, ast.Module], limit: int = MAX_CLASS_LINES) -> list[str]:
    return [
        f"{path}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
        for path, tree in trees.items()
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef) and (n.end_lineno or n.lineno) - n.lineno + 1 > limit
    ]


def test_no_getattr_forwarding_in_the_solver():
    """Estimator stages (and everything else of the solver) declare what they
    offer; nothing is forwarded to an inner object by ``__getattr__``."""
    found = [f"{path}:{line}" for path, tree in sources("solver").items() for line in defined(tree, "__getattr__")]
    assert found == []


def test_no_class_is_longer_than_500_lines():
    assert long_classes(sources(*PACKAGES)) == []


def test_plan_problem_is_called_where_plans_are_made_and_at_the_two_guards_only():
    """The contract floor holds the rule (refusal, for plans being generated,
    is plan_problem over them); outside it, only the two guards call it."""
    callers = {
        path
        for path, tree in sources(*PACKAGES).items()
        if calls(tree, "plan_problem") and not path.startswith("solver/contract/")
    }
    assert callers <= GUARDS and len(callers) <= 3
    assert callers == GUARDS  # both guards check, whatever policy or framework made the plan


def test_read_site_is_part_of_the_backend_protocol():
    tree = sources("slurm_ext")["slurm_ext/backends/base.py"]
    protocol = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Backend")
    assert "read_site" in {n.name for n in protocol.body if isinstance(n, ast.FunctionDef)}


def test_the_measures_see_what_they_look_for():
    """The helpers catch a planted case (a test of the tests)."""
    tree = ast.parse("class A:\n    def __getattr__(self, n):\n        return plan_problem(n)\n" + "    x = 1\n" * 600)
    assert defined(tree, "__getattr__") == [2] and calls(tree, "plan_problem") == [3]
    assert long_classes({"m.py": tree}) == ["m.py:1 A (603 lines)"]
