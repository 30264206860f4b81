"""A mixed-GPU-type plan lists batch shares node by node; the launcher puts
them in the order Slurm gave the step its nodes."""

import json
import sys

from srun_local import task_envs
from test_cli import SHOW_ENV, child_env, launch

from launch.layout import shares_in_step_order

MASTER = {"CELLSCHED_MASTER_ADDR": "127.0.0.1"}


def test_shares_follow_the_step_node_order():
    assert shares_in_step_order((3, 3, 6, 6), ("n1", "n2"), ("n2", "n1")) == (6, 6, 3, 3)
    assert shares_in_step_order((3, 3, 6, 6), ("n1", "n2"), ("n1", "n2")) == (3, 3, 6, 6)
    assert shares_in_step_order((3, 3, 6, 6), ("n1", "n3"), ("n1", "n2")) is None
    assert shares_in_step_order((3, 3, 6), ("n1", "n2"), ("n1", "n2")) is None


def test_launcher_reorders_a_plans_shares_to_the_step():
    plan = {"pp": 1, "dp": 4, "tp": 1, "batch_shares": [6, 6, 3, 3], "nodes": ["n2", "n1"]}
    seen = [
        json.loads(
            child_env(launch(["--", sys.executable, "-c", SHOW_ENV], t, plan=plan, extra=MASTER))["CELLSCHED_PLAN"]
        )
        for t in task_envs(4, nnodes=2)
    ]  # the step runs on n1, n2
    assert {tuple(p["batch_shares"]) for p in seen} == {(3.0, 3.0, 6.0, 6.0)}
    assert {tuple(p["nodes"]) for p in seen} == {("n1", "n2")}
    other = {**plan, "nodes": ["n7", "n8"]}  # planned for other nodes: shares kept (speed only, never the update)
    got = json.loads(
        child_env(launch(["--", sys.executable, "-c", SHOW_ENV], task_envs(4, nnodes=2)[0], plan=other, extra=MASTER))[
            "CELLSCHED_PLAN"
        ]
    )
    assert got["batch_shares"] == [6, 6, 3, 3]
