"""Disaggregated profiling (Arena): layer costs on ONE device of a GPU type,
communication curves once per link.

* ``profile_layers``: each layer of a transformer model (the embedding, every
  block, the head with its loss) is run alone, forward and backward, for each
  tensor-parallel degree and micro-batch size. A tp shard is simulated on one
  device: the block keeps heads/tp attention heads and 4h/tp MLP columns, so
  it runs exactly the shard's matmuls, without the collectives (the
  estimator adds those from the communication curves: 4 all-reduces per
  "block", none for "embed" / "head"). Times are of the median run, on the
  device's compute clock (``compute_clock``: CPU time for a one-thread CPU
  profile, so a busy machine does not inflate them). With ``stack=k`` the
  layers run as a model of k distinct blocks between the embedding and the
  head, so each meets the cache a training step leaves it. Memory: parameter bytes of the shard,
  activation bytes autograd keeps for backward (the tensors it saves,
  parameters excluded), and the bytes of the layer's output.
* ``profile_comm``: point-to-point, all-reduce and all-gather time against
  message size among local processes (nccl over GPUs, gloo over loopback on
  CPU), each call after the same CPU work on every rank, as between a
  step's layers; an all-gather's size is what each rank contributes.
* ``profile_update``: the memory bandwidth an optimizer step (AdamW) achieves
  on the model's parameters, in the estimator's terms (its traffic taken as
  2 x optimizer_bytes_per_param per parameter): the ``mem_bw_gbps`` that
  prices the weight update. Worth storing for "cpu", whose datasheet is a guess.
* ``detect_gpu_type``: the GPU type from NVML ("cpu" without a GPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import itertools
import json
import math
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.multiprocessing.spawn import start_processes

from launch.errors import LauncherError
from solver.contract.models import TRANSFORMER_FAMILIES, ModelSpec
from solver.contract.profiles.records import (
    FSDP_REDUCE,
    FSDP_UNSHARD,
    RUNTIME_SEP,
    TP_ALLREDUCES_PER_BLOCK,
    CommRecord,
    LayerRecord,
    runtime_gpu_type,
)

#: Model dtype -> torch dtype.
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: Known GPU types, as NVML names contain them (longer names first).
GPU_TYPES = (
    "h200",
    "h100",
    "gh200",
    "a100",
    "a800",
    "h800",
    "a40",
    "a30",
    "a10",
    "l40s",
    "l40",
    "l4",
    "v100",
    "t4",
    "p100",
)
LOOPBACK = "loopback"
#: Message sizes of the communication curves (bytes): 1 KiB .. 16 MiB, x4.
COMM_SIZES = tuple(4**k * 1024 for k in range(8))
#: Seconds every rank computes before each profiled collective: about a
#: layer's forward, so the collective meets ranks coming from compute.
COMM_BUSY_S = 0.005
#: a run of _median_run (any kind)
R = TypeVar("R")


class ProfileError(ValueError, LauncherError):
    """The model or the settings cannot be profiled (the message says why)."""


# ------------------------------------------------------------------ GPU type


def gpu_type_of(name: str) -> str:
    """NVML device name -> GPU type: ``"NVIDIA A100-SXM4-40GB"`` -> ``"a100"``;
    an unknown name becomes a slug of itself."""
    low = name.lower().replace("nvidia", " ")
    for t in GPU_TYPES:
        if re.search(rf"(?<![a-z0-9]){t}(?![0-9])", low):
            return t
    return re.sub(r"[^a-z0-9]+", "-", low).strip("-") or "gpu"


def detect_gpu_type(index: int = 0) -> str:
    """GPU type of device `index` from NVML; "cpu" when pynvml is missing,
    NVML does not start, or there is no such device."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # ImportError, NVMLError (no driver / library)
        return "cpu"
    try:
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
        return gpu_type_of(name.decode() if isinstance(name, bytes) else name)
    except Exception:
        return "cpu"
    finally:
        pynvml.nvmlShutdown()


# -------------------------------------------------------------------- layers


