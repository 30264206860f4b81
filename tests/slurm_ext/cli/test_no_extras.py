"""cellsched installed from its wheel without extras (no torch, matplotlib or
pyslurm), in a fresh venv: every command's --help works, simulate writes its
results and says the plots were skipped, commands that need an extra say which
one in one line (exit 2), the launcher runs, and `admin files` writes the admin
files the wheel carries.

The venv is made once per session. Its dependencies (click, numpy, ortools,
nvidia-ml-py) come from the package index or pip's cache; the tests skip, with
pip's error, only when pip cannot install them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import ADMIN

from slurm_ext.cli.admin_cmd import admin_files

pytestmark = pytest.mark.slow  # real processes or a package build: left out of the quick layer

#: the environment of the venv's commands: nothing of the checkout or of the test's venv leaks in
SCRUB = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "VIRTUAL_ENV", "PYTHONSTARTUP", "CELLSCHED_PLAN")

#: the command tree (and whether torch, matplotlib, pyslurm import), read inside the venv
TREE = """
import importlib.util, json, click
from slurm_ext.cli import main

def walk(cmd, path):
    yield path
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd, info_name=path[-1] if path else "cellsched")
        for name in cmd.list_commands(ctx):
            yield from walk(cmd.get_command(ctx, name), [*path, name])

import slurm_ext
print(json.dumps({
    "commands": [" ".join(p) for p in walk(main, [])],
    "slurm_ext": slurm_ext.__file__,
    "importable": [m for m in ("torch", "matplotlib", "pyslurm") if importlib.util.find_spec(m)],
}))
"""


@dataclass(frozen=True)
class Venv:
    root: Path
    env: dict[str, str]
    work: Path

    def bin(self, name: str) -> str:
        return str(self.root / "bin" / name)

    def run(self, *argv: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.work,
            env={**self.env, **(env or {})},
            check=False,
        )

    def cellsched(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.run(self.bin("cellsched"), *args, timeout=timeout)


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=600, check=False
    )


@pytest.fixture(scope="session")
def venv(built_dist, tmp_path_factory) -> Venv:
    """A fresh venv (no pip of its own: this pip installs into it) holding the wheel and its dependencies only."""
    root = tmp_path_factory.mktemp("no-extras") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = str(root / "bin" / "python")
    alone = pip("--python", python, "install", "--no-deps", "--no-input", str(built_dist.wheel))
    assert alone.returncode == 0, f"the wheel does not install:\n{alone.stdout}{alone.stderr}"
    deps = pip("--python", python, "install", "--no-input", str(built_dist.wheel))
    if deps.returncode != 0:
        pytest.skip(f"pip cannot install the wheel's dependencies (no package index or cache?): {deps.stderr[-800:]}")
    env = {k: v for k, v in os.environ.items() if k not in SCRUB}
    env["PYTHONNOUSERSITE"] = "1"
    env["PATH"] = f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    work = tmp_path_factory.mktemp("no-extras-work")  # the cwd: never the checkout, whose packages would shadow
    return Venv(root, env, work)


@pytest.fixture(scope="session")
def tree(venv) -> dict:
    proc = venv.run(venv.bin("python"), "-c", TREE)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_venv_runs_the_wheel_without_extras(venv, tree):
    """Else the other tests here would prove nothing."""
    assert Path(tree["slurm_ext"]).is_relative_to(venv.root), tree["slurm_ext"]
    assert tree["importable"] == []


def test_every_command_has_help(venv, tree):
    commands = tree["commands"]
    for expected in ("", "admin files", "controller run", "profiles list", "profile", "simulate", "sbatch", "status"):
        assert expected in commands, commands  # the walk found the tree, nested groups and the plugin included
    for command in commands:
        proc = venv.cellsched(*command.split(), "--help")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (command, proc.stderr)
        assert "usage" in proc.stdout.lower(), (command, proc.stdout)


def test_shell_completion(venv):
    """Click's completion, as docs/controller.md installs it: the script, and the nested commands it completes."""
    proc = venv.run(venv.bin("cellsched"), env={"_CELLSCHED_COMPLETE": "bash_source"})
    assert proc.returncode == 0 and "_cellsched_completion()" in proc.stdout, proc.stderr
    env = {"_CELLSCHED_COMPLETE": "bash_complete", "COMP_WORDS": "cellsched admin ", "COMP_CWORD": "2"}
    assert venv.run(venv.bin("cellsched"), env=env).stdout.split() == ["plain,files"]


