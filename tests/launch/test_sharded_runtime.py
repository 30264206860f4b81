"""The sharded runtime (FSDP2 x DTensor TP x pipelining, DCP checkpoints) on gloo, real multi-process runs.

Oracle: ``keyed_reference_losses``, the same model, data and optimizer on one
process without torch.distributed (minigpt's own loop, no launch code).
Tolerance: docs/runtime-sharded.md claims a float32 loss within 1e-5
(relative) of the unmoved run, moves included.
"""

import json
import signal
import sys
import time
from pathlib import Path

import pytest
from minigpt.model import GPTConfig, build_full_model
from minigpt.trainer import TrainConfig, keyed_reference_losses
from srun_local import srun, start, wait
from support import free_port
from trainer_runs import check, train

from launch import checkpoint
from launch.parallel import ParallelError
from launch.sharded import TRAINER_STATE, batch_sizes, step_dir
from launch.trainer import runtime_of
from solver.contract import EXIT_CHECKPOINTED
from solver.contract.plan import JobPlan

pytestmark = pytest.mark.slow  # real processes or a package build: left out of the quick layer

TOL = 1e-5  #: docs/runtime-sharded.md: relative loss deviation from the unmoved run (float32)

FLAGS = ("--layers", "4", "--hidden", "32", "--heads", "4")
CFG = GPTConfig(layers=4, hidden=32, heads=4)
#: >= 20M float32 parameters: 4 x (12 h^2 + 11 h) + embeddings and head at h = 672
BIG = ("--layers", "4", "--hidden", "672", "--heads", "4")


def sharded(**kw):
    return {"runtime": "sharded", **kw}


def deviation(got, want):
    return max(abs(a - b) / abs(b) for a, b in zip(got, want, strict=True))


def shard_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.distcp"))


@pytest.mark.parametrize(
    "plan",
    [
        sharded(dp=2, tp=2),
        sharded(pp=2, dp=2, micro_batches=2),
        sharded(pp=2, dp=2, tp=2, micro_batches=2, stage_layers=[1, 3], batch_shares=[0.3, 0.7]),
    ],
    ids=["dp2xtp2", "pp2xdp2", "pp2xdp2xtp2-uneven"],
)
def test_matches_the_single_process_reference(tmp_path, plan):
    ref = keyed_reference_losses(CFG, TrainConfig(), 4)
    run = train(plan, tmp_path / "out.json", 4, *FLAGS)
    assert run.printed == [1, 2, 3, 4]
    print(f"\n{plan}: largest relative loss deviation {deviation(run.losses, ref):.2e}")
    assert deviation(run.losses, ref) < TOL


def test_moves_across_plans_continue_the_unmoved_loss_curve(tmp_path):
    """dp2 x tp2 on 4 ranks -> pp2 x dp2 on 4 -> dp3 on 3, each resuming the
    previous plan's DCP checkpoint; the loss follows the unmoved run. The
    plans are as the controller writes them: a V (ignored), and each plan's
    own micro-batches (a runtime without virtual workers keeps none of the
    last plan's: solver.contract.runtimes.moved_micro_batches), at least pp
    in the pipeline."""
    ckpt = tmp_path / "ckpt"
    ref = keyed_reference_losses(CFG, TrainConfig(), 9)
    v = {"virtual_workers": 4}
    moves = [sharded(dp=2, tp=2, **v), sharded(pp=2, dp=2, micro_batches=2, **v), sharded(dp=3, **v)]
    for i, plan in enumerate(moves):
        run = train({**plan, "checkpoint_dir": str(ckpt)}, tmp_path / f"{i}.json", 3 * (i + 1), *FLAGS)
        assert run.printed == [3 * i + 1, 3 * i + 2, 3 * i + 3]  # resumed, not started over
        world = plan.get("pp", 1) * plan.get("dp", 1) * plan.get("tp", 1)
        assert [f.name for f in shard_files(step_dir(ckpt, 3 * (i + 1)))] == [f"__{r}_0.distcp" for r in range(world)]
    assert (ckpt / "LATEST").read_text() == "9\n"
    assert json.loads((step_dir(ckpt, 9) / TRAINER_STATE).read_text())["losses"] == run.losses
    print(f"\nmoved dp2xtp2 -> pp2xdp2 -> dp3: largest relative loss deviation {deviation(run.losses, ref):.2e}")
    assert deviation(run.losses, ref) < TOL


def test_every_rank_writes_a_balanced_shard_of_a_20m_model(tmp_path):
    """One shard file per rank, none over 1.5x the even share, under each plan of a move."""
    ckpt = tmp_path / "ckpt"
    for i, plan in enumerate([sharded(dp=2, tp=2), sharded(pp=2, dp=2, micro_batches=2), sharded(dp=3)]):
        train({**plan, "checkpoint_dir": str(ckpt)}, tmp_path / f"{i}.json", i + 1, *BIG)
        files = shard_files(step_dir(ckpt, i + 1))
        world = plan.get("pp", 1) * plan.get("dp", 1) * plan.get("tp", 1)
        assert len(files) == world
        sizes = [f.stat().st_size for f in files]
        # model + AdamW's two moments, float32: 3 x 4 bytes x parameters
        params = sum(p.numel() for p in build_full_model(GPTConfig(4, 672, 4), 0).parameters())
        assert params >= 20_000_000
        assert sum(sizes) >= 12 * params
        assert max(sizes) <= 1.5 * sum(sizes) / world, sizes


