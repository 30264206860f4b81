"""Without an extra, the commands that need it print one line naming the extra
and exit 2; simulate skips its plots and says so. In-process, with the
optional packages hidden (test_no_extras.py does the same from a wheel)."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from slurm_ext.backends import get_backend, pyslurm_matches
from slurm_ext.backends.cli import CliBackend
from slurm_ext.cli import main


def hide(monkeypatch, *modules: str) -> None:
    """Make `modules` unimportable here, as in an interpreter without them."""
    for name in [m for m in sys.modules if m.partition(".")[0] in modules] + list(modules):
        monkeypatch.setitem(sys.modules, name, None)


def run(*args: str):
    return CliRunner().invoke(main, list(args), prog_name="cellsched")


def test_profile_without_torch(monkeypatch, tmp_path):
    hide(monkeypatch, "torch")
    res = run("profile", "--model", "gpt-tiny", "--db", str(tmp_path / "p.sqlite"))
    assert (res.exit_code, res.stdout) == (2, "")
    assert res.stderr == "cellsched profile: error: needs PyTorch; install it with: pip install 'cellsched[torch]'\n"
    assert not (tmp_path / "p.sqlite").exists()


@pytest.mark.parametrize("command", [["cluster"], ["controller", "run", "--once"]])
def test_pyslurm_backend_without_pyslurm(monkeypatch, tmp_path, command):
    hide(monkeypatch, "pyslurm")
    config = tmp_path / "c.toml"
    config.write_text(f'[controller]\nstate_path = "{tmp_path / "s.sqlite"}"\nkick_file = ""\n[metrics]\nport = 0\n')
    args = [*command, "--backend", "pyslurm"] + (["--config", str(config)] if command[0] == "controller" else [])
    res = run(*args)
    assert res.exit_code == 2, res.output
    assert res.stderr == (
        f"cellsched {command[0]}: error: needs pyslurm built for this Slurm; "
        "install it with: pip install 'cellsched[pyslurm]'\n"
    )


def test_auto_backend_takes_the_cli_without_pyslurm(monkeypatch):
    hide(monkeypatch, "pyslurm")
    assert not pyslurm_matches()
    assert isinstance(get_backend("auto"), CliBackend)


def test_simulate_without_matplotlib_skips_the_plots(monkeypatch, tmp_path):
    hide(monkeypatch, "matplotlib")
    out = tmp_path / "sim"
    res = run("simulate", "--arena-compat", "--limit-jobs", "20", "--policy", "fcfs", "--out", str(out), "--json")
    assert res.exit_code == 0, res.output[-3000:]
    skipped = [ln for ln in res.stderr.splitlines() if "plots" in ln]
    assert skipped == [
        "cellsched simulate: plots skipped: needs matplotlib; install it with: pip install 'cellsched[sim]'"
    ]
    assert sorted(json.loads(res.stdout)["files"]) == ["results.json", "results.md"]
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md"]


def test_no_plots_says_nothing_about_matplotlib(monkeypatch, tmp_path):
    hide(monkeypatch, "matplotlib")
    res = run("simulate", "--limit-jobs", "5", "--policy", "fcfs", "--out", str(tmp_path / "sim"), "--no-plots")
    assert res.exit_code == 0 and "matplotlib" not in res.stderr, res.output[-3000:]
