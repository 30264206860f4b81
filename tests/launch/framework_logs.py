"""The step lines torchtitan and Megatron-LM print, recorded, and a stand-in
framework that prints them (launch.steplog parses them).

Versions: those pinned in contrib/frameworks.txt.

- torchtitan 0.3.0: `TITAN_LINES` were printed by torchtitan's own
  ``MetricsProcessor.log`` and ``log_validation``
  (``torchtitan/components/metrics.py``) through its ``init_logger``
  (``torchtitan/tools/logging.py``: the root logger, on stdout), colored
  (its default) and not (``--metrics.disable_color_printing``);
  tests/launch/test_frameworks.py prints them again with the installed
  torchtitan and checks that they still read the same.
- Megatron-LM core_v0.16.1: `MEGATRON_LINES` are what
  ``megatron/training/training.py`` ``training_log`` prints (``print_rank_last``)
  with the values shown: its format strings applied to them, including the
  optional fields (``skipped samples``, ``throughput per GPU``); Megatron-LM's
  training code is not on PyPI (the megatron-core package has no
  ``megatron/training``), so it cannot be run here; the last of them was
  printed by Megatron-LM's own ``pretrain_gpt.py`` on a GPU
  (benchmarks/results/frameworks_gpu.md), in the same format. `MEGATRON_OTHER` are other
  lines it prints that name an iteration (``megatron/training/checkpointing.py``
  save messages, ``evaluate_and_print_results``'s validation line).

Run as a script, this file is the stand-in: ``python framework_logs.py
{megatron,torchtitan} --steps N --pace S [--log-interval K] [the adapter's
options...]`` (K: Megatron's ``--log-interval``, torchtitan's ``--metrics.log_freq``)
trains nothing but keeps the framework's contract with the launcher: it
prints the framework's step lines (its format, `titan_line` and
`megatron_line`, the ranks that print them, how often), one iteration every
S seconds (against a fixed schedule, so the pace is S on average), resumes
from its checkpoint folder, and answers the checkpoint signal as the
framework does (Megatron: SIGTERM, save at the iteration's end and exit 0,
SIGUSR1 never seen; torchtitan with the launcher's bridge: SIGUSR1 or
SIGTERM, save the step, exit 75). Rank 0 appends a JSON line per run that
ends to ``--runs`` (world size, first and last iteration).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

from launch.steplog import Step

# torchtitan 0.3.0, printed by its own code (see the module doc); the expected step, or None: no step
TITAN_LINES = [
    (
        "[titan] 2026-11-29 07:30:18,751 - root - INFO - \x1b[31mstep:  7  \x1b[32mloss:  8.12345  "
        "\x1b[38;2;180;60;0mgrad_norm:  2.3456  \x1b[38;2;54;234;195mmemory: 12.34GiB(15.43%)  "
        "\x1b[34mtps: 8,192  \x1b[36mtflops: 8.19  \x1b[35mmfu: 0.82%\x1b[39m",
        Step(7),
    ),
    (
        "[titan] 2026-11-29 07:30:18,751 - root - INFO - step: 120  loss:  3.25000  grad_norm:  0.7500  "
        "memory: 12.34GiB(15.43%)  tps: 1,234,566  tflops: 1,234.57  mfu: 123.46%",
        Step(120),
    ),
    (
        "[titan] 2026-11-29 07:30:18,751 - root - INFO - validate step:  7  loss:  2.5000  "
        "memory: 12.34GiB(15.43%)  tps: 0",
        None,
    ),
    (
        "[titan] 2026-11-29 07:30:18,751 - root - INFO - \x1b[33mvalidate step:  7  \x1b[32mloss:  2.5000  "
        "\x1b[38;2;54;234;195mmemory: 12.34GiB(15.43%)  \x1b[34mtps: 0\x1b[39m",
        None,
    ),
    ("[titan] 2026-11-29 07:30:17,002 - root - INFO - Training starts at step 1", None),
]

# Megatron-LM core_v0.16.1 training_log lines (see the module doc) and the step each reports
MEGATRON_LINES = [
    (
        " [2026-01-05 10:11:12.345678] iteration        1/     500 | consumed samples:           64 | "
        "elapsed time per iteration (ms): 4521.3 | learning rate: 1.500000E-06 | global batch size:    64 | "
        "lm loss: 1.083000E+01 | loss scale: 1.0 | grad norm: 2.345 | number of skipped iterations:   0 | "
        "number of nan iterations:   0 |",
        Step(1, 4.5213),
    ),
    (
        " [2026-01-05 10:11:12.345678] iteration       10/     500 | consumed samples:          640 | "
        "elapsed time per iteration (ms): 731.9 | throughput per GPU (TFLOP/s/GPU): 45.1 | "
        "learning rate: 1.500000E-05 | global batch size:    64 | lm loss: 9.123400E+00 | loss scale: 1.0 | "
        "grad norm: 2.345 | number of skipped iterations:   0 | number of nan iterations:   0 |",
        Step(10, 0.7319),
    ),
    (
        " [2026-01-05 10:11:12.345678] iteration       20/     500 | consumed samples:         1280 | "
        "skipped samples:           32 | elapsed time per iteration (ms): 312.4 | learning rate: 3.000000E-05 | "
        "global batch size:    64 | lm loss: 7.812345E+00 | loss scale: 1.0 | grad norm: 2.345 | "
        "number of skipped iterations:   0 | number of nan iterations:   0 |",
        Step(20, 0.3124),
    ),
    (
        " [2026-01-05 10:11:12.345678] iteration   123456/ 1000000 | consumed samples:      7901184 | "
        "elapsed time per iteration (ms): 1043.0 | learning rate: 1.200000E-04 | global batch size:    64 | "
        "lm loss: 2.500000E+00 | loss scale: 1.0 | grad norm: 2.345 | number of skipped iterations:   0 | "
        "number of nan iterations:   0 |",
        Step(123456, 1.043),
    ),
    (  # printed by Megatron-LM's own pretrain_gpt.py at core_v0.16.1 on an H200 (benchmarks/frameworks_gpu.py)
        " [2026-11-29 19:00:25.787538] iteration        3/      10 | consumed samples:           24 | "
        "elapsed time per iteration (ms): 65.0 | learning rate: 2.897237E-04 | global batch size:     8 | "
        "lm loss: 6.917109E+00 | loss scale: 1.0 | grad norm: 1.653 | number of skipped iterations:   0 | "
        "number of nan iterations:   0 |",
        Step(3, 0.065),
    ),
]
MEGATRON_OTHER = [
    "[2026-01-05 10:11:12.345678] saving checkpoint at iteration      20 to /ck in torch_dist format",
    "  [2026-01-05 10:11:12.345678] successfully saved checkpoint from iteration      20 to /ck [ t 1/1, p 1/1 ]",
    " validation loss at iteration 20 on validation set | lm loss value: 7.900000E+00 | lm loss PPL: 2.697282E+03 | ",
    "[after training is done] datetime: 2026-01-05 10:11:12 ",
]

#: torchtitan's logger format (torchtitan/tools/logging.py) and step-line colors (tools/utils.py Color)
TITAN_FORMAT = "[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s"
_RED, _GREEN, _ORANGE, _TURQUOISE, _BLUE, _CYAN, _MAGENTA, _RESET = (
    "\x1b[31m",
    "\x1b[32m",
    "\x1b[38;2;180;60;0m",
    "\x1b[38;2;54;234;195m",
    "\x1b[34m",
    "\x1b[36m",
    "\x1b[35m",
    "\x1b[39m",
)


def titan_line(step: int, loss: float) -> str:
    """The message of torchtitan's step line, colored as by default (the
    other figures those of `TITAN_LINES`' first line), without the logger's prefix."""
    return (
        f"{_RED}step: {step:2}  {_GREEN}loss: {loss:8.5f}  {_ORANGE}grad_norm: {2.3456:7.4f}  "
        f"{_TURQUOISE}memory: {12.34:5.2f}GiB({15.43:.2f}%)  {_BLUE}tps: {8192:,}  {_CYAN}tflops: {8.19:,.2f}  "
        f"{_MAGENTA}mfu: {0.82:.2f}%{_RESET}"
    )


def megatron_line(iteration: int, total: int, ms: float, loss: float, lr: float, when: datetime) -> str:
    """Megatron's training_log line with the fields it always prints (the
    batch, 64, and the other figures those of `MEGATRON_LINES`)."""
    return (
        f" [{when.strftime('%Y-%m-%d %H:%M:%S.%f')}]"
        f" iteration {iteration:8d}/{total:8d} | consumed samples: {iteration * 64:12d} |"
        f" elapsed time per iteration (ms): {ms:.1f} | learning rate: {lr:.6E} | global batch size: {64:5d} |"
        f" lm loss: {loss:.6E} | loss scale: {1.0:.1f} | grad norm: {2.345:.3f} |"
        f" number of skipped iterations: {0:3d} | number of nan iterations: {0:3d} |"
    )


class _Stand:
    """The stand-in's run (module doc)."""

    def __init__(self, args: argparse.Namespace, folder: Path) -> None:
        self.args, self.folder = args, folder
        self.rank, self.world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        self.signalled = False

    def on_signal(self, signum: int, frame: object) -> None:
        self.signalled = True

    def record(self, start: int, end: int) -> None:
        if self.rank == 0 and self.args.runs:
            with open(self.args.runs, "a") as f:
                f.write(json.dumps({"world_size": self.world, "start": start, "end": end}) + "\n")

    def pace(self, start: int):
        t0 = time.monotonic()
        for k, it in enumerate(range(start + 1, self.args.steps + 1), 1):
            time.sleep(max(0.0, t0 + k * self.args.pace - time.monotonic()))
            yield it


