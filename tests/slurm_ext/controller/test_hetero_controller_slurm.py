"""Issue 15's dev-cluster proofs with the CONTROLLER choosing the cell: a job
submitted through ``cellsched sbatch``, one real controller round (the
profile store's estimator, seeded afresh; the cellsched policy) places it
and writes its plan, and the job runs under ``srun cellsched-launch``
(``hetero_runs.Managed``). The trainer is gpt-tiny (4 layers); the job spec
declares a model of the same 4 layers but billions of parameters (a spec
file), which is what the controller prices.

- A pipeline across A100 and A10: a 4.2B model (17 GB of training state per
  layer, priced as the exact runtime holds it: its flat unit gradient and their
  sum besides the state, solver.cost.runtime) fits neither the 2 A100 GPUs nor the 2 A10 GPUs that are free (a
  blocker job holds the rest of the A100s); the controller's only cell that
  fits now is the pipeline a100 (tp 2, 3 layers) + a10 (tp 2, 1 layer).
- Optimizer state sharded by memory across A40 and A10 (Cephalo's case): a
  7.3B model whose training state fits no A40 cell unsharded (a cluster
  without pipelines: max_pp = 1); the job asks for 6 GPUs of a40 or a10, and
  the controller gives it the a40 + a10 cell with the state split by each
  GPU's free memory.

Losses match the single-process reference within 1e-5 (float64).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
from controller_support import SHAPE, write_config
from hetero_runs import Managed, Training, check_losses, check_stages, check_state, job_env, planned_roles, run_job
from support import wait_for

from slurm_ext.config import load
from slurm_ext.controller.round import Controller
from solver.cells import enumerate_cells
from solver.contract.models import load_spec_file
from solver.mixed import parse_key
from solver.types import Cell, ClusterView, JobRequest, NodeView

pytestmark = pytest.mark.slurm

#: 4 layers like gpt-tiny, 17 GB of training state each (16 bytes per parameter); under exact 2 A100s
#: (36 GB usable each) hold 2 layers' state + 2 gradient copies per GPU (42 GB): no, 1.5 layers (32 GB): yes
WIDE = {
    "name": "gpt-wide-4l",
    "family": "gpt",
    "num_layers": 4,
    "hidden": 9344,
    "heads": 16,
    "seq_len": 32,
    "vocab": 256,
}
PIPELINE = Training(steps=8, global_batch=8)
#: 4 layers like gpt-tiny, 29 GB of training state each
CEPHALO = {
    "name": "gpt-cephalo-4l",
    "family": "gpt",
    "num_layers": 4,
    "hidden": 12288,
    "heads": 16,
    "seq_len": 32,
    "vocab": 256,
}
SHARDED = Training(steps=8, global_batch=24, virtual_workers=24)  # one sample per virtual worker


def controller(tmp_path: Path, **solver: object) -> Controller:
    """A controller on the dev cluster with its own state and a fresh profile store; SOLVER: [solver] keys."""
    config = write_config(
        tmp_path / "cellsched.toml", tmp_path / "state.sqlite", profiles_path=str(tmp_path / "profiles.sqlite")
    )
    with config.open("a") as f:
        f.writelines(f"{k} = {json.dumps(v)}\n" for k, v in solver.items())
    return Controller(load(config))


def spec_file(tmp_path: Path, model: dict) -> Path:
    path = tmp_path / f"{model['name']}.json"
    path.write_text(json.dumps(model))
    return path


def probe(model: Path, training: Training, **kw: object) -> JobRequest:
    """A job request of the declared model, to ask the controller's estimator about cells."""
    return JobRequest(
        job_id="probe",
        model=load_spec_file(model),
        global_batch=training.global_batch,
        iterations=training.steps,
        **{"runtime": "adaptive", **kw},
    )


def block(tmp_path: Path, node: str, gpus: int) -> str:
    """An ordinary (unmanaged) job holding GPUS of NODE until it is cancelled; its id once it runs."""
    script = tmp_path / "block.sh"
    script.write_text("#!/bin/bash\nexec sleep 3600\n")
    script.chmod(0o755)
    argv = ["sbatch", "--parsable", "-p", "all", "-w", node, "-N1", "-n1", f"--gres=gpu:{gpus}", "-J", "cs-block"]
    argv += ["-o", "/dev/null", str(script)]
    out = subprocess.run(argv, env=job_env(), capture_output=True, text=True, timeout=30, check=True).stdout
    job_id = out.strip().split(";")[0]

    def running() -> bool:
        state = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%T"], env=job_env(), capture_output=True, text=True, timeout=30
        ).stdout.strip()
        return state == "RUNNING"

    wait_for(running, timeout=60, interval=0.5, what=f"blocker {job_id} on {node} to run")
    return job_id


