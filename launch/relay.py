"""The framework's standard output, passed on unchanged and read for its steps.

Under ``cellsched-launch`` the task whose framework prints its step lines
(``launch.steplog.StepLog.printed_by``) runs the framework as a child with
its standard output on a pipe. `StepRelay` copies every byte from the pipe
to the launcher's own standard output as it comes (same bytes, same order;
standard error is not touched: it stays the child's own), and reads the
lines for steps on the way:

- The pipe is drained by a thread that does nothing else: copying the
  output, cutting it into lines and matching each against the parser. A
  line longer than ``steplog.MAX_LINE`` is passed on but not parsed; bytes
  that are not UTF-8 are parsed as U+FFFD. The child waits only where it
  would have waited without the launcher: when the launcher's own output
  does not take it. If that output is gone (closed, an error), the relay
  says so once on standard error and keeps draining the pipe, so the child
  never blocks on it.
- A step counts when its number is above the last one counted (a line that
  goes back or repeats is the framework's other output or a misprint).
- The file is written by another thread (`Reporter`), at most every
  `MIN_WRITE_S`, with the newest step and the time its line arrived, so a
  slow or failing file system never holds up the pipe. A write that fails
  is said once on standard error; later steps are tried again.

Stdlib only (the launcher's path).
"""

from __future__ import annotations

import os
import threading
import time

from launch.progress import ProgressWriter
from launch.steplog import MAX_LINE, Step, StepLog

#: bytes read from the pipe at a time
CHUNK = 65536
#: the shortest time (s) between two writes of the progress file
MIN_WRITE_S = 0.2


def _say(message: str) -> None:
    """One line on the launcher's standard error (best effort)."""
    try:
        os.write(2, f"cellsched-launch: {message}\n".encode())
    except OSError:
        pass


class Lines:
    """A byte stream cut into lines of at most `limit` bytes (without the
    newline); a longer line is dropped whole, its end included."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self.limit = limit
        self.partial = bytearray()
        self.dropping = False  #: inside a line already longer than the limit

    def feed(self, data: bytes) -> list[bytes]:
        """The lines that `data` completes."""
        out: list[bytes] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                self._keep(data[start:])
                return out
            if not self.dropping and len(self.partial) + end - start <= self.limit:
                out.append(bytes(self.partial) + data[start:end])
            self.partial.clear()
            self.dropping = False
            start = end + 1

    def end(self) -> list[bytes]:
        """The last line, when the stream ended without a newline."""
        last = [] if self.dropping or not self.partial else [bytes(self.partial)]
        self.partial.clear()
        self.dropping = False
        return last

    def _keep(self, rest: bytes) -> None:
        if self.dropping:
            return
        if len(self.partial) + len(rest) > self.limit:
            self.partial.clear()
            self.dropping = True
        else:
            self.partial += rest


class Reporter:
    """Writes the newest step offered to ``<checkpoint_dir>/progress.json``
    from its own thread, at most every `min_interval_s` (module doc)."""

    def __init__(self, checkpoint_dir: str, min_interval_s: float = MIN_WRITE_S) -> None:
        self.checkpoint_dir, self.min_interval_s = checkpoint_dir, min_interval_s
        self.writer = ProgressWriter()
        self._cond = threading.Condition()
        self._pending: tuple[Step, float, float | None] | None = None
        self._stopping = False
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="cellsched-progress", daemon=True)

    def start(self) -> Reporter:
        self._thread.start()
        return self

    def offer(self, step: Step, seen_at: float, iter_time_s: float | None) -> None:
        """STEP, whose line arrived at SEEN_AT; ITER_TIME_S: the framework's
        own iteration time when it is believed (else the window's)."""
        with self._cond:
            self._pending = (step, seen_at, iter_time_s)
            self._cond.notify()

    def close(self, timeout_s: float) -> None:
        """Write what is pending and stop, waiting at most TIMEOUT_S."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._stopping:
                    self._cond.wait()
                pending, self._pending = self._pending, None
                stopping = self._stopping
            if pending is not None:
                self._write(*pending)
            if stopping:
                return
            with self._cond:
                self._cond.wait_for(lambda: self._stopping, self.min_interval_s)

    def _write(self, step: Step, seen_at: float, iter_time_s: float | None) -> None:
        try:
            self.writer.write(self.checkpoint_dir, step.done, now=seen_at, iter_time_s=iter_time_s)
        except (OSError, ValueError) as e:
            if not self._failed:
                self._failed = True
                _say(f"cannot write the progress file in {self.checkpoint_dir!r}: {e}")


class StepRelay:
    """Copies the pipe `src` (its own: closed at its end) to `dst` unchanged
    and reports the steps its lines show (module doc). `start`, then
    `finish` once the child has exited."""

    def __init__(self, src: int, dst: int, log: StepLog, reporter: Reporter) -> None:
        self.src, self.dst, self.log, self.reporter = src, dst, log, reporter
        self.lines = Lines()
        self.last = 0  #: the highest step counted
        self.reports = 0  #: steps counted in this run
        self.out_ok = True
        self._thread = threading.Thread(target=self._run, name="cellsched-relay", daemon=True)

    def start(self) -> StepRelay:
        self.reporter.start()
        self._thread.start()
        return self

    def finish(self, grace_s: float = 2.0) -> None:
        """After the child exited: wait up to GRACE_S for what is left in the
        pipe (a process the child left behind may hold it open), then write
        the last step."""
        self._thread.join(grace_s)
        self.reporter.close(grace_s)

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self.src, CHUNK)
            except OSError:
                data = b""
            if not data:
                os.close(self.src)
                self._lines(self.lines.end(), time.time())
                return
            self._out(data)
            self._lines(self.lines.feed(data), time.time())

    def _out(self, data: bytes) -> None:
        view = memoryview(data)
        while self.out_ok and view:
            try:
                view = view[os.write(self.dst, view) :]
            except OSError as e:
                self.out_ok = False
                _say(f"the command's output cannot be passed on ({e.strerror}); it is dropped from here on")

    def _lines(self, lines: list[bytes], now: float) -> None:
        for raw in lines:
            step = self.log.parse(raw.decode("utf-8", "replace"))
            if step is None or step.done <= self.last:
                continue
            self.last = step.done
            settled = self.reports >= self.log.settled_after
            self.reports += 1
            self.reporter.offer(step, now, step.iter_time_s if settled else None)
