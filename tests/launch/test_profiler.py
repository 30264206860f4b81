"""`cellsched profile` on CPU: layer records and loopback comm curves land in
the store with sane values, and the estimator composes plans from them."""

import json
import sys
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner
from support import free_port

from launch import profiler
from slurm_ext.cli import main
from solver.contract.models import get_model
from solver.contract.profiles.seed import open_store
from solver.estimator import Estimator
from solver.types import Cell, EstimateSource

MODEL = get_model("gpt-tiny")
SIG = MODEL.signature


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    db = tmp_path_factory.mktemp("profile") / "profiles.sqlite"
    args = [
        "profile",
        "--model",
        "gpt-tiny",
        "--tp",
        "1,2",
        "--micro-batch",
        "1,2",
        "--db",
        str(db),
        "--comm",
        "--warmup",
        "1",
        "--repeat",
        "3",
        "--threads",
        "1",
        "--json",
    ]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert {(r["tp"], r["micro_batch"]) for r in rows if "tp" in r} == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert rows[-1]["link"] == "loopback" and rows[-1]["ranks"] == 2
    with open_store(db) as s:
        yield s


def test_layer_records_are_complete_and_sane(store):
    assert store.layer_keys(SIG) == [("cpu", tp, b) for tp in (1, 2) for b in (1, 2)]
    h, s, v = MODEL.hidden, MODEL.seq_len, MODEL.vocab
    for tp in (1, 2):
        for b in (1, 2):
            recs = store.layers(SIG, "cpu", tp, b)
            assert [r.kind for r in recs] == ["embed"] + ["block"] * MODEL.num_layers + ["head"]
            assert [r.layer for r in recs] == list(range(MODEL.num_layers + 2))
            assert all(r.fwd_s > 0 and r.bwd_s > 0 and r.act_bytes > 0 for r in recs)
            embed, block, head = recs[0], recs[1], recs[-1]
            # fp32 parameters of one tp shard: matmuls and column biases split, norms and row biases whole
            assert embed.param_bytes == 4 * (v + s) * h
            assert block.param_bytes == 4 * ((12 * h * h + 7 * h) // tp + 6 * h)
            assert head.param_bytes == 4 * (h * v + v + 2 * h)
            assert block.out_bytes == embed.out_bytes == 4 * b * s * h
    # the unsplit block is the ModelSpec's block; activations grow with the micro-batch, shrink with tp
    assert store.layers(SIG, "cpu", 1, 1)[1].param_bytes == 4 * MODEL.params_per_layer
    act = {(tp, b): store.layers(SIG, "cpu", tp, b)[1].act_bytes for tp in (1, 2) for b in (1, 2)}
    assert act[(1, 2)] == pytest.approx(2 * act[(1, 1)], rel=0.05)
    assert act[(2, 1)] < act[(1, 1)]


def test_comm_records_from_two_gloo_processes(store):
    for op in ("p2p", "allreduce", "allgather", "reducescatter", "fsdp_unshard"):
        recs = store.comm("loopback", op, nranks=2)
        assert [r.nbytes for r in recs] == list(profiler.COMM_SIZES)
        assert all(r.time_s > 0 for r in recs)
    # FSDP2's reduce is a difference of two timings (with and without gradient sync): never negative
    reduce = store.comm("loopback", "fsdp_reduce", nranks=2)
    assert [r.nbytes for r in reduce] == list(profiler.COMM_SIZES) and all(r.time_s >= 0 for r in reduce)
    assert reduce[-1].time_s > 0  # a 16 MiB reduce-scatter with its copies is never free
    # 16 MiB cannot cross loopback faster than 100 GB/s, nor slower than 10 MB/s (FSDP2 gathers half of
    # it; its reduce, a difference of two noisy timings, is not held to a rate)
    for op, moved in (("allreduce", 1.0), ("fsdp_unshard", 0.5)):
        big = store.comm("loopback", op, nranks=2)[-1]
        assert 1e7 < moved * big.nbytes / big.time_s < 1e11, op


def test_estimator_composes_from_the_profile(store):
    est = Estimator(store).estimate_model(MODEL, 8, Cell("cpu", 1, 2, pp=2))
    assert est.feasible and est.source == EstimateSource.COMPOSED and est.iter_time_s > 0


def test_update_bandwidth_reproduces_an_optimizer_step():
    import time

    import torch

    torch.set_num_threads(1)
    gbps = profiler.profile_update(MODEL, warmup=1, repeat=3)
    assert 0.1 < gbps < 1000  # a CPU sweeps memory at GB/s
    # the estimator's update term (params x 32 B at that bandwidth) gives an AdamW step's time back
    net = torch.nn.ModuleList([profiler.Embed(MODEL), profiler.BlockShard(MODEL, 1), profiler.Head(MODEL)])
    params = list(net.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-4)
    clock = profiler.compute_clock(torch.device("cpu"))
    assert clock is time.process_time
    times = []
    for _ in range(5):
        t0 = clock()
        opt.step()
        times.append(clock() - t0)
    predicted = sum(p.numel() for p in params) * 32 / (gbps * 1e9)
    assert 0.5 < predicted / min(times[1:]) < 2


def test_gpu_type_falls_back_to_cpu_without_nvml(monkeypatch):
    class BrokenNvml:
        class NVMLError(Exception):
            pass

        @staticmethod
        def nvmlInit():
            raise BrokenNvml.NVMLError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", BrokenNvml)
    assert profiler.detect_gpu_type() == "cpu"
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert profiler.detect_gpu_type() == "cpu"


def test_gpu_type_here_is_cpu():
    """This machine has no NVIDIA driver: the real pynvml fails to start."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert profiler.detect_gpu_type() == "cpu"


@pytest.mark.parametrize(
    "name, kind",
    [
        ("NVIDIA A100-SXM4-40GB", "a100"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA A10G", "a10"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A40", "a40"),
        ("NVIDIA GeForce RTX 4090", "geforce-rtx-4090"),
    ],
)
def test_gpu_type_of_nvml_names(name, kind):
    assert profiler.gpu_type_of(name) == kind


def test_tp_that_does_not_divide_the_heads_is_refused(tmp_path):
    result = CliRunner().invoke(main, ["profile", "--model", "gpt-tiny", "--tp", "3", "--db", str(tmp_path / "p")])
    assert result.exit_code == 2 and "tp=3 does not divide its 4 heads" in result.output


def test_collective_time_is_the_mean_of_calls_after_busy_ranks(monkeypatch):
    """Each call is timed after the rank computed for busy_s (not counted); the record is their mean."""
    clock = {"t": 0.0}
    steps = iter([9.0, 9.0, 1.0, 3.0, 8.0])  # two warm-up calls, then 1, 3 and 8 s

    def busy(seconds, _scratch):
        clock["t"] += seconds

    def op():
        clock["t"] += next(steps)

    monkeypatch.setattr(profiler, "time", SimpleNamespace(perf_counter=lambda: clock["t"]))
    monkeypatch.setattr(profiler, "_busy", busy)
    # the mean of 1, 3 and 8 s (a median would say 3), without the 0.5 s of compute before each
    assert profiler._timed(op, torch.device("cpu"), 2, 3, 0.5) == pytest.approx(4.0)


def test_collectives_of_a_curve_are_timed_in_rounds(monkeypatch):
    """Several ops are timed round by round, each once per round, so a drifting machine
    weighs every point of a curve alike; each op's time is still the mean of its own calls."""
    clock = {"t": 0.0}
    order = []

    def op(name, seconds):
        def call():
            order.append(name)
            clock["t"] += seconds

        return call

    monkeypatch.setattr(profiler, "time", SimpleNamespace(perf_counter=lambda: clock["t"]))
    monkeypatch.setattr(profiler, "_busy", lambda seconds, _scratch: None)
    times = profiler._timed_rounds([(op("a", 1.0), None), (op("b", 3.0), None)], torch.device("cpu"), 1, 2, 0.5)
    assert order == ["a", "b"] * 3  # a warm-up round, then two timed ones
    assert times == pytest.approx([1.0, 3.0])


def test_layer_time_is_the_median_run(monkeypatch):
    """Forward and backward come from the run of median total time (not the fastest), both from that run."""
    clock = {"t": 0.0, "i": 0}
    # clock readings per run: start, after forward, after backward; runs of (fwd, bwd) =
    # warm-up (9, 9), then (1, 1), (2, 4), (1, 2): totals 2, 6, 3 -> the median run is (1, 2)
    halves = iter([9.0, 9.0, 1.0, 1.0, 2.0, 4.0, 1.0, 2.0])

    def now():
        clock["i"] += 1
        if clock["i"] % 3 != 1:  # the start of a run reads the clock without time passing
            clock["t"] += next(halves)
        return clock["t"]

    monkeypatch.setattr(profiler, "compute_clock", lambda _device: now)
    layer = torch.nn.Linear(2, 2)
    x = torch.ones(1, 2)
    assert profiler._median_times(layer, lambda: layer(x), torch.device("cpu"), 1, 3) == (1.0, 2.0)


class _Tick(torch.autograd.Function):
    """Identity that advances a fake clock by `bwd` seconds in backward."""

    @staticmethod
    def forward(ctx, x, clock, bwd):
        ctx.clock, ctx.bwd = clock, bwd
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.clock["t"] += ctx.bwd
        return grad, None, None


class _Timed(torch.nn.Module):
    """A layer that takes `fwd` fake seconds forward and `bwd` backward."""

    def __init__(self, clock, fwd, bwd):
        super().__init__()
        self.clock, self.fwd, self.bwd = clock, fwd, bwd
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x, tokens=None):
        self.clock["t"] += self.fwd
        y = (x.float() if x.dtype == torch.long else x) * self.w
        return _Tick.apply(y.sum() if tokens is not None else y, self.clock, self.bwd)


