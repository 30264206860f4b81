"""Cephalo state sharding: memory-proportional optimizer state over dp ranks."""

import itertools
import json
import math
import os
from fractions import Fraction

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from minigpt.model import GPTConfig
from minigpt.trainer import TrainConfig, reference_run
from support import free_port
from trainer_runs import checkpoint_state, relative_error, train

from launch.elastic import ordered_sum
from launch.sharding import ShardedOptimizer, ShardingError, ShardLayout, sharding_mode, state_numel
from solver.contract.plan import JobPlan, PlanError

SHAPE = {"layers": 2, "hidden": 16, "heads": 2, "seq": 8, "vocab": 32}
FLAGS = tuple(x for k, v in SHAPE.items() for x in (f"--{k}", str(v)))


# ------------------------------------------------------------------ layout


def hamilton(total: int, weights) -> list[int]:
    """Reference split in exact arithmetic: each rank its quota's floor, the leftovers to the largest
    remainders, ties to the lower rank."""
    quotas = [Fraction(total * w, sum(weights)) for w in weights]
    parts = [math.floor(q) for q in quotas]
    for r in sorted(range(len(parts)), key=lambda r: (parts[r] - quotas[r], r))[: total - sum(parts)]:
        parts[r] += 1
    return parts


@pytest.mark.parametrize(
    "numel, weights", [(1000, (3, 1)), (12_345, (80, 40, 24)), (7, (1, 1, 1)), (5, (1000, 1, 1)), (0, (1, 2))]
)
def test_slices_are_proportional_and_cover_everything_once(numel, weights):
    layout = ShardLayout.proportional(numel, weights)
    covered = torch.zeros(numel, dtype=torch.int64)
    for r in range(len(weights)):
        covered[layout.slice(r)] += 1
    assert covered.eq(1).all() and layout.numel == numel
    total = sum(weights)
    for size, w in zip(layout.sizes, weights, strict=True):
        assert abs(size - numel * w / total) < 1  # largest remainder: within one element
    assert list(layout.sizes) == hamilton(numel, weights)  # the exact-arithmetic reference


def test_3_to_1_gives_75_and_25_percent():
    assert ShardLayout.proportional(1000, (3, 1)).bounds == ((0, 750), (750, 1000))


@pytest.mark.parametrize(
    "numel, weights, sizes",
    [
        (1000, (3, 1), (750, 250)),  # quotas 750, 250: no leftover
        (12_345, (80, 40, 24), (6858, 3429, 2058)),  # 6858.33, 3429.17, 2057.5: floors add to 12344, 1 left -> .5
        (7, (1, 1, 1), (3, 2, 2)),  # 2.33 each: floors 6, 1 left, a tie -> rank 0
        (10, (1, 1, 1, 1), (3, 3, 2, 2)),  # 2.5 each: floors 8, 2 left, ties -> ranks 0 and 1
        (8, (5, 3, 2), (4, 2, 2)),  # 4, 2.4, 1.6: floors 7, 1 left -> .6 (rank 2), not the larger weight
        (100, (1, 2, 4), (14, 29, 57)),  # 14.29, 28.57, 57.14: floors 99, 1 left -> .57 (rank 1)
        (5, (1000, 1, 1), (5, 0, 0)),  # 4.99, 0.005, 0.005: floors 4, 1 left -> .99; a rank may own nothing
        (0, (1, 2), (0, 0)),
    ],
)
def test_slices_by_hand(numel, weights, sizes):
    """Slice sizes and bounds worked out by hand (largest remainder, ties to the lower rank)."""
    starts = tuple(itertools.accumulate(sizes, initial=0))
    assert ShardLayout.proportional(numel, weights).bounds == tuple(itertools.pairwise(starts))


@pytest.mark.parametrize("bounds", [(), ((1, 4),), ((0, 4), (5, 6)), ((0, 4), (4, 3))])
def test_a_layout_with_gaps_or_overlaps_is_refused(bounds):
    with pytest.raises(ShardingError):
        ShardLayout(bounds)


def test_plan_fields():
    plan = JobPlan.from_json('{"dp": 2, "state_shares": [3, 1]}')
    assert plan.state_shares == (3, 1) and sharding_mode(plan) == "memory"
    assert JobPlan.from_json(plan.to_json()) == plan
    assert sharding_mode(JobPlan(dp=2)) == "none" and sharding_mode(JobPlan(dp=2), "even") == "even"
    assert sharding_mode(JobPlan(dp=2, state_sharding="even")) == "even"
    for bad in ('{"dp": 2, "state_shares": [1]}', '{"dp": 1, "state_shares": [0]}', '{"state_sharding": "zero3"}'):
        with pytest.raises(PlanError):
            JobPlan.from_json(bad)


# ----------------------------------------- the optimizer, 3 gloo processes

