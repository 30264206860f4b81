"""Mutation score of the core modules, measured with mutmut.

mutmut (https://mutmut.readthedocs.io, version 3) rewrites each function of a
module into variants with one small change each (a mutant: `<` for `<=`,
`+ 1` for `- 1`, `None` for a value, a dropped argument ...) and runs the
tests that reach that function against every mutant. A mutant whose tests
fail is "killed"; one whose tests still pass "survived": a change to the code
that no test notices. The score is (killed + timeout) / mutants tested: a
mutant that makes its tests hang past the limit is caught too.

Per module the benchmark copies this checkout into a work folder (mutmut
writes its copies under `mutants/` there; the checkout is never touched),
adds a `[tool.mutmut]` section to that copy's pyproject.toml that mutates
only the module and runs only the test files mapped to it (MODULES below),
with `-x -q -p no:cacheprovider -m "not slurm"`; mutmut's own per-mutant
timeout (CPU seconds, a multiple of the tests' clean run) applies. Prints one
JSON line per module and a summary line; the surviving mutants (their diffs)
go to OUT/<module>.survivors.txt.

    pip install mutmut   # not part of the project's extras
    python benchmarks/mutation.py                                   # every module below
    python benchmarks/mutation.py --modules solver/contract/__init__.py launch/layout.py
    python benchmarks/mutation.py --max-mutants 100 --seed 0        # a seeded sample per module
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent

# module (path in the checkout) -> the test files that cover it (those that import it)
MODULES: dict[str, list[str]] = {
    "solver/contract/__init__.py": [
        "tests/solver/test_contract.py",
        "tests/launch/test_elastic.py",
        "tests/slurm_ext/controller/test_failsafe_unit.py",
        "tests/slurm_ext/controller/test_rebuild_unit.py",
    ],
    "launch/layout.py": [
        "tests/launch/test_layout.py",
        "tests/launch/test_layout_edges.py",
        "tests/launch/test_step_order.py",
        "tests/launch/test_mixed_shares.py",
        "tests/solver/test_stage_layers_sharding.py",
    ],
    "launch/elastic.py": [
        "tests/launch/test_elastic_units.py",
        "tests/launch/test_elastic.py",
        "tests/launch/test_layout.py",
        "tests/launch/test_sharding.py",
        "tests/launch/test_uneven_virtual_workers.py",
    ],
    "solver/placement/objective.py": [
        "tests/solver/test_objective.py",
        "tests/solver/test_placement.py",
        "tests/solver/test_policies.py",
    ],
    "solver/policies/": [
        "tests/solver/test_policies.py",
        "tests/solver/test_srsf_policies.py",
        "tests/solver/test_policy_rules.py",
        "tests/solver/test_srsf_rules.py",
        "tests/solver/test_virtual_workers.py",
        "tests/solver/test_mixed.py",
        "tests/solver/test_contention.py",
    ],
}
PYTEST_ARGS = ["-x", "-q", "-p", "no:cacheprovider", "-m", "not slurm"]
SOURCE_PACKAGES = ["solver", "launch", "slurm_ext"]
ALSO_COPY = ["contrib"]  # tests/launch/conftest.py puts contrib/examples (minigpt) on sys.path
KILLED = {1, 3}
SURVIVED = {0}
TIMEOUT = {36, -24, 24, 152, 255}
NOT_CHECKED = {None, 2, 5, 33, 34}


def _slug(module: str) -> str:
    return module.rstrip("/").replace("/", ".").removesuffix(".py")


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(x) for x in items) + "]"


def _prepare(module: str, work: pathlib.Path, timeout_multiplier: float) -> None:
    """Copy the checkout's files (tracked + untracked, not ignored) and add the mutmut config."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if not src.is_file():
            continue
        dst = work / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    only = module + "*" if module.endswith("/") else module
    config = (
        "\n[tool.mutmut]\n"
        f"source_paths = {_toml_list(SOURCE_PACKAGES)}\n"
        f"only_mutate = {_toml_list([only])}\n"
        f"pytest_add_cli_args = {_toml_list(PYTEST_ARGS)}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(MODULES[module])}\n"
        f"also_copy = {_toml_list(ALSO_COPY)}\n"
        f"timeout_multiplier = {float(timeout_multiplier)}\n"
        "use_git_change_detection = false\n"
    )
    with (work / "pyproject.toml").open("a") as f:
        f.write(config)


def _mutmut(args: list[str], work: pathlib.Path, log: pathlib.Path) -> int:
    # the folder must exist before Python starts: a missing sys.path entry is cached as absent, and the
    # installed (editable) packages would be imported instead of the mutants
    (work / "mutants").mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(work / "mutants"))
    with log.open("a") as out:
        out.write(f"$ mutmut {' '.join(args)}\n")
        out.flush()
        return subprocess.run(
            [sys.executable, "-m", "mutmut", *args], cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT
        ).returncode


