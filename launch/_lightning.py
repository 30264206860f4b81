"""The Lightning callback of ``launch.on_checkpoint`` (imports lightning; loaded on use)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning.pytorch.callbacks import Callback

if TYPE_CHECKING:
    from launch.hook import CheckpointHook


class _HookCallback(Callback):
    def __init__(self, hook: CheckpointHook) -> None:
        self.hook = hook

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.hook.step(int(trainer.global_step))


def hook_callback(hook: CheckpointHook) -> Any:
    return _HookCallback(hook)
