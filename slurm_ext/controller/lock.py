"""One controller per state file: an exclusive flock next to it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from slurm_ext.errors import CellschedError


class LockError(RuntimeError, CellschedError):
    """Another controller runs on the same state file."""


class StateLock:
    """An exclusive flock next to the state file, held while the daemon runs
    (released by the kernel if the process dies)."""

    def __init__(self, state_path: str) -> None:
        self.path = state_path + ".lock"
        self._fd: int | None = None

    def __enter__(self) -> StateLock:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise LockError(f"another controller holds {self.path}") from None
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
