"""The reference trainer as a batch job on the dev cluster, under a plan from
a given source, and the checks that it ran the plan and trained like the
single-process reference.

A plan source is a function ``submit(script, out) -> job id`` that submits
the job script and leaves the job released with its plan in its AdminComment
(where ``cellsched-launch`` reads it): ``explicit_plan`` writes a given plan
with scontrol, as the controller would; ``Managed`` submits the job through
``cellsched sbatch`` with a job spec and lets a real controller round choose
the cell and write the plan.
``run_job`` waits for the job to end and reads back the plan it ran under,
so the checks (``check_losses``, ``check_stages``, ``check_state``) hold for
any source. Needs the ``slurm_cluster`` fixture (SLURM_CONF set) and
contrib/examples on sys.path (the launch and controller conftests put it
there).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minigpt.model import GPTConfig
from minigpt.trainer import TrainConfig, reference_losses
from support import slurm, wait_for

from launch.layout import split_layers
from launch.scontrol import admin_comment_json
from solver.contract import PLAN_KEY, admin_comment_plan
from solver.contract.plan import JobPlan, largest_remainder

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "contrib" / "examples" / "train_gpt.py"

#: (job script, output directory) -> job id, released with its plan in its AdminComment
Submit = Callable[[Path, Path], str]


@dataclass(frozen=True)
class Training:
    """What the job trains: a model preset, steps, samples per step, virtual workers, dtype."""

    model: str = "gpt-tiny"
    steps: int = 8
    global_batch: int = 8
    virtual_workers: int = 1
    dtype: str = "float64"

    @property
    def config(self) -> GPTConfig:
        return GPTConfig.from_preset(self.model)

    def reference(self) -> list[float]:
        """The single-process losses of the same training."""
        tc = TrainConfig(global_batch=self.global_batch, dtype=self.dtype)
        return reference_losses(self.config, tc, self.steps, virtual_workers=self.virtual_workers)

    def command(self, out: Path) -> list[str]:
        """``srun cellsched-launch -- python train_gpt.py ...``, results under OUT."""
        launcher = shutil.which("cellsched-launch", path=job_env()["PATH"])
        if launcher is None:
            raise AssertionError("cellsched-launch is not on PATH")
        return [
            "srun",
            launcher,
            "--",
            sys.executable,
            str(TRAIN),
            "--model",
            self.model,
            "--dtype",
            self.dtype,
            "--global-batch",
            str(self.global_batch),
            "--steps",
            str(self.steps),
            "--out",
            str(out / "losses.json"),
            "--report",
            str(out / "report"),
        ]


@dataclass(frozen=True)
class Run:
    """A finished job: its id, the plan it ran under, rank 0's losses, each rank's reports."""

    job_id: str
    plan: JobPlan
    losses: list[float]
    ranks: list[dict] = field(repr=False)  #: train_gpt --report rank-R.json, by rank
    states: list[dict] = field(repr=False)  #: train_gpt --report state-R.json, by rank


def job_env(**extra: str) -> dict[str, str]:
    """The environment of a test job: no outer Slurm step or plan, one thread, this interpreter first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_JOB", "SLURM_STEP", "CELLSCHED_"))}
    path = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, "OMP_NUM_THREADS": "1", "PATH": path, **extra}


def _slurm(*argv: str) -> str:
    return slurm(*argv, env=job_env())


def explicit_plan(plan: JobPlan, sbatch_args: Sequence[str]) -> Submit:
    """A source that submits the job held (SBATCH_ARGS: its nodes, tasks and
    GPUs), writes PLAN (with the job's id) into its AdminComment as the
    controller does, and releases it."""

    def submit(script: Path, out: Path) -> str:
        argv = ["sbatch", "--parsable", "--hold", *sbatch_args, "-o", str(out / "job-%j.out"), str(script)]
        job_id = _slurm(*argv).strip().split(";")[0]
        comment = json.dumps({PLAN_KEY: json.loads(plan_for(plan, job_id).to_json())}, separators=(",", ":"))
        _slurm("scontrol", "update", f"JobId={job_id}", f"AdminComment={comment}")
        _slurm("scontrol", "release", job_id)
        return job_id

    return submit


