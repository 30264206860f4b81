"""The `cellsched` command line: one click group, one module per command."""

from __future__ import annotations

import importlib

import click

from slurm_ext import __version__

#: command name -> "module:attribute" (imported only when the command runs,
#: so `cellsched --help` stays fast and one broken command cannot hide others).
COMMANDS: dict[str, str] = {
    "cluster": "slurm_ext.cli.cluster_cmd:cluster",
    "profiles": "slurm_ext.cli.profiles_cmd:profiles",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in COMMANDS:
            module, attr = COMMANDS[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cellsched")
def main() -> None:
    """cellsched: joint, heterogeneity-aware scheduling of training jobs on Slurm.

    Users submit with `cellsched sbatch`; the controller places jobs into cells
    (GPU type x count x node layout x pipeline stages) chosen by a CP-SAT solver.
    """
