"""The base of every error the solver raises on purpose.

Each layer has one base (``solver.contract.errors.SolverError``,
``slurm_ext.errors.CellschedError``, ``launch.errors.LauncherError``), so a
caller can catch one layer's failures without catching a programming error
of another. The concrete classes keep their builtin bases too (most are
``ValueError``s) so that existing ``except ValueError`` callers still work.
"""


class SolverError(Exception):
    """An input the solver cannot use, or a result it cannot produce."""
