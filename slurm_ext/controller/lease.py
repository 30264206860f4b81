"""Active and standby controllers: a lease in one small file on storage that
every controller host sees (docs/controller.md, two controllers).

The file holds one JSON record: who holds the lease (`holder`), a fencing
`epoch` bumped on every take-over, a `serial` bumped on every write, when it
was written and when it expires (wall time), and when its holder last
completed a round (the fail-safe reads it). Every write goes to a temporary
file next to it, is fsynced and renamed over it (atomic, on NFS too), and is
read back. No flock or fcntl lock is used: their semantics on NFS depend on
the version, the mount options and a lock daemon, and a lock held by a dead
client can outlive it.

Taking a free or expired lease is a timed protocol (Fischer's mutual
exclusion): read the record, write one's own within `settle_s / 2` of that
read (else give up this try), wait `settle_s`, read it back; only the last of
several writers still finds its own record. The holder renews while its lease
is valid on its own clock: from before the write that gave it, `lease_s` less
`settle_s` (CLOCK_BOOTTIME, which counts a suspended host's sleep). A contender
writes only once the record's wall-clock expiry has passed, so the hosts'
clocks must agree within `settle_s` (NTP).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from slurm_ext.errors import CellschedError

log = logging.getLogger("cellsched.controller")


def boottime() -> float:
    """Seconds on a clock that never goes back and counts suspend (Linux
    CLOCK_BOOTTIME; elsewhere the monotonic clock)."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(clock) if clock is not None else time.monotonic()


