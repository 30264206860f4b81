"""The controller stays in pieces a reader can hold: no function in
slurm_ext/controller/ is longer than MAX_LINES (from its `def` line to its
last line, docstring included)."""

from __future__ import annotations

import ast
from pathlib import Path

import slurm_ext.controller

MAX_LINES = 60
ROOT = Path(slurm_ext.controller.__file__).parent


def long_functions(source: str, filename: str, limit: int = MAX_LINES) -> list[str]:
    """`file:line name (N lines)` of each function (sync or async, nested too) over `limit` lines."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                out.append(f"{filename}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_in_the_controller_is_longer_than_60_lines():
    modules = sorted(ROOT.glob("*.py"))
    assert {"round.py", "inputs.py", "reconcile.py", "relaunch.py"} <= {p.name for p in modules}
    too_long = [f for p in modules for f in long_functions(p.read_text(), f"slurm_ext/controller/{p.name}")]
    assert not too_long, f"split these into named steps of at most {MAX_LINES} lines: {too_long}"


def test_the_measure_counts_from_the_def_line_to_the_last_line():
    def source(body_lines: int, prefix: str = "") -> str:
        body = "".join(f"    x{i} = {i}\n" for i in range(body_lines))
        return f'{prefix}def f():\n    """doc"""\n{body}'

    # def + docstring + 58 statements = 60 lines: allowed; one more is not
    assert long_functions(source(58), "m.py") == []
    assert long_functions(source(59), "m.py") == ["m.py:1 f (61 lines)"]
    # async and nested functions count too
    nested = "class C:\n    async def g(self):\n" + "".join(f"        y{i} = {i}\n" for i in range(60))
    assert long_functions(nested, "n.py") == ["n.py:2 g (61 lines)"]