def test_controller_pipelines_a_job_across_a100_and_a10(slurm_cluster, tmp_path):
    model = spec_file(tmp_path, WIDE)
    ctl = controller(tmp_path)
    blockers = [block(tmp_path, "n2", 4), block(tmp_path, "n1", 2)]  # free now: 2 a100 GPUs on n1, 2 a10 on n6
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    source = Managed(
        ctl,
        (
            "--model",
            str(model),
            "--gpu-types",
            "a100,a10",
            "--global-batch",
            str(PIPELINE.global_batch),
            "--runtime",
            "exact",
        )
        + ("--iterations", str(PIPELINE.steps)),
    )
    try:
        run = run_job(run_dir, PIPELINE, source)
    finally:
        subprocess.run(["scancel", *blockers], env=job_env(), capture_output=True, timeout=30, check=False)

    cell = parse_key(source.placed["cell"])
    assert cell is not None and cell.mixed and cell.pp == 2, source.placed
    assert source.placed["cell"] == "a10x1+a100x1:2x2:pp2", source.placed
    plan = run.plan
    assert plan.cell == source.placed["cell"] and (plan.pp, plan.dp, plan.tp) == (2, 1, 2), plan
    assert plan.gpu_types == ("a10", "a100") and plan.nodes == ("n1", "n6"), plan  # Slurm's task order
    assert plan.stage_layers == (3, 1), plan  # stage 0 on the a100 node: 3 of the 4 layers, the a10's stage 1
    stages = sorted(set(check_stages(run, PIPELINE.config.layers)))
    assert stages == [("n1", 3), ("n6", 1)], stages

    # why this cell: by the controller's estimator, nothing the free GPUs allow fits but the pipeline
    job = probe(model, PIPELINE, runtime="exact")
    mixed = ctl.estimator.estimate(job, cell)
    assert mixed.feasible and mixed.plan.stage_layers == (1, 3), mixed  # priced in part order: a10, a100
    for c in [Cell(t, 1, 2, pp) for t in ("a100", "a10") for pp in (1, 2)]:
        e = ctl.estimator.estimate(job, c)
        assert not e.feasible and e.note.startswith("OOM"), e
    whole = [ctl.estimator.estimate(job, Cell("a100", 1, 4, pp)) for pp in (1, 2, 4)]
    assert min(e.iter_time_s for e in whole) < mixed.iter_time_s, whole  # a whole a100 node would be faster

    worst = check_losses(run, PIPELINE.reference())
    print(
        f"\ncontroller: {plan.cell} on {plan.nodes}, stage_layers {plan.stage_layers}, m {plan.micro_batches}"
        f" (estimate {mixed.iter_time_s:.4f} s, {mixed.mem_per_gpu_gb:.1f} GB); worst relative loss error {worst:.2e}"
    )


def test_controller_shards_state_by_memory_across_a40_and_a10(slurm_cluster, tmp_path):
    model = spec_file(tmp_path, CEPHALO)
    ctl = controller(tmp_path, max_pp=1)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    source = Managed(
        ctl,
        ("--model", str(model), "--gpu-types", "a40,a10", "--min-gpus", "6", "--runtime", "exact")
        + ("--virtual-workers", str(SHARDED.virtual_workers), "--global-batch", str(SHARDED.global_batch))
        + ("--iterations", str(SHARDED.steps)),
    )
    run = run_job(run_dir, SHARDED, source)

    # the Cephalo case: by the controller's estimator, no a40 cell holds the model unsharded
    job = probe(model, SHARDED, virtual_workers=SHARDED.virtual_workers)
    config = ctl.config.solver
    view = ClusterView(tuple(NodeView(n, t, g, g) for n, (t, g) in SHAPE.items()))
    a40 = enumerate_cells(dataclasses.replace(job, gpu_types=("a40",)), view, config)
    assert a40 and all(c.gpu_type == "a40" and c.pp == 1 for c in a40), a40
    unsharded = dataclasses.replace(job, state_sharding=False)
    for c in a40:
        e = ctl.estimator.estimate(unsharded, c)
        assert not e.feasible and e.note.startswith("OOM"), e

    cell = parse_key(source.placed["cell"])
    assert source.placed["cell"] == "a10x1+a40x2:3x2:pp1", source.placed
    mixed = ctl.estimator.estimate(job, cell)
    assert mixed.feasible and mixed.plan.sharded, mixed
    assert not ctl.estimator.estimate(unsharded, cell).feasible  # the mixed cell too fits only sharded
    plan = run.plan
    assert plan.cell == source.placed["cell"] and plan.nodes == ("n4", "n5", "n6"), plan
    assert plan.pp == 1 and plan.dp * plan.tp == 6 and plan.state_sharding == "memory", plan
    # one share per dp rank in task order: its GPU type's free memory (GB) as the estimator priced it
    by_type = dict(zip((t for t, _ in cell.parts), (round(w, 4) for w in mixed.plan.state_shares), strict=True))
    per_node = plan.gpus_per_node // plan.tp
    types = {n: SHAPE[n][0] for n in plan.nodes}
    assert plan.state_shares == tuple(by_type[types[n]] for n in plan.nodes for _ in range(per_node)), plan
    assert by_type["a40"] > by_type["a10"], by_type
    state = check_state(run)  # each rank's slice of the optimizer state follows its share
    a10 = [s for n, s in state if n == "n6"]
    a40_state = [s for n, s in state if n != "n6"]
    assert max(a10) < min(a40_state), state
    for rank, (node, held) in planned_roles(run).items():  # and each rank ran its batch share
        share = plan.batch_shares[held // plan.tp % plan.dp]
        assert run.ranks[rank]["batch"][1] == SHARDED.global_batch * share / sum(plan.batch_shares), (rank, node)

    worst = check_losses(run, SHARDED.reference())
    print(
        f"\ncontroller: {plan.cell} on {plan.nodes}, dp {plan.dp} tp {plan.tp}, batch shares {plan.batch_shares},"
        f" state_shares {plan.state_shares} (estimate {mixed.iter_time_s:.4f} s, {mixed.mem_per_gpu_gb:.1f} GB);"
        f" (node, state elements) {state}; worst relative loss error {worst:.2e}"
    )
