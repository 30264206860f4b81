"""`cellsched admin files DIR`: write the files an admin installs on the
controller host (config, systemd units, job_submit.lua, ...) into DIR.

There is one copy of each file, in slurm_ext/admin/: ordinary package data
of slurm_ext (pyproject.toml lists them), read through importlib.resources,
so an installed wheel and a checkout (an editable install) read the same.
"""

from __future__ import annotations

from fnmatch import fnmatch
from importlib.resources import files as package_files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import click

from slurm_ext.errors import CellschedError

PROG = "cellsched admin files"

#: the admin files, as paths (or globs of one folder) relative to `data_root()`; pyproject.toml's
#: package-data of slurm_ext lists the same under admin/ (tests/test_packaging.py checks)
ADMIN_FILES: tuple[str, ...] = (
    "cellsched.toml",
    "cellsched-controller.service",
    "sim-cluster.toml",
    "job_submit.lua",
    "grafana/*.json",
    "cellsched-failsafe.service",
    "cellsched-failsafe.timer",
)


class AdminError(click.ClickException, CellschedError):
    """One line, exit status 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"{PROG}: error: {self.message}", err=True)


def data_root() -> Traversable:
    """Where the admin files are: slurm_ext/admin/ of the installed package."""
    return package_files("slurm_ext") / "admin"


def _at(root: Traversable, relative: Path) -> Traversable:
    for part in relative.parts:
        root = root / part
    return root


def admin_files(root: Traversable | None = None) -> list[Path]:
    """The admin files under `root` (default `data_root()`), relative to it; an
    AdminError names any fixed one that is missing (a glob may match nothing)."""
    root = data_root() if root is None else root
    found: list[Path] = []
    for pattern in map(Path, ADMIN_FILES):
        if "*" in pattern.name:
            folder = _at(root, pattern.parent)
            names = [e.name for e in folder.iterdir() if e.is_file()] if folder.is_dir() else []
            found += [pattern.parent / n for n in sorted(names) if fnmatch(n, pattern.name)]
        elif _at(root, pattern).is_file():
            found.append(pattern)
        else:
            raise AdminError(f"{pattern} is missing from {root} (a broken install? reinstall cellsched)")
    return found


def write_admin_files(dest: Path, *, force: bool = False, root: Traversable | None = None) -> list[Path]:
    """Copy the admin files into `dest` (keeping grafana/); returns the paths
    written. Without `force` nothing is written when any of them exists."""
    root = data_root() if root is None else root
    files = admin_files(root)
    if dest.exists() and not dest.is_dir():
        raise AdminError(f"{dest} is not a directory")
    clash = [dest / f for f in files if (dest / f).exists() or (dest / f).is_symlink()]
    if clash and not force:
        if len(clash) == 1:
            raise AdminError(f"{clash[0]} exists already; --force overwrites it")
        raise AdminError(f"{clash[0]} and {len(clash) - 1} more exist already; --force overwrites them")
    written = []
    for f in files:
        target = dest / f
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink():
                target.unlink()  # replace the link, never write through it
            target.write_bytes(_at(root, f).read_bytes())
        except OSError as exc:
            raise AdminError(f"{target}: {exc.strerror or exc}") from None
        written.append(target)
    return written


@click.group()
def admin() -> None:
    """Set up the controller host."""


@admin.command(short_help="Write the config, systemd unit, job_submit.lua and dashboards into DIR.")
@click.argument("directory", metavar="DIR", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite files that exist already.")
def files(directory: Path, force: bool) -> None:
    """Write the admin files into DIR: cellsched.toml (the config),
    cellsched-controller.service (the systemd unit), sim-cluster.toml,
    cellsched-failsafe.service and .timer (the fail-safe's units),
    job_submit.lua (the Slurm plugin) and grafana/*.json (dashboards).
    Refuses to overwrite unless --force; prints each path written."""
    for path in write_admin_files(directory, force=force):
        click.echo(f"wrote {path}")
