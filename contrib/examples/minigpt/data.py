"""The synthetic, seeded dataset and its draws by virtual workers."""

from __future__ import annotations

import functools
from collections.abc import Sequence

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


@functools.lru_cache(maxsize=4)
def _epoch_order(seed: int, epoch: int, dataset_size: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + 999_983 * (epoch + 1))
    return torch.randperm(dataset_size, generator=g)


def sample_at(position: int, cfg: GPTConfig, seed: int, dataset_size: int, noise: float = 0.1) -> torch.Tensor:
    """The sample at global POSITION of the run's stream (``step * global_batch + i``).

    Epoch ``position // dataset_size`` visits the dataset in its own seeded
    order; the input tokens are corrupted from a stream keyed by the
    position. Nothing depends on which rank draws it or on what it drew
    before, so every layout sees the same samples (the sharded runtime)."""
    epoch, i = divmod(position, dataset_size)
    tokens = sample(seed, int(_epoch_order(seed, epoch, dataset_size)[i]), cfg)
    g = torch.Generator().manual_seed(seed * 1_000_033 + 7_777_777 + position)
    flip = torch.rand(tokens.shape, generator=g) < noise
    random = torch.randint(cfg.vocab, tokens.shape, generator=g)
    tokens[:-1] = torch.where(flip[:-1], random[:-1], tokens[:-1])
    return tokens


def batch_at(positions: Sequence[int], cfg: GPTConfig, seed: int, dataset_size: int) -> torch.Tensor:
    """The samples at POSITIONS, stacked."""
    return torch.stack([sample_at(p, cfg, seed, dataset_size) for p in positions])
