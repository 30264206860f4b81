"""Virtual workers: a resized job continues bitwise where it left off."""

import json
import shutil
import signal
import sys
import time

import pytest
import torch
from minigpt.model import GPTConfig
from minigpt.trainer import TrainConfig, reference_losses
from srun_local import start, wait
from support import free_port
from trainer_runs import check, checkpoint_state, train

from launch.elastic import VirtualWorker
from slurm_ext.controller.progress import read_progress, read_progress_file
from solver.contract import EXIT_CHECKPOINTED
from solver.contract.models import ModelShape

pytestmark = pytest.mark.slow  # real processes or a package build: left out of the quick layer

V = 4

FLAGS = ("--layers", "2", "--hidden", "16", "--heads", "2", "--seq", "8", "--vocab", "32")


def plan(ckpt, pp=1, dp=4, tp=1):
    return {"pp": pp, "dp": dp, "tp": tp, "micro_batches": 2, "virtual_workers": V, "checkpoint_dir": str(ckpt)}


@pytest.mark.parametrize("count,size", [(3, 10), (3, 11), (4, 10), (4, 4), (1, 7), (5, 12)])
def test_every_sample_is_drawn_exactly_once_per_epoch(count, size):
    """Worker i owns the indices i, i+V, ... below the dataset size, so over
    all V workers an epoch draws every sample exactly once, also when V does
    not divide the size (at V=3 over 10 samples worker 0 owns 0, 3, 6, 9)."""
    workers = [VirtualWorker(i, count, size, seed=7) for i in range(count)]
    for i, vw in enumerate(workers):
        assert vw.shard_size == len([k for k in range(size) if k % count == i])
    for epoch in range(3):
        drawn = {i: vw.next_indices(vw.shard_size) for i, vw in enumerate(workers)}
        assert sorted(k for ks in drawn.values() for k in ks) == list(range(size)), f"epoch {epoch}"
        assert all(k % count == i for i, ks in drawn.items() for k in ks)
    # drawing across an epoch boundary: one more epoch of worker 0 in odd-sized pieces
    vw = VirtualWorker(0, count, size, seed=7)
    own = list(range(0, size, count))
    stream = [k for n in (1, 2, 3, 1) * len(own) for k in vw.next_indices(n)][: 3 * len(own)]
    for e in range(3):
        assert sorted(stream[e * len(own) : (e + 1) * len(own)]) == own


def test_resume_on_fewer_ranks_is_bitwise_identical(tmp_path):
    full = train(plan(tmp_path / "full"), tmp_path / "full.json", 20, *FLAGS).losses

    first = train(plan(tmp_path / "a"), tmp_path / "first.json", 10, *FLAGS)
    assert first.losses == full[:10]
    assert (tmp_path / "a" / "LATEST").read_text() == "10\n"
    # the progress channel the controller reads (rank 0 writes it every step)
    assert read_progress(str(tmp_path / "a")) == 10.0
    assert read_progress_file(str(tmp_path / "a")).model == ModelShape(2, 16, 2, 8, 32)  # FLAGS: the model trained
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.copytree(tmp_path / "a", tmp_path / "c")

    for d, dp in (("a", 2), ("b", 1)):
        resumed = train(plan(tmp_path / d, dp=dp), tmp_path / f"{d}.json", 20, *FLAGS)
        assert resumed.printed == list(range(11, 21))  # really resumed, not started over
        assert resumed.losses == full  # bitwise: floats compare exactly
    want = checkpoint_state(tmp_path / "full")
    for d in ("a", "b"):
        got = checkpoint_state(tmp_path / d)
        assert got["step"] == 20
        assert all(torch.equal(got["model"][k], v) for k, v in want["model"].items())
        assert all(torch.equal(got["optim"][k]["exp_avg_sq"], v["exp_avg_sq"]) for k, v in want["optim"].items())

    # Another pipeline / tensor layout resumes from the same files; only the
    # summation order inside a unit changes, so it agrees to rounding (float32:
    # measured 1.8e-8, docs/elasticity.md says about 2e-8).
    other = train(plan(tmp_path / "c", pp=2, dp=1, tp=2), tmp_path / "c.json", 20, *FLAGS)
    assert other.printed == list(range(11, 21))
    assert other.losses[:10] == full[:10]
    assert max(abs(a - b) / abs(b) for a, b in zip(other.losses[10:], full[10:], strict=True)) < 1e-7


