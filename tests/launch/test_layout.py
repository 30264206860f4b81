"""Layout arithmetic, batch slices, virtual workers and checkpoint files (one process)."""

import itertools
from fractions import Fraction

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from launch import checkpoint
from launch.elastic import VirtualWorker, ordered_sum
from launch.layout import Layout, LayoutError, largest_remainder, split_layers, virtual_worker_blocks
from launch.parallel import ParallelError, batch_slice, unit_counts
from solver.contract.plan import JobPlan, PlanError


@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))
def test_megatron_order_roundtrip(pp, dp, tp):
    layout = Layout(pp, dp, tp)
    for rank in range(layout.world_size):
        c = layout.coords(rank)
        assert rank == (c.pp * dp + c.dp) * tp + c.tp == layout.rank(c)
        assert rank in layout.group("tp", rank) and len(layout.group("dp", rank)) == dp
    assert layout.group("tp", 0) == tuple(range(tp))


def test_groups_of_a_2x2x2_layout():
    layout = Layout(2, 2, 2)
    assert layout.group("tp", 5) == (4, 5)
    assert layout.group("dp", 5) == (5, 7)
    assert layout.group("pp", 5) == (1, 5)
    with pytest.raises(LayoutError, match="rank 8 is outside a world of 8"):
        layout.coords(8)


@given(st.integers(0, 10_000), st.lists(st.floats(0.1, 100), min_size=1, max_size=8))
def test_largest_remainder_is_exact_and_close(total, weights):
    parts = largest_remainder(total, weights)
    assert sum(parts) == total
    for p, w in zip(parts, weights, strict=True):
        assert abs(p - total * w / sum(weights)) < 1


def test_largest_remainder_examples():
    assert largest_remainder(16, [3, 1]) == (12, 4)
    assert largest_remainder(10, [1, 1, 1]) == (4, 3, 3)
    assert largest_remainder(7, [2, 1.5, 1]) == (3, 2, 2)  # quotas 3.11, 2.33, 1.56
    assert largest_remainder(3, [1, 1]) == (2, 1)  # ties go to the lower index


@pytest.mark.parametrize("n", [1, 2, 3])
def test_largest_remainder_is_the_closest_whole_split(n):
    """Brute force over every whole split: none is closer to the exact quotas; a larger weight never gets less."""
    for total in range(9):
        for weights in itertools.product((1, 2, 3, 5), repeat=n):
            quotas = [Fraction(total * w, sum(weights)) for w in weights]

            def err(parts, quotas=quotas):
                return sum((p - q) ** 2 for p, q in zip(parts, quotas, strict=True))

            best = min(err(c) for c in itertools.product(range(total + 1), repeat=n) if sum(c) == total)
            got = largest_remainder(total, weights)
            assert sum(got) == total and err(got) == best, (total, weights, got)
            # equal weights: the lower index first (e.g. 10 by (1, 1, 1) is 4, 3, 3)
            assert all(
                got[i] >= got[j]
                for i in range(n)
                for j in range(n)
                if weights[i] > weights[j] or (weights[i] == weights[j] and i < j)
            ), (total, weights, got)
            # equal remainders (of any weights): the leftover to the lower index (3 by (2, 2, 5): quotas
            # 2/3, 2/3, 5/3 -> 0, 0, 1 and two units left for remainders 2/3, 2/3, 2/3 -> 1, 1, 1)
            floors = [int(q) for q in quotas]
            for i in range(n):
                for j in range(i + 1, n):
                    if quotas[i] - floors[i] == quotas[j] - floors[j]:
                        assert got[i] - floors[i] >= got[j] - floors[j], (total, weights, got)


def test_split_layers():
    assert split_layers(5, 2) == (range(0, 3), range(3, 5))
    assert split_layers(6, 3, [1, 2, 3]) == (range(0, 1), range(1, 3), range(3, 6))
    with pytest.raises(LayoutError, match="adding up to 6 layers"):
        split_layers(6, 2, [1, 2])
    with pytest.raises(LayoutError, match="cannot split 1 layers into 2"):
        split_layers(1, 2)


