"""`cellsched admin files DIR`: write the files an admin installs on the
controller host (config, systemd unit, job_submit.lua, ...) into DIR.

There is one copy of each file: etc/ and contrib/ of the source tree. The
wheel carries them as package data under slurm_ext/share/ (pyproject.toml
maps the package ``slurm_ext.share`` onto the project root), so an installed
cellsched and a source checkout read them from the same relative paths.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import click

from slurm_ext.errors import CellschedError

PROG = "cellsched admin files"

#: the admin files, as paths (or globs) relative to `data_root()`; pyproject.toml's
#: package-data of slurm_ext.share lists the same (tests/test_packaging.py checks)
ADMIN_FILES: tuple[str, ...] = (
    "etc/cellsched.toml",
    "etc/cellsched-controller.service",
    "etc/sim-cluster.toml",
    "contrib/job_submit.lua",
    "contrib/grafana/*.json",
    "etc/cellsched-failsafe.service",
    "etc/cellsched-failsafe.timer",
)


class AdminError(click.ClickException, CellschedError):
    """One line, exit status 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"{PROG}: error: {self.message}", err=True)


def data_root() -> Path:
    """Where the admin files are: slurm_ext/share/ in an installed wheel, else
    the source checkout that holds slurm_ext (also an editable install)."""
    package = Path(__file__).resolve().parents[1]
    shared = package / "share"
    return shared if shared.is_dir() else package.parent


def admin_files(root: Path | None = None) -> list[Path]:
    """The admin files under `root` (default `data_root()`), relative to it; an
    AdminError names any fixed one that is missing (a glob may match nothing)."""
    root = data_root() if root is None else root
    found: list[Path] = []
    for pattern in ADMIN_FILES:
        if "*" in pattern:
            found += sorted(p.relative_to(root) for p in root.glob(pattern) if p.is_file())
        elif (root / pattern).is_file():
            found.append(Path(pattern))
        else:
            raise AdminError(f"{pattern} is missing from {root} (a broken install? reinstall cellsched)")
    return found


def write_admin_files(dest: Path, *, force: bool = False, root: Path | None = None) -> list[Path]:
    """Copy the admin files into `dest` (keeping etc/ and contrib/); returns the
    paths written. Without `force` nothing is written when any of them exists."""
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
            shutil.copyfile(root / f, target)
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
    """Write the admin files into DIR: etc/cellsched.toml (the config),
    etc/cellsched-controller.service (the systemd unit), etc/sim-cluster.toml,
    etc/cellsched-failsafe.service and .timer (the fail-safe's units),
    contrib/job_submit.lua (the Slurm plugin) and contrib/grafana/*.json
    (dashboards). Refuses to overwrite unless --force; prints each path written."""
    for path in write_admin_files(directory, force=force):
        click.echo(f"wrote {path}")
