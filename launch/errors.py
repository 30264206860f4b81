"""The base of every error the in-job launcher raises on purpose.

One base per layer (see ``solver.contract.errors``): ``LauncherError`` for ``launch``.
"""


class LauncherError(Exception):
    """A failure of the launcher or the runtime inside a job that it reports on purpose."""
