"""A plain torchrun-style DDP script: nothing in it knows cellsched.

It reads what torchrun (or ``cellsched-launch``) sets: ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; joins
the group with ``torch.distributed.init_process_group("gloo")`` (CPU);
wraps a tiny model in ``DistributedDataParallel``; trains `--steps` steps on
seeded synthetic data (each rank its own slice of the batch) and exits 0.
Rank 0 prints one JSON line per step and writes ``{"world_size": W,
"losses": [...]}`` to `--out`.

Run it on the cluster as any DDP script, with the ddp runtime::

    cellsched sbatch --runtime ddp --model gpt-350m --global-batch 64 --iterations 100 job.sh
    # job.sh:  srun cellsched-launch -- python contrib/examples/ddp/train.py --steps 100

or on one machine with ``torchrun --nproc-per-node 2 contrib/examples/ddp/train.py``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps")
    parser.add_argument("--batch", type=int, default=8, help="samples per rank and step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out", help="rank 0 writes the losses here (JSON)")
    args = parser.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dist.init_process_group("gloo", rank=rank, world_size=world)  # MASTER_ADDR / MASTER_PORT from the environment
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(1)
    target_w = torch.randn(16, 1, generator=data)
    losses = []
    for step in range(args.steps):
        x = torch.randn(world * args.batch, 16, generator=data)[rank * args.batch : (rank + 1) * args.batch]
        y = x @ target_w
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
        if rank == 0:
            print(json.dumps({"step": step + 1, "loss": losses[-1], "world_size": world}), flush=True)
    if rank == 0 and args.out:
        Path(args.out).write_text(json.dumps({"world_size": world, "local_rank_0": local_rank, "losses": losses}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