def test_stacked_layer_times_split_one_forward_and_backward(monkeypatch):
    """In a stack each layer's forward and backward are its own share of the model's; blocks give their mean."""
    clock = {"t": 0.0}
    monkeypatch.setattr(profiler, "compute_clock", lambda _device: lambda: clock["t"])
    embed, head = _Timed(clock, 0.1, 0.2), _Timed(clock, 5.0, 6.0)
    blocks = [_Timed(clock, 1.0, 2.0), _Timed(clock, 3.0, 4.0)]
    tokens = torch.ones(2, 3, dtype=torch.long)
    times = profiler._stack_times(embed, blocks, head, tokens, torch.device("cpu"), 1, 3)
    assert times["embed"] == pytest.approx((0.1, 0.2))
    assert times["block"] == pytest.approx((2.0, 3.0))
    assert times["head"] == pytest.approx((5.0, 6.0))


class _FakeComm(profiler.TPComm):
    """A tp group's all-reduces that each take 100 s of the fake compute clock."""

    def __init__(self, clock):
        super().__init__(None)
        self.clock, self.calls = clock, []

    def all_reduce(self, x):
        self.calls.append(tuple(x.shape))
        self.clock["t"] += 100.0
        self.spent += 100.0
        return x


def test_a_tp_shard_all_reduces_as_a_megatron_block():
    """With a tp group a block shard all-reduces 4 times per micro-batch, all activation-sized:
    the attention and MLP outputs forward, the gradients of their inputs backward."""
    comm = _FakeComm({"t": 0.0})
    block = profiler.BlockShard(MODEL, 2, comm)
    x = torch.randn(2, MODEL.seq_len, MODEL.hidden, requires_grad=True)
    y = block(x)
    assert len(comm.calls) == 2
    y.sum().backward()
    assert comm.calls == [(2, MODEL.seq_len, MODEL.hidden)] * 4
    # without a group the same shard issues none and computes alike
    torch.manual_seed(0)
    alone = profiler.BlockShard(MODEL, 2)
    torch.manual_seed(0)
    with_comm = profiler.BlockShard(MODEL, 2, _FakeComm({"t": 0.0}))
    assert torch.equal(alone(x), with_comm(x))  # the fake sums over a group of one


