"""launch.elastic in one process: the many-rank path of ordered_sum against
a stand-in for torch.distributed (what the other ranks send is given), and
the bounds of VirtualWorker. The mutation benchmark found these reached only
from child processes, where a changed line did not show."""

from __future__ import annotations

import pytest
import torch

from launch import elastic
from launch.elastic import VirtualWorker, ordered_sum


class FakeDist:
    """This process is rank `me`; `others[r]` is what rank r sends (its units' tensors)."""

    def __init__(self, me: int, others: dict[int, list[torch.Tensor]], world: int):
        self.me, self.others, self.world, self.sent = me, others, world, None

    def get_rank(self, group):
        assert group is GROUP, "asked about another group than the one given"
        return self.me

    def get_world_size(self, group):
        assert group is GROUP, "asked about another group than the one given"
        return self.world

    def all_gather(self, parts, send, group=None):
        assert group is GROUP, "gathered over another group than the one given"
        self.sent = send.clone()
        for r, part in enumerate(parts):
            if r == self.me:
                part.copy_(send)
            else:
                rows = self.others[r]
                part.fill_(float("nan"))  # rows past a rank's count must never be read
                for i, t in enumerate(rows):
                    part[i].copy_(t)


GROUP = object()  # the process group ordered_sum is given: every call must name it


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def test_many_ranks_sum_in_global_unit_order(monkeypatch):
    # ranks hold 1, 3 and 2 units; this process is rank 1
    fake = FakeDist(1, {0: [t(1e16, 0.0)], 2: [t(-1e16, 5.0), t(1.0, 6.0)]}, world=3)
    monkeypatch.setattr(elastic, "dist", fake)
    got = ordered_sum([t(1.0, 1.0), t(2.0, 2.0), t(3.0, 3.0)], group=GROUP, counts=[1, 3, 2])
    # units in global order: rank 0's, then this rank's three, then rank 2's two, summed left to right
    # (1e16 swallows odd steps: another order gives another first column)
    first = ((((1e16 + 1.0) + 2.0) + 3.0) + -1e16) + 1.0
    assert got.tolist() == [first, 0.0 + 1.0 + 2.0 + 3.0 + 5.0 + 6.0]
    # what this rank sent: its 3 units, padded to the widest rank (3 rows): no padding here
    assert fake.sent.tolist() == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]


def test_a_short_rank_sends_zero_rows_that_are_dropped(monkeypatch):
    fake = FakeDist(0, {1: [t(10.0), t(20.0), t(30.0)]}, world=2)
    monkeypatch.setattr(elastic, "dist", fake)
    assert ordered_sum([t(1.0)], group=GROUP, counts=[1, 3]).tolist() == [61.0]
    assert fake.sent.tolist() == [[1.0], [0.0], [0.0]]


def test_counts_must_match_the_group(monkeypatch):
    monkeypatch.setattr(elastic, "dist", FakeDist(0, {}, world=2))
    with pytest.raises(ValueError, match=r"rank 0 of a group of 2 holds 1 units, counts say \[1, 1, 1\]"):
        ordered_sum([t(1.0)], group=GROUP, counts=[1, 1, 1])
    with pytest.raises(ValueError, match=r"rank 0 of a group of 2 holds 1 units, counts say \[2, 1\]"):
        ordered_sum([t(1.0)], group=GROUP, counts=[2, 1])
    with pytest.raises(ValueError) as e:
        ordered_sum([], group=GROUP)
    assert str(e.value) == "ordered_sum needs at least one local tensor"


@pytest.mark.parametrize(("index", "count", "size"), [(-1, 3, 10), (3, 3, 10), (0, 3, 2)])
def test_a_virtual_worker_outside_its_count_or_dataset_is_refused(index, count, size):
    with pytest.raises(ValueError, match=f"virtual worker {index} of {count} needs a dataset of at least {count}"):
        VirtualWorker(index, count, size, seed=1)