def test_batch_slices():
    even = JobPlan(dp=2, micro_batches=2, virtual_workers=4)
    s = batch_slice(even, 1, 16)
    assert (s.offset, s.size, s.micro_batch_size, s.num_micro_batches, s.virtual_workers) == (8, 8, 2, 4, range(2, 4))
    shares = JobPlan(dp=2, micro_batches=2, batch_shares=(3, 1))
    assert [(batch_slice(shares, d, 16).offset, batch_slice(shares, d, 16).size) for d in (0, 1)] == [(0, 12), (12, 4)]
    with pytest.raises(ParallelError, match="does not split into 4 virtual workers x 2 micro-batches"):
        batch_slice(JobPlan(dp=2, micro_batches=2, virtual_workers=4), 0, 12)
    with pytest.raises(ParallelError, match="batch share of 3 .* does not split into 2 micro-batches"):
        batch_slice(JobPlan(dp=2, micro_batches=2, batch_shares=(3, 1)), 1, 12)


def test_virtual_worker_blocks_are_contiguous_and_uneven():
    assert virtual_worker_blocks(4, 2) == (range(0, 2), range(2, 4))
    assert virtual_worker_blocks(4, 3) == (range(0, 2), range(2, 3), range(3, 4))  # leftovers to the first ranks
    assert virtual_worker_blocks(3, 2) == (range(0, 2), range(2, 3))
    assert virtual_worker_blocks(6, 4) == (range(0, 2), range(2, 4), range(4, 5), range(5, 6))
    assert virtual_worker_blocks(4, 4) == (range(0, 1), range(1, 2), range(2, 3), range(3, 4))
    assert virtual_worker_blocks(4, 2, (3, 1)) == (range(0, 3), range(3, 4))  # 3:1 -> 3 and 1 workers
    assert virtual_worker_blocks(6, 3, (1, 2, 1)) == (range(0, 2), range(2, 5), range(5, 6))  # 1.5, 3, 1.5
    with pytest.raises(LayoutError, match="2 virtual workers cannot be spread over dp=4 ranks"):
        virtual_worker_blocks(2, 4)
    with pytest.raises(LayoutError, match="leave a dp rank without a virtual worker of 4"):
        virtual_worker_blocks(4, 3, (100, 1, 1))


def test_uneven_batch_slices():
    def fields(plan, global_batch):
        return [
            (s.offset, s.size, s.micro_batch_size, s.num_micro_batches, s.virtual_workers)
            for s in (batch_slice(plan, d, global_batch) for d in range(plan.dp))
        ]

    # V=4 over dp=3: 16 samples, 4 per worker, 2 micro-batches of 2 per worker
    assert fields(JobPlan(dp=3, micro_batches=2, virtual_workers=4), 16) == [
        (0, 8, 2, 4, range(0, 2)),
        (8, 4, 2, 2, range(2, 3)),
        (12, 4, 2, 2, range(3, 4)),
    ]
    # V=5 over dp=2, one micro-batch: 10 samples, 2 per worker
    assert fields(JobPlan(dp=2, virtual_workers=5), 10) == [(0, 6, 2, 3, range(0, 3)), (6, 4, 2, 2, range(3, 5))]
    # batch shares with virtual workers move whole workers: 3:1 of V=4
    assert fields(JobPlan(dp=2, micro_batches=2, virtual_workers=4, batch_shares=(3, 1)), 16) == [
        (0, 12, 2, 6, range(0, 3)),
        (12, 4, 2, 2, range(3, 4)),
    ]
    assert unit_counts(JobPlan(dp=3, virtual_workers=4)) == (2, 1, 1)
    assert unit_counts(JobPlan(dp=2, virtual_workers=4, batch_shares=(3, 1))) == (3, 1)
    assert unit_counts(JobPlan(dp=2, batch_shares=(3, 1))) == (1, 1)  # legacy: one slice of samples per rank
    assert unit_counts(JobPlan(dp=3)) == (1, 1, 1)
    with pytest.raises(ParallelError, match="global batch 12 does not split into 4 virtual workers x 2 micro-batches"):
        batch_slice(JobPlan(dp=3, micro_batches=2, virtual_workers=4), 2, 12)
    with pytest.raises(ParallelError, match="without a virtual worker"):
        batch_slice(JobPlan(dp=3, virtual_workers=4, batch_shares=(100, 1, 1)), 0, 16)
    with pytest.raises(PlanError, match="'virtual_workers' \\(2\\) must be at least dp \\(4\\)"):
        JobPlan(dp=4, virtual_workers=2)


