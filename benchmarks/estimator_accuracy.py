"""How close the composed estimate is to real training, on CPU.

1. Profile a small GPT on this machine into a temporary profile store, as
   the job's ranks will use it: each rank is one process on one thread, and
   a job of n ranks keeps n cores busy, which slows each of them (shared
   caches and memory bandwidth: several percent on small micro-batches, a
   fifth on the optimizer step), so the device a rank runs on is "a core
   while n cores work". For every n up to the cores, n processes profile at
   once (``profile_corun``; the mean over them) and store it as GPU type
   ``gpu_type(n)`` ("cpu", "cpu-x2", ...; a GpuSpec with this machine's
   memory, that update bandwidth, intra link "loopback"):
   - layers per tp degree and micro-batch, timed in a stack of the model's
     blocks between the embedding and the head, forward then backward as a
     micro-batch runs them (``profile_layers(stack=layers)``): timed alone,
     a layer finds its weights and activations in cache, which on this CPU
     hides 5-10% of small micro-batches; the tp=2 layers on pairs of the
     processes, a tp group of 2, among the all-reduces they train with
     (``profile_layers(tp_group=...)``, their own time left out): the gloo
     threads and copies of 4 all-reduces a block leave the next matmul cold
     caches, which cost the tp plans' compute 10-25% (measured: the
     trainer's tp=2 ranks spent 147 ms of CPU per step outside collectives
     where the shards profiled without them said 121 ms);
   - the update bandwidth of an AdamW step over the whole model
     (``profile_update(blocks=layers)``: a bigger state sweeps slower).
   Once: the loopback comm curves among 2 gloo processes (p2p, all-reduce,
   all-gather; the mean of 90 calls, each after the same CPU work on every
   rank and on a freshly written buffer, as a step meets its collectives:
   on 2 cores the ranks' skew makes single calls vary by 20-50%, and the
   mean of 30 moved tensor-parallel estimates by 10% from run to run).
   Layers and the update are the median of 11 repeats; each plan runs 20
   timed steps (the median of 6 moved by 5% between runs).
2. Predict each plan's iteration time with the solver's Estimator (source
   "composed", cell ``gpu_type(min(ranks, cores))`` x one node x ranks).
3. Run the reference trainer (minigpt's Trainer, as contrib/examples/train_gpt.py does) under that plan
   on local processes started through the real launcher, with the stage
   split the estimator assumed (plan.stage_layers), and take the median
   steady-state step time over all ranks.

Every rank times each of its steps. A step of the job ends when its slowest
rank does (each step ends in a world all-reduce of the loss), so a step's
time is the maximum over ranks, and `measured_s`, the job's iteration time,
is the median of that over the timed steps; `fastest_s` is their minimum.
`uncontended_s` is the median over steps of the step's time less the
longest time any rank's main thread sat runnable without a CPU that step
(/proc schedstat), i.e. about what the step would take with a core per
rank (the collectives' threads' waits are not subtracted, nor a second
rank's whose wait stalled its peers).

Steps 1-3 run `--passes` times (default 3), each pass with a fresh profile;
a plan's predicted and measured times are each the median over the passes
(`error_pct_passes`: every pass's own error; the summary's
`mape_pct_fitting_passes`: every pass's MAPE, what a one-pass run says). A
shared machine drifts between a profile and the runs a minute later: on 2
loaded cores one pass in five found every plan 4-12% slower than profiled,
1-rank plans included, which no estimate of the plans can know.

Prints one JSON line per plan and a summary with the mean absolute
percentage error (MAPE) of the prediction against `measured_s` (also against
`fastest_s` and `uncontended_s`). Plans with more ranks than cores
oversubscribe the machine, which a per-device estimate cannot know: the
headline MAPE is over the plans that fit (ranks <= cores), the others are
reported separately.

The estimate prices what the reference trainer does: each layer's compute;
under tp, 4 all-reduces of the activation per block and micro-batch (the
trainer's blocks issue Megatron's 4: q, k and v enter the tp region
together), at the all-reduce curve; the pipeline's activation sends; adding
each micro-batch's gradients into the step's (``accumulate_bytes_per_param``
12 B); the dp gradient sum as the trainer does it, an all-gather of every
rank's gradient (``Estimator(grad_sync="allgather")``) at the all-gather
curve, then added in rank order; and the update at the profiled update
bandwidth: the AdamW step and the trainer's four copies of the gradient
(``UPDATE_BYTES_PER_PARAM``; `optimizer_step_s` is the trainer's AdamW
step over the whole model, for comparison). Not in the estimate, so
measured runs are expected a little slower: drawing the batch, the loss
all-reduce ending each step, the pipeline schedule's own work, pipeline
sends beyond the first micro-batch (the schedule overlaps them), and ranks
reaching a collective at different times after long compute (the curves
see the skew of 5 ms of work, not of a whole backward).

With ``--device cuda`` the same three steps run on this machine's first
GPU instead, for the plans one GPU holds (one rank: micro-batches 1 to 8 of
a larger GPT, ``GPU_SHAPE``): layers and the update profiled on the GPU
under its NVML type, the trainer on it (NCCL), each step timed to the GPU's
end of work. Nothing is shared there, so the headline is the plain MAPE.

    python benchmarks/estimator_accuracy.py [--steps 20] [--passes 3] [--quick] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "contrib" / "examples")]  # this tree's solver and launch, not an installed one

SHAPE = {"layers": 4, "hidden": 192, "heads": 4, "seq": 256, "vocab": 256}
BATCH = 8
MICRO_BATCHES = (1, 2, 4, 8)
#: The GPU run: a GPT of about 110M parameters (fp32), big enough that a
#: step is the GPU's work rather than Python's; one rank, 1 to 8 micro-batches.
GPU_SHAPE = {"layers": 8, "hidden": 1024, "heads": 16, "seq": 1024, "vocab": 8192}
GPU_BATCH = 16
GPU_MICRO_BATCHES = (2, 4, 8, 16)
GPU_PLANS = [(1, 1, 1, m) for m in (1, 2, 4, 8)]
#: The trainer's update per parameter (fp32): AdamW's state read and
#: written (2 x 16 B, as profile_update measures it) and its four copies of
#: the gradient (8 B each: flattened, copied into the ordered sum's
#: all-gather buffer (not with dp 1: 0.5% of a step too many there), the
#: sum cloned, cloned back per parameter), all at the profiled update bandwidth.
UPDATE_BYTES_PER_PARAM = 2 * 16 + 4 * 8
#: (pp, dp, tp, micro-batches)
PLANS = [
    (1, 1, 1, 1),
    (1, 1, 1, 2),
    (2, 1, 1, 2),
    (2, 1, 1, 4),
    (1, 2, 1, 1),
    (1, 2, 1, 2),
    (1, 1, 2, 1),
    (1, 1, 2, 2),
    (2, 2, 1, 2),
    (1, 2, 2, 1),
    (2, 2, 2, 2),
]


def model_spec(s: dict = SHAPE):
    from solver.models import spec_from_dict

    return spec_from_dict(
        {
            "name": "gpt-bench" if s == SHAPE else "gpt-bench-gpu",
            "family": "gpt",
            "layers": s["layers"],
            "hidden": s["hidden"],
            "heads": s["heads"],
            "seq_len": s["seq"],
            "vocab": s["vocab"],
            "dtype": "fp32",
        }
    )


# ---------------------------------------------------------------- one rank


def run_delay_s() -> float:
    """Seconds this thread has waited for a CPU while runnable (Linux schedstat)."""
    with open("/proc/thread-self/schedstat", encoding="ascii") as f:
        return int(f.read().split()[1]) / 1e9


def worker(steps: int, warmup: int, shape: dict, batch: int) -> None:
    """One training rank (started by the launcher): prints, per timed step, the
    wall time and how long this rank waited for a CPU (another process had it)."""
    import torch
    from minigpt.model import GPTConfig
    from minigpt.trainer import TrainConfig, Trainer

    from launch.parallel import init_parallel, plan_from_env

    torch.set_num_threads(1)
    cfg = GPTConfig(**shape)
    ctx = init_parallel(plan_from_env(), num_layers=cfg.layers, global_batch=batch)
    trainer = Trainer(ctx, cfg, TrainConfig(global_batch=batch))
    on_gpu = ctx.device.type == "cuda"
    wall, wait = [], []
    for i in range(warmup + steps):
        t0, d0 = time.perf_counter(), run_delay_s()
        trainer.train_step()
        if on_gpu:
            torch.cuda.synchronize(ctx.device)  # the step ends when the GPU's work does
        if i >= warmup:
            wall.append(time.perf_counter() - t0)
            wait.append(run_delay_s() - d0)
    print(json.dumps({"rank": ctx.rank, "wall": wall, "wait": wait}), flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(plan: dict, steps: int, warmup: int, shape: dict, batch: int, timeout: float = 300) -> dict:
    """Run every rank of `plan` as a one-node Slurm step would, through the launcher."""
    n = plan["pp"] * plan["dp"] * plan["tp"]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CELLSCHED_"))}
    base.update(
        {
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
            "CELLSCHED_PLAN": json.dumps(plan),
            "CELLSCHED_MASTER_PORT": str(free_port()),
        }
    )
    step = {
        "SLURM_JOB_ID": "1",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": str(n),
        "SLURM_NNODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_TASKS_PER_NODE": str(n),
    }
    cmd = [
        sys.executable,
        "-m",
        "launch",
        "--",
        sys.executable,
        __file__,
        "--worker",
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--shape",
        json.dumps(shape),
        "--batch",
        str(batch),
    ]
    procs = [
        subprocess.Popen(
            cmd,
            env={**base, **step, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(n)
    ]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    bad = [(r, p.returncode, outs[r][1]) for r, p in enumerate(procs) if p.returncode != 0]
    if bad:
        raise RuntimeError(f"plan {plan}: rank {bad[0][0]} exited {bad[0][1]}:\n{bad[0][2][-2000:]}")
    ranks = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    wall = [max(w) for w in zip(*(r["wall"] for r in ranks), strict=True)]  # a step ends with its slowest rank
    wait = [max(d) for d in zip(*(r["wait"] for r in ranks), strict=True)]
    return {
        "measured_s": statistics.median(wall),
        "fastest_s": min(wall),
        "uncontended_s": statistics.median(w - d for w, d in zip(wall, wait, strict=True)),
        "cpu_wait_pct": 100 * statistics.median(d / w for w, d in zip(wall, wait, strict=True)),
    }


def pct_error(predicted: float, measured: float) -> float:
    return round(100 * (predicted - measured) / measured, 1)


# ------------------------------------------------------- profile + predict


def gpu_type(ranks: int) -> str:
    """The profile of a core while `ranks` cores of this machine run the job's ranks."""
    return "cpu" if ranks == 1 else f"cpu-x{ranks}"


