"""The README and docs/ stay short, true and free of provenance.

- README.md has at most README_MAX_LINES lines, and links the docs' map;
  every page of docs/ is linked from docs/index.md.
- No commit hash in the README's or docs' prose: a token of 7 to 40
  lower-case hex characters with at least one digit, anywhere outside fenced
  code blocks (inline code included, so "at `586e48f`" is
  caught as well as "at 586e48f"). Provenance lives in benchmarks/results/.
- Every command shown is runnable: each `cellsched ...` line (in shell code
  blocks and in inline code) names an existing subcommand, which answers
  `--help` with exit 0 and lists every long option the line uses; the same
  for `cellsched-launch`; each `benchmarks/X.py` exists and its `--help`
  exits 0 and lists the options used; each shell script exists and knows the
  subcommand it is given; every repository path shown exists.
- The Python examples import only names that exist.
- Every key of the config classes is documented in docs/ (as inline code,
  or as `key = ...` in a TOML block). docs/config.md, the generated
  reference, documents them all once it exists; the hand-written pages name
  every key too.
- Every relative link resolves to a file, and every #anchor to a heading.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import glob
import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from support import ROOT

from slurm_ext.cli import main as cellsched_main
from slurm_ext.config import ControllerConfig, LogConfig, MetricsConfig, NetworkConfig
from solver.types import SolverConfig

README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 250
#: pages written by a generator (the config reference); a link to one that is not generated yet is allowed
GENERATED = {DOCS / "config.md"}
CONFIG_CLASSES = {
    "controller": ControllerConfig,
    "solver": SolverConfig,
    "network": NetworkConfig,
    "metrics": MetricsConfig,
    "log": LogConfig,
}
SHELL_LANGS = {"", "sh", "bash", "shell", "console"}
#: a commit hash as prose would cite it: 7 to 40 lower-case hex characters, at least one a digit (a hash
#: may have no letter; a word such as "defaced" has no digit), as a token of its own
HASH = re.compile(r"(?<![0-9A-Za-z_])(?=[a-f]*[0-9])[0-9a-f]{7,40}(?![0-9A-Za-z_])")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
#: a path in the repository, as the docs show it (not one under /tmp or another absolute path)
REPO_PATH = re.compile(
    r"(?<![\w./$-])((?:contrib|etc|benchmarks|tests|solver|slurm_ext|launch|docs)/[\w./{},*-]*[\w}/])"
)
#: what ends one command of a shell line
SEPARATORS = re.compile(r"^(?:&&|\|\||\||;|\d*[<>]+.*)$")
WRAPPERS = {"exec", "sudo", "eval", "time"}


@dataclasses.dataclass(frozen=True)
class Page:
    path: Path
    prose: tuple[tuple[int, str], ...]  #: (line number, text) outside fenced code blocks
    blocks: tuple[tuple[int, str, tuple[str, ...]], ...]  #: (first line, language, lines)

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT))

    def inline_code(self) -> list[tuple[int, str]]:
        return [(n, m.group(2).strip()) for n, line in self.prose for m in INLINE_CODE.finditer(line)]


@functools.cache
def parse(path: Path) -> Page:
    prose: list[tuple[int, str]] = []
    blocks: list[tuple[int, str, tuple[str, ...]]] = []
    fence: tuple[int, str, str, str] | None = None  # (first line, indent, marker, language)
    body: list[str] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence, body = (n, m.group(1), m.group(2), m.group(3).lower()), []
        elif fence is not None and line.strip().startswith(fence[2]) and not line.strip().strip(fence[2][0]):
            indent = fence[1]
            blocks.append((fence[0], fence[3], tuple(b[len(indent) :] if b.startswith(indent) else b for b in body)))
            fence = None
        elif fence is not None:
            body.append(line)
        else:
            prose.append((n, line))
    assert fence is None, f"{path}: the code block opened on line {fence and fence[0]} is never closed"
    return Page(path, tuple(prose), tuple(blocks))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[`*_]{2,}|`", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in parse(path).prose:
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            k = seen.get(base, 0)
            seen[base] = k + 1
            out.add(base if k == 0 else f"{base}-{k}")
    return out


# --- length, map, hashes -------------------------------------------------------------------------


def test_readme_is_short_and_leads_to_the_docs():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; keep it to {README_MAX_LINES}"
    assert "docs/index.md" in README.read_text(encoding="utf-8")


def test_every_page_is_on_the_map():
    index = DOCS / "index.md"
    targets = [target for _, line in parse(index).prose for target in LINK.findall(line)]
    linked = {(DOCS / target.split("#")[0]).resolve() for target in targets}
    pages = {p.resolve() for p in DOCS.glob("*.md") if p.name != "index.md"} | (GENERATED - {index})
    assert not pages - linked, f"docs/index.md does not link {sorted(p.name for p in pages - linked)}"


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("Sia at 586e48f with uncommitted edits, continued at 83e9a3c", ["586e48f", "83e9a3c"]),
        ("the mixed-88 rows at `6148116` (x2, x4)", ["6148116"]),
        ("commit 71303e8a9b2c4d5e6f708192a3b4c5d6e7f80912 landed", ["71303e8a9b2c4d5e6f708192a3b4c5d6e7f80912"]),
        ("written as a number: 1234567, rows at 6148116", ["1234567", "6148116"]),
        ("on 2026-11-26, 1e-15, a100x1, gpt-1.3b, 0x1b, 1,234,567, deadbeef, defaced, data_parser v0.0.41", []),
        ("a token of 6 hex: abc123, and one of 41: " + "a1" * 20 + "b", []),
    ],
)
def test_the_hash_rule(text, found):
    assert HASH.findall(text) == found


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_no_commit_hash_in_prose(path):
    hits = [f"{path.name}:{n}: {h}" for n, line in parse(path).prose for h in HASH.findall(line)]
    assert not hits, "commit hashes belong in benchmarks/results/, not in prose:\n" + "\n".join(hits)


# --- commands ------------------------------------------------------------------------------------


def logical_lines(lines: tuple[str, ...]) -> list[tuple[int, str]]:
    """(index of the first line, line) of shell lines, their backslash continuations joined."""
    out: list[tuple[int, str]] = []
    cur, start = "", 0
    for i, line in enumerate(lines):
        if not cur:
            start = i
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
        else:
            out.append((start, cur + line))
            cur = ""
    if cur:
        out.append((start, cur))
    return out


def commands(line: str) -> list[list[str]]:
    """The commands of one shell line (comments dropped, `$(...)` opened, wrappers and env assignments left out)."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        return []
    out: list[list[str]] = []
    cur: list[str] = []
    for tok in [*tokens, ";"]:
        if tok.startswith("$(") and tok.endswith(")"):
            out += commands(tok[2:-1])
        elif SEPARATORS.match(tok):
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(tok)
    cleaned = []
    for cmd in out:
        while cmd and (cmd[0] in WRAPPERS or re.match(r"^[A-Za-z_]\w*=", cmd[0])):
            cmd = cmd[1:]
        if cmd and cmd[0] == "srun":
            cmd = cmd[1:]
            while cmd and cmd[0].startswith("-"):
                cmd = cmd[1:]
        if cmd:
            cleaned.append(cmd)
    return cleaned


