"""Reading a file in a user's directory, as root, without trusting it.

The controller reads two kinds of file that users control: a job's progress
record and its checkpoint hook record (slurm_ext.controller.hooks). It
reads them in-process, not through a helper running as the job's user: a
helper would cost a process start per job and round (hundreds of jobs) and
would still need the same checks and time limit. The rules:

- the last path component is never followed (``O_NOFOLLOW``) and the open
  never waits (``O_NONBLOCK``: a FIFO opens at once, and is then refused);
- what was opened must be a regular file owned by the job's user (so a
  symlinked directory cannot lead to anyone else's file, root's included)
  and no larger than the cap; nothing else of it is read;
- each read runs in a daemon thread with a time budget: a read stuck in
  the kernel (a hung network or FUSE mount) is abandoned, and that path is
  not read again while the stuck thread lives;
- nothing is ever created, followed or written in a user's directories.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from dataclasses import dataclass

from slurm_ext.errors import CellschedError


class Refused(CellschedError):
    """The file is not one the controller reads (the message says why)."""


_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC


def read_owned_file(path: str, uid: int | None, max_bytes: int) -> bytes | None:
    """The content of `path` if it is a regular file owned by `uid` (any
    owner when None) of at most `max_bytes`; None when it does not exist;
    Refused otherwise."""
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused("a symbolic link") from None
        raise Refused(exc.strerror or type(exc).__name__) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused("not a regular file")
        if uid is not None and st.st_uid != uid:
            raise Refused(f"owned by uid {st.st_uid}, not by the job's user ({uid})")
        if st.st_size > max_bytes:
            raise Refused(f"{st.st_size} bytes, more than {max_bytes}")
        data = os.read(fd, max_bytes + 1)
        if len(data) > max_bytes:
            raise Refused(f"more than {max_bytes} bytes")
        return data
    except OSError as exc:
        raise Refused(exc.strerror or type(exc).__name__) from None
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Read:
    """What a bounded read gave: the content (None: no file), or why not."""

    data: bytes | None = None
    error: str = ""


class BoundedReader:
    """`read_owned_file` with a time budget per read (`timeout_s`) and for
    all reads until `reset()` (`budget_s`, e.g. one round). A read that
    overruns is abandoned (its daemon thread finishes on its own); its path
    is refused until that thread has ended."""

    def __init__(self, timeout_s: float = 0.5, budget_s: float = 5.0, max_bytes: int = 65536) -> None:
        self.timeout_s = timeout_s
        self.budget_s = budget_s
        self.max_bytes = max_bytes
        self.spent_s = 0.0
        self._stuck: dict[str, threading.Thread] = {}

    def reset(self) -> None:
        """A new round: the budget is whole again."""
        self.spent_s = 0.0
        self._stuck = {p: t for p, t in self._stuck.items() if t.is_alive()}

    def read(self, path: str, uid: int | None) -> Read:
        if path in self._stuck and self._stuck[path].is_alive():
            return Read(error="an earlier read of it has not returned")
        left = min(self.timeout_s, self.budget_s - self.spent_s)
        if left <= 0:
            return Read(error="the round's time for reading users' files is spent")
        box: list[Read] = []

        def work() -> None:
            try:
                box.append(Read(read_owned_file(path, uid, self.max_bytes)))
            except Refused as exc:
                box.append(Read(error=str(exc)))

        t = threading.Thread(target=work, name="cellsched-read", daemon=True)
        start = time.monotonic()
        t.start()
        t.join(left)
        self.spent_s += time.monotonic() - start
        if t.is_alive():
            self._stuck[path] = t
            return Read(error=f"no answer within {left:.2f} s")
        return box[0]