class Embed(nn.Module):
    """Token + position embedding (replicated over tp)."""

    def __init__(self, m: ModelSpec):
        super().__init__()
        self.tok, self.pos = nn.Embedding(m.vocab, m.hidden), nn.Embedding(m.seq_len, m.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return out


class TPComm:
    """The all-reduces a tp shard issues, over a real tp group, and the CPU
    time they took (``spent``): a layer profiled on its tp ranks computes
    among the collectives it trains with (on a CPU their threads and copies
    evict the caches the next matmul reads: 10-25% on small micro-batches),
    while the collectives themselves are priced by the comm curves."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.spent = 0.0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        clock = compute_clock(x.device)
        t0 = clock()
        dist.all_reduce(x, group=self.group)
        self.spent += clock() - t0
        return x


class _ReduceOut(torch.autograd.Function):
    """All-reduce forward, identity backward: a row-parallel output leaving the tp region."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: TPComm) -> torch.Tensor:  # ctx: torch's context object
        return comm.all_reduce(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _ReduceGrad(torch.autograd.Function):
    """Identity forward, all-reduced gradient backward: an input entering the tp region."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: TPComm) -> torch.Tensor:  # ctx: torch's context object
        ctx.comm = comm
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.comm.all_reduce(grad), None


class BlockShard(nn.Module):
    """One tp shard of a pre-norm GPT block: heads/tp heads, 4h/tp MLP columns.

    At tp=1 it has ``12 h^2 + 13 h`` parameters (the ModelSpec block). With
    `comm` it all-reduces as a Megatron block does, 4 times per micro-batch:
    the attention and MLP outputs forward, the gradients of their inputs
    backward."""

    def __init__(self, m: ModelSpec, tp: int, comm: TPComm | None = None):
        super().__init__()
        h, w = m.hidden, m.hidden // tp
        self.heads, self.comm = m.heads // tp, comm
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * w), nn.Linear(w, h)
        self.fc, self.out = nn.Linear(h, 4 * w), nn.Linear(4 * w, h)

    def _enter(self, x: torch.Tensor) -> torch.Tensor:
        if self.comm is None:
            return x
        y: torch.Tensor = _ReduceGrad.apply(x, self.comm)  # type: ignore[no-untyped-call]  # torch: apply is unannotated
        return y

    def _leave(self, x: torch.Tensor) -> torch.Tensor:
        if self.comm is None:
            return x
        y: torch.Tensor = _ReduceOut.apply(x, self.comm)  # type: ignore[no-untyped-call]  # torch: apply is unannotated
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self._enter(self.ln1(x))).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self._leave(self.proj(att.transpose(1, 2).reshape(b, s, -1)))
        return x + self._leave(self.out(F.gelu(self.fc(self._enter(self.ln2(x))))))


class Head(nn.Module):
    """Final norm, vocabulary projection and the loss (replicated over tp)."""

    def __init__(self, m: ModelSpec):
        super().__init__()
        self.ln, self.proj = nn.LayerNorm(m.hidden), nn.Linear(m.hidden, m.vocab)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.proj(self.ln(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def check_profilable(model: ModelSpec, tp: int) -> None:
    if model.family not in TRANSFORMER_FAMILIES or model.num_experts > 1:
        raise ProfileError(
            f"model {model.name!r}: only dense transformers can be profiled "
            f"(family {model.family}, {model.num_experts} experts)"
        )
    if tp < 1 or model.heads % tp:
        raise ProfileError(f"model {model.name!r}: tp={tp} does not divide its {model.heads} heads")


# ----------------------------------------------------------------- measuring


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def saved_bytes(module: nn.Module, run: Callable[[], torch.Tensor]) -> tuple[int, torch.Tensor]:
    """(bytes autograd saves for backward while `run` executes, its output).

    Tensors are counted once per storage; the module's parameters are not
    activations and are left out."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    return sum(seen.values()), out


def compute_clock(device: torch.device) -> Callable[[], float]:
    """The clock that times compute on DEVICE: wall time on a GPU; on a CPU
    running torch on one thread, that process's CPU time, which leaves out
    the time other processes held the core (sharing a busy machine only
    delays a layer, its work stays the same)."""
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return time.process_time
    return time.perf_counter


def _stamper(device: torch.device, comm: TPComm | None = None) -> tuple[Callable[[], Any], Callable[[Any, Any], float]]:
    """(stamp, seconds): ``stamp()`` marks this point of the device's work,
    ``seconds(a, b)`` is the time from stamp a to stamp b once the work is done.

    On a CPU, ``compute_clock``, less the time `comm`'s collectives took.
    On a GPU, CUDA events on the current stream: the host queues a run's
    kernels ahead of the GPU as a training step does, and nothing waits for
    the GPU inside the run (a sync at every layer boundary would add each
    layer's launch latency, which a step hides)."""
    if device.type != "cuda":
        clock = compute_clock(device)
        if comm is None:
            return clock, lambda a, b: b - a
        return (lambda: clock() - comm.spent), lambda a, b: b - a
    if comm is not None:
        raise ProfileError("profiling tp layers among their collectives is for CPUs (gloo) only")

    def stamp() -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch: unannotated
        event.record()
        return event

    return stamp, lambda a, b: a.elapsed_time(b) / 1e3


def _median_times(
    module: nn.Module, run: Callable[[], torch.Tensor], device: torch.device, warmup: int, repeat: int
) -> tuple[float, float]:
    """Forward and backward seconds of the median of `repeat` runs of `run` (a
    forward call; median by their sum, the two halves from that one run;
    timed by ``compute_clock``): a step pays a layer's typical time, not its
    luckiest (on CPU time the runs differ by a few percent only, so this is
    also about their mean)."""
    fwd, bwd = [], []
    clock = compute_clock(device)
    for i in range(warmup + repeat):
        module.zero_grad(set_to_none=True)
        _sync(device)
        t0 = clock()
        out = run()
        _sync(device)
        t1 = clock()
        out.backward(torch.ones_like(out))  # type: ignore[no-untyped-call]  # torch: Tensor.backward is unannotated
        _sync(device)
        t2 = clock()
        if i >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return _median_run(list(zip(fwd, bwd, strict=True)), key=sum)


def _median_run(runs: list[R], key: Callable[[R], float]) -> R:
    """The run of median `key` (the lower one of an even count): a run that happened, not an average."""
    return sorted(runs, key=key)[(len(runs) - 1) // 2]


def _stack_times(
    embed: nn.Module,
    blocks: Sequence[nn.Module],
    head: nn.Module,
    tokens: torch.Tensor,
    device: torch.device,
    warmup: int,
    repeat: int,
    comm: TPComm | None = None,
) -> dict[str, tuple[float, float]]:
    """Forward and backward seconds of "embed", "block" (the mean of the
    blocks) and "head" run as one model, embed -> blocks -> head, forward
    then backward, as a training micro-batch runs them (less the time of
    the blocks' collectives, `comm`).

    A layer's forward is the clock between its call and the next; its
    backward, from the gradient of its output to that of its input (tensor
    hooks; the head's from the start of backward, the embedding's to its
    end). The median run by total time gives the values (``_stamper``)."""
    stamp, seconds = _stamper(device, comm)
    layers = [embed, *blocks, head]
    runs = []

    def mark(marks: dict[int, Any], j: int) -> Callable[[torch.Tensor], None]:
        def hook(_grad: torch.Tensor) -> None:
            marks[j] = stamp()

        return hook

    for i in range(warmup + repeat):
        for layer in layers:
            layer.zero_grad(set_to_none=True)
        marks: dict[int, Any] = {}
        _sync(device)
        bounds = [stamp()]  # the forward's layer boundaries
        x = embed(tokens)
        for j, block in enumerate(blocks):  # x is the input of layer j + 1
            x.register_hook(mark(marks, j + 1))
            bounds.append(stamp())
            x = block(x)
        x.register_hook(mark(marks, len(blocks) + 1))
        bounds.append(stamp())
        loss = head(x, tokens)
        bounds.append(stamp())
        loss.backward()
        end = stamp()
        _sync(device)
        fwd = [seconds(a, b) for a, b in itertools.pairwise(bounds)]
        # the gradient reaches layer j's input at marks[j]: layer j's backward ends there
        ends = [end] + [marks[j] for j in range(1, len(layers))]
        starts = ends[1:] + [bounds[-1]]
        bwd = [seconds(s, e) for e, s in zip(ends, starts, strict=True)]
        if i >= warmup:
            runs.append(list(zip(fwd, bwd, strict=True)))
    run = _median_run(runs, key=lambda r: sum(f + b for f, b in r))
    k = len(blocks)
    return {
        "embed": run[0],
        "block": (sum(f for f, _ in run[1:-1]) / k, sum(b for _, b in run[1:-1]) / k),
        "head": run[-1],
    }


def _layer_runs(
    embed: nn.Module, block: nn.Module, head: nn.Module, tokens: torch.Tensor, x: torch.Tensor
) -> dict[str, tuple[nn.Module, Callable[[], torch.Tensor]]]:
    """Each kind of layer with its forward call on `tokens` (embed, head) and
    `x` (the block's and head's input, without an old gradient)."""

    def fresh() -> torch.Tensor:
        x.grad = None
        return x

    return {
        "embed": (embed, lambda: embed(tokens)),
        "block": (block, lambda: block(fresh())),
        "head": (head, lambda: head(fresh(), tokens)),
    }


#: runtimes whose layers the profiler can run wrapped as the runtime wraps them (``profile_layers(runtime=...)``)
WRAPPED_RUNTIMES = ("sharded",)


class _SplitBlock(nn.Module):
    """A pre-norm GPT block laid out as the reference trainer's (minigpt:
    q, k and v separate linears), for DTensor's tp plan: each column-wise
    linear redistributes its own input's gradient, so the layout decides
    the block's collectives."""

    def __init__(self, m: ModelSpec):
        super().__init__()
        h = m.hidden
        self.heads = m.heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv = nn.ModuleList(nn.Linear(h, h) for _ in range(3))
        self.proj, self.fc, self.out = nn.Linear(h, h), nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        y = self.ln1(x)
        q, k, v = (lin(y).view(b, s, self.heads, -1).transpose(1, 2) for lin in self.qkv)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, -1))
        out: torch.Tensor = x + self.out(F.gelu(self.fc(self.ln2(x))))
        return out


class _Root(nn.Module):
    """The stage FSDP2 wraps last (the runtime's root unit): embedding, blocks, head."""

    def __init__(self, embed: nn.Module, blocks: Sequence[nn.Module], head: nn.Module):
        super().__init__()
        self.embed, self.blocks, self.head = embed, nn.ModuleList(blocks), head

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x, tokens)
        return out


