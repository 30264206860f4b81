"""The reference trainer's tensor-parallel block issues Megatron's collectives: 4 all-reduces of the
activation per micro-batch (2 forward, 2 backward), whatever the estimator assumes."""

import json
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support import free_port


def _count(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    from minigpt.model import Block, GPTConfig

    calls: list[list[int]] = []
    real = dist.all_reduce

    def counted(t, *args, **kwargs):
        calls.append(list(t.shape))
        return real(t, *args, **kwargs)

    dist.all_reduce = counted
    try:
        block = Block(GPTConfig(layers=1, hidden=16, heads=4, seq=8, vocab=32), tp=2, group=dist.group.WORLD)
        x = torch.randn(3, 8, 16, requires_grad=True)
        y = block(x)
        forward = len(calls)
        y.sum().backward()
    finally:
        dist.all_reduce = real
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"forward": forward, "shapes": calls}, f)
    dist.destroy_process_group()


def test_tp_block_all_reduces_four_times(tmp_path):
    port = free_port()
    out = str(tmp_path / "calls.json")
    mp.start_processes(_count, args=(port, out), nprocs=2, join=True, start_method="spawn")
    got = json.loads((tmp_path / "calls.json").read_text())
    assert got["forward"] == 2  # the attention and MLP outputs
    assert len(got["shapes"]) == 4  # + the gradients of their inputs (q, k and v enter together)
    assert all(s == [3, 8, 16] for s in got["shapes"])  # each the block's activation
