"""torchtitan's checkpoint manager, answering the controller's checkpoint signal.

Imported by torchtitan itself when the launcher's torchtitan adapter adds
``--override.imports launch.adapters.titan_bridge.signal_checkpoint``:
torchtitan's override mechanism then builds ``SignalCheckpointManager``
instead of its own ``CheckpointManager`` (every other setting kept). torchtitan
calls the manager's ``save(step)`` on every rank after every step; this one
also asks there whether any rank has seen SIGUSR1/SIGTERM (one all-reduce of
a flag, so all ranks decide at the same step), and if so saves that step with
torchtitan's own (DCP) save, waits for it, and exits ``EXIT_CHECKPOINTED``
(75) on every rank. SIGUSR1, blocked by ``cellsched-launch``, is unblocked
once the handlers are in place.

Not imported on the launcher's path (it imports torch and torchtitan).
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torchtitan.components.checkpointer.dcp import CheckpointManager
from torchtitan.config.override import derive, override

from solver.contract import CHECKPOINT_SIGNALS, EXIT_CHECKPOINTED

SIGNALS = tuple(signal.Signals[f"SIG{name}"] for name in CHECKPOINT_SIGNALS)


class SignalCheckpointManager(CheckpointManager):  # type: ignore[misc]
    """torchtitan's DCP checkpoint manager plus save-and-exit on the checkpoint signal."""

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):  # type: ignore[misc]
        pass

    def __init__(self, config: Any, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._signalled = False
        for s in SIGNALS:
            signal.signal(s, self._on_signal)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(SIGNALS))

    def _on_signal(self, signum: int, frame: object) -> None:
        self._signalled = True

    def _agreed(self) -> bool:
        """True on every rank when any rank has seen the signal (collective)."""
        flag = torch.tensor([1 if self._signalled else 0], dtype=torch.int32)
        if dist.is_initialized():
            if "nccl" in str(dist.get_backend()):
                flag = flag.cuda()
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _should_save(self, curr_step: int, last_step: bool = False) -> bool:
        return bool(self._stopping or super()._should_save(curr_step, last_step))

    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        self._stopping = self._agreed()
        saved = bool(super()._save(curr_step, last_step))
        if self._stopping:
            self.maybe_wait_for_saving()
            self.close()
            print(f"cellsched: checkpointed step {curr_step} on the checkpoint signal, exiting", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_CHECKPOINTED)  # at once: a shutdown with live process groups can abort instead
        return saved

    _stopping = False


@override(target=CheckpointManager.Config, description="cellsched: save and exit 75 on SIGUSR1/SIGTERM")  # type: ignore[untyped-decorator]
def signal_checkpoint(cfg: Any) -> Any:
    """The override torchtitan applies: its checkpoint config, as SignalCheckpointManager's."""
    return derive(cfg, SignalCheckpointManager.Config)