@dataclass
class Managed:
    """A source through the controller: submits the job script with
    ``cellsched sbatch OPTIONS`` (the job spec: --model, --gpu-types, ...),
    from the job's output directory (its working directory), then runs one
    round of CONTROLLER (a ``slurm_ext.controller.round.Controller``), which
    must place it; `placed` keeps that round's placement of the job (cell,
    nodes, pp, dp, tp) and `round` the round's report."""

    controller: Any
    options: tuple[str, ...]
    placed: dict = field(default_factory=dict)
    round: Any = None

    def __call__(self, script: Path, out: Path) -> str:
        argv = [sys.executable, "-m", "slurm_ext", "sbatch", "--parsable", *self.options]
        argv += ["-o", str(out / "job-%j.out"), "--", str(script)]
        done = subprocess.run(argv, cwd=out, env=job_env(), capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, f"cellsched sbatch exited {done.returncode}: {done.stderr[-2000:]}"
        job_id = done.stdout.strip().splitlines()[-1]
        assert job_id.isdigit(), done.stdout
        self.round = self.controller.round()
        acted = [a for a in self.round.actions if a["job"] == job_id]
        assert acted and acted[0]["kind"] == "place" and acted[0]["ok"], (self.round.actions, self.round.jobs)
        self.placed = dict(self.round.placements[job_id])
        return job_id


def plan_for(plan: JobPlan, job_id: str) -> JobPlan:
    return JobPlan.from_dict({**json.loads(plan.to_json()), "job_id": job_id})


def _job_line(job_id: str) -> str:
    return _slurm("scontrol", "show", "-o", "job", job_id)


def _state(line: str) -> str:
    return line.split("JobState=", 1)[1].split()[0]


def run_job(tmp_path: Path, training: Training, submit: Submit, timeout: float = 180) -> Run:
    """Submit TRAINING's job through SUBMIT, wait for it to end, and read its results."""
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\nexec {shlex.join(training.command(tmp_path))}\n")
    script.chmod(0o755)
    job_id = submit(script, tmp_path)
    try:

        def ended() -> str | None:
            line = _job_line(job_id)
            return None if _state(line) in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED") else line

        line = wait_for(ended, timeout=timeout, interval=0.5, what=f"job {job_id} to end")
    finally:
        subprocess.run(["scancel", job_id], env=job_env(), capture_output=True, timeout=30, check=False)
    log = "\n".join(p.read_text()[-4000:] for p in tmp_path.glob("job-*.out"))
    assert _state(line) == "COMPLETED", f"job {job_id} ended {_state(line)}:\n{log}"
    plan = admin_comment_plan(admin_comment_json(line))
    assert plan is not None, f"job {job_id} has no plan in its AdminComment: {line}"
    n = plan.world_size
    report = tmp_path / "report"
    return Run(
        job_id=job_id,
        plan=plan,
        losses=json.loads((tmp_path / "losses.json").read_text())["losses"],
        ranks=[json.loads((report / f"rank-{r}.json").read_text()) for r in range(n)],
        states=[json.loads((report / f"state-{r}.json").read_text()) for r in range(n)],
    )


def check_losses(run: Run, reference: Sequence[float], rel: float = 1e-15) -> float:
    """The job's losses are the reference's within REL (relative); the worst error.
    1e-15 is what docs/submitting.md states for float64 (the same plans run
    locally: at most 6.4e-16)."""
    assert len(run.losses) == len(reference), (len(run.losses), len(reference))
    assert run.losses[-1] < run.losses[0], run.losses
    worst = max(abs(a - b) / abs(b) for a, b in zip(run.losses, reference, strict=True))
    assert worst <= rel, f"losses differ from the reference by {worst:.2e} (relative): {run.losses} vs {reference}"
    return worst


def planned_roles(run: Run) -> dict[int, tuple[str, int]]:
    """Step rank -> (its node, the rank its node's task held in the plan's
    task order over ``plan.nodes``), from the ranks' reports: every node
    holds as many tasks in both orders, the same ones (by local order)."""
    on_node: dict[str, list[int]] = {}
    for info in run.ranks:
        on_node.setdefault(info["node"], []).append(info["rank"])
    plan_nodes = run.plan.nodes
    assert sorted(plan_nodes) == sorted(on_node), f"the job ran on {sorted(on_node)}, the plan names {plan_nodes}"
    roles, start = {}, 0
    for node in plan_nodes:
        for i, rank in enumerate(sorted(on_node[node])):
            roles[rank] = (node, start + i)
        start += len(on_node[node])
    return roles


def check_stages(run: Run, num_layers: int) -> list[tuple[str, int]]:
    """Every rank ran the layers of the plan stage its node had (the plan's
    stage_layers, in the plan's node order); the (node, layers) of each step stage."""
    plan = run.plan
    assert plan.stage_layers is not None and len(plan.stage_layers) == plan.pp, plan
    per_stage = plan.dp * plan.tp
    step_stages = split_layers(num_layers, plan.pp, _step_values(run, "pp", plan.stage_layers))
    seen = []
    for rank, (node, held) in sorted(planned_roles(run).items()):
        info = run.ranks[rank]
        want = plan.stage_layers[held // per_stage]
        assert len(info["stage_layers"]) == want, f"rank {rank} on {node} ran {info['stage_layers']}, plan: {want}"
        assert info["stage_layers"] == list(step_stages[info["coords"][0]]), info
        seen.append((node, len(info["stage_layers"])))
    return seen


def check_state(run: Run) -> list[tuple[str, int]]:
    """Optimizer state sharded by the plan's state_shares: each rank's slice of
    its stage's parameters follows the share its node's dp rank had in the
    plan, holds AdamW's two moments of that slice only, and the slices of a
    dp group cover the parameters once; the (node, state elements) of each rank."""
    plan = run.plan
    assert plan.state_shares is not None and len(plan.state_shares) == plan.dp, plan
    seen = []
    for rank, (node, held) in sorted(planned_roles(run).items()):
        st = run.states[rank]
        assert st["mode"] == "memory", st
        share = plan.state_shares[held // plan.tp % plan.dp]
        (start, stop) = st["slice"]
        exact = st["param_numel"] * share / sum(plan.state_shares)
        assert abs((stop - start) - exact) < 1, f"rank {rank} on {node}: slice {stop - start}, share {exact:.1f}"
        sizes = list(largest_remainder(st["param_numel"], _step_values(run, "dp", plan.state_shares)))
        assert [b - a for a, b in st["bounds"]] == sizes, (st["bounds"], sizes)
        assert st["state_numel"] == 2 * (stop - start), st  # exp_avg and exp_avg_sq of the slice, nothing more
        seen.append((node, st["state_numel"]))
    return seen


def _step_values(run: Run, dim: str, values: Sequence) -> tuple:
    """VALUES (per plan stage or dp rank) as the step's ranks took them, from the reports."""
    per = {"pp": run.plan.dp * run.plan.tp, "dp": run.plan.tp}[dim]
    size = {"pp": run.plan.pp, "dp": run.plan.dp}[dim]
    out: dict[int, object] = {}
    for rank, (_, held) in planned_roles(run).items():
        coord = run.ranks[rank]["coords"][0 if dim == "pp" else 1]
        out.setdefault(coord, values[held // per % size])
    return tuple(out[i] for i in range(size))