def test_the_last_worker_of_a_dataset_just_large_enough():
    vw = VirtualWorker(2, 3, 3, seed=1)
    assert vw.shard_size == 1 and vw.next_indices(2) == [2, 2]
    assert vw.epoch == 1  # the second index began a new epoch


def test_the_epoch_counts_wraps_not_the_first_shuffle():
    vw = VirtualWorker(0, 2, 4, seed=3)  # shard of 2
    vw.next_indices(2)
    assert vw.epoch == 0
    vw.next_indices(1)
    assert vw.epoch == 1


def test_a_fresh_worker_saves_and_loads_no_order():
    fresh = VirtualWorker(1, 2, 4, seed=3)
    state = fresh.state_dict()
    assert (state["index"], state["count"], state["epoch"], state["position"], state["order"]) == (1, 2, 0, 0, None)
    twin = VirtualWorker(1, 2, 4, seed=99)
    twin.load_state_dict(state)
    assert twin.next_indices(2) == fresh.next_indices(2)  # the saved generator state, not its own seed


def _mask(seed: int, worker: int, step: int, site: object, calls: int = 1, skip: int = 0) -> torch.Tensor:
    """The kept positions of SITE's CALLS-th dropout call (rate 0.5) in one unit."""
    ones = torch.ones(4, 64, dtype=torch.float64)
    with elastic.unit_stream(seed, worker, step, skip=skip):
        for _ in range(calls - 1):
            elastic.dropout(ones, 0.5, site)
        return elastic.dropout(ones, 0.5, site) != 0


def test_a_dropout_mask_is_the_units_and_the_sites_own():
    base = _mask(0, 1, 5, (0, "attn"))
    assert torch.equal(base, _mask(0, 1, 5, (0, "attn")))  # the same key, the same mask: any rank draws it
    assert 0.3 < base.double().mean().item() < 0.7
    for other in (_mask(1, 1, 5, (0, "attn")), _mask(0, 2, 5, (0, "attn")), _mask(0, 1, 6, (0, "attn"))):
        assert not torch.equal(base, other)  # another seed, virtual worker or step
    assert not torch.equal(base, _mask(0, 1, 5, (1, "attn")))  # another site
    second = _mask(0, 1, 5, (0, "attn"), calls=2)  # the unit's next micro-batch
    assert not torch.equal(base, second)
    # a passed-over call (a pipeline stage's shape inference) leaves the next call the first one's mask
    assert torch.equal(base, _mask(0, 1, 5, (0, "attn"), calls=2, skip=1))


def test_dropout_scales_what_it_keeps_and_needs_a_unit():
    x = torch.full((2, 8), 3.0, dtype=torch.float64)
    with elastic.unit_stream(0, 0, 0):
        y = elastic.dropout(x, 0.25, "s")
    assert set(y.flatten().tolist()) <= {0.0, 4.0}  # 3 / (1 - 0.25)
    assert elastic.dropout(x, 0.25, "s", training=False) is x and elastic.dropout(x, 0.0, "s") is x
    with pytest.raises(ValueError, match="dropout needs a unit's random stream"):
        elastic.dropout(x, 0.25, "s")


def test_the_exact_runtime_asks_torch_for_repeatable_kernels():
    """In a fresh process (the settings are process-wide): what make_deterministic sets, read back from torch."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json, os, torch; from launch.exact import make_deterministic; make_deterministic(); "
        "m = torch.backends.cuda.matmul; print(json.dumps([os.environ['CUBLAS_WORKSPACE_CONFIG'], "
        "torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic, "
        "torch.backends.cudnn.benchmark, m.fp32_precision, torch.backends.cudnn.conv.fp32_precision, "
        "m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction, "
        "torch.utils.deterministic.fill_uninitialized_memory]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout) == [":4096:8", True, True, False, "ieee", "ieee", False, False, False]
