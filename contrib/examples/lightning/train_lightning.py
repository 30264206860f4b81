"""A plain Lightning DDP script, movable by cellsched with one added call.

    srun cellsched-launch -- python contrib/examples/lightning/train_lightning.py --steps 200

Under ``cellsched-launch`` Lightning finds torchrun's variables
(TORCHELASTIC_RUN_ID, RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK), takes its
ranks from them and starts no processes of its own; ``devices`` and
``num_nodes`` come from LOCAL_WORLD_SIZE and GROUP_WORLD_SIZE. The per-rank
batch is the plan's (CELLSCHED_LOCAL_BATCH), so the global batch stays the
same when the controller changes the number of ranks.

The only cellsched line is ``launch.on_checkpoint``: on the controller's
signal every rank saves a Lightning checkpoint and exits 75; the next run
resumes from it (``ckpt_path``). Everything else is ordinary Lightning.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import launch


class Regression(L.LightningModule):
    def __init__(self, width: int = 16, step_delay: float = 0.0) -> None:
        super().__init__()
        self.step_delay = step_delay  # seconds slept per step: a slow job, for tests and demos
        self.net = torch.nn.Sequential(torch.nn.Linear(width, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(self.step_delay)
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def data(n: int = 4096, width: int = 16) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, width, generator=g)
    y = x @ torch.randn(width, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep in each step")
    ap.add_argument("--accumulate", type=int, default=1, help="batches per optimizer step (gradient accumulation)")
    ap.add_argument("--log", type=Path, help="rank 0 appends a JSON line per run: world size, start and end step")
    args = ap.parse_args()

    ckpt_dir = Path(os.environ.get("CELLSCHED_CHECKPOINT_DIR", "lightning-checkpoints"))
    ckpt = ckpt_dir / "lightning.ckpt"
    local_batch = int(os.environ.get("CELLSCHED_LOCAL_BATCH", "16"))
    trainer: L.Trainer | None = None

    hook = launch.on_checkpoint(lambda: trainer.save_checkpoint(ckpt), checkpoint_dir=str(ckpt_dir), poll=True)
    trainer = L.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        max_steps=args.steps,
        accumulate_grad_batches=args.accumulate,
        callbacks=[hook.lightning_callback()],
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    )
    resume = ckpt.exists()
    start = torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"] if resume else 0
    trainer.fit(
        Regression(step_delay=args.step_delay),
        DataLoader(data(), batch_size=local_batch, shuffle=True),
        ckpt_path=str(ckpt) if resume else None,
    )
    if trainer.global_rank == 0 and args.log:  # reached only by a run that finished (a stopped one exits 75)
        with args.log.open("a") as f:
            f.write(json.dumps({"world_size": trainer.world_size, "start": start, "end": trainer.global_step}) + "\n")


if __name__ == "__main__":
    main()
