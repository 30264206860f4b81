"""cellsched's Slurm side: records, backends, controller, wrapper and CLI."""

__version__ = "0.1.0"
