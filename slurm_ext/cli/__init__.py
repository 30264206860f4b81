"""The `cellsched` command line: one click group, one module per command.

Commands of other packages (e.g. `cellsched profile`, which lives in the
launch runtime because it needs torch) plug in through the
``cellsched.commands`` entry-point group, so this package never names them.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

import click

from slurm_ext import __version__
from solver.contract.extras import MissingExtra

#: command name -> "module:attribute" (imported only when the command runs,
#: so `cellsched --help` stays fast and one broken command cannot hide others).
COMMANDS: dict[str, str] = {
    "cluster": "slurm_ext.cli.cluster_cmd:cluster",
    "profiles": "slurm_ext.cli.profiles_cmd:profiles",
    "controller": "slurm_ext.cli.controller_cmd:controller",
    "failsafe": "slurm_ext.cli.failsafe_cmd:failsafe",
    "status": "slurm_ext.cli.status_cmd:status",
    "plan": "slurm_ext.cli.status_cmd:plan",
    "sbatch": "slurm_ext.cli.sbatch_cmd:sbatch",
    "simulate": "slurm_ext.cli.simulate_cmd:simulate",
    "admin": "slurm_ext.cli.admin_cmd:admin",
}


def plugin_commands() -> dict[str, str]:
    """name -> "module:attribute" of commands registered by other packages."""
    return {ep.name: ep.value for ep in entry_points(group="cellsched.commands")}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS) | set(plugin_commands()))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name) or plugin_commands().get(name)
        if target is None:
            return super().get_command(ctx, name)
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)

    def invoke(self, ctx: click.Context) -> object:
        """Run the subcommand; a missing optional dependency is one line naming its extra (exit 2)."""
        try:
            return super().invoke(ctx)
        except MissingExtra as exc:
            click.echo(f"{ctx.command_path} {ctx.invoked_subcommand}: error: {exc}", err=True)
            ctx.exit(2)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cellsched")
def main() -> None:
    """cellsched: joint, heterogeneity-aware scheduling of training jobs on Slurm.

    Users submit with `cellsched sbatch`; the controller places jobs into cells
    (GPU type x count x node layout x pipeline stages) chosen by a CP-SAT solver.
    """
