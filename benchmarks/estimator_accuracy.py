"""How close the controller's estimator is to real training, per runtime, on CPU.

The estimator measured is the one the controller builds
(``slurm_ext.controller.speeds.make_estimator``: ``MixedEstimator(Estimator(
open_store(profiles_path), state_sharding=...))``, its defaults), over a
store seeded as the controller's is, and each job priced by its runtime
(``JobRequest.runtime``, ``solver.cost.runtime``). Per runtime mode
(``exact``: virtual workers and the ordered all-gather sum; ``sharded``:
FSDP2 x DTensor TP x pipelining, where this tree has ``launch.sharded``):

1. Profile a small GPT on this machine into that store, as ``cellsched-launch
   profile`` would, at the micro-batch sizes of ``PROFILED`` only: the
   layers per tp degree (``launch.profiler.profile_layers``, a stack of the
   model's blocks, the tp=2 layers on a tp group of 2 processes among their
   all-reduces), the AdamW update bandwidth (``profile_update``) and the
   loopback comm curves among 2 gloo processes. The job's ranks run one per
   core with every core busy, so the profile is taken the same way: as many
   processes as the plans have ranks (``RANKS``, at most the cores) profile
   at once, the mean over them, stored as one GPU type, "cpu".
2. Predict each held-out plan: plans whose micro-batch sizes were NOT
   profiled (``HELD_OUT``), priced from the nearest profiled size per
   sample. Time and per-rank peak memory are the estimator's for that
   (pp, dp, tp, micro-batches, V) in a one-node cell of "cpu" GPUs
   (``Estimator.plans(..., runtime=...)``, the same candidates
   ``estimate`` chooses from).
3. Run the reference trainer (contrib/examples/minigpt) under that plan, its
   ``runtime`` field set, on local processes started through the real
   launcher with gloo, one thread each: the step time is the slowest rank's
   (each step ends in a world all-reduce of the loss), `measured_s` the
   median over the timed steps. After them, one more step is run under
   ``torch.profiler`` with ``profile_memory``: the bytes of the live tensors
   at the step's start (every tensor the garbage collector tracks, each
   storage once) plus the largest running sum of the allocations and frees
   the profiler saw in the step (an allocation at its op's start, a free at
   its event) is the rank's peak; `measured_peak_mb` is the largest over
   the ranks, as the estimate is of the busiest stage.

Prints one JSON line per plan and one per runtime with `runtime`,
`mape_pct_heldout` (mean absolute percentage error of the time over the
held-out plans) and `memory_err_pct` (mean absolute percentage error of
the peak memory), then a summary. Plans with more ranks than cores are
left out (a per-device estimate cannot know an oversubscribed machine):
on CPU a "GPU" of the cell is one core, each rank one process on one
thread (``OMP_NUM_THREADS=1``), so on a 2-core machine every plan has 2
ranks. Each pass profiles afresh, predicts and measures; a plan's
prediction and measurement are their medians over the passes (3 by
default), and the summary's means are over every plan timed. The summary
records the 1-minute load average at the start and the end: other work on
the cores slows the steps (``cpu_wait_pct``), which no estimate can know;
so does a VM's host taking its CPUs for other guests (``steal_pct`` of the
steps, ``profile_steal_pct_passes`` of the profiles: /proc/stat's steal
over every CPU's time).

For ``sharded`` the layers are also profiled as that runtime wraps them
(``profile_layers(runtime="sharded")``: FSDP2 over one rank on every block
and the stage, DTensor's tp plan on a tp group of 2), stored under
``cpu@sharded``, from which the estimator prices its plans.

What the estimate prices (solver.cost.runtime): each layer's compute (for
``sharded`` as it wraps the layers; a held-out size between the profiled
ones on the line through their times, ``Estimator._ref``); under
tp, 4 all-reduces of the activation per block and micro-batch; the
pipeline's activation sends; the autograd's adds of each micro-batch's
gradients into the step's; exact: the all-gather of every unit's gradient
at the all-gather curve, its copies and the ordered sum's adds at the
update bandwidth, and the receive buffers in memory; sharded: FSDP's
parameter all-gathers and gradient reduce-scatters and its sharded state;
the AdamW update at the profiled update bandwidth. Not in it: drawing the
batch, the loss all-reduce ending each step, the pipeline schedule's own
work.

With ``--device cuda`` the exact runtime runs on this machine's first GPU
(one rank, a larger GPT, ``GPU_SHAPE``): the layers profiled at
``GPU_PROFILED`` micro-batch sizes, the plans at the others, and the memory
is ``torch.cuda.max_memory_allocated``.

    python benchmarks/estimator_accuracy.py [--steps 10] [--passes 3] [--runtime exact ...] [--quick] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from local_step import free_port, run_step  # beside this script

#: the reference trainer (minigpt): an example job, not part of the package
EXAMPLES = Path(__file__).resolve().parents[1] / "contrib" / "examples"
sys.path.insert(0, str(EXAMPLES))

SHAPE = {"layers": 4, "hidden": 192, "heads": 4, "seq": 256, "vocab": 256}
BATCH = 8
#: micro-batch sizes profiled; every plan below runs others (held out)
PROFILED = (1, 4)
HELD_OUT = (2, 8)
#: runtimes whose layers are also profiled as the runtime wraps them (launch.profiler.WRAPPED_RUNTIMES)
WRAPPED = ("sharded",)
#: ranks of every plan (one per core; plans of more ranks than cores are left out)
RANKS = 2
#: The GPU run: a GPT of about 110M parameters (fp32), big enough that a
#: step is the GPU's work rather than Python's; one rank.
GPU_SHAPE = {"layers": 8, "hidden": 1024, "heads": 16, "seq": 1024, "vocab": 8192}
GPU_BATCH = 16
GPU_PROFILED = (2, 8)
#: (pp, dp, tp, micro-batches, V): one rank, micro-batch sizes 16 and 4 (held out)
GPU_PLANS = {"exact": [(1, 1, 1, 1, None), (1, 1, 1, 4, None)]}
#: (pp, dp, tp, micro-batches, V) per runtime; micro-batch sizes 2 and 8 (HELD_OUT)
PLANS = {
    "exact": [
        (1, 2, 1, 2, None),  # dp2, b=2
        (1, 2, 1, 1, 4),  # dp2 x 2 virtual workers each, b=2
        (1, 1, 2, 1, None),  # tp2, b=8
        (1, 1, 2, 4, None),  # tp2, b=2
        (2, 1, 1, 4, None),  # pp2, b=2 (1F1B needs m >= pp: no b=8)
    ],
    "sharded": [(1, 2, 1, 2, None), (1, 1, 2, 1, None), (1, 1, 2, 4, None), (2, 1, 1, 4, None)],
}
QUICK = {"exact": [(1, 2, 1, 2, None), (1, 1, 2, 1, None)], "sharded": [(1, 2, 1, 2, None), (1, 1, 2, 1, None)]}


def runtimes_here() -> list[str]:
    """The runtimes this tree's launcher carries out (sharded once launch.sharded exists)."""
    import importlib.util

    return ["exact"] + (["sharded"] if importlib.util.find_spec("launch.sharded") is not None else [])