def default_holder() -> str:
    """This process, unique across hosts and restarts: host:pid:random."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseLost(RuntimeError, CellschedError):
    """This controller no longer holds the lease (fencing: it must change nothing)."""


@dataclass(frozen=True)
class LeaseRecord:
    """The lease file's content."""

    holder: str
    epoch: int
    serial: int
    renewed_at: float
    expires_at: float
    last_round_at: float | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LeaseRecord | None:
        """The record, or None when `text` is not one (a garbled file is free)."""
        try:
            d = json.loads(text)
            rec = cls(
                str(d["holder"]),
                int(d["epoch"]),
                int(d["serial"]),
                float(d["renewed_at"]),
                float(d["expires_at"]),
                None if d.get("last_round_at") is None else float(d["last_round_at"]),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        return rec if math.isfinite(rec.expires_at) else None


def read_record(path: str) -> LeaseRecord | None:
    """The record in `path`; None when there is none (or it cannot be parsed)."""
    try:
        with open(path, encoding="utf-8") as f:
            return LeaseRecord.from_json(f.read())
    except FileNotFoundError:
        return None


class FileLease:
    """One controller's side of the lease in `path` (thread-safe: the round
    and the keeper thread share it).

    `clock` is wall time (written into the record, compared with its expiry);
    `elapsed` the holder's own clock for its validity; `sleep` waits
    `settle_s`. A read or write that fails (OSError) counts as not holding."""

    def __init__(
        self,
        path: str,
        lease_s: float,
        settle_s: float,
        *,
        holder: str | None = None,
        clock: Callable[[], float] = time.time,
        elapsed: Callable[[], float] = boottime,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not 0 < settle_s * 4 <= lease_s:
            raise ValueError(f"the lease's settle_s ({settle_s}) must be > 0 and at most lease_s / 4 ({lease_s})")
        self.path = path
        self.lease_s = lease_s
        self.settle_s = settle_s
        self.holder = holder or default_holder()
        self.clock = clock
        self.elapsed = elapsed
        self.sleep = sleep
        self._lock = threading.RLock()
        self._mine: LeaseRecord | None = None  # the record last written, while held
        self._valid_until = -math.inf  # on `elapsed`
        self._last_round_at: float | None = None

    # --- reading ----------------------------------------------------------

    def read(self) -> LeaseRecord | None:
        """The record in the file now (None: free)."""
        return read_record(self.path)

    def held(self) -> bool:
        """Whether this controller holds the lease now (its own clock; no I/O)."""
        return self.remaining() > 0

    def remaining(self) -> float:
        """Seconds this controller still holds the lease for (0: not held)."""
        return max(0.0, self._valid_until - self.elapsed())

    @property
    def epoch(self) -> int | None:
        """The fencing epoch of the lease held (None when not held)."""
        mine = self._mine
        return mine.epoch if mine is not None and self.held() else None

    # --- acquiring and renewing -------------------------------------------

    def acquire(self) -> bool:
        """Renew the lease when held, take it when it is free or expired;
        whether this controller holds it now, for `lease_s` less `settle_s`."""
        with self._lock:
            try:
                return self._acquire()
            except OSError as exc:
                self._lose(f"lease file: {exc}")
                return False

    def _acquire(self) -> bool:
        t0 = self.elapsed()
        rec = self.read()
        if self._mine is not None and t0 < self._valid_until:
            if rec != self._mine:
                self._lose(f"the lease file changed under its holder: {rec.holder if rec else 'removed'}")
                return False
            return self._renew(rec, t0)
        self._mine = None
        if rec is not None and self.clock() < rec.expires_at:
            return False  # another's (or an earlier lease of ours not trusted any more): wait for it to expire
        now = self.clock()
        new = LeaseRecord(
            self.holder,
            (rec.epoch if rec else 0) + 1,
            (rec.serial if rec else 0) + 1,
            now,
            now + self.lease_s,
            self._last_round_at,
        )
        self._write(new)
        if self.elapsed() - t0 > self.settle_s / 2:
            log.warning("lease write too slow to be sure of it: not taken", extra={"fields": {"path": self.path}})
            return False
        self.sleep(self.settle_s)
        if self.read() != new:
            return False  # a later contender's record stands
        self._mine, self._valid_until = new, t0 + self.lease_s - self.settle_s
        if not self.held():
            self._lose("the lease was taken too late to be used")
            return False
        log.info("lease taken", extra={"fields": {"holder": self.holder, "epoch": new.epoch, "path": self.path}})
        return True

    def _renew(self, rec: LeaseRecord, t0: float) -> bool:
        now = self.clock()
        new = replace(
            rec, serial=rec.serial + 1, renewed_at=now, expires_at=now + self.lease_s, last_round_at=self._last_round_at
        )
        self._write(new)
        if self.elapsed() >= self._valid_until:
            self._lose("the lease expired while it was renewed")
            return False
        back = self.read()
        if back != new:
            self._lose(f"the lease file changed under its holder: {back.holder if back else 'removed'}")
            return False
        self._mine, self._valid_until = new, t0 + self.lease_s - self.settle_s
        return True

    def _write(self, rec: LeaseRecord) -> None:
        tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, (rec.to_json() + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def _lose(self, why: str) -> None:
        if self._mine is not None:
            log.warning("lease lost", extra={"fields": {"holder": self.holder, "why": why}})
        self._mine, self._valid_until = None, -math.inf

    # --- while acting -----------------------------------------------------

    def fence(self) -> None:
        """Before a change to Slurm: LeaseLost unless this controller holds
        the lease; renewed (read back) when half of it is spent, so that the
        change has at least `lease_s / 2` to land within the lease."""
        with self._lock:
            if self.held() and self.remaining() > self.lease_s / 2:
                return
            if not self.held() or not self.acquire():
                raise LeaseLost(f"{self.holder} does not hold the lease in {self.path}")

    def check(self) -> None:
        """Renew now and read back (LeaseLost when not held): the check before a round applies."""
        with self._lock:
            if not self.held() or not self.acquire():
                raise LeaseLost(f"{self.holder} does not hold the lease in {self.path}")

    def note_round(self, at: float) -> None:
        """A round completed `at`: written into the record now (a renewal) when
        held, else with the next write (the fail-safe reads it)."""
        with self._lock:
            self._last_round_at = at
            if self.held():
                self.acquire()

    def release(self) -> None:
        """Give the lease up (a clean stop): the record expires now, and a
        standby takes over at its next try."""
        with self._lock:
            if not self.held() or self._mine is None:
                return
            try:
                if self.read() == self._mine:
                    now = self.clock()
                    self._write(replace(self._mine, serial=self._mine.serial + 1, renewed_at=now, expires_at=now))
                    log.info("lease released", extra={"fields": {"holder": self.holder}})
            except OSError as exc:
                log.warning("lease not released", extra={"fields": {"error": str(exc)}})
            self._mine, self._valid_until = None, -math.inf


class LeaseKeeper:
    """A thread that renews a held lease every `lease_s / 4` between and
    during rounds (a long solve or checkpoint wait does not let it lapse);
    it never takes a lease (rounds do)."""

    def __init__(self, lease: FileLease, stop: threading.Event) -> None:
        self.lease = lease
        self.stop = stop
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.wait(self.lease.lease_s / 4):
            if self.lease.held():
                self.lease.acquire()


#: the Backend calls that change Slurm
WRITES = frozenset(
    {"submit", "update", "hold", "release", "requeue", "cancel", "signal"}
    | {"update_many", "hold_many", "release_many", "requeue_many"}
)


class FencedBackend:
    """A backend whose every change to Slurm is preceded by `fence()` (which
    raises LeaseLost when the lease is gone); reads pass through."""

    def __init__(self, inner: object, fence: Callable[[], None]) -> None:
        self._inner = inner
        self._fence = fence

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._inner, name)
        if name not in WRITES:
            return attr

        def fenced(*args: object, **kw: object) -> object:
            self._fence()
            return attr(*args, **kw)

        return fenced