OPTIMIZERS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=False),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=False),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-1, momentum=0.9, weight_decay=0.01, foreach=False),
}
WEIGHTS = {"3:2:1": (3, 2, 1), "one-empty": (1000, 1000, 1)}
SHAPES = ((5, 3), (7,), (2, 2, 2))
N = 30  # elements of SHAPES


def _params(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for shape in SHAPES]


def _grads(step: int, rank: int, units: int = 2) -> list[torch.Tensor]:
    """Rank RANK's flat unit gradients of step STEP (N elements each)."""
    g = torch.Generator().manual_seed(1000 * step + 10 * rank)
    return [torch.randn(N, generator=g, dtype=torch.float64) for _ in range(units)]


#: units of each of the 3 ranks (uneven: rank 1 holds three, rank 0 one)
COUNTS = (1, 3, 2)
#: unit u's gradient holds BIG[u] at even and ONES[u] at odd positions. Left
#: to right, BIG sums to 4.5 (1e16 + 1 rounds to 1e16); adding per rank first
#: gives 3.5. ONES sums to 111111 when every unit counts exactly once.
BIG = (1e16, 1.0, -1e16, 1.0, 3.0, 0.5)
ONES = (1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0)
UNEVEN_SUM = [4.5, 111111.0] * (N // 2)


def _unit(u: int) -> torch.Tensor:
    return torch.tensor([BIG[u], ONES[u]] * (N // 2), dtype=torch.float64)


def _uneven(rank: int, world: int) -> dict:
    """ordered_sum / ShardedOptimizer with COUNTS units per rank."""
    first = sum(COUNTS[:rank])
    mine = [_unit(u) for u in range(first, first + COUNTS[rank])]
    out = {"ordered_sum": ordered_sum(mine, None, COUNTS).tolist(), "reduce": {}, "step_equal": {}}
    for wname, weights in WEIGHTS.items():
        layout = ShardLayout.proportional(N, weights)
        sharded = ShardedOptimizer(_params(0), OPTIMIZERS["adamw"], layout, None, rank)
        out["reduce"][wname] = [sharded.reduce(mine, COUNTS).tolist(), list(layout.bounds[rank])]
        # a few steps with random unit gradients against the replicated optimizer, bitwise
        ref_params = _params(0)
        ref = OPTIMIZERS["adamw"](ref_params)
        for step in range(3):
            sharded.step(_grads(step, rank, COUNTS[rank]), COUNTS)
            units = [g for r in range(world) for g in _grads(step, r, COUNTS[r])]
            total = units[0].clone()
            for g in units[1:]:
                total += g
            offset = 0
            for p in ref_params:
                p.grad = total[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            ref.step()
        out["step_equal"][wname] = all(torch.equal(a, b) for a, b in zip(sharded.params, ref_params, strict=True))
    return out


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {"uneven": _uneven(rank, world)}
    for oname, make in OPTIMIZERS.items():
        for wname, weights in WEIGHTS.items():
            params = _params(0)
            layout = ShardLayout.proportional(N, weights)
            sharded = ShardedOptimizer(params, make, layout, None, rank)
            ref_params = _params(0)
            ref = make(ref_params)
            for step in range(4):
                sharded.step(_grads(step, rank))
                total = torch.cat([torch.stack(_grads(step, r)) for r in range(world)]).sum(0)
                offset = 0
                for p in ref_params:
                    p.grad = total[offset : offset + p.numel()].view_as(p).clone()
                    offset += p.numel()
                ref.step()
            full = sharded.full_optimizer_state()
            ref_state = [{k: v.clone() for k, v in ref.state[p].items()} for p in ref_params]
            # resume the gathered state under other weights: a further step still matches
            moved = ShardedOptimizer(params, make, ShardLayout.proportional(N, (1, 1, 4)), None, rank)
            moved.load_full_optimizer_state(full)
            moved.step(_grads(9, rank))
            total = torch.cat([torch.stack(_grads(9, r)) for r in range(world)]).sum(0)
            offset = 0
            for p in ref_params:
                p.grad = total[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            ref.step()
            results[f"{oname}/{wname}"] = {
                "param_err": max(relative_error(a, b) for a, b in zip(params, ref_params, strict=True)),
                "state_err": max(
                    relative_error(a[k], b[k]) for a, b in zip(full, ref_state, strict=True) for k in b if b[k].dim()
                ),
                "state_keys_equal": all(sorted(a) == sorted(b) for a, b in zip(full, ref_state, strict=True)),
                "state_numel": state_numel(sharded.optimizer),
                "slice": layout.sizes[rank],
                "per_element_state": sum(1 for v in ref_state[0].values() if v.dim()),
            }
    with open(f"{out}/rank-{rank}.json", "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()
    # results are written: skip the interpreter's teardown, where gloo's threads
    # now and then abort the process ("terminate called without an active exception")
    os._exit(0)


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    mp.start_processes(_worker, args=(3, free_port(), str(out)), nprocs=3, join=True, start_method="spawn")
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(3)]


@pytest.mark.parametrize("case", [f"{o}/{w}" for o in OPTIMIZERS for w in WEIGHTS])
def test_sharded_step_equals_the_unsharded_optimizer(three_ranks, case):
    for r, results in enumerate(three_ranks):
        got = results[case]
        assert got["param_err"] <= 1e-12, f"rank {r}: parameters differ by {got['param_err']:.1e}"
        assert got["state_err"] <= 1e-12, f"rank {r}: gathered state differs by {got['state_err']:.1e}"
        assert got["state_keys_equal"]


def test_ordered_sum_with_uneven_counts_adds_in_global_unit_order(three_ranks):
    for r, results in enumerate(three_ranks):
        assert results["uneven"]["ordered_sum"] == UNEVEN_SUM, f"rank {r}"


@pytest.mark.parametrize("weights", list(WEIGHTS))
def test_sharded_reduce_and_step_with_uneven_counts(three_ranks, weights):
    for r, results in enumerate(three_ranks):
        got, (start, stop) = results["uneven"]["reduce"][weights]
        assert got == UNEVEN_SUM[start:stop], f"rank {r}"
        assert results["uneven"]["step_equal"][weights], f"rank {r}: parameters differ from the replicated step"


@pytest.mark.parametrize("case", [f"{o}/{w}" for o in OPTIMIZERS for w in WEIGHTS])
def test_each_rank_holds_state_for_its_slice_only(three_ranks, case):
    sizes = [results[case]["slice"] for results in three_ranks]
    assert sum(sizes) == N
    for results in three_ranks:
        got = results[case]
        assert got["state_numel"] == got["per_element_state"] * got["slice"]


# ------------------------------------------------- the trainer, end to end


def _reference(steps: int, virtual_workers: int, batch: int):
    cfg = GPTConfig(**SHAPE)
    return reference_run(cfg, TrainConfig(global_batch=batch), steps, virtual_workers)


def _state_reports(directory, ranks):
    return [json.loads((directory / f"state-{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.slow
def test_memory_3_to_1_with_batch_3_to_1_matches_one_process(tmp_path):
    plan = {
        "dp": 2,
        "micro_batches": 2,
        "batch_shares": [3, 1],
        "state_shares": [3, 1],
        "checkpoint_dir": str(tmp_path / "ckpt"),
    }
    run = train(plan, tmp_path / "l.json", 10, *FLAGS, "--global-batch", "16", "--report", str(tmp_path / "r"))
    losses, ref = _reference(10, 2, 16)
    state = checkpoint_state(tmp_path / "ckpt")
    names = sorted(ref)
    flat = torch.cat([state["model"][k].reshape(-1) for k in names])
    assert relative_error(flat, torch.cat([ref[k].reshape(-1) for k in names])) <= 1e-6
    assert max(abs(a - b) / abs(b) for a, b in zip(run.losses, losses, strict=True)) <= 1e-6

    reports = _state_reports(tmp_path / "r", 2)
    n = reports[0]["param_numel"]
    assert [r["mode"] for r in reports] == ["memory", "memory"]
    assert [r["slice"] for r in reports] == [[0, round(0.75 * n)], [round(0.75 * n), n]]
    for r in reports:  # AdamW: exp_avg and exp_avg_sq per owned element, nothing else
        assert r["state_numel"] == 2 * (r["slice"][1] - r["slice"][0])


@pytest.mark.slow
def test_resume_on_three_ranks_with_other_memory_weights(tmp_path):
    """5 steps sharded 3:1 on 2 ranks, then 5 more sharded 1:2:1 on 3 ranks."""
    ckpt = str(tmp_path / "ckpt")
    flags = (*FLAGS, "--global-batch", "12")
    train(
        {"dp": 2, "virtual_workers": 6, "batch_shares": [3, 1], "state_shares": [3, 1], "checkpoint_dir": ckpt},
        tmp_path / "a.json",
        5,
        *flags,
    )
    run = train(
        {
            "dp": 3,
            "virtual_workers": 6,
            "batch_shares": [1, 2, 1],
            "state_sharding": "memory",
            "state_shares": [1, 2, 1],
            "checkpoint_dir": ckpt,
        },
        tmp_path / "b.json",
        10,
        *flags,
        "--report",
        str(tmp_path / "r"),
    )
    losses, ref = _reference(10, 6, 12)
    state = checkpoint_state(tmp_path / "ckpt")
    assert state["step"] == 10 and run.printed == list(range(6, 11))
    names = sorted(ref)
    flat = torch.cat([state["model"][k].reshape(-1) for k in names])
    assert relative_error(flat, torch.cat([ref[k].reshape(-1) for k in names])) <= 1e-6
    assert max(abs(a - b) / abs(b) for a, b in zip(run.losses, losses, strict=True)) <= 1e-6
    sizes = [r["slice"][1] - r["slice"][0] for r in _state_reports(tmp_path / "r", 3)]
    assert sizes == hamilton(sum(sizes), (1, 2, 1)) and sizes[1] > 1.9 * sizes[0]