def test_stacked_tp_layers_leave_their_collectives_out(monkeypatch):
    """A block's time among its all-reduces is its compute only: the collectives' time is the curves'."""
    clock = {"t": 0.0}
    monkeypatch.setattr(profiler, "compute_clock", lambda _device: lambda: clock["t"])
    comm = _FakeComm(clock)
    embed, head = _Timed(clock, 0.1, 0.2), _Timed(clock, 5.0, 6.0)
    blocks = [profiler.BlockShard(MODEL, 2, comm), profiler.BlockShard(MODEL, 2, comm)]
    tokens = torch.ones(2, MODEL.seq_len, dtype=torch.long)
    embed.forward = lambda t, tokens=None: _Tick.apply(  # the embedding's output is the blocks' input
        torch.ones(2, MODEL.seq_len, MODEL.hidden) * embed.w, clock, 0.2
    )
    times = profiler._stack_times(embed, blocks, head, tokens, torch.device("cpu"), 1, 2, comm)
    assert len(comm.calls) == 3 * 2 * 4  # 3 runs x 2 blocks x 4 all-reduces, each 100 s of the clock
    assert times["block"] == pytest.approx((0.0, 0.0))  # the blocks' real compute does not move the fake clock
    assert times["head"] == pytest.approx((5.0, 6.0))
    # the same stack timed without leaving the collectives out would carry them
    clock["t"] = 0.0
    carried = profiler._stack_times(embed, blocks, head, tokens, torch.device("cpu"), 1, 2)
    assert carried["block"] == pytest.approx((200.0, 200.0))


