"""The steps a framework prints: one parser per framework, of its own log lines.

torchtitan and Megatron-LM write no ``progress.json``; they print a line per
logged step. Under ``cellsched-launch`` the task whose framework process
prints them has its standard output read through a pipe
(``launch.relay``), and each line goes to the framework's parser here; a step
it finds becomes ``progress.json`` (``launch.progress``). Each adapter
declares its framework's `StepLog` (``launch.adapters.base.Adapter.progress``).

The formats, as the pinned versions (contrib/frameworks.txt) print them:

- **torchtitan 0.3.0**, ``torchtitan/components/metrics.py``,
  ``MetricsProcessor.log``, through the root logger that
  ``torchtitan/tools/logging.py`` ``init_logger`` sends to stdout with the
  format ``[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s``;
  every rank prints it (rank 0's is read), at step 1 and every
  ``--metrics.log_freq`` steps, colored with ANSI codes unless
  ``--metrics.disable_color_printing``::

      [titan] 2026-01-05 10:11:12,345 - root - INFO - step:  1  loss:  8.12345  grad_norm:  2.3456  ...

  ``step: N`` is the number of steps done (torchtitan counts from 1 and
  logs after the step); its validation line (``validate step: N``) is not a
  training step. The line has no iteration time (``tps`` is tokens per
  second per device): the iteration time is measured from when lines arrive.
- **Megatron-LM core_v0.16.1**, ``megatron/training/training.py``,
  ``training_log``, printed with ``print_rank_last`` (the last rank only,
  flushed) at the first iteration and every ``--log-interval`` iterations::

       [2026-01-05 10:11:12.345678] iteration       10/     500 | consumed samples:          640 |
      elapsed time per iteration (ms): 312.4 | learning rate: 1.500000E-04 | ... (one line)

  ``iteration N/ M``: N iterations done of M. ``elapsed time per iteration
  (ms)`` is Megatron's own timer over the iterations since the last line,
  except that its first line times the first iteration (start-up included)
  and its second averages over every iteration since the start (the timer
  is not reset after the first line): it is believed from the third line
  of a run on (`StepLog.settled_after`).

Whole lines, as recorded, are in tests/launch/framework_logs.py.

A line is the framework's word, printed by the user's code: at most
`MAX_LINE` bytes are looked at (a longer line is not a step), anything that
does not match exactly, or whose numbers are out of range, is no step. Stdlib
only (the launcher's path).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

#: the longest line a parser is given (bytes); a longer line is skipped whole
MAX_LINE = 8192
#: the largest step number believed (a larger one is a misprint or a lie)
MAX_STEP = 10**12
#: the longest iteration time believed (s), as the controller's bound (slurm_ext.controller.progress)
MAX_ITER_TIME_S = 86400.0


@dataclass(frozen=True)
class Step:
    """What one log line reports: `done` iterations done (the framework's
    step count) and, when the framework prints one, its own seconds per
    iteration over the steps since its last line."""

    done: int
    iter_time_s: float | None = None


@dataclass(frozen=True)
class StepLog:
    """How a framework prints its steps: the parser of one line of its
    standard output, which rank prints them (rank 0, or the last rank), and
    from which line of a run on its own iteration time is believed."""

    parse: Callable[[str], Step | None]
    last_rank: bool = False
    settled_after: int = 0

    def printed_by(self, rank: int, world_size: int) -> bool:
        """Does task RANK of WORLD_SIZE print the step lines (the one whose output is read)?"""
        return rank == (world_size - 1 if self.last_rank else 0)


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TITAN = re.compile(r"(?<!\w)(?<!validate )step:\s*(\d{1,13})\s+loss:\s*-?\d+\.\d+(?:\s|$)")
_MEGATRON_ITER = re.compile(r"\] iteration\s+(\d{1,13})/\s*(\d{1,13}) \|")
_MEGATRON_TIME = re.compile(r"\| elapsed time per iteration \(ms\): (\d{1,12}(?:\.\d+)?) \|")


def _done(text: str) -> int | None:
    n = int(text)
    return n if 1 <= n <= MAX_STEP else None


def parse_torchtitan(line: str) -> Step | None:
    """torchtitan's training step line (module doc); None for any other line."""
    if "step:" not in line:
        return None
    m = _TITAN.search(_ANSI.sub("", line))
    done = _done(m.group(1)) if m else None
    return None if done is None else Step(done)


def parse_megatron(line: str) -> Step | None:
    """Megatron-LM's ``training_log`` line (module doc); None for any other line,
    or one whose iteration passes its total or whose time is out of range."""
    if "iteration" not in line:
        return None
    it, ms = _MEGATRON_ITER.search(line), _MEGATRON_TIME.search(line)
    if it is None or ms is None or it.start() > ms.start():
        return None
    done, total = _done(it.group(1)), int(it.group(2))
    seconds = float(ms.group(1)) / 1000.0
    if done is None or (total and done > total) or not (math.isfinite(seconds) and 0 < seconds <= MAX_ITER_TIME_S):
        return None
    return Step(done, seconds)


#: the frameworks' step logs, declared by their adapters (launch.adapters)
TORCHTITAN = StepLog(parse_torchtitan)
MEGATRON = StepLog(parse_megatron, last_rank=True, settled_after=2)