def _root_stack_times(
    root: _Root, tokens: torch.Tensor, device: torch.device, warmup: int, repeat: int, comm: _PricedComm | None
) -> dict[str, tuple[float, float]]:
    """``_stack_times`` of a stage called as one module (its root's hooks run
    once a micro-batch, as in training): the layer boundaries are stamped by
    forward pre-hooks run before any other (FSDP2's all-gather of a block is
    the block's) and by hooks on the gradients of the layers' inputs; the
    root's own work (its unshard at the call, its callbacks at the end of
    backward) counts to the embedding."""
    stamp, seconds = _stamper(device, comm)
    layers = [root.embed, *root.blocks, root.head]
    state: dict[str, Any] = {}

    def mark(marks: dict[int, Any], j: int) -> Callable[[torch.Tensor], None]:
        def hook(_grad: torch.Tensor) -> None:
            marks[j] = stamp()

        return hook

    def pre(j: int) -> Callable[..., None]:
        def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
            if j > 0:  # the embedding's forward starts before the root's hooks (its all-gather), at the call
                state["bounds"].append(stamp())
            marks = state["marks"]
            if j > 0 and isinstance(args[0], torch.Tensor) and args[0].requires_grad:
                x: torch.Tensor = args[0]
                x.register_hook(mark(marks, j))  # type: ignore[no-untyped-call]  # torch: unannotated

        return hook

    handles = [layer.register_forward_pre_hook(pre(j), prepend=True) for j, layer in enumerate(layers)]
    runs = []
    try:
        for i in range(warmup + repeat):
            root.zero_grad(set_to_none=True)
            state["marks"] = {}
            if comm is not None:
                comm.left = TP_ALLREDUCES_PER_BLOCK * len(root.blocks)
            _sync(device)
            state["bounds"] = [stamp()]
            loss = root(tokens)
            state["bounds"].append(stamp())
            loss.backward()
            end = stamp()
            _sync(device)
            bounds, marks = state["bounds"], state["marks"]
            fwd = [seconds(a, b) for a, b in itertools.pairwise(bounds)]
            ends = [end] + [marks[j] for j in range(1, len(layers))]
            starts = ends[1:] + [bounds[-1]]
            bwd = [seconds(s, e) for e, s in zip(ends, starts, strict=True)]
            if i >= warmup:
                runs.append(list(zip(fwd, bwd, strict=True)))
    finally:
        for h in handles:
            h.remove()
    run = _median_run(runs, key=lambda r: sum(f + b for f, b in r))
    k = len(root.blocks)
    return {
        "embed": run[0],
        "block": (sum(f for f, _ in run[1:-1]) / k, sum(b for _, b in run[1:-1]) / k),
        "head": run[-1],
    }