def _tp_profile_worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    recs = profiler.profile_layers(
        MODEL, tps=(1, 2), micro_batches=(1, 2), stack=2, warmup=0, repeat=2, tp_group=dist.group.WORLD
    )
    dist.barrier()  # neither rank tears the group down while the other is still in it
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump([[r.tp, r.micro_batch, r.kind, r.fwd_s, r.bwd_s] for r in recs], f)


@pytest.mark.slow
def test_tp_layers_profile_on_their_tp_ranks(tmp_path):
    """Two gloo processes of one tp group profile the tp=2 layers among their all-reduces, in step."""
    import torch.multiprocessing as mp

    out = tmp_path / "recs.json"
    mp.start_processes(_tp_profile_worker, args=(free_port(), str(out)), nprocs=2, start_method="spawn")
    recs = json.loads(out.read_text())
    assert {(tp, b) for tp, b, *_ in recs} == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert all(fwd > 0 and bwd > 0 for *_, fwd, bwd in recs)


def test_tp_layers_among_collectives_need_a_stack():
    with pytest.raises(profiler.ProfileError, match="stack"):
        profiler.profile_layers(MODEL, tps=(2,), micro_batches=(1,), tp_group=SimpleNamespace())


def test_stacked_profile_keeps_the_records_memory():
    """stack=k changes how layers are timed, not what is recorded about their memory."""
    torch.set_num_threads(1)
    alone = profiler.profile_layers(MODEL, tps=(1, 2), micro_batches=(2,), warmup=1, repeat=1)
    stacked = profiler.profile_layers(MODEL, tps=(1, 2), micro_batches=(2,), warmup=1, repeat=1, stack=2)
    assert [(r.tp, r.layer, r.kind, r.param_bytes, r.act_bytes, r.out_bytes) for r in stacked] == [
        (r.tp, r.layer, r.kind, r.param_bytes, r.act_bytes, r.out_bytes) for r in alone
    ]
    assert all(r.fwd_s > 0 and r.bwd_s > 0 for r in stacked)
    with pytest.raises(profiler.ProfileError, match="stack"):
        profiler.profile_layers(MODEL, stack=-1)


def test_update_over_more_blocks():
    torch.set_num_threads(1)
    assert 0.1 < profiler.profile_update(MODEL, warmup=1, repeat=1, blocks=2) < 1000
    with pytest.raises(profiler.ProfileError, match="blocks"):
        profiler.profile_update(MODEL, blocks=0)


def test_busy_compute_is_work_not_a_wall_clock_deadline(monkeypatch):
    """Ranks compute for the same CPU time before a collective, so one the machine slows arrives late."""
    cpu = {"t": 0.0, "mm": 0}

    def mm(_a, _b):
        cpu["mm"] += 1
        cpu["t"] += 0.001  # each matmul: 1 ms of this thread's CPU

    def wall():  # the wall clock runs 4 ms per reading: other processes hold the core
        cpu["wall"] = cpu.get("wall", 0.0) + 0.004
        return cpu["wall"]

    monkeypatch.setattr(profiler, "time", SimpleNamespace(thread_time=lambda: cpu["t"], perf_counter=wall))
    monkeypatch.setattr(profiler.torch, "mm", mm)
    profiler._busy(0.01, None)
    assert cpu["mm"] == 10  # a wall-clock deadline would stop after 2


def test_collective_meets_a_freshly_written_buffer(monkeypatch):
    """`touch` writes the op's buffer before every call (a layer's fresh output), outside the timing."""
    clock = {"t": 0.0}
    touched = []

    def touch():
        touched.append(clock["t"])
        clock["t"] += 100.0

    def op():
        clock["t"] += 2.0

    monkeypatch.setattr(profiler, "time", SimpleNamespace(perf_counter=lambda: clock["t"]))
    monkeypatch.setattr(profiler, "_busy", lambda seconds, _scratch: None)
    assert profiler._timed(op, torch.device("cpu"), 1, 3, 0.5, touch) == pytest.approx(2.0)
    assert len(touched) == 4


