"""The synthetic, seeded dataset and its draws by virtual workers."""

from __future__ import annotations

import torch

from launch.elastic import VirtualWorker
from minigpt.model import GPTConfig


def sample(seed: int, index: int, cfg: GPTConfig) -> torch.Tensor:
    """Dataset item INDEX: ``seq + 1`` tokens of an arithmetic progression mod vocab."""
    g = torch.Generator().manual_seed(seed * 7_919 + index)
    start = torch.randint(cfg.vocab, (1,), generator=g)
    stride = torch.randint(1, 4, (1,), generator=g)
    return (start + stride * torch.arange(cfg.seq + 1)) % cfg.vocab


def draw(vw: VirtualWorker, n: int, cfg: GPTConfig, seed: int, noise: float = 0.1) -> torch.Tensor:
    """N samples of one virtual worker; input tokens are corrupted from its own RNG."""
    tokens = torch.stack([sample(seed, i, cfg) for i in vw.next_indices(n)])
    flip = torch.rand(tokens.shape, generator=vw.generator) < noise
    random = torch.randint(cfg.vocab, tokens.shape, generator=vw.generator)
    tokens[:, :-1] = torch.where(flip[:, :-1], random[:, :-1], tokens[:, :-1])
    return tokens


def global_batch(vws: list[VirtualWorker], batch: int, cfg: GPTConfig, seed: int) -> torch.Tensor:
    """One step's global batch: every virtual worker's part, in worker order."""
    return torch.cat([draw(vw, batch // len(vws), cfg, seed) for vw in vws])


def make_virtual_workers(count: int, dataset_size: int, seed: int) -> list[VirtualWorker]:
    """COUNT virtual workers over a dataset of DATASET_SIZE items, each with its own shard."""
    return [VirtualWorker(i, count, dataset_size, seed) for i in range(count)]