def _corun_worker(index: int, ranks: int, port: int, started, finished, out: str) -> None:
    """One of `ranks` processes profiling at once (spawned): the layers in a
    stack of the model's blocks and the update over the whole model, each
    process on one thread, as a training rank runs; it keeps profiling until
    every process has finished its first pass, so none is measured alone.
    Pairs of processes form tp groups of 2: their tp=2 layers are profiled
    among the all-reduces they train with (``profiler.TPComm``)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from launch import profiler

    torch.set_num_threads(1)
    model = model_spec()
    kw = {"warmup": 3, "repeat": 11}
    tp_group = None
    if ranks > 1:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=index, world_size=ranks, timeout=timedelta(seconds=300)
        )
        pairs = {r: dist.new_group([r - r % 2, r - r % 2 + 1]) for r in range(0, ranks - 1, 2)}  # all ranks make all
        tp_group = pairs.get(index - index % 2)
    started.wait()
    recs = profiler.profile_layers(
        model, tps=(1, 2), micro_batches=MICRO_BATCHES, stack=model.num_layers, tp_group=tp_group, **kw
    )
    gbps = profiler.profile_update(model, blocks=model.num_layers, **kw)
    with finished.get_lock():
        finished.value += 1
    while finished.value < ranks:  # load the machine as the job will until the others are done
        profiler.profile_layers(model, tps=(1,), micro_batches=(MICRO_BATCHES[-1],), stack=model.num_layers, **kw)
    if ranks > 1:
        dist.barrier()  # neither process tears the group down while another is still in it
        dist.destroy_process_group()
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"layers": [r.__dict__ for r in recs], "update_gbps": gbps}, f)


def profile_corun(ranks: int) -> tuple[list, float]:
    """(layer records, update GB/s) of a core while `ranks` cores run alike
    work: `ranks` processes profile at once (``_corun_worker``), and each
    time is the mean over them. The ranks of a job on this machine share its
    memory bandwidth and caches, which a one-process profile cannot see."""
    import multiprocessing as mp

    from solver.profiles.records import LayerRecord

    ctx = mp.get_context("spawn")
    started, finished = ctx.Barrier(ranks), ctx.Value("i", 0)
    with tempfile.TemporaryDirectory(prefix="cellsched-corun-") as tmp:
        outs = [os.path.join(tmp, f"{i}.json") for i in range(ranks)]
        port = free_port()
        procs = [
            ctx.Process(target=_corun_worker, args=(i, ranks, port, started, finished, outs[i])) for i in range(ranks)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        bad = [i for i, proc in enumerate(procs) if proc.exitcode != 0]
        if bad:
            raise RuntimeError(f"co-run profile of {ranks} processes: process {bad[0]} exited {procs[bad[0]].exitcode}")
        runs = []
        for out in outs:
            with open(out, encoding="utf-8") as f:
                runs.append(json.load(f))
    recs = []
    for parts in zip(*(r["layers"] for r in runs), strict=True):
        fields = dict(parts[0], gpu_type=gpu_type(ranks))
        fields["fwd_s"] = statistics.mean(p["fwd_s"] for p in parts)
        fields["bwd_s"] = statistics.mean(p["bwd_s"] for p in parts)
        recs.append(LayerRecord(**fields))
    return recs, statistics.mean(r["update_gbps"] for r in runs)


def cpu_spec(comm, update_gbps: float, name: str = "cpu"):
    """This machine as a "cpu" GpuSpec: its memory, the profiled update bandwidth; ranks talk over loopback."""
    from launch.profiler import LOOPBACK, curve_bandwidth_gbps
    from solver.profiles.records import GpuSpec

    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return GpuSpec(
        name,
        mem_gb=mem_gb,
        peak_tflops=0.1,
        mem_bw_gbps=update_gbps,
        intra_link=LOOPBACK,
        intra_bw_gbps=curve_bandwidth_gbps(comm),
        inter_bw_gbps=curve_bandwidth_gbps(comm),
    )


def optimizer_step_s(shape: dict, device: str = "cpu") -> float:
    """Median seconds of the trainer's AdamW step over the whole model."""
    import torch
    from minigpt.model import GPTConfig, build_full_model
    from minigpt.trainer import make_optimizer

    net = build_full_model(GPTConfig(**shape), seed=0).to(device)
    opt = make_optimizer(net.parameters(), 1e-3)
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def profile_cpu(store, plans: list[tuple[int, int, int, int]], cores: int) -> dict[str, float]:
    """Profile this CPU into `store` as ``gpu_type(n)`` for each rank count the
    plans need (``profile_corun``), with the loopback comm curves; returns the
    update bandwidth (GB/s) per type."""
    from launch import profiler

    comm = profiler.profile_comm(2, link=profiler.LOOPBACK, backend="gloo", repeat=90)
    store.put_comm(comm)
    update_gbps = {}
    for ranks in sorted({min(pp * dp * tp, cores) for pp, dp, tp, _ in plans}):
        layers, gbps = profile_corun(ranks)
        store.put_layers(layers)
        store.put_gpu(cpu_spec(comm, gbps, gpu_type(ranks)))
        update_gbps[gpu_type(ranks)] = gbps
    return update_gbps