def test_layers_profiled_as_the_sharded_runtime_wraps_them(monkeypatch):
    """runtime="sharded": the times are of a stage wrapped as launch.sharded
    wraps it (every block and the stage under fully_shard: FSDP2's
    reduce-scatter runs for every unit), the memory the plain layers';
    stored under the runtime's GPU type, in a process group of its own."""
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as coll  # where FSDP2 calls them

    torch.set_num_threads(1)
    calls = {"scatter": 0}
    scatter = coll.foreach_reduce

    def counted(*args, **kwargs):
        calls["scatter"] += 1
        return scatter(*args, **kwargs)

    monkeypatch.setattr(coll, "foreach_reduce", counted)
    plain = profiler.profile_layers(MODEL, micro_batches=(2,), warmup=0, repeat=1)
    wrapped = profiler.profile_layers(MODEL, micro_batches=(2,), warmup=1, repeat=2, stack=2, runtime="sharded")
    assert not dist.is_initialized()  # its own one-rank group, gone again
    assert {r.gpu_type for r in wrapped} == {"cpu@sharded"}
    assert [(r.tp, r.layer, r.kind, r.param_bytes, r.act_bytes, r.out_bytes) for r in wrapped] == [
        (r.tp, r.layer, r.kind, r.param_bytes, r.act_bytes, r.out_bytes) for r in plain
    ]
    assert all(r.fwd_s > 0 and r.bwd_s > 0 for r in wrapped)
    # (over one rank FSDP2 copies a unit's shard into its unsharded parameters rather than all-gather it)
    assert calls["scatter"] == 3 * 3  # 3 runs x (2 blocks + the root), each unit's gradients reduced once

    rows = profiler.summarize(plain + wrapped)
    assert [r.get("runtime") for r in rows] == [None, "sharded"]


def test_only_known_runtimes_are_profiled_wrapped():
    with pytest.raises(profiler.ProfileError, match="cannot be profiled wrapped"):
        profiler.profile_layers(MODEL, micro_batches=(1,), runtime="exact")
    with pytest.raises(profiler.ProfileError, match="tp processes"):
        profiler.profile_layers(MODEL, tps=(2,), micro_batches=(1,), stack=1, runtime="sharded")


def _wrapped_tp_worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    calls, orig = [0], funcol.all_reduce

    def counted(*args, **kwargs):
        calls[0] += 1
        return orig(*args, **kwargs)

    funcol.all_reduce = counted
    try:
        recs = profiler.profile_layers(
            MODEL, tps=(2,), micro_batches=(1,), stack=2, warmup=1, repeat=2, runtime="sharded"
        )
    finally:
        funcol.all_reduce = orig
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"calls": calls[0], "recs": [[r.gpu_type, r.tp, r.kind, r.fwd_s, r.bwd_s] for r in recs]}, f)


@pytest.mark.slow
def test_tp_layers_profiled_as_the_sharded_runtime_parallelizes_them(tmp_path):
    """tp=2 as DTensor runs it on two gloo processes: the reference trainer's
    plan (q, k, v and fc column-wise, proj and out row-wise) all-reduces 6
    times a block and micro-batch, 2 outputs forward and 4 input gradients
    backward; 3 runs of 2 blocks."""
    import torch.multiprocessing as mp

    out = tmp_path / "wrapped.json"
    mp.start_processes(_wrapped_tp_worker, args=(free_port(), str(out)), nprocs=2, start_method="spawn")
    got = json.loads(out.read_text())
    assert got["calls"] == 3 * 2 * 6
    assert {(g, tp) for g, tp, *_ in got["recs"]} == {("cpu@sharded", 2)}
    assert all(fwd > 0 and bwd > 0 for *_, fwd, bwd in got["recs"])


def test_profile_cli_stores_the_sharded_runtimes_layers(tmp_path):
    """`cellsched profile --runtime sharded` adds the layers as that runtime wraps them under TYPE@sharded."""
    db = tmp_path / "p.sqlite"
    args = ["profile", "--model", "gpt-tiny", "--micro-batch", "1", "--db", str(db), "--runtime", "sharded"]
    args += ["--warmup", "0", "--repeat", "1", "--threads", "1", "--json"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [r.get("runtime") for r in rows] == [None, "sharded"]
    with open_store(db) as s:
        assert s.layer_keys(SIG) == [("cpu", 1, 1), ("cpu@sharded", 1, 1)]
