"""Golden records (submitit-style), importable as `golden`: the argument lists a
test recorded, compared with a checked-in JSON file.

`ArgvRecorder` stands in for subprocess.run at CliBackend's `run` seam: it
records every argument list and answers with the stdout its `answer` gives.
`check_golden(path, recorded)` fails with a diff unless `recorded` equals the
file; with CELLSCHED_UPDATE_GOLDEN=1 in the environment it (re)writes the file
instead. Review the diff of the golden file before committing it.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

UPDATE_ENV = "CELLSCHED_UPDATE_GOLDEN"


class ArgvRecorder:
    """A stand-in for subprocess.run: records each argument list (`calls`;
    a command fed on its standard input is recorded as its argument list,
    "<stdin>" and the lines it read) and exits 0 printing `answer(args)` ("" by
    default)."""

    def __init__(self, answer: Callable[[list[str]], str] = lambda args: "") -> None:
        self.calls: list[list[str]] = []
        self._answer = answer

    def __call__(self, args: list[str], *, input: str | None = None, **_: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(args) + (["<stdin>", *input.splitlines()] if input is not None else []))
        return subprocess.CompletedProcess(args, 0, stdout=self._answer(list(args)), stderr="")


def check_golden(path: Path, recorded: Mapping[str, Any]) -> None:
    """Compare `recorded` (JSON-able) with the golden file at `path`, or write
    it there when CELLSCHED_UPDATE_GOLDEN=1."""
    text = json.dumps(recorded, indent=2) + "\n"
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.is_file():
        pytest.fail(f"no golden file {path}: write it with {UPDATE_ENV}=1", pytrace=False)
    expected = path.read_text()
    if json.loads(text) != json.loads(expected):
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), str(path), "recorded"))
        pytest.fail(
            f"the recorded argument lists differ from {path} (if the change is meant, rewrite it with "
            f"{UPDATE_ENV}=1 and review its diff):\n{diff}",
            pytrace=False,
        )