def test_virtual_worker_covers_its_shard_and_resumes():
    vw = VirtualWorker(1, 3, dataset_size=10, seed=5)
    epoch = vw.next_indices(vw.shard_size)
    assert sorted(epoch) == [1, 4, 7]
    vw.next_indices(2)
    saved = vw.state_dict()
    ahead = vw.next_indices(5), torch.rand(3, generator=vw.generator)
    twin = VirtualWorker(1, 3, dataset_size=10, seed=5)
    twin.load_state_dict(saved)
    assert (twin.next_indices(5), torch.rand(3, generator=twin.generator))[0] == ahead[0]
    assert vw.epoch == twin.epoch > 0
    with pytest.raises(ValueError, match="loaded into 2/3"):
        VirtualWorker(2, 3, 10, 5).load_state_dict(saved)


def test_ordered_sum_runs_left_to_right():
    xs = [
        torch.tensor([1e16], dtype=torch.float64),
        torch.tensor([1.0], dtype=torch.float64),
        torch.tensor([-1e16], dtype=torch.float64),
    ]
    assert ordered_sum(xs, None).item() == 0.0  # 1e16 + 1 rounds to 1e16; adding the big ones first gives 1
    assert ordered_sum(xs, None, [3]).item() == 0.0
    with pytest.raises(ValueError, match="3 local units, counts say \\[2\\]"):
        ordered_sum(xs, None, [2])


def test_checkpoint_files_and_marker(tmp_path):
    assert checkpoint.latest_step(tmp_path) is None and checkpoint.load_latest(tmp_path) is None
    checkpoint.save(tmp_path, 3, {"w": torch.ones(2)})
    checkpoint.save(tmp_path, 7, {"w": torch.zeros(2)})
    assert (tmp_path / "LATEST").read_text() == "7\n"
    assert torch.equal(checkpoint.load_latest(tmp_path)["w"], torch.zeros(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "step-00000003.pt", "step-00000007.pt"]
    (tmp_path / "LATEST").write_text("junk")
    with pytest.raises(ValueError, match="not a step number"):
        checkpoint.latest_step(tmp_path)


def test_init_parallel_checks_the_world_before_joining(monkeypatch):
    from launch.parallel import init_parallel

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ParallelError, match="WORLD_SIZE=3 but the plan needs pp\\*dp\\*tp = 4"):
        init_parallel(JobPlan(dp=2, tp=2))
    monkeypatch.delenv("CELLSCHED_PLAN", raising=False)
    with pytest.raises(ParallelError, match="CELLSCHED_PLAN is not set"):
        init_parallel()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("CELLSCHED_PLAN", '{"dp": 4, "virtual_workers": 2}')
    with pytest.raises(ParallelError, match="'virtual_workers' \\(2\\) must be at least dp \\(4\\)"):
        init_parallel()
    bad = JobPlan(dp=4)
    object.__setattr__(bad, "virtual_workers", 2)  # a plan that skipped validation
    with pytest.raises(ParallelError, match="dp=4 ranks but only 2 virtual workers"):
        init_parallel(bad)
    with pytest.raises(ParallelError, match="dp=4 ranks but only 2 virtual workers"):
        batch_slice(bad, 0, 8)
