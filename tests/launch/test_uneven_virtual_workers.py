"""Virtual workers over any dp <= V: uneven blocks (V=4, dp=3: 2, 1, 1) train bitwise the same."""

import json
import shutil

import pytest
import torch
from minigpt.model import GPTConfig
from minigpt.trainer import TrainConfig, reference_losses
from trainer_runs import checkpoint_state, train

pytestmark = pytest.mark.slow  # real processes or a package build: left out of the quick layer

V = 4

STEPS = 6
SHAPE = {"layers": 2, "hidden": 16, "heads": 2, "seq": 8, "vocab": 32}
FLAGS = tuple(x for k, v in SHAPE.items() for x in (f"--{k}", str(v)))  # global batch 8: 2 samples per worker


def plan(ckpt, dp, **kw):
    return {"dp": dp, "micro_batches": 2, "virtual_workers": V, "checkpoint_dir": str(ckpt), **kw}


def same_state(a: dict, b: dict, optim: bool = True) -> bool:
    """Bitwise equal parameters (and AdamW moments) of two checkpoints."""
    if a["model"].keys() != b["model"].keys():
        return False
    ok = all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"])
    if optim:
        moments = ("exp_avg", "exp_avg_sq")
        ok &= all(torch.equal(a["optim"][k][m], b["optim"][k][m]) for k in b["optim"] for m in moments)
    return ok


def batches(report_dir, dp):
    return [json.loads((report_dir / f"rank-{r}.json").read_text())["batch"] for r in range(dp)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """STEPS float64 steps with V=4 on dp = 1, 2, 3, 4 (dp=2 also checkpoints at step 3)."""
    out = {}
    for dp in (1, 2, 3, 4):
        d = tmp_path_factory.mktemp(f"dp{dp}")
        extra = {"checkpoint_every": 3} if dp == 2 else {}
        run = train(
            plan(d / "ckpt", dp, **extra), d / "l.json", STEPS, "--dtype", "float64", *FLAGS, "--report", str(d / "r")
        )
        out[dp] = (run, d)
    return out


def test_dp3_trains_bitwise_like_dp_1_2_4(runs):
    run3, d3 = runs[3]
    # offset, size, micro-batch size, micro-batches, virtual workers: 8 samples, 2 per worker, 2 micro-batches
    assert batches(d3 / "r", 3) == [[0, 4, 1, 4, [0, 1]], [4, 2, 1, 2, [2]], [6, 2, 1, 2, [3]]]
    state3 = checkpoint_state(d3 / "ckpt")
    assert state3["step"] == STEPS and run3.losses[-1] < run3.losses[0]
    for dp in (1, 2, 4):
        run, d = runs[dp]
        assert run.losses == run3.losses, f"dp={dp}"  # bitwise: floats compare exactly
        assert same_state(checkpoint_state(d / "ckpt"), state3), f"dp={dp}"
    # one plain process on whole batches: the same up to rounding
    ref = reference_losses(GPTConfig(**SHAPE), TrainConfig(dtype="float64"), STEPS, virtual_workers=V)
    assert max(abs(a - b) / abs(b) for a, b in zip(run3.losses, ref, strict=True)) < 1e-13


def test_resume_at_dp3_from_a_dp2_checkpoint(runs, tmp_path):
    run3, d3 = runs[3]
    ckpt = tmp_path / "ckpt"
    shutil.copytree(runs[2][1] / "ckpt", ckpt)
    (ckpt / "step-00000006.pt").unlink()
    (ckpt / "LATEST").write_text("3\n")  # as if the dp=2 job had been stopped at step 3
    resumed = train(plan(ckpt, 3), tmp_path / "l.json", STEPS, "--dtype", "float64", *FLAGS)
    assert resumed.printed == [4, 5, 6]  # really resumed, not started over
    assert resumed.losses == run3.losses
    assert same_state(checkpoint_state(ckpt), checkpoint_state(d3 / "ckpt"))


def test_batch_shares_move_whole_virtual_workers(tmp_path):
    """Mixed GPU types: shares 3:1 give dp rank 0 three of the 4 workers; the
    update is bitwise the even split's (float32 here, float64 above)."""
    flags = ("--dtype", "float32", *FLAGS)
    even = train(plan(tmp_path / "even", 2), tmp_path / "even.json", STEPS, *flags)
    mixed = train(
        plan(tmp_path / "mixed", 2, batch_shares=[3, 1]),
        tmp_path / "mixed.json",
        STEPS,
        *flags,
        "--report",
        str(tmp_path / "r"),
    )
    assert batches(tmp_path / "r", 2) == [[0, 6, 1, 6, [0, 1, 2]], [6, 2, 1, 2, [3]]]
    assert mixed.losses == even.losses
    assert same_state(checkpoint_state(tmp_path / "mixed"), checkpoint_state(tmp_path / "even"))


def test_state_sharding_with_uneven_counts_equals_the_replicated_path(runs, tmp_path):
    run3, d3 = runs[3]
    sharded = train(
        plan(tmp_path / "ckpt", 3, state_shares=[1, 2, 1]),
        tmp_path / "l.json",
        STEPS,
        "--dtype",
        "float64",
        *FLAGS,
        "--report",
        str(tmp_path / "r"),
    )
    assert [json.loads((tmp_path / "r" / f"state-{r}.json").read_text())["mode"] for r in range(3)] == ["memory"] * 3
    assert sharded.losses == run3.losses
    assert same_state(checkpoint_state(tmp_path / "ckpt"), checkpoint_state(d3 / "ckpt"))