def long_options(args: list[str]) -> list[str]:
    """The long options ARGS name (`[--x]`, `--x=V`, `--x/--no-x`), up to a bare `--`."""
    out = []
    for arg in args:
        if arg == "--":
            break
        for part in arg.strip("[]").split("/"):
            m = re.match(r"^(--[A-Za-z][\w-]*)", part)
            if m:
                out.append(m.group(1))
    return out


def listed(option: str, help_text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text) is not None


@functools.cache
def cellsched_help(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(cellsched_main, [*path, "--help"], prog_name="cellsched")
    assert result.exit_code == 0, f"cellsched {' '.join(path)} --help exits {result.exit_code}:\n{result.output}"
    return result.output


def cellsched_path(args: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """(the subcommand path ARGS name, the rest); a word where a subcommand must be fails."""
    import click

    cmd: click.Command = cellsched_main
    path: list[str] = []
    ctx = click.Context(cellsched_main)
    while args and isinstance(cmd, click.Group) and not args[0].startswith("-"):
        sub = cmd.get_command(ctx, args[0])
        assert sub is not None, f"cellsched {' '.join([*path, args[0]])}: no such command"
        path.append(args[0])
        cmd, args = sub, args[1:]
    return tuple(path), args


def run_help(argv: tuple[str, ...]) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, *argv, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, f"{' '.join(argv)} --help exits {proc.returncode}:\n{proc.stderr[-2000:]}"
    return proc.stdout


@functools.cache
def script_help(script: str) -> str:
    return run_help((script,))


@functools.cache
def launcher_help() -> str:
    return run_help(("-m", "launch"))


def check_command(cmd: list[str]) -> None:
    head, args = cmd[0], cmd[1:]
    if head in ("python", "python3") and args and args[0].startswith("benchmarks/"):
        head, args = args[0], args[1:]
    if head == "bash" and args and args[0].endswith(".sh"):
        head, args = args[0], args[1:]
    if head == "cellsched":
        path, rest = cellsched_path(args)
        text = cellsched_help(path)
        missing = [o for o in long_options(rest) if not listed(o, text)]
        assert not missing, f"cellsched {' '.join(path)} has no {missing}"
    elif head == "cellsched-launch":
        text = launcher_help()
        missing = [o for o in long_options(args) if not listed(o, text)]
        assert not missing, f"cellsched-launch has no {missing}"
    elif re.match(r"^benchmarks/\w+\.py$", head):
        assert (ROOT / head).is_file(), f"{head} does not exist"
        text = script_help(head)
        missing = [o for o in long_options(args) if not listed(o, text)]
        assert not missing, f"{head} has no {missing}"
    elif re.match(r"^(contrib|etc)/[\w./-]+\.sh$", head):
        script = ROOT / head
        assert script.is_file(), f"{head} does not exist"
        if args and re.match(r"^[a-z][\w-]*$", args[0]):
            assert re.search(rf"(?m)^\s*{re.escape(args[0])}\)", script.read_text()), f"{head} has no {args[0]!r}"


def shown_commands() -> list[tuple[str, str]]:
    """(where, line) of every command line the pages show."""
    out = []
    for path in PAGES:
        page = parse(path)
        for first, lang, lines in page.blocks:
            if lang in SHELL_LANGS:
                out += [(f"{page.name}:{first + 1 + i}", line) for i, line in logical_lines(lines)]
        out += [
            (f"{page.name}:{n}", code)
            for n, code in page.inline_code()
            if re.match(r"^cellsched(-launch)?( |$)", code) and not re.search(r":( |$)", code)  # not a message
        ]
    return out


def test_the_pages_show_commands():
    heads = {cmd[0] for _, line in shown_commands() for cmd in commands(line)}
    assert {"cellsched", "cellsched-launch", "bash", "python"} <= heads


def test_every_command_shown_is_runnable():
    failures = []
    for where, line in shown_commands():
        for cmd in commands(line):
            try:
                check_command(cmd)
            except AssertionError as exc:
                failures.append(f"{where}: {line.strip()}\n    {str(exc).splitlines()[0]}")
    assert not failures, "\n".join(failures)


def test_every_repository_path_shown_exists():
    missing = []
    for path in PAGES:
        page = parse(path)
        texts = [(n, code) for n, code in page.inline_code()]
        texts += [
            (first + 1 + i, line)
            for first, lang, lines in page.blocks
            if lang in SHELL_LANGS
            for i, line in enumerate(lines)
        ]
        for n, text in texts:
            for shown in REPO_PATH.findall(text):
                m = re.match(r"^(.*)\{([^}]*)\}(.*)$", shown)
                variants = [m.group(1) + alt + m.group(3) for alt in m.group(2).split(",")] if m else [shown]
                for v in variants:
                    if not glob.glob(str(ROOT / v)):
                        missing.append(f"{page.name}:{n}: {v}")
    assert not missing, "paths shown that do not exist:\n" + "\n".join(missing)


def test_python_examples_import_what_exists():
    pytest.importorskip("torch")  # the in-job runtime's modules need it
    failures = []
    for path in PAGES:
        page = parse(path)
        for first, lang, lines in page.blocks:
            if lang != "python":
                continue
            tree = ast.parse("\n".join(lines))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        importlib.import_module(alias.name)
                elif isinstance(node, ast.ImportFrom) and node.module:
                    module = importlib.import_module(node.module)
                    for alias in node.names:
                        if not hasattr(module, alias.name):
                            try:
                                importlib.import_module(f"{node.module}.{alias.name}")
                            except ImportError:
                                failures.append(f"{page.name}:{first}: from {node.module} import {alias.name}")
    assert not failures, "\n".join(failures)


# --- config keys ---------------------------------------------------------------------------------


def documented_keys() -> set[str]:
    out = set()
    for path in sorted(DOCS.glob("*.md")):
        page = parse(path)
        for _, code in page.inline_code():
            m = re.match(r"^(?:(\w+)\.)?(\w+)(?:\s*=.*)?$", code)
            if m:
                out.add(m.group(2))
        for _, lang, lines in page.blocks:
            if lang == "toml":
                out |= {m.group(1) for line in lines if (m := re.match(r"^\s*(\w+)\s*=", line))}
    return out


def test_every_config_key_is_documented():
    keys = documented_keys()
    missing = [f"[{section}] {f.name}" for section, cls in CONFIG_CLASSES.items() for f in dataclasses.fields(cls)]
    missing = [k for k in missing if k.split()[1] not in keys]
    assert not missing, f"config keys no page of docs/ names (as `key`): {missing}"


# --- links ---------------------------------------------------------------------------------------


def test_every_relative_link_resolves():
    broken = []
    for path in PAGES:
        page = parse(path)
        for n, line in page.prose:
            line = INLINE_CODE.sub("", line)
            for target in LINK.findall(line):
                if re.match(r"^[a-z][\w+.-]*:", target):  # https:, mailto:
                    continue
                file, _, anchor = target.partition("#")
                dest = (path.parent / file).resolve() if file else path.resolve()
                if not dest.exists():
                    if dest not in {g.resolve() for g in GENERATED}:
                        broken.append(f"{page.name}:{n}: {target} (no such file)")
                    continue
                if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    broken.append(f"{page.name}:{n}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