def test_signal_checkpoints_exits_75_and_resumes_under_another_plan(tmp_path):
    ckpt = tmp_path / "ckpt"
    plan = sharded(dp=2, checkpoint_dir=str(ckpt))
    env = {"CELLSCHED_PLAN": json.dumps(plan), "CELLSCHED_MASTER_PORT": str(free_port())}
    procs = start([sys.executable, "contrib/examples/train_gpt.py", "--steps", "100000", *FLAGS], 2, env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = procs[0].stdout.readline()
            assert line, "rank 0 ended before step 2"
            if json.loads(line)["step"] >= 2:
                break
        procs[1].send_signal(signal.SIGUSR1)  # one rank is enough: the ranks agree
        tasks = wait(procs, timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    check(tasks, expect=EXIT_CHECKPOINTED)
    stopped = int((ckpt / "LATEST").read_text())
    assert 2 <= stopped < 1000
    assert len(shard_files(step_dir(ckpt, stopped))) == 2
    resumed = train(sharded(tp=2, checkpoint_dir=str(ckpt)), tmp_path / "r.json", stopped + 2, *FLAGS)
    assert resumed.printed == [stopped + 1, stopped + 2]
    assert deviation(resumed.losses, keyed_reference_losses(CFG, TrainConfig(), stopped + 2)) < TOL


# -- units


def test_a_pipeline_with_fewer_micro_batches_than_stages_is_refused_at_start(tmp_path):
    """Schedule1F1B needs one micro-batch per stage at least: the trainer runs
    the plan it is given or stops with one line, never a plan of its own."""
    plan = sharded(pp=2, dp=1, micro_batches=1, checkpoint_dir=str(tmp_path / "ckpt"))
    tasks = srun(
        [sys.executable, "contrib/examples/train_gpt.py", "--steps", "1", *FLAGS],
        2,
        env={"CELLSCHED_PLAN": json.dumps(plan), "CELLSCHED_MASTER_PORT": str(free_port())},
        timeout=300,
    )
    assert all(t.returncode != 0 for t in tasks), [t.returncode for t in tasks]
    why = "1 micro-batches for pp=2: Schedule1F1B needs at least one per stage"
    assert all(why in t.stderr for t in tasks), tasks[0].stderr[-2000:]
    assert not (tmp_path / "ckpt" / "LATEST").exists()  # nothing trained


def test_batch_sizes_follow_the_shares_and_refuse_empty_micro_batches():
    assert batch_sizes(8, 2, None, 1) == (4, 4)
    assert batch_sizes(8, 3, None, 2) == (3, 3, 2)
    assert batch_sizes(8, 2, (0.3, 0.7), 2) == (2, 6)
    with pytest.raises(ParallelError, match="batch of 2 .* is smaller than 4 micro-batches"):
        batch_sizes(8, 2, (0.2, 0.8), 4)
    with pytest.raises(ParallelError, match="3 entries for dp=2"):
        batch_sizes(8, 2, (1.0, 1.0, 1.0), 1)


def test_runtime_of_the_plan():
    assert runtime_of(JobPlan()) == "exact"
    assert runtime_of(JobPlan(runtime="sharded")) == "sharded"
    assert runtime_of(JobPlan(runtime="ddp")) == "exact"  # dp-only, even: exact runs it as it is
    with pytest.raises(ValueError, match="'megatron'; launch.Trainer carries out exact and sharded"):
        runtime_of(JobPlan(runtime="megatron"))


def test_keyed_samples_do_not_depend_on_who_draws_them():
    from minigpt.data import batch_at

    whole = batch_at(range(0, 24), CFG, 0, 10)
    parts = [batch_at(range(a, b), CFG, 0, 10) for a, b in ((16, 24), (0, 5), (5, 16))]
    assert whole.tolist() == [*parts[1].tolist(), *parts[2].tolist(), *parts[0].tolist()]


def test_a_checkpoint_of_the_other_runtime_is_refused(tmp_path):
    checkpoint.mark_latest(tmp_path, 3)
    step_dir(tmp_path, 3).mkdir()
    with pytest.raises(ValueError, match="step 3 is not a whole-state checkpoint"):
        checkpoint.load_latest(tmp_path)


@pytest.mark.parametrize("plan", [sharded(dp=2), sharded(pp=2, dp=2, micro_batches=2, batch_shares=[1, 3])])
def test_a_users_own_model_trains_like_its_single_process_loop(tmp_path, plan):
    """launch.Trainer with a Workload that is not minigpt's (tests/launch/mlp_user.py); the oracle is
    the plain loop over the same model, samples and loss."""
    import mlp_user
    import torch

    model = mlp_user.full_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref = []
    for step in range(3):
        x, y = mlp_user.WORK.split(mlp_user.samples(range(step * 8, step * 8 + 8)))
        for layer in model.values():
            x = torch.tanh(layer(x))
        loss = ((x - y) ** 2).sum() / 8
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref.append(loss.item())
    out = tmp_path / "losses.json"
    n = plan.get("pp", 1) * plan.get("dp", 1)
    env = {"CELLSCHED_PLAN": json.dumps(plan), "CELLSCHED_MASTER_PORT": str(free_port())}
    tasks = wait(start([sys.executable, "tests/launch/mlp_user.py", str(out), "3"], n, env=env), timeout=300)
    check(tasks)
    assert deviation(json.loads(out.read_text()), ref) < TOL
