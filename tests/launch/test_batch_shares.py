"""Uneven batch shares (fast GPUs take more samples) give the even split's update."""

import json

import pytest
import torch
from trainer_runs import checkpoint_state, relative_error, train

pytestmark = pytest.mark.slow  # real processes or a package build: left out of the quick layer

FLAGS = ("--layers", "2", "--hidden", "16", "--heads", "2", "--seq", "8", "--vocab", "32", "--global-batch", "16")


def plan(ckpt, **kw):
    return {"dp": 2, "micro_batches": 2, "checkpoint_dir": str(ckpt), **kw}


@pytest.fixture(scope="module")
def even(tmp_path_factory):
    d = tmp_path_factory.mktemp("even")
    run = train(plan(d / "ckpt"), d / "losses.json", 10, *FLAGS)
    return run, checkpoint_state(d / "ckpt")


def flat(state, names):
    return torch.cat([state["model"][k].reshape(-1) for k in names])


@pytest.mark.parametrize("pp", [1, 2])
def test_shares_3_to_1_update_like_the_even_split(tmp_path, even, pp):
    even_run, even_state = even
    run = train(
        plan(tmp_path / "ckpt", pp=pp, batch_shares=[3, 1]),
        tmp_path / "l.json",
        10,
        *FLAGS,
        "--report",
        str(tmp_path / "r"),
    )

    shares = [json.loads((tmp_path / "r" / f"rank-{r}.json").read_text())["batch"] for r in (0, 1)]
    assert [s[:4] for s in shares] == [[0, 12, 6, 2], [12, 4, 2, 2]]  # offset, size, micro-batch size, count

    state = checkpoint_state(tmp_path / "ckpt")
    assert state["step"] == 10
    names = sorted(even_state["model"])
    assert relative_error(flat(state, names), flat(even_state, names)) <= 1e-6
    worst = max(relative_error(state["model"][k], even_state["model"][k]) for k in names)
    assert worst <= 1e-5, f"a parameter tensor differs by {worst:.2e} (relative)"
    assert max(abs(a - b) / abs(b) for a, b in zip(run.losses, even_run.losses, strict=True)) <= 1e-6