def model_spec(s: dict = SHAPE):
    from solver.contract.models import spec_from_dict

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


def steal_s() -> float:
    """Seconds of CPU time the hypervisor gave other guests while this
    machine's CPUs wanted it (/proc/stat's steal, all CPUs; 0 where the
    kernel does not count it): a VM's host, which no load inside it shows."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = f.readline().split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


def steal_pct(steal: float, wall: float) -> float:
    """`steal` seconds as a share of `wall` seconds of every CPU."""
    return round(100 * steal / (wall * os.cpu_count()), 1) if wall > 0 else 0.0


def live_tensor_bytes() -> int:
    """Bytes of the tensors alive now: every tensor the garbage collector
    tracks, each storage once (views and parameters share theirs)."""
    import gc

    import torch

    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if issubclass(type(obj), torch.Tensor) and obj.device.type == "cpu":  # type(): no __class__ lookups
                st = obj.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()
        except (
            RuntimeError,
            TypeError,
            NotImplementedError,
        ):  # a wrapper without storage (DTensor): its local one counts
            continue
    return sum(seen.values())


def step_peak_bytes(step) -> int:
    """The peak of live tensor bytes during one call of `step` on CPU: the
    bytes alive at its start plus the largest running sum of the
    allocations and frees the profiler records (``profile_memory``: every
    allocation and free of the CPU allocator, each at its own time; a block
    allocated before the step and freed in it is not subtracted, so the
    peak is never under the truth)."""
    from torch.profiler import ProfilerActivity, profile

    base = live_tensor_bytes()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    raw = prof.profiler.kineto_results.events() if prof.profiler is not None else []
    deltas = sorted((e.start_ns(), e.nbytes()) for e in raw if e.name() == "[memory]")
    cur = peak = 0
    for _, d in deltas:
        cur += d
        peak = max(peak, cur)
    return base + peak


def worker(steps: int, warmup: int, shape: dict, batch: int) -> None:
    """One training rank (started by the launcher): prints, per timed step, the
    wall time and how long this rank waited for a CPU (another process had
    it), then the peak memory of one more step."""
    import inspect

    import torch
    from minigpt.model import GPTConfig
    from minigpt.trainer import TrainConfig, Trainer

    from launch.parallel import init_parallel, plan_from_env

    torch.set_num_threads(1)
    cfg = GPTConfig(**shape)
    plan = plan_from_env()
    kw = {}
    if "split_batch" in inspect.signature(init_parallel).parameters:  # the runtimes' trainer: exact splits the batch
        kw["split_batch"] = (plan.runtime or "exact") == "exact"
    ctx = init_parallel(plan, num_layers=cfg.layers, global_batch=batch, **kw)
    trainer = Trainer(ctx, cfg, TrainConfig(global_batch=batch))
    on_gpu = ctx.device.type == "cuda"
    wall, wait = [], []
    for i in range(warmup + steps):
        if i == warmup:
            s0 = steal_s()
        t0, d0 = time.perf_counter(), run_delay_s()
        trainer.train_step()
        if on_gpu:
            torch.cuda.synchronize(ctx.device)  # the step ends when the GPU's work does
        if i >= warmup:
            wall.append(time.perf_counter() - t0)
            wait.append(run_delay_s() - d0)
    stolen = steal_s() - s0
    if on_gpu:
        peak = torch.cuda.max_memory_allocated(ctx.device)
    else:
        peak = step_peak_bytes(trainer.train_step)
    print(json.dumps({"rank": ctx.rank, "wall": wall, "wait": wait, "steal": stolen, "peak": peak}), flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def measure(plan: dict, steps: int, warmup: int, shape: dict, batch: int, timeout: float = 300) -> dict:
    """Run every rank of `plan` as a one-node Slurm step would, through the launcher."""
    worker = [__file__, "--worker", "--steps", str(steps), "--warmup", str(warmup)]
    worker += ["--shape", json.dumps(shape), "--batch", str(batch)]
    ranks = run_step(plan, worker, pythonpath=[EXAMPLES], timeout=timeout)
    wall = [max(w) for w in zip(*(r["wall"] for r in ranks), strict=True)]  # a step ends with its slowest rank
    wait = [max(d) for d in zip(*(r["wait"] for r in ranks), strict=True)]
    return {
        "measured_peak_mb": max(r["peak"] for r in ranks) / 1e6,
        "measured_s": statistics.median(wall),
        "fastest_s": min(wall),
        "uncontended_s": statistics.median(w - d for w, d in zip(wall, wait, strict=True)),
        "cpu_wait_pct": 100 * statistics.median(d / w for w, d in zip(wall, wait, strict=True)),
        "steal_pct": steal_pct(ranks[0]["steal"], sum(wall)),
    }


def pct_error(predicted: float, measured: float) -> float:
    return round(100 * (predicted - measured) / measured, 1)


# ------------------------------------------------------- profile + predict


#: the store's GPU type for this machine's cores (one type, as a node of the controller's has)
CPU_TYPE = "cpu"


def _corun_worker(
    index: int, ranks: int, port: int, started, finished, out: str, repeat: int = 11, wrapped: tuple[str, ...] = ()
) -> None:
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
    kw = {"warmup": 3, "repeat": repeat}
    tp_group = None
    if ranks > 1:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=index, world_size=ranks, timeout=timedelta(seconds=300)
        )
        pairs = {r: dist.new_group([r - r % 2, r - r % 2 + 1]) for r in range(0, ranks - 1, 2)}  # all ranks make all
        tp_group = pairs.get(index - index % 2)
    started.wait()
    recs = profiler.profile_layers(
        model, tps=(1, 2), micro_batches=PROFILED, stack=model.num_layers, tp_group=tp_group, **kw
    )
    for runtime in wrapped:  # the layers as that runtime wraps them (every process alike: they share its groups)
        recs += profiler.profile_layers(
            model,
            tps=(1, 2) if ranks > 1 else (1,),
            micro_batches=PROFILED,
            stack=model.num_layers,
            runtime=runtime,
            **kw,
        )
    gbps = profiler.profile_update(model, blocks=model.num_layers, **kw)
    with finished.get_lock():
        finished.value += 1
    while finished.value < ranks:  # load the machine as the job will until the others are done
        profiler.profile_layers(model, tps=(1,), micro_batches=(PROFILED[-1],), stack=model.num_layers, **kw)
    if ranks > 1:
        dist.barrier()  # neither process tears the group down while another is still in it
        dist.destroy_process_group()
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"layers": [r.__dict__ for r in recs], "update_gbps": gbps}, f)


def profile_corun(ranks: int, repeat: int = 11, wrapped: tuple[str, ...] = ()) -> tuple[list, float]:
    """(layer records, update GB/s) of a core while `ranks` cores run alike
    work: `ranks` processes profile at once (``_corun_worker``), and each
    time is the mean over them. The ranks of a job on this machine share its
    memory bandwidth and caches, which a one-process profile cannot see."""
    import multiprocessing as mp

    from solver.contract.profiles.records import LayerRecord

    ctx = mp.get_context("spawn")
    started, finished = ctx.Barrier(ranks), ctx.Value("i", 0)
    with tempfile.TemporaryDirectory(prefix="cellsched-corun-") as tmp:
        outs = [os.path.join(tmp, f"{i}.json") for i in range(ranks)]
        port = free_port()
        procs = [
            ctx.Process(target=_corun_worker, args=(i, ranks, port, started, finished, outs[i], repeat, wrapped))
            for i in range(ranks)
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
        fields = dict(parts[0])  # "cpu", or a runtime's wrapped type of it
        fields["fwd_s"] = statistics.mean(p["fwd_s"] for p in parts)
        fields["bwd_s"] = statistics.mean(p["bwd_s"] for p in parts)
        recs.append(LayerRecord(**fields))
    return recs, statistics.mean(r["update_gbps"] for r in runs)


def cpu_spec(comm, update_gbps: float, name: str = "cpu"):
    """This machine as a "cpu" GpuSpec: its memory, the profiled update bandwidth; ranks talk over loopback."""
    from launch.profiler import LOOPBACK, curve_bandwidth_gbps
    from solver.contract.profiles.records import GpuSpec

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


def profile_cpu(store, cores: int, quick: bool = False, wrapped: tuple[str, ...] = ()) -> dict[str, float]:
    """Profile this CPU into `store` as one GPU type, ``CPU_TYPE``: the layers
    and update of ``profile_corun`` with as many processes as a plan has
    ranks (``RANKS``, at most the cores), and the loopback comm curves;
    returns the update bandwidth (GB/s)."""
    from launch import profiler

    comm = profiler.profile_comm(2, link=profiler.LOOPBACK, backend="gloo", repeat=10 if quick else 90)
    store.put_comm(comm)
    layers, gbps = profile_corun(min(RANKS, cores), 3 if quick else 11, wrapped)
    store.put_layers(layers)
    store.put_gpu(cpu_spec(comm, gbps, CPU_TYPE))
    return {CPU_TYPE: gbps}


def profile_gpu(store, model) -> tuple[str, dict[str, float]]:
    """Profile the first GPU into `store` under its NVML type (layers in a
    stack of the model's blocks, the update over the whole model); returns
    the type and its update bandwidth (GB/s)."""
    import torch

    from launch import profiler
    from solver.contract.profiles.records import GpuSpec

    name = profiler.detect_gpu_type(0)
    kw = {"device": "cuda", "warmup": 3, "repeat": 11}
    store.put_layers(
        profiler.profile_layers(model, micro_batches=GPU_PROFILED, gpu_type=name, stack=model.num_layers, **kw)
    )
    gbps = profiler.profile_update(model, blocks=model.num_layers, **kw)
    mem_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    store.put_gpu(GpuSpec(name, mem_gb=mem_gb, peak_tflops=1.0, mem_bw_gbps=gbps))
    return name, {name: gbps}


def controller_estimator(store_path: Path):
    """The estimator the controller builds (speeds.make_estimator) over the store at `store_path`."""
    from slurm_ext.config import from_dict
    from slurm_ext.controller.speeds import make_estimator

    return make_estimator(from_dict({"controller": {"profiles_path": str(store_path)}}))


def one_pass(
    on_gpu: bool, shape: dict, batch: int, plans: dict, cores: int, steps: int, warmup: int, quick: bool = False
) -> dict:
    """Profile this machine into a fresh store (seeded as the controller's),
    then predict with the controller's estimator and measure every plan of
    every runtime: {"device", "update_gbps", "profile_s", "rows": [...]}."""
    from solver.contract.profiles.seed import open_store

    model = model_spec(shape)
    t0, s0 = time.perf_counter(), steal_s()
    with tempfile.TemporaryDirectory(prefix="cellsched-bench-") as tmp:
        path = Path(tmp) / "profiles.sqlite"
        with open_store(path) as store:
            if on_gpu:
                device_name, update_gbps = profile_gpu(store, model)
            else:
                wrapped = tuple(r for r in plans if r in WRAPPED)
                device_name, update_gbps = CPU_TYPE, profile_cpu(store, cores, quick, wrapped)
        profile_s = time.perf_counter() - t0
        profile_steal = steal_pct(steal_s() - s0, profile_s)
        est = controller_estimator(path)
        rows = []
        for runtime, runs in plans.items():
            for pp, dp, tp, m, vw in runs:
                rows.append(
                    predict_and_measure(
                        est, model, shape, batch, device_name, runtime, (pp, dp, tp, m, vw), steps, warmup
                    )
                )
    return {
        "device": device_name,
        "update_gbps": update_gbps,
        "profile_s": profile_s,
        "profile_steal_pct": profile_steal,
        "rows": rows,
    }


def predict_and_measure(est, model, shape, batch, gpu, runtime, plan_t, steps, warmup) -> dict:
    """The estimator's time and memory of one plan under `runtime`, and the trainer's."""
    from solver.types import Cell, EstimateSource, JobRequest

    pp, dp, tp, m, vw = plan_t
    n = pp * dp * tp
    cell = Cell(gpu, 1, n, pp)
    job = JobRequest("bench", model, batch, 1, virtual_workers=vw, runtime=runtime, state_sharding=False)
    assert est.estimate(job, cell).source == EstimateSource.COMPOSED
    chosen, predicted, mem_gb = next(
        (p, t, mem)
        for p, t, mem in est.costs.plans(job, cell)
        if (p.dp, p.tp, p.micro_batches) == (dp, tp, m) and not p.sharded
    )
    plan = {
        "pp": pp,
        "dp": dp,
        "tp": tp,
        "micro_batches": m,
        "global_batch": batch,
        "runtime": runtime,
        "stage_layers": list(chosen.stage_layers or (model.num_layers,)),
    }
    if vw is not None:
        plan["virtual_workers"] = vw
    return {
        **plan,
        "predicted_s": predicted,
        "predicted_mb": mem_gb * 1e3,
        **measure(plan, steps, warmup, shape, batch),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="timed steps per plan (default: 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per plan")
    ap.add_argument(
        "--passes",
        type=int,
        default=None,
        help="profile-predict-measure passes; a plan's prediction and measurement are each their median "
        "(default: 3, 1 with --quick)",
    )
    ap.add_argument("--runtime", action="append", help="runtime mode to measure (repeat; default: every one here)")
    ap.add_argument("--quick", action="store_true", help="two plans per runtime, 4 timed steps, a short profile")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="profile and train on (default: cpu)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shape", type=json.loads, default=SHAPE, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=BATCH, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.steps, args.warmup, args.shape, args.batch)
        return 0
    if args.passes is None:
        args.passes = 1 if args.quick else 3
    if args.passes < 1:
        ap.error("--passes must be at least 1")

    import torch

    on_gpu = args.device == "cuda"
    if not on_gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a CPU run's profiles and ranks (inherited) stay off any GPU
    torch.set_num_threads(1)
    if on_gpu and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no GPU here")
    here = runtimes_here()
    wanted = args.runtime or here
    missing = [r for r in wanted if r not in here]
    if missing:
        ap.error(f"runtime {missing[0]!r} is not carried out by this tree's launcher (here: {', '.join(here)})")
    shape, batch, table = (
        (GPU_SHAPE, GPU_BATCH, GPU_PLANS) if on_gpu else (SHAPE, BATCH, QUICK if args.quick else PLANS)
    )
    plans = {r: table[r] for r in wanted if r in table}
    steps = min(args.steps, 4) if args.quick else args.steps
    cores = len(os.sched_getaffinity(0))
    if not on_gpu:  # a per-device estimate cannot know an oversubscribed machine
        plans = {r: [p for p in ps if p[0] * p[1] * p[2] <= cores] for r, ps in plans.items()}
    t_start, load_start = time.perf_counter(), os.getloadavg()
    passes = [one_pass(on_gpu, shape, batch, plans, cores, steps, args.warmup, args.quick) for _ in range(args.passes)]
    rows = [row_of(list(runs), batch) for runs in zip(*(p["rows"] for p in passes), strict=True)]
    for row in rows:
        print(json.dumps(row), flush=True)
    for runtime in plans:
        mine = [r for r in rows if r["runtime"] == runtime]
        if not mine:
            continue
        print(
            json.dumps(
                {
                    "runtime": runtime,
                    "plans": len(mine),
                    "mape_pct_heldout": round(statistics.mean(abs(r["error_pct"]) for r in mine), 1),
                    # against the steps less the CPU waits (a shared machine's other work)
                    "mape_pct_heldout_uncontended": round(
                        statistics.mean(abs(r["error_uncontended_pct"]) for r in mine), 1
                    ),
                    "memory_err_pct": round(statistics.mean(abs(r["memory_error_pct"]) for r in mine), 1),
                    "max_abs_error_pct": max(abs(r["error_pct"]) for r in mine),
                    "max_abs_memory_error_pct": max(abs(r["memory_error_pct"]) for r in mine),
                }
            ),
            flush=True,
        )
    print(
        json.dumps(
            {
                "summary": "estimator accuracy (the controller's estimator, held-out plans)",
                "device": passes[0]["device"],
                "model": model_spec(shape).signature,
                "global_batch": batch,
                "profiled_micro_batch_sizes": list(GPU_PROFILED if on_gpu else PROFILED),
                "cores": cores,
                # on CPU each rank is one process on one thread: a "GPU" of the estimator is a core here
                "rank": "one GPU" if on_gpu else "one CPU core (a GPU of the cell), OMP_NUM_THREADS=1",
                "load_avg_1m": {"start": round(load_start[0], 2), "end": round(os.getloadavg()[0], 2)},
                "passes": args.passes,
                "steps": steps,
                "optimizer_step_s": round(optimizer_step_s(shape, args.device), 4),
                "update_gbps": {
                    k: round(statistics.median(p["update_gbps"][k] for p in passes), 2)
                    for k in passes[0]["update_gbps"]
                },
                "profile_s": round(sum(p["profile_s"] for p in passes), 1),
                # the host's share of the profiles' CPU time (steal_s): a profile and the steps priced from it
                # taken under different steal see different machines
                "profile_steal_pct_passes": [p["profile_steal_pct"] for p in passes],
                "total_s": round(time.perf_counter() - t_start, 1),
            }
        )
    )
    return 0


def row_of(runs: list[dict], batch: int) -> dict:
    """One plan over the passes: the medians of its predictions and of its measured fields."""
    first = runs[0]
    vw = first.get("virtual_workers")
    predicted = statistics.median(r["predicted_s"] for r in runs)
    predicted_mb = statistics.median(r["predicted_mb"] for r in runs)
    got = {
        k: statistics.median(r[k] for r in runs)
        for k in ("measured_s", "fastest_s", "uncontended_s", "cpu_wait_pct", "steal_pct", "measured_peak_mb")
    }
    return {
        "runtime": first["runtime"],
        **{k: first[k] for k in ("pp", "dp", "tp", "micro_batches")},
        "virtual_workers": vw,
        "micro_batch_size": batch // (vw or first["dp"]) // first["micro_batches"],
        "ranks": first["pp"] * first["dp"] * first["tp"],
        "stage_layers": first["stage_layers"],
        "predicted_s": round(predicted, 4),
        "predicted_mb": round(predicted_mb, 2),
        **{k: round(v, 4) for k, v in got.items()},
        "error_pct": pct_error(predicted, got["measured_s"]),
        "error_uncontended_pct": pct_error(predicted, got["uncontended_s"]),
        "memory_error_pct": pct_error(predicted_mb, got["measured_peak_mb"]),
        "error_pct_passes": [pct_error(r["predicted_s"], r["measured_s"]) for r in runs],
    }


if __name__ == "__main__":
    sys.exit(main())
