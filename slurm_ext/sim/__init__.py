"""The simulator: the real controller and solver on a simulated Slurm
driven by a clock (``cellsched simulate``)."""