def _results(work: pathlib.Path) -> dict[str, int | None]:
    codes: dict[str, int | None] = {}
    for meta in (work / "mutants").rglob("*.py.meta"):
        codes.update(json.loads(meta.read_text())["exit_code_by_key"])
    return codes


def _locate(work: pathlib.Path, diff: str) -> str:
    """file:line of a mutant's changed line (the diff is function-relative; find the original line in the file)."""
    m = re.search(r"^--- (\S+)", diff, re.M)
    if not m:
        return "?"
    path = m.group(1)
    removed = [ln[1:] for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    try:
        lines = (work / path).read_text().splitlines()
    except OSError:
        return path
    if removed:
        # the def line of the function (first context/removed line) then the first changed line after it
        head = next((ln[1:] for ln in diff.splitlines()[3:] if ln[:1] in (" ", "-")), "")
        start = next((i for i, ln in enumerate(lines) if ln.strip() == head.strip()), 0)
        target = removed[0].strip()
        for i in range(start, len(lines)):
            if lines[i].strip() == target:
                return f"{path}:{i + 1}"
    return path


def run_module(
    module: str, out: pathlib.Path, max_mutants: int | None, seed: int, jobs: int, timeout_multiplier: float = 15.0
) -> dict:
    slug = _slug(module)
    work = out / "work" / slug
    log = out / f"{slug}.log"
    log.write_text("")
    t0 = time.monotonic()
    _prepare(module, work, timeout_multiplier)
    names: list[str] = []
    if max_mutants is not None:
        # generate the mutants and the test stats only (a filter that matches nothing), then draw a sample
        _mutmut(["run", "--max-children", str(jobs), "__no_such_mutant__"], work, log)
        every = sorted(_results(work))
        names = sorted(random.Random(seed).sample(every, min(max_mutants, len(every))))
    rc = _mutmut(["run", "--max-children", str(jobs), *names], work, log)
    codes = _results(work)
    if names:
        codes = {k: v for k, v in codes.items() if k in set(names)}
    killed = sorted(k for k, v in codes.items() if v in KILLED)
    survived = sorted(k for k, v in codes.items() if v in SURVIVED)
    timeout = sorted(k for k, v in codes.items() if v in TIMEOUT)
    unchecked = sorted(k for k, v in codes.items() if v in NOT_CHECKED)
    other = sorted(k for k, v in codes.items() if k not in set(killed + survived + timeout + unchecked))
    with (out / f"{slug}.survivors.txt").open("w") as f:
        for name in survived + other:
            diff = subprocess.run(
                [sys.executable, "-m", "mutmut", "show", name],
                cwd=work,
                capture_output=True,
                text=True,
                env=dict(os.environ, PYTHONPATH=str(work / "mutants")),
            ).stdout
            f.write(f"## {name} {_locate(work, diff)}\n{diff}\n\n")
    # timeouts count as killed (the mutant made the tests hang): score = (killed + timeout) / checked
    checked = len(killed) + len(survived) + len(timeout) + len(other)
    return {
        "module": module,
        "tests": MODULES[module],
        "mutants": len(codes),
        "killed": len(killed),
        "survived": len(survived),
        "timeout": len(timeout),
        "not_checked": len(unchecked),
        "other": len(other),
        "score_pct": round(100.0 * (len(killed) + len(timeout)) / checked, 1) if checked else None,
        "sampled": max_mutants is not None,
        "mutmut_rc": rc,
        "wall_s": round(time.monotonic() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modules", nargs="+", default=list(MODULES), choices=list(MODULES), metavar="MODULE")
    p.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path(tempfile.gettempdir()) / "cellsched-mutation",
        help="work folder, logs and survivors (outside the checkout: the checkout's untracked files are copied)",
    )
    p.add_argument("--max-mutants", type=int, default=None, help="test a seeded random sample of N mutants per module")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--timeout-multiplier",
        type=float,
        default=15.0,
        help="a mutant's CPU-time limit: 2 x this x (its tests' clean time + 1 s) (mutmut's default: 15)",
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="mutants tested at once")
    args = p.parse_args(argv)
    try:
        import mutmut
    except ImportError:
        print("mutmut is not installed: pip install mutmut", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    args.out = args.out.resolve()
    total = {"killed": 0, "survived": 0, "timeout": 0, "mutants": 0, "other": 0, "not_checked": 0}
    for module in args.modules:
        row = run_module(module, args.out, args.max_mutants, args.seed, args.jobs, args.timeout_multiplier)
        print(json.dumps(row), flush=True)
        for k in total:
            total[k] += row[k]
    checked = total["killed"] + total["survived"] + total["timeout"] + total["other"]
    summary = {
        "summary": True,
        "tool": "mutmut",
        "tool_version": getattr(mutmut, "__version__", "?"),
        "modules": args.modules,
        **total,
        "score_pct": round(100.0 * (total["killed"] + total["timeout"]) / checked, 1) if checked else None,
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