def profile_gpu(store, model) -> tuple[str, dict[str, float]]:
    """Profile the first GPU into `store` under its NVML type (layers in a
    stack of the model's blocks, the update over the whole model); returns
    the type and its update bandwidth (GB/s)."""
    import torch

    from launch import profiler
    from solver.profiles.records import GpuSpec

    name = profiler.detect_gpu_type(0)
    kw = {"device": "cuda", "warmup": 3, "repeat": 11}
    store.put_layers(
        profiler.profile_layers(model, micro_batches=GPU_MICRO_BATCHES, gpu_type=name, stack=model.num_layers, **kw)
    )
    gbps = profiler.profile_update(model, blocks=model.num_layers, **kw)
    mem_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    store.put_gpu(GpuSpec(name, mem_gb=mem_gb, peak_tflops=1.0, mem_bw_gbps=gbps))
    return name, {name: gbps}


def one_pass(on_gpu: bool, shape: dict, batch: int, plans: list, cores: int, steps: int, warmup: int) -> dict:
    """Profile this machine into a fresh store, then predict and measure every
    plan: {"device", "update_gbps", "profile_s", "rows": [{plan, predicted_s,
    measure()'s fields}]}."""
    from solver.cost.pipeline import ALLGATHER
    from solver.estimator import Estimator
    from solver.profiles.store import ProfileStore
    from solver.types import Cell, EstimateSource

    model = model_spec(shape)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cellsched-bench-") as tmp, ProfileStore(Path(tmp) / "p.sqlite") as store:
        if on_gpu:
            device_name, update_gbps = profile_gpu(store, model)
        else:
            device_name, update_gbps = "cpu", profile_cpu(store, plans, cores)
        profile_s = time.perf_counter() - t0
        est = Estimator(
            store,
            grad_sync=ALLGATHER,  # the trainer gathers the dp ranks' gradients and adds them in rank order
            accumulate_bytes_per_param=3 * model.dtype_bytes,  # grad += new: read two, write one
            update_bytes_per_param=UPDATE_BYTES_PER_PARAM,
        )
        rows = []
        for pp, dp, tp, m in plans:
            n = pp * dp * tp
            gpu = device_name if on_gpu else gpu_type(min(n, cores))
            cell = Cell(gpu, 1, n, pp)
            assert est.estimate_model(model, batch, cell).source == EstimateSource.COMPOSED
            chosen, predicted = next(
                (p, t) for p, t, _ in est.plans(model, batch, cell) if (p.dp, p.tp, p.micro_batches) == (dp, tp, m)
            )
            plan = {
                "pp": pp,
                "dp": dp,
                "tp": tp,
                "micro_batches": m,
                "global_batch": batch,
                "stage_layers": list(chosen.stage_layers or (model.num_layers,)),
            }
            rows.append({**plan, "predicted_s": predicted, **measure(plan, steps, warmup, shape, batch)})
    return {"device": device_name, "update_gbps": update_gbps, "profile_s": profile_s, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per plan")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per plan")
    ap.add_argument(
        "--passes",
        type=int,
        default=3,
        help="profile-predict-measure passes; a plan's prediction and measurement are each their median (default: 3)",
    )
    ap.add_argument("--quick", action="store_true", help="only the plans that fit the cores")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="profile and train on (default: cpu)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shape", type=json.loads, default=SHAPE, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=BATCH, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.steps, args.warmup, args.shape, args.batch)
        return 0
    if args.passes < 1:
        ap.error("--passes must be at least 1")

    import torch

    on_gpu = args.device == "cuda"
    if not on_gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a CPU run's profiles and ranks (inherited) stay off any GPU
    torch.set_num_threads(1)
    if on_gpu and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no GPU here")
    shape, batch, plans = (GPU_SHAPE, GPU_BATCH, GPU_PLANS) if on_gpu else (SHAPE, BATCH, PLANS)
    cores = len(os.sched_getaffinity(0))
    if args.quick and not on_gpu:
        plans = [p for p in plans if p[0] * p[1] * p[2] <= cores]
    t_start = time.perf_counter()
    passes = [one_pass(on_gpu, shape, batch, plans, cores, args.steps, args.warmup) for _ in range(args.passes)]

    def row_of(runs: list[dict]) -> dict:
        """One plan over the passes: the medians of its predictions and of its measured fields."""
        first = runs[0]
        n = first["pp"] * first["dp"] * first["tp"]
        predicted = statistics.median(r["predicted_s"] for r in runs)
        got = {
            k: statistics.median(r[k] for r in runs)
            for k in ("measured_s", "fastest_s", "uncontended_s", "cpu_wait_pct")
        }
        return {
            **{k: first[k] for k in ("pp", "dp", "tp", "micro_batches")},
            "micro_batch_size": batch // first["dp"] // first["micro_batches"],
            "ranks": n,
            "oversubscribed": not on_gpu and n > cores,
            "stage_layers": first["stage_layers"],
            "predicted_s": round(predicted, 4),
            **{k: round(v, 4) for k, v in got.items()},
            "error_pct": pct_error(predicted, got["measured_s"]),
            "error_fastest_pct": pct_error(predicted, got["fastest_s"]),
            "error_uncontended_pct": pct_error(predicted, got["uncontended_s"]),
            "error_pct_passes": [pct_error(r["predicted_s"], r["measured_s"]) for r in runs],
        }

    rows = [row_of(list(runs)) for runs in zip(*(p["rows"] for p in passes), strict=True)]
    for row in rows:
        print(json.dumps(row), flush=True)

    def mape(key: str, over: bool | None = None) -> float | None:
        errs = [abs(r[key]) for r in rows if over is None or r["oversubscribed"] == over]
        return round(statistics.mean(errs), 1) if errs else None

    fitting = [r for r in rows if not r["oversubscribed"]]
    print(
        json.dumps(
            {
                "summary": "estimator accuracy",
                "device": passes[0]["device"],
                "model": model_spec(shape).signature,
                "global_batch": batch,
                "cores": cores,
                "passes": args.passes,
                "plans": len(rows),
                "plans_oversubscribed": sum(r["oversubscribed"] for r in rows),
                "mape_pct_fitting": mape("error_pct", False),
                "mape_pct_oversubscribed": mape("error_pct", True),
                # each pass on its own, as a one-pass run would have said
                "mape_pct_fitting_passes": [
                    round(statistics.mean(abs(r["error_pct_passes"][k]) for r in fitting), 1) if fitting else None
                    for k in range(args.passes)
                ],
                "mape_fastest_pct_fitting": mape("error_fastest_pct", False),
                "mape_uncontended_pct_fitting": mape("error_uncontended_pct", False),
                "mape_uncontended_pct_oversubscribed": mape("error_uncontended_pct", True),
                "mape_uncontended_pct_all": mape("error_uncontended_pct"),
                "optimizer_step_s": round(optimizer_step_s(shape, args.device), 4),
                "update_gbps": {
                    k: round(statistics.median(p["update_gbps"][k] for p in passes), 2)
                    for k in passes[0]["update_gbps"]
                },
                "profile_s": round(sum(p["profile_s"] for p in passes), 1),
                "total_s": round(time.perf_counter() - t_start, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