def test_signal_checkpoints_exits_75_and_resumes(tmp_path):
    ckpt = tmp_path / "ckpt"
    env = {"CELLSCHED_PLAN": json.dumps(plan(ckpt, dp=2)), "CELLSCHED_MASTER_PORT": str(free_port())}
    procs = start(
        [sys.executable, "contrib/examples/train_gpt.py", "--steps", "100000", "--dtype", "float64", *FLAGS], 2, env=env
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = procs[0].stdout.readline()
            assert line, "rank 0 ended before step 3"
            if json.loads(line)["step"] >= 3:
                break
        procs[1].send_signal(signal.SIGUSR1)  # one rank is enough: the ranks agree
        tasks = wait(procs, timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    check(tasks, expect=EXIT_CHECKPOINTED)
    stopped = int((ckpt / "LATEST").read_text())
    assert 3 <= stopped < 1000
    state = checkpoint_state(ckpt)
    assert state["step"] == stopped and len(state["losses"]) == stopped

    resumed = train(plan(ckpt, dp=1), tmp_path / "resumed.json", stopped + 3, "--dtype", "float64", *FLAGS)
    assert resumed.printed == [stopped + 1, stopped + 2, stopped + 3]
    cfg = GPTConfig(layers=2, hidden=16, heads=2, seq=8, vocab=32)
    ref = reference_losses(cfg, TrainConfig(dtype="float64"), stopped + 3, virtual_workers=V)
    assert resumed.losses[:stopped] == state["losses"]
    assert max(abs(a - b) / abs(b) for a, b in zip(resumed.losses, ref, strict=True)) < 1e-9


def test_dropout_from_each_virtual_workers_stream_keeps_a_resized_run_bitwise(tmp_path):
    """Dropout (rate 0.2 on the embedding and every block's attention and MLP
    outputs) draws from each virtual worker's own stream: a run resized on
    resume (dp 1 -> 2 of V = 4, and under pp 2: dp 2 -> 1, where the resumed
    run's pipeline stages infer their shapes with one extra forward) trains
    bitwise as the unmoved run of the same pp, tp and micro-batches (and here,
    without tp, as the run of one stage). Without dropout the same training
    gives other losses: the masks really act."""
    drop = (*FLAGS, "--dropout", "0.2")
    full = train(plan(tmp_path / "full"), tmp_path / "full.json", 6, *drop).losses
    cfg = GPTConfig(layers=2, hidden=16, heads=2, seq=8, vocab=32)
    plain = reference_losses(cfg, TrainConfig(), 6, virtual_workers=V)
    assert len(full) == 6 and all(a != b for a, b in zip(full, plain, strict=True))

    train(plan(tmp_path / "a", dp=1), tmp_path / "a1.json", 3, *drop)
    resumed = train(plan(tmp_path / "a", dp=2), tmp_path / "a2.json", 6, *drop)
    assert resumed.printed == [4, 5, 6] and resumed.losses == full

    # the masks are keyed by global layer, not by stage: without tp even two stages train these same bits
    piped = train(plan(tmp_path / "p", pp=2, dp=2), tmp_path / "p.json", 6, *drop).losses
    assert piped == full
    train(plan(tmp_path / "q", pp=2, dp=2), tmp_path / "q1.json", 3, *drop)
    moved = train(plan(tmp_path / "q", pp=2, dp=1), tmp_path / "q2.json", 6, *drop)
    assert moved.printed == [4, 5, 6] and moved.losses == piped
