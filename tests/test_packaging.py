"""The package builds and installs from a wheel: `python -m build` makes an
sdist and, from it, a wheel that `twine check` passes, and the wheel carries
every module, the Arena data and the admin files (see slurm_ext/cli/admin_cmd.py)."""

from __future__ import annotations

import email
import subprocess
import sys
import tomllib
import zipfile

from support import ADMIN, ROOT

from slurm_ext.cli.admin_cmd import ADMIN_FILES, admin_files

PACKAGES = ("slurm_ext", "solver", "launch")


def wheel_names(wheel) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return {n for n in zf.namelist() if ".dist-info/" not in n}


def test_twine_check_passes(built_dist):
    proc = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(built_dist.sdist), str(built_dist.wheel)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASSED") == 2, proc.stdout


def test_wheel_holds_every_module_and_no_stray_one(built_dist):
    """The package list in pyproject.toml is written out: a subpackage missing there fails here."""
    source = {
        p.relative_to(ROOT).as_posix()
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    in_wheel = {n for n in wheel_names(built_dist.wheel) if n.endswith(".py")}
    assert in_wheel == source


def test_wheel_carries_the_arena_data_and_the_admin_files(built_dist):
    names = wheel_names(built_dist.wheel)
    arena = {p.relative_to(ROOT).as_posix() for p in (ROOT / "solver" / "data" / "arena").rglob("*") if p.is_file()}
    assert arena and arena <= names
    admin = {f"slurm_ext/admin/{f.as_posix()}" for f in admin_files(ADMIN)}
    assert {"slurm_ext/admin/cellsched.toml", "slurm_ext/admin/job_submit.lua"} <= admin
    assert {n for n in names if n.startswith("slurm_ext/admin/")} == admin
    with zipfile.ZipFile(built_dist.wheel) as zf:
        for f in admin_files(ADMIN):
            assert zf.read(f"slurm_ext/admin/{f.as_posix()}") == (ADMIN / f).read_bytes(), f


def test_package_data_lists_the_admin_files():
    """pyproject.toml ships what `cellsched admin files` writes, glob for glob, as
    package data of slurm_ext (no package mapped onto another folder)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "package-dir" not in setuptools
    assert setuptools["package-data"]["slurm_ext"] == [f"admin/{f}" for f in ADMIN_FILES]


def test_wheel_metadata(built_dist):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    with zipfile.ZipFile(built_dist.wheel) as zf:
        dist_info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(zf.read(f"{dist_info}/METADATA"))
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    assert (meta["Name"], meta["Version"], meta["License-Expression"]) == (
        "cellsched",
        project["version"],
        "Apache-2.0",
    )
    assert sorted(meta.get_all("Provides-Extra")) == ["frameworks", "pyslurm", "sim", "test", "torch"]
    plain = [r for r in meta.get_all("Requires-Dist") if "extra ==" not in r]
    assert sorted(r.split(">")[0] for r in plain) == ["click", "numpy", "nvidia-ml-py", "ortools", "prometheus-client"]
    assert "cellsched = slurm_ext.cli:main" in entry_points and "cellsched-launch = launch.cli:main" in entry_points
    assert "profile = launch.profile_cli:profile" in entry_points
    assert "[cellsched.backends]\nsim = slurm_ext.sim.backend:sim_backend" in entry_points