def test_simulate_writes_results_and_says_plots_were_skipped(venv):
    out = venv.work / "sim"
    proc = venv.cellsched(
        "simulate", "--arena-compat", "--limit-jobs", "20", "--policy", "fcfs", "--out", str(out), timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    skipped = [ln for ln in proc.stderr.splitlines() if "plots skipped" in ln]
    assert skipped == [
        "cellsched simulate: plots skipped: needs matplotlib; install it with: pip install 'cellsched[sim]'"
    ]
    results = json.loads((out / "results.json").read_text())
    assert results["summary"]["fcfs"]["jobs_total"] == len(results["runs"]["fcfs"]["jobs"]) == 20
    assert (out / "results.md").is_file() and not list(out.glob("*.png"))


def test_profile_names_the_torch_extra(venv):
    proc = venv.cellsched("profile", "--model", "gpt-tiny", "--db", str(venv.work / "p.sqlite"))
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "cellsched profile: error: needs PyTorch; install it with: pip install 'cellsched[torch]'\n"


def test_pyslurm_backend_names_the_pyslurm_extra(venv):
    line = "error: needs pyslurm built for this Slurm; install it with: pip install 'cellsched[pyslurm]'\n"
    proc = venv.cellsched("cluster", "--backend", "pyslurm")
    assert (proc.returncode, proc.stderr) == (2, f"cellsched cluster: {line}")
    config = venv.work / "pyslurm.toml"
    config.write_text(
        f'[controller]\nstate_path = "{venv.work / "state.sqlite"}"\nkick_file = ""\n[metrics]\nport = 0\n'
    )
    proc = venv.cellsched("controller", "run", "--once", "--backend", "pyslurm", "--config", str(config))
    assert (proc.returncode, proc.stderr) == (2, f"cellsched controller: {line}")


def test_launcher_and_the_library_without_torch(venv):
    """cellsched-launch needs no torch; launch.init_parallel says which extra it needs."""
    task = {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_NNODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_STEP_NODELIST": "n1",
        "SLURM_TASKS_PER_NODE": "1",
        "SLURM_STEP_TASKS_PER_NODE": "1",
        "CELLSCHED_PLAN": json.dumps({"pp": 1, "dp": 1, "tp": 1}),
        "CELLSCHED_MASTER_ADDR": "127.0.0.1",
    }
    show = "import os; print(os.environ['WORLD_SIZE'], os.environ['RANK'])"
    proc = venv.run(venv.bin("cellsched-launch"), "--", venv.bin("python"), "-c", show, env=task)
    assert (proc.returncode, proc.stdout) == (0, "1 0\n"), proc.stderr
    proc = venv.run(venv.bin("python"), "-c", "import launch; launch.init_parallel")
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        "solver.contract.extras.MissingExtra: needs PyTorch; install it with: pip install 'cellsched[torch]'"
    )


def test_admin_files_from_the_wheel(venv):
    dest = venv.work / "admin"
    proc = venv.cellsched("admin", "files", str(dest))
    assert proc.returncode == 0, proc.stderr
    files = admin_files(ADMIN)
    assert proc.stdout.splitlines() == [f"wrote {dest / f}" for f in files]
    for f in files:
        assert (dest / f).read_bytes() == (ADMIN / f).read_bytes(), f
    assert tomllib.loads((dest / "cellsched.toml").read_text())  # the config as shipped parses
    proc = venv.cellsched("admin", "files", str(dest))
    assert (
        proc.returncode == 2 and proc.stderr.startswith("cellsched admin files: error: ") and "--force" in proc.stderr
    )
