"""Mixed cells measured: the simulator's composition of a mixed cell against
real steps of ranks of unequal speed.

The simulator's truth of a mixed cell (slurm_ext.sim.conditions.mixed_time,
through ``table_speed(table, mixed=True)``) is composed from the truth
table's single-type cells: each part's compute at the samples its ranks run,
one gradient sync, the update (data parallel, at the plan's batch shares);
for a pipeline across types, MixedEstimator's pipeline priced from per-layer
costs scaled to the table. Here the table is measured, and so are the mixed
steps the composition predicts.

**GPU speeds on CPU ranks.** Each rank is one process on one thread that, once
built (imports, model, a first step at full speed), moves itself into a
cgroup (v1 ``cpu`` controller, /sys/fs/cgroup/cpu/cellsched-mixed/<rank>) whose
CFS quota lets it run QUOTA[type] of a core (``cpu.cfs_quota_us`` /
``cpu.cfs_period_us``, period 10 ms); the groups' ``cpu.shares`` are high, so
that other work on the machine does not take their quota (the quota, not the
load, binds: each step records the rank's CPU seconds over its wall seconds,
reported as `cpu_rate`). "cpufast" runs half a core, "cpuslow" a quarter: a
2x speed ratio (about A100 to V100 in Arena's tables). The emulation slows a
rank's communication with its compute (gloo runs on the same throttled
thread), where a GPU's network does not: the model's gradients are 7.6 MB, a
few ms on loopback against seconds of compute.

**Why local processes, not the dev cluster:** a step is the same code either
way (the reference trainer, contrib/examples/minigpt, under the plan through
the real launcher, ``python -m launch``, with the Slurm step's environment, as
benchmarks/estimator_accuracy.py runs it); the dev cluster's nodes are this
same machine, and slurmd would add only the start-up, which is not timed.

Per pass, each on the ``exact`` runtime (``--runtime sharded`` also):

1. the table: one rank of each type alone with the whole batch (a 1-GPU cell,
   what a truth table holds);
2. the composition's predictions, from that table (`predict`): data parallel
   over one rank of each type at the composition's own best batch shares and
   at even shares, and the pipeline across the two types it finds best
   (stage layers, micro-batches);
3. those plans run, the step time the slowest rank's (each step ends in a
   world all-reduce of the loss), the median over the timed steps.

Each plan's error is |predicted - measured| / measured, per pass; prints one
JSON line per plan and pass and a summary (mean error per plan over passes,
min-max, the load average). Needs root (cgroups).

    python benchmarks/mixed_real.py [--passes 3] [--steps 4] [--runtime exact] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from local_step import run_step  # beside this script

#: the reference trainer (minigpt): an example job, not part of the package
EXAMPLES = Path(__file__).resolve().parents[1] / "contrib" / "examples"
sys.path.insert(0, str(EXAMPLES))

SHAPE = {"layers": 4, "hidden": 192, "heads": 4, "seq": 256, "vocab": 256}
BATCH = 8
#: fraction of one core per rank of each emulated type
QUOTA = {"cpufast": 0.5, "cpuslow": 0.25}
PERIOD_US = 10_000
CGROUP = Path("/sys/fs/cgroup/cpu/cellsched-mixed")
SHARES = 32768


def model_spec() -> Any:
    from solver.contract.models import spec_from_dict

    return spec_from_dict(
        {
            "name": "gpt-mixed-bench",
            "family": "gpt",
            "layers": SHAPE["layers"],
            "hidden": SHAPE["hidden"],
            "heads": SHAPE["heads"],
            "seq_len": SHAPE["seq"],
            "vocab": SHAPE["vocab"],
            "dtype": "fp32",
        }
    )


def job_spec(runtime: str) -> Any:
    from solver.contract.jobspec import JobSpec

    m = model_spec()
    model_def = {
        "name": m.name,
        "family": "gpt",
        "layers": m.num_layers,
        "hidden": m.hidden,
        "heads": m.heads,
        "seq_len": m.seq_len,
        "vocab": m.vocab,
        "dtype": "fp32",
    }
    return JobSpec(model=m.name, model_def=model_def, global_batch=BATCH, iterations=1, runtime=runtime)


# --------------------------------------------------------------------------- the composition


class MeasuredTable:
    """A truth table of the 1-GPU cells measured here (iter_time), with the
    per-layer costs a pipeline across types is priced from (the datasheet's:
    the "cpu" placeholder spec scaled by each type's quota, calibrated to
    the table as ArenaEstimates calibrates to Arena's)."""

    def __init__(self, times: dict[str, float]) -> None:
        from solver.contract.profiles.gpus import default_gpu_specs
        from solver.contract.profiles.records import CellRecord
        from solver.contract.profiles.store import ProfileStore
        from solver.estimator import Estimator

        self.times = times
        cpu = default_gpu_specs()["cpu"]
        store = ProfileStore(":memory:")
        for t, q in QUOTA.items():
            store.put_gpu(_scaled_spec(cpu, t, q))
        store.put_cells(CellRecord(model_spec().name, BATCH, t, 1, 1, s) for t, s in times.items())
        self.est = Estimator(store)

    def iter_time(self, model: str, batch: int, gpu_type: str, num_nodes: int, gpus_per_node: int) -> float | None:
        if (model, batch, num_nodes, gpus_per_node) != (model_spec().name, BATCH, 1, 1):
            return None
        return self.times.get(gpu_type)

    @property
    def cost_model(self) -> Any:
        """What pipelines across types are priced from: our estimator over the table's times."""
        return self.est


def _scaled_spec(cpu: Any, name: str, q: float) -> Any:
    import dataclasses

    return dataclasses.replace(cpu, name=name, peak_tflops=cpu.peak_tflops * q, mem_bw_gbps=cpu.mem_bw_gbps * q)


FAST, SLOW = "cpufast-1", "cpuslow-1"


def plans_and_predictions(times: dict[str, float], runtime: str) -> dict[str, tuple[dict, float | None]]:
    """name -> (the plan to run, the composition's time for it)."""
    from slurm_ext.sim.conditions import MixedEstimator, TableTruth, table_speed
    from solver.contract.plan import JobPlan
    from solver.mixed.cells import mixed_cell
    from solver.types import JobRequest

    table = MeasuredTable(times)
    speed = table_speed(table, mixed=True)
    spec = job_spec(runtime)
    truth = MixedEstimator(TableTruth(table))
    job = JobRequest("bench", model_spec(), BATCH, 1, runtime=runtime)
    out: dict[str, tuple[dict, float | None]] = {}
    dp_cell = mixed_cell((("cpufast", 1), ("cpuslow", 1)), 1, 1)
    est = truth.estimate(job, dp_cell)
    shares = tuple(float(s) for s in est.plan.shares) if est.plan is not None else (1.0, 1.0)
    for name, sh in (("dp-balanced", shares), ("dp-even", (1.0, 1.0))):
        plan = JobPlan(
            pp=1, dp=2, tp=1, micro_batches=1, global_batch=BATCH, batch_shares=sh, nodes=(FAST, SLOW),
            gpus_per_node=1, cell=dp_cell.key(), runtime=runtime,
        )  # fmt: skip
        out[name] = (_plan_dict(plan), speed(spec, "cpufast+cpuslow", 2, 1, plan))
    pp_cell = mixed_cell((("cpufast", 1), ("cpuslow", 1)), 1, 2)
    pest = truth.estimate(job, pp_cell)
    if pest.feasible and pest.plan is not None:
        m = max(2, pest.plan.micro_batches)
        plan = JobPlan(
            pp=2, dp=1, tp=1, micro_batches=m, global_batch=BATCH, stage_layers=tuple(pest.plan.stage_layers),
            nodes=(FAST, SLOW), gpus_per_node=1, cell=pp_cell.key(), runtime=runtime,
        )  # fmt: skip
        pred = speed(spec, "cpufast+cpuslow", 2, 1, plan)
        if m != pest.plan.micro_batches:
            pred = None  # the composition's own plan cannot run here
        out["pipeline"] = (_plan_dict(plan), pred)
    else:
        print(f"# no pipeline across types: {pest.note}", file=sys.stderr)
    return out


def _plan_dict(plan: Any) -> dict:
    from dataclasses import asdict

    return {k: v for k, v in asdict(plan).items() if v not in (None, (), [])}


# --------------------------------------------------------------------------- cgroups


@contextlib.contextmanager
def cgroups(ranks: int) -> Iterator[dict[str, Path]]:
    """type -> the cgroup directory of each (type, rank) pair: `<type>-<rank>`."""
    made: list[Path] = []
    try:
        CGROUP.mkdir(exist_ok=True)
        (CGROUP / "cpu.shares").write_text(str(SHARES))  # the parent competes with the machine's other work
        out = {}
        for t, q in QUOTA.items():
            for r in range(ranks):
                d = CGROUP / f"{t}-{r}"
                d.mkdir(exist_ok=True)
                made.append(d)
                (d / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (d / "cpu.cfs_quota_us").write_text(str(int(PERIOD_US * q)))
                (d / "cpu.shares").write_text(str(SHARES))
                out[f"{t}-{r}"] = d
        yield out
    finally:
        for d in made:
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            CGROUP.rmdir()


# --------------------------------------------------------------------------- one rank


def worker(steps: int, warmup: int) -> None:
    """One training rank (started by the launcher): one step at full speed,
    then into its cgroup, then per step its wall and CPU seconds."""
    import torch
    from minigpt.model import GPTConfig
    from minigpt.trainer import TrainConfig, Trainer

    from launch.parallel import init_parallel, plan_from_env

    torch.set_num_threads(1)
    cfg = GPTConfig(**SHAPE)
    plan = plan_from_env()
    ctx = init_parallel(
        plan, num_layers=cfg.layers, global_batch=BATCH, split_batch=(plan.runtime or "exact") == "exact"
    )
    trainer = Trainer(ctx, cfg, TrainConfig(global_batch=BATCH))
    trainer.train_step()
    group = os.environ.get("MIXED_CGROUP", "")
    if group:
        Path(group, "cgroup.procs").write_text(str(os.getpid()))
    torch.distributed.barrier()
    wall, cpu = [], []
    for i in range(warmup + steps):
        t0, c0 = time.perf_counter(), time.process_time()
        trainer.train_step()
        if i >= warmup:
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    print(json.dumps({"rank": ctx.rank, "wall": wall, "cpu": cpu}), flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def measure(plan: dict, groups: list[Path], steps: int, warmup: int, timeout: float = 300) -> dict:
    """Run every rank of `plan` through the launcher, rank r in groups[r]."""
    worker = [__file__, "--worker", "--steps", str(steps), "--warmup", str(warmup)]
    ranks = run_step(
        plan, worker, pythonpath=[EXAMPLES], timeout=timeout, rank_env=lambda r: {"MIXED_CGROUP": str(groups[r])}
    )
    ranks.sort(key=lambda r: r["rank"])
    wall = [max(w) for w in zip(*(r["wall"] for r in ranks), strict=True)]
    return {
        "measured_s": statistics.median(wall),
        "steps_s": [round(w, 4) for w in wall],
        "cpu_rate": [round(sum(r["cpu"]) / sum(r["wall"]), 3) for r in ranks],
    }


def alone_plan(t: str, runtime: str) -> dict:
    return {
        "pp": 1, "dp": 1, "tp": 1, "micro_batches": 1, "global_batch": BATCH, "nodes": [f"{t}-1"],
        "gpus_per_node": 1, "runtime": runtime,
    }  # fmt: skip


# --------------------------------------------------------------------------- driver


def one_pass(k: int, runtime: str, groups: dict[str, Path], steps: int, warmup: int) -> list[dict]:
    rows = []
    times = {}
    for t in QUOTA:
        got = measure(alone_plan(t, runtime), [groups[f"{t}-0"]], steps, warmup)
        times[t] = got["measured_s"]
        rows.append({"pass": k, "runtime": runtime, "plan": f"{t} alone", **got})
        emit(rows[-1])
    for name, (plan, pred) in plans_and_predictions(times, runtime).items():
        order = [groups["cpufast-0"], groups["cpuslow-0"]]  # rank 0 on the fast "node", rank 1 on the slow
        got = measure(plan, order, steps, warmup)
        err = abs(pred - got["measured_s"]) / got["measured_s"] if pred else None
        row = {"pass": k, "runtime": runtime, "plan": name, "predicted_s": pred, **got, "error": err}
        row["shares"] = plan.get("batch_shares")
        row["stage_layers"] = plan.get("stage_layers")
        row["micro_batches"] = plan.get("micro_batches")
        rows.append(row)
        emit(row)
    return rows


def emit(row: dict) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if OUT["file"] is not None:
        print(line, file=OUT["file"], flush=True)


OUT: dict[str, Any] = {"file": None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--runtime", action="append", help="exact (default) and/or sharded")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.steps, a.warmup)
        return 0
    if os.geteuid() != 0 or not Path("/sys/fs/cgroup/cpu").is_dir():
        print("mixed_real.py: needs root and the cgroup v1 cpu controller", file=sys.stderr)
        return 4
    OUT["file"] = open(a.out, "w") if a.out else None  # noqa: SIM115 (closed at exit)
    load0 = os.getloadavg()[0]
    rows: list[dict] = []
    with cgroups(1) as groups:
        for k in range(a.passes):
            for runtime in a.runtime or ["exact"]:
                rows += one_pass(k, runtime, groups, a.steps, a.warmup)
    summary: dict[str, Any] = {"summary": True, "load_start": load0, "load_end": os.getloadavg()[0]}
    for runtime in a.runtime or ["exact"]:
        for name in dict.fromkeys(r["plan"] for r in rows if r["runtime"] == runtime):
            mine = [r for r in rows if r["runtime"] == runtime and r["plan"] == name]
            errs = [r["error"] for r in mine if r.get("error") is not None]
            key = f"{runtime}/{name}"
            summary[key] = {
                "measured_s": [round(r["measured_s"], 3) for r in mine],
                "predicted_s": [round(r["predicted_s"], 3) for r in mine if r.get("predicted_s")],
                "mean_error": round(statistics.mean(errs), 4) if errs else None,
                "error_range": [round(min(errs), 4), round(max(errs), 4)] if errs else None,
                "cpu_rate": [r["cpu_rate"] for r in mine],
            }
    all_errs = [r["error"] for r in rows if r.get("error") is not None]
    summary["mean_error_all_mixed"] = round(statistics.mean(all_errs), 4) if all_errs else None
    emit(summary)
    if OUT["file"] is not None:
        OUT["file"].close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