class _PricedComm(TPComm):
    """``TPComm``'s account of DTensor's all-reduces, of which only the first
    `left` of a run are left out of the layers' times: those the estimator
    prices from the curves (``TP_ALLREDUCES_PER_BLOCK`` per block). The rest
    stay in the times, as measured: DTensor's plan of separate q, k and v
    linears all-reduces each one's input gradient, 6 a block, not 4."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        super().__init__(group)
        self.left = 0


@contextlib.contextmanager
def _timed_funcol(comm: _PricedComm) -> Iterator[None]:
    """DTensor's all-reduces (``funcol.all_reduce``) waited for at once and
    their time added to `comm.spent` while `comm.left` lasts, as ``TPComm``
    does for the plain tp layers (the runtime waits for them at the next op,
    which is the next line)."""
    import torch.distributed._functional_collectives as funcol

    orig = funcol.all_reduce
    clock = compute_clock(torch.device("cpu"))

    def timed(*args: Any, **kwargs: Any) -> torch.Tensor:
        t0 = clock()
        out: torch.Tensor = orig(*args, **kwargs)
        if isinstance(out, funcol.AsyncCollectiveTensor):
            out = out.wait()
        if comm.left > 0:
            comm.spent += clock() - t0
            comm.left -= 1
        return out

    funcol.all_reduce = timed  # the same signature, waited for
    try:
        yield
    finally:
        funcol.all_reduce = orig


def _sharded_mesh(tp: int) -> Any:
    """A (rest, dp=1, tp) device mesh over the default group: each rank's
    FSDP mesh of one rank and, for tp > 1, a tp group of `tp` consecutive ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if world % tp:
        raise ProfileError(f"profiling tp={tp} as the sharded runtime runs needs tp processes; the group has {world}")
    return init_device_mesh("cpu", (world // tp, 1, tp), mesh_dim_names=("rest", "dp", "tp"))


def _sharded_stack_times(
    model: ModelSpec, tp: int, b: int, device: torch.device, dtype: torch.dtype, warmup: int, repeat: int, stack: int
) -> dict[str, tuple[float, float]]:
    """``_stack_times`` of a stack built as the ``sharded`` runtime builds a
    stage (``launch.sharded``): for tp > 1 the blocks parallelized by DTensor
    (``parallelize_module``: q, k, v and fc column-wise, proj and out
    row-wise; its all-reduces' own time left out, ``_timed_funcol``), then
    ``fully_shard`` on every block and on the stage, over a dp mesh of one
    rank: FSDP2's hooks, its copies into and out of the collectives' buffers
    and DTensor's dispatch per op are in the times; the dp > 1 collectives
    themselves are the comm curves'."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from launch.sharded import shard_unit

    mesh = _sharded_mesh(tp)
    blocks = [_SplitBlock(model).to(device=device, dtype=dtype) for _ in range(max(1, stack))]
    root = _Root(Embed(model), blocks, Head(model)).to(device=device, dtype=dtype)
    if tp > 1:
        plan: dict[str, Any] = {}
        for i in range(len(blocks)):
            for j in range(3):
                plan[f"blocks.{i}.qkv.{j}"] = ColwiseParallel()
            plan[f"blocks.{i}.fc"] = ColwiseParallel()
            plan[f"blocks.{i}.proj"] = RowwiseParallel()
            plan[f"blocks.{i}.out"] = RowwiseParallel()
        parallelize_module(root, mesh["tp"], plan)
        for blk in blocks:
            blk.heads //= tp
    for unit in (*blocks, root):  # as the runtime shards them (the root last)
        shard_unit(unit, mesh["dp"])
    tokens = torch.randint(model.vocab, (b, model.seq_len), device=device)
    comm = _PricedComm(mesh["tp"].get_group()) if tp > 1 else None
    with _timed_funcol(comm) if comm is not None else contextlib.nullcontext():
        return _root_stack_times(root, tokens, device, warmup, repeat, comm)


def profile_layers(
    model: ModelSpec,
    *,
    tps: Sequence[int] = (1,),
    micro_batches: Sequence[int] = (1, 2, 4),
    gpu_type: str = "cpu",
    device: torch.device | str | None = None,
    warmup: int = 2,
    repeat: int = 5,
    seed: int = 0,
    stack: int = 0,
    tp_group: dist.ProcessGroup | None = None,
    runtime: str | None = None,
) -> list[LayerRecord]:
    """LayerRecords of every (tp, micro-batch): layer 0 "embed", 1..L "block", L+1 "head".

    Blocks are alike, so one block is measured and its record repeated.
    `stack` = 0 times each layer alone; `stack` = k >= 1 times them in a
    model of the embedding, k distinct blocks (their mean is the block's
    record) and the head, forward then backward (``_stack_times``): a layer
    then meets the cache a training step leaves it (the other layers' weights
    and activations in between), which on a CPU costs small micro-batches
    several percent. Memory is measured per layer either way.

    `tp_group` (CPU, with `stack`): this process is one of the ranks of a
    tp group, all calling this alike; the layers of tp = the group's size
    are then profiled among their all-reduces, as they train (``TPComm``:
    the collectives' own time is left out, the comm curves price it).

    `runtime` (one of ``WRAPPED_RUNTIMES``, CPU): the times are of the
    layers as that runtime wraps them (``_sharded_stack_times``), the memory
    the plain layers'; the records are stored under the GPU type
    ``runtime_gpu_type(gpu_type, runtime)``, where the estimator prices
    that runtime's plans from them. It needs a process group (one of a
    single rank is made when there is none) and, for tp > 1, a world of
    tp processes per group, all calling this alike."""
    if runtime is not None and runtime not in WRAPPED_RUNTIMES:
        raise ProfileError(f"runtime {runtime!r} cannot be profiled wrapped (known: {', '.join(WRAPPED_RUNTIMES)})")
    if runtime is not None:
        with _process_group():
            return _profile_wrapped(model, runtime, tps, micro_batches, gpu_type, device, warmup, repeat, seed, stack)
    if warmup < 0 or repeat < 1:
        raise ProfileError(f"need warmup >= 0 and repeat >= 1, got {warmup} and {repeat}")
    if stack < 0:
        raise ProfileError(f"stack must be >= 0 blocks, got {stack}")
    if tp_group is not None and not stack:
        raise ProfileError("profiling tp layers among their collectives (tp_group) needs stack >= 1")
    for tp in tps:
        check_profilable(model, tp)
    if any(b < 1 for b in micro_batches):
        raise ProfileError(f"micro-batch sizes must be positive, got {list(micro_batches)}")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = TORCH_DTYPES[model.dtype]
    torch.manual_seed(seed)
    sig, s, h = model.signature, model.seq_len, model.hidden
    out: list[LayerRecord] = []
    group_size = dist.get_world_size(tp_group) if tp_group is not None else 1
    for tp in tps:
        comm = TPComm(tp_group) if tp > 1 and tp == group_size else None
        embed, block, head = (
            layer.to(device=device, dtype=dtype) for layer in (Embed(model), BlockShard(model, tp, comm), Head(model))
        )
        blocks = [block] + [BlockShard(model, tp, comm).to(device=device, dtype=dtype) for _ in range(stack - 1)]
        for b in micro_batches:
            tokens = torch.randint(model.vocab, (b, s), device=device)
            x = torch.randn(b, s, h, device=device, dtype=dtype, requires_grad=True)
            runs = _layer_runs(embed, block, head, tokens, x)
            times = _stack_times(embed, blocks, head, tokens, device, warmup, repeat, comm) if stack else {}
            measured = {}
            for kind, (layer, run) in runs.items():
                act, y = saved_bytes(layer, run)
                fwd, bwd = times[kind] if stack else _median_times(layer, run, device, warmup, repeat)
                params = sum(_nbytes(p) for p in layer.parameters())
                measured[kind] = (fwd, bwd, params, act, _nbytes(y))
            kinds = ["embed"] + ["block"] * model.num_layers + ["head"]
            out += [LayerRecord(sig, gpu_type, tp, b, i, k, *measured[k]) for i, k in enumerate(kinds)]
    if tp_group is not None:
        # the runs' autograd graphs hold the collectives' context in reference cycles: free them while the
        # group lives (a caller's destroy_process_group with them alive aborted 1 run in 6, torch 2.13 gloo)
        gc.collect()
    return out


@contextlib.contextmanager
def _process_group() -> Iterator[None]:
    """The default process group: the caller's, else one of this process alone (gloo) for the call."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        gc.collect()
        dist.destroy_process_group()


def _profile_wrapped(
    model: ModelSpec,
    runtime: str,
    tps: Sequence[int],
    micro_batches: Sequence[int],
    gpu_type: str,
    device: torch.device | str | None,
    warmup: int,
    repeat: int,
    seed: int,
    stack: int,
) -> list[LayerRecord]:
    """``profile_layers(runtime=...)``: the plain records' memory with the wrapped stack's times."""
    dev = torch.device(device or "cpu")
    if dev.type != "cpu":
        raise ProfileError(f"profiling layers as runtime {runtime} wraps them is for CPUs (gloo) only")
    plain = profile_layers(
        model, tps=tps, micro_batches=micro_batches, gpu_type=gpu_type, device=dev, warmup=0, repeat=1, seed=seed
    )
    dtype = TORCH_DTYPES[model.dtype]
    times = {
        (tp, b): _sharded_stack_times(model, tp, b, dev, dtype, warmup, repeat, stack or model.num_layers)
        for tp in tps
        for b in micro_batches
    }
    gc.collect()  # the runs' graphs hold DTensor's collectives: free them while the groups live
    wrapped = runtime_gpu_type(gpu_type, runtime)
    return [
        dataclasses.replace(
            r,
            gpu_type=wrapped,
            fwd_s=times[(r.tp, r.micro_batch)][r.kind][0],
            bwd_s=times[(r.tp, r.micro_batch)][r.kind][1],
        )
        for r in plain
    ]


# -------------------------------------------------------------------- update


def profile_update(
    model: ModelSpec,
    *,
    device: torch.device | str | None = None,
    optimizer_bytes_per_param: float = 16.0,
    warmup: int = 2,
    repeat: int = 5,
    seed: int = 0,
    blocks: int = 1,
) -> float:
    """Effective memory bandwidth (GB/s) of an AdamW step over the embedding,
    `blocks` blocks and the head: ``params x 2 x optimizer_bytes_per_param /
    time`` (the median of `repeat` steps, what a training step pays), so the
    estimator's update term gives back the measured step time. A step's
    bandwidth falls as its state outgrows the caches: `blocks` = the model's
    layers measures the whole model's step (when its state fits the device)."""
    check_profilable(model, 1)
    if warmup < 0 or repeat < 1:
        raise ProfileError(f"need warmup >= 0 and repeat >= 1, got {warmup} and {repeat}")
    if blocks < 1:
        raise ProfileError(f"blocks must be >= 1, got {blocks}")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(seed)
    parts = [Embed(model), *(BlockShard(model, 1) for _ in range(blocks)), Head(model)]
    layers = nn.ModuleList(parts).to(device, TORCH_DTYPES[model.dtype])
    params = list(layers.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-4)
    clock, times = compute_clock(device), []
    for i in range(warmup + repeat):
        _sync(device)
        t0 = clock()
        opt.step()
        _sync(device)
        if i >= warmup:
            times.append(clock() - t0)
    n = sum(p.numel() for p in params)
    return n * 2 * optimizer_bytes_per_param / _median_run(times, key=lambda t: t) / 1e9


# ------------------------------------------------------------- communication


def _busy(seconds: float, scratch: torch.Tensor) -> None:
    """Keep this rank computing for `seconds` of its own CPU time (small
    matmuls on the host): the same work on every rank, as the ranks of a
    step compute alike shards, so a rank the machine slows arrives late (a
    wall-clock deadline would line the ranks up again and hide that)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        torch.mm(scratch, scratch)


def _timed(
    op: Callable[[], object],
    device: torch.device,
    warmup: int,
    repeat: int,
    busy_s: float,
    touch: Callable[[], object] | None = None,
) -> float:
    """Mean seconds of `repeat` calls of `op` (after `warmup` calls), each
    after `busy_s` of computing on every rank, as a training step issues its
    collectives: between layers, not back to back, on a buffer just written
    (`touch`, untimed: a layer's fresh output). The call then pays for
    waking ranks that were busy, and the skew of their arrival; on a CPU it
    is bimodal (the collective's threads on every rank find a core at once,
    or wait for one), so a median says either mode and the mean is what a
    step issuing many of them pays."""
    return _timed_rounds([(op, touch)], device, warmup, repeat, busy_s)[0]


def _timed_rounds(
    ops: Sequence[tuple[Callable[[], object], Callable[[], object] | None]],
    device: torch.device,
    warmup: int,
    repeat: int,
    busy_s: float,
) -> list[float]:
    """``_timed`` of several (op, touch) at once, in rounds: each round calls
    every op once, in order, so the ops' means span the same time. A shared
    machine drifts between modes over seconds (on 2 loaded cores the same
    gloo all-reduce averages 2 ms over one batch of calls and 3.5 ms over
    the next); timed one after the other, the points of a curve would each
    catch a mode of their own, and a message size between two points would
    be priced by the luck of its neighbours."""
    scratch = torch.ones(64, 64)
    totals = [0.0] * len(ops)
    for i in range(warmup + repeat):
        for k, (op, touch) in enumerate(ops):
            _busy(busy_s, scratch)
            if touch is not None:
                touch()
            _sync(device)
            t0 = time.perf_counter()
            op()
            _sync(device)
            if i >= warmup:
                totals[k] += time.perf_counter() - t0
    return [t / repeat for t in totals]


#: the two timings FSDP_REDUCE is the difference of (not records themselves)
_FSDP_SYNC, _FSDP_NO_SYNC = "_fsdp_sync", "_fsdp_no_sync"


class _FlatUnit(nn.Module):
    """One FSDP unit of `numel` parameters whose forward and backward are a sweep of them."""

    def __init__(self, numel: int, device: torch.device) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(numel, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.w * x).sum()


def _fsdp_unit_ops(nbytes: int, group: Any, device: torch.device) -> list[tuple[str, Callable[[], object]]]:
    """FSDP2's (``fully_shard``, as ``launch.sharded`` sets it up) work on one
    unit of `nbytes` of parameters among `group`'s ranks, besides what a
    one-rank profile sees: gathering the parameters (copy into the
    all-gather buffer, the all-gather, the copies out, the views; timed as
    ``unshard`` + ``reshard``), and the gradient's reduce (copy in, the
    reduce-scatter, the copy into the sharded gradient; a forward and
    backward with gradient sync, and the same without it, whose difference
    is the record)."""
    from torch.distributed.device_mesh import DeviceMesh

    from launch.sharded import shard_unit

    flat = _FlatUnit(max(nbytes // 4, 1), device)
    unit = shard_unit(flat, DeviceMesh.from_group(group, device.type))
    x = torch.ones((), device=device)

    def gather() -> None:
        unit.unshard()
        unit.reshard()

    def step(sync: bool) -> None:
        unit.set_requires_gradient_sync(sync)
        flat(x).backward()  # the same module: fully_shard changes its class in place
        flat.w.grad = None

    return [
        (FSDP_UNSHARD, gather),
        (_FSDP_SYNC, functools.partial(step, True)),
        (_FSDP_NO_SYNC, functools.partial(step, False)),
    ]


def _comm_worker(
    rank: int,
    world: int,
    rendezvous: str,
    backend: str,
    link: str,
    sizes: Sequence[int],
    warmup: int,
    repeat: int,
    busy_s: float,
    result: str,
) -> None:
    """One rank of the communication profile; rank 0 writes the records to
    `result`. The ranks meet in the file `rendezvous` (no port to pick)."""
    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, init_method=f"file://{rendezvous}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    counts = sorted({n for n in (2, 4, 8, 16, world) if n <= world})
    groups = {n: dist.new_group(list(range(n))) for n in counts}  # every rank must create every group
    items: list[tuple[str, int, int]] = []  # (op, ranks, bytes), in the order of ops
    ops: list[tuple[Callable[[], object], Callable[[], object] | None]] = []
    for nbytes in sizes:
        buf = torch.zeros(max(nbytes // 4, 1), dtype=torch.float32, device=device)

        def ping(buf: torch.Tensor = buf) -> None:  # one round trip between ranks 0 and 1: two sends
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)

        def touch(buf: torch.Tensor = buf) -> None:
            buf.fill_(1.0)

        items.append(("p2p", 2, _nbytes(buf)))
        ops.append((ping, touch))
        for n in counts:
            if rank >= n:  # not in this group: the group's ranks run it without this one
                continue
            parts = [torch.empty_like(buf) for _ in range(n)]
            group = groups[n]
            # a reduce-scatter of an nbytes buffer (rounded down to n equal chunks), as FSDP reduces its
            # gradients: each rank keeps its chunk of the sum (gloo: an all-reduce of the whole buffer)
            chunk = torch.zeros(max(buf.numel() // n, 1), dtype=buf.dtype, device=device)
            whole = torch.zeros(chunk.numel() * n, dtype=buf.dtype, device=device)
            items += [("allreduce", n, _nbytes(buf)), ("allgather", n, _nbytes(buf))]
            items.append(("reducescatter", n, _nbytes(whole)))
            ops.append((functools.partial(dist.all_reduce, buf, group=group), touch))
            ops.append((functools.partial(dist.all_gather, parts, buf, group=group), touch))
            scatter = functools.partial(dist.reduce_scatter_tensor, chunk, whole, group=group)
            ops.append((scatter, functools.partial(whole.fill_, 1.0)))
            for op, call in _fsdp_unit_ops(nbytes, group, device):
                items.append((op, n, nbytes))
                ops.append((call, None))
    dist.barrier()
    times = dict(zip(items, _timed_rounds(ops, device, warmup, repeat, busy_s), strict=True))
    recs = [
        CommRecord(link, op, n, nbytes, t / 2 if op == "p2p" else t)  # a ping is two sends
        for (op, n, nbytes), t in times.items()
        if not op.startswith("_")
    ]
    recs += [  # FSDP's reduce: its backward with gradient sync less the same backward without
        CommRecord(link, FSDP_REDUCE, n, nbytes, max(0.0, t - times[(_FSDP_NO_SYNC, n, nbytes)]))
        for (op, n, nbytes), t in times.items()
        if op == _FSDP_SYNC
    ]
    dist.barrier()
    if rank == 0:
        with open(result, "w", encoding="utf-8") as f:
            json.dump([r.__dict__ for r in recs], f)
    dist.destroy_process_group()


def profile_comm(
    world: int,
    *,
    link: str,
    backend: str | None = None,
    sizes: Iterable[int] = COMM_SIZES,
    warmup: int = 2,
    repeat: int = 5,
    busy_s: float = COMM_BUSY_S,
) -> list[CommRecord]:
    """p2p (ranks 0 <-> 1), all-reduce, all-gather, reduce-scatter and
    FSDP2's gather and reduce of one unit (``_fsdp_unit_ops``; among 2, 4,
    ... `world` ranks) times against message size, measured by `world` local processes,
    each computing for `busy_s` before every call, the sizes in rounds
    (see ``_timed_rounds``)."""
    if busy_s < 0:
        raise ProfileError(f"busy_s must be >= 0, got {busy_s}")
    if world < 2:
        raise ProfileError(f"communication profiling needs at least 2 ranks, got {world}")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl" and torch.cuda.device_count() < world:
        raise ProfileError(f"{world} ranks need {world} GPUs, this node has {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory(prefix="cellsched-comm-") as tmp:
        result = os.path.join(tmp, "comm.json")
        start_processes(  # type: ignore[no-untyped-call]  # torch: unannotated
            _comm_worker,
            args=(world, os.path.join(tmp, "rendezvous"), backend, link, tuple(sizes), warmup, repeat, busy_s, result),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        with open(result, encoding="utf-8") as f:
            return [CommRecord(**r) for r in json.load(f)]


# ------------------------------------------------------------------- summary


def summarize(recs: Sequence[LayerRecord]) -> list[dict[str, Any]]:
    """One row per (tp, micro-batch) and wrapping runtime (``runtime``, only
    on the rows of layers profiled as a runtime wraps them): whole-model
    forward/backward ms and MB."""
    rows: dict[tuple[str, int, int], dict[str, Any]] = {}
    for r in recs:
        wrapped = r.gpu_type.partition(RUNTIME_SEP)[2]
        row = rows.setdefault(
            (wrapped, r.tp, r.micro_batch),
            ({"runtime": wrapped} if wrapped else {})
            | {
                "tp": r.tp,
                "micro_batch": r.micro_batch,
                "layers": 0,
                "fwd_ms": 0.0,
                "bwd_ms": 0.0,
                "params_mb": 0.0,
                "act_mb": 0.0,
            },
        )
        row["layers"] += 1
        row["fwd_ms"] += r.fwd_s * 1e3
        row["bwd_ms"] += r.bwd_s * 1e3
        row["params_mb"] += r.param_bytes / 1e6
        row["act_mb"] += r.act_bytes / 1e6
    return [{k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()} for row in rows.values()]


def curve_bandwidth_gbps(recs: Sequence[CommRecord], op: str = "p2p") -> float:
    """Bus bandwidth (GB/s) of the largest message of `op`: nbytes / time."""
    big = max((r for r in recs if r.op == op), key=lambda r: r.nbytes, default=None)
    return big.nbytes / big.time_s / 1e9 if big and big.time_s > 0 else math.nan
