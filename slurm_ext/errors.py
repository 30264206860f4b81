"""The base of every error the Slurm extension raises on purpose.

One base per layer (see ``solver.contract.errors``): ``CellschedError`` for
``slurm_ext`` (controller, CLI, backends, simulator, wrapper).
"""


class CellschedError(Exception):
    """A failure of the controller, the CLI, a backend or the simulator that it reports on purpose."""
