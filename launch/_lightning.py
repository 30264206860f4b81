"""The Lightning callback of ``launch.on_checkpoint`` (imports lightning; loaded on use)."""

from __future__ import annotations

from typing import Any, Protocol

from lightning.pytorch.callbacks import Callback


class Stepper(Protocol):
    """What the callback drives: ``launch.hook.CheckpointHook.step``."""

    def step(self, done: int | None = None) -> None: ...


class _HookCallback(Callback):
    def __init__(self, hook: Stepper) -> None:
        self.hook = hook

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.hook.step(int(trainer.global_step))


def hook_callback(hook: Stepper) -> Any:
    return _HookCallback(hook)
