"""Pipelines whose stages hold different numbers of layers (a plan's
stage_layers, as for stages on different GPU types), with tensor and data
parallelism and sharded optimizer state, train exactly like one process."""

import json

import pytest
from minigpt.model import GPTConfig
from minigpt.trainer import TrainConfig, reference_losses
from trainer_runs import train

from solver.contract.plan import JobPlan, PlanError, largest_remainder

pytestmark = pytest.mark.slow  # real processes or a package build: left out of the quick layer

STEPS = 6

VIRTUAL = 2
FLAGS = ("--dtype", "float64", "--layers", "5", "--hidden", "16", "--heads", "4", "--seq", "8", "--vocab", "32")
CASES = {  # name: (plan, each stage's layer indices); 1F1B needs micro_batches >= pp
    "pp2-tp2-4+1": ({"pp": 2, "dp": 1, "tp": 2, "stage_layers": [4, 1]}, [[0, 1, 2, 3], [4]]),
    "pp2-dp2-1+4-sharded": (
        {"pp": 2, "dp": 2, "tp": 1, "stage_layers": [1, 4], "state_sharding": "memory", "state_shares": [2, 1]},
        [[0], [1, 2, 3, 4]],
    ),
    "pp3-3+1+1": ({"pp": 3, "dp": 1, "tp": 1, "stage_layers": [3, 1, 1], "micro_batches": 4}, [[0, 1, 2], [3], [4]]),
}


@pytest.fixture(scope="module")
def reference():
    cfg = GPTConfig(layers=5, hidden=16, heads=4, seq=8, vocab=32)
    return reference_losses(cfg, TrainConfig(dtype="float64"), STEPS, virtual_workers=VIRTUAL)


@pytest.mark.parametrize("name", list(CASES))
def test_uneven_stages_match_single_process(tmp_path, reference, name):
    plan, stages = CASES[name]
    plan = {"micro_batches": 2, **plan, "virtual_workers": VIRTUAL}
    losses = train(plan, tmp_path / "losses.json", STEPS, *FLAGS, "--report", str(tmp_path / "ranks")).losses

    assert len(losses) == STEPS and losses[-1] < losses[0]
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))
    assert worst <= 1e-5, f"losses differ from the single-process reference by {worst:.2e} (relative)"
    n = plan["pp"] * plan["dp"] * plan["tp"]
    for rank in range(n):
        info = json.loads((tmp_path / "ranks" / f"rank-{rank}.json").read_text())
        assert info["stage_layers"] == stages[info["coords"][0]], info
        if "state_shares" in plan:  # each stage's state sliced by the plan's shares
            state = json.loads((tmp_path / "ranks" / f"state-{rank}.json").read_text())
            sizes = [b - a for a, b in state["bounds"]]
            assert state["mode"] == "memory" and sizes == list(largest_remainder(sum(sizes), plan["state_shares"]))
            assert state["slice"] == state["bounds"][info["coords"][1]]


def test_plan_stage_layers_are_whole_positive_numbers_one_per_stage():
    assert JobPlan(pp=2, stage_layers=(3, 1)).stage_layers == (3, 1)
    assert JobPlan.from_json('{"pp": 2, "stage_layers": [3, 1]}').stage_layers == (3, 1)
    for bad in ((3,), (4, 0), (2.5, 1.5), (3.0, 1), (True, 3), ("3", "1")):
        with pytest.raises(PlanError, match="'stage_layers' needs 2 integers >= 1"):
            JobPlan(pp=2, stage_layers=bad)


def test_resume_under_another_stage_split(tmp_path, reference):
    """A job moved between cells changes its stage split (and sharding): the
    checkpoint is keyed by global layer names, so it resumes under any split."""
    ckpt = str(tmp_path / "ckpt")
    (first, _), (then, _) = CASES["pp2-tp2-4+1"], CASES["pp2-dp2-1+4-sharded"]
    common = {"micro_batches": 2, "virtual_workers": VIRTUAL, "checkpoint_dir": ckpt}
    train({**first, **common}, tmp_path / "a.json", 3, *FLAGS)
    resumed = train({**then, **common}, tmp_path / "b.json", STEPS, *FLAGS)
    assert resumed.printed == [4, 5, 6]  # really resumed, not started over
    worst = max(abs(a - b) / abs(b) for a, b in zip(resumed.losses, reference, strict=True))
    assert len(resumed.losses) == STEPS and worst <= 1e-5, (resumed.losses, reference)
