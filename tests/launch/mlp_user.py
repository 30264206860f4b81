"""A user's own model through ``launch.Trainer`` (not minigpt): an MLP
regression, layers keyed by global index so any pipeline split names them
alike. Rank 0 writes the losses to argv[1] as JSON."""

import json
import sys

import torch
from torch import nn

from launch import StageSpec, Trainer, Workload
from launch.trainer import exit_now

WIDTH, LAYERS = 8, 4


def full_model() -> nn.ModuleDict:
    torch.manual_seed(0)
    return nn.ModuleDict({str(i): nn.Linear(WIDTH, WIDTH) for i in range(LAYERS)})


class Stage(nn.Module):
    def __init__(self, spec: StageSpec):
        super().__init__()
        whole = full_model()
        self.layers = nn.ModuleDict({str(i): whole[str(i)] for i in spec.layers})

    def forward(self, x):
        for layer in self.layers.values():
            x = torch.tanh(layer(x))
        return x


def samples(positions) -> torch.Tensor:
    """Sample p: an input and its target, keyed by its position."""
    out = []
    for p in positions:
        g = torch.Generator().manual_seed(1000 + p)
        x = torch.randn(WIDTH, generator=g)
        out.append(torch.cat([x, x.flip(0) * 0.5]))
    return torch.stack(out)


WORK = Workload(
    num_layers=LAYERS,
    build_stage=Stage,
    split=lambda b: (b[:, :WIDTH], b[:, WIDTH:]),
    loss=lambda out, y: ((out - y) ** 2).sum(),
    optimizer=lambda params: torch.optim.SGD(params, lr=0.05),
    sample=samples,
    shard_units=lambda stage: list(stage.layers.values()),
)

if __name__ == "__main__":
    trainer = Trainer(WORK, global_batch=8)
    code = trainer.run(int(sys.argv[2]))
    if trainer.ctx.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(trainer.losses, f)
    trainer.close()
    exit_now(code)
