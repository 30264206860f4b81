"""`python -m slurm_ext` is the `cellsched` command."""

from slurm_ext.cli import main

main()
