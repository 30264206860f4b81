"""`cellsched sbatch`: submit a managed training job (see slurm_ext.wrapper)."""

from __future__ import annotations

import sys

import click


@click.command(
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False, "help_option_names": []},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def sbatch(args: tuple[str, ...]) -> None:
    """Submit a training job that cellsched schedules (held until placed).

    Use instead of sbatch: cellsched sbatch [OPTIONS] [--] SCRIPT [ARGS...];
    `cellsched sbatch --help` lists the options.
    """
    from slurm_ext.wrapper.command import main

    sys.exit(main(args))