def megatron(args: argparse.Namespace, rest: list[str]) -> int:
    """Megatron's contract: --save DIR, its tracker file, SIGTERM -> save at the iteration's end, exit 0."""
    folder = Path(rest[rest.index("--save") + 1])
    run = _Stand(args, folder)
    signal.signal(signal.SIGTERM, run.on_signal)
    tracker = folder / "latest_checkpointed_iteration.txt"
    start = int(tracker.read_text()) if tracker.exists() else 0
    timer, since, first = time.monotonic(), 0, True
    for it in run.pace(start):
        since += 1
        if it % args.log_interval == 0 or first:
            if run.rank == run.world - 1:
                ms = (time.monotonic() - timer) / since * 1000.0
                print(megatron_line(it, args.steps, ms, 10.0 / it, 1e-4, datetime.now()), flush=True)
            if not first:  # Megatron's timer is not reset after its first line
                timer, since = time.monotonic(), 0
            first = False
        if run.signalled or it == args.steps:
            folder.mkdir(parents=True, exist_ok=True)
            tracker.write_text(str(it))
            if it == args.steps:
                run.record(start, it)
            return 0
    return 0


def torchtitan(args: argparse.Namespace, rest: list[str]) -> int:
    """torchtitan with the launcher's bridge: --checkpoint.folder DIR with step-N, SIGUSR1/SIGTERM -> exit 75."""
    folder = Path(rest[rest.index("--checkpoint.folder") + 1])
    run = _Stand(args, folder)
    for s in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(s, run.on_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1, signal.SIGTERM})
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(TITAN_FORMAT))
    log = logging.getLogger()
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    steps = [int(p.name[5:]) for p in folder.glob("step-*") if p.name[5:].isdigit()] if folder.is_dir() else []
    start = max(steps, default=0)
    log.info(f"Training starts at step {start + 1}")
    for step in run.pace(start):
        if step == 1 or step % args.log_interval == 0:
            log.info(titan_line(step, 10.0 / step))
        if run.signalled:
            (folder / f"step-{step}").mkdir(parents=True, exist_ok=True)
            print(f"cellsched: checkpointed step {step} on the checkpoint signal, exiting", file=sys.stderr)
            sys.stdout.flush()
            os._exit(75)
    run.record(start, args.steps)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description="a stand-in for torchtitan's or Megatron's trainer (module doc)")
    ap.add_argument("framework", choices=("megatron", "torchtitan"))
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--pace", type=float, required=True, help="seconds per iteration")
    ap.add_argument("--log-interval", "--metrics.log_freq", dest="log_interval", type=int, default=1)
    ap.add_argument("--runs", type=Path)
    args, rest = ap.parse_known_args()
    return megatron(args, rest) if args.framework == "megatron" else torchtitan(args, rest)


if __name__ == "__main__":
    sys.exit(main())
