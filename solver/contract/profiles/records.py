"""Rows of the profile store, as frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ProfileSource(StrEnum):
    """Where a cell record comes from (other names are kept as given, and rank last)."""

    MEASURED = "measured"  # our profiler
    ARENA_OPTIMAL = "arena-optimal"  # Arena's measured optimal-plan table
    ARENA_ESTIMATED = "arena-estimated"  # Arena's per-plan profiler estimates


@dataclass(frozen=True)
class CellRecord:
    """A measured (or externally estimated) iteration time of a whole cell.

    iter_time_s None means the configuration ran out of memory.
    pp/dp/tp are set when the record is for one specific plan (None: the best
    plan, plan unknown, as in Arena's optimal database).
    """

    model: str
    global_batch: int
    gpu_type: str
    num_nodes: int
    gpus_per_node: int
    iter_time_s: float | None
    pp: int | None = None
    dp: int | None = None
    tp: int | None = None
    source: str = ProfileSource.MEASURED  # or any name an importer gives

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def oom(self) -> bool:
        return self.iter_time_s is None


#: layer kinds (LayerRecord.kind):
#: TP all-reduces per micro-batch (forward + backward) of one layer, by
#: kind; any other kind is a whole transformer block: 2 forward, 2 backward.
TP_ALLREDUCES_BY_KIND = {
    "embed": 0,
    "embedding": 0,
    "head": 0,
    "lm_head": 0,
    "loss": 0,
    "pool": 0,
    "stem": 0,
    "attention": 2,
    "attn": 2,
    "mlp": 2,
    "ffn": 2,
}
TP_ALLREDUCES_PER_BLOCK = 4
#: Layer kinds that are not one of the trainer's layers (blocks): they ride with a neighbouring block.
NON_BLOCK_KINDS = frozenset(k for k, n in TP_ALLREDUCES_BY_KIND.items() if n == 0)


@dataclass(frozen=True)
class LayerRecord:
    """One layer of a model profiled on ONE GPU of a type (Arena-style).

    Times are per micro-batch of `micro_batch` samples with the layer split
    `tp` ways; memory in bytes per GPU: parameters (+ grads + optimizer state
    is derived from param_bytes), activations kept for backward, and the size
    of the activation tensor the layer sends on (for pipeline p2p).
    """

    model_sig: str
    gpu_type: str
    tp: int
    micro_batch: int
    layer: int
    kind: str
    fwd_s: float
    bwd_s: float
    param_bytes: int
    act_bytes: int
    out_bytes: int


#: CommRecord's ops for FSDP2's gather and reduce of one unit (by the unit's parameter bytes)
FSDP_UNSHARD, FSDP_REDUCE = "fsdp_unshard", "fsdp_reduce"


@dataclass(frozen=True)
class CommRecord:
    """Time of one communication op of `nbytes` among `nranks` over a link.

    link: "nvlink" | "pcie" | "net" | "loopback" (or any name a profiler uses).
    op: "p2p" | "allreduce" | "allgather" | "reducescatter" | "fsdp_unshard" |
    "fsdp_reduce". nbytes: the buffer of an all-reduce or a reduce-scatter
    (each rank keeps nbytes / nranks of the latter), what each rank
    contributes to an all-gather, one send, an FSDP unit's parameters (FSDP2
    gathering them, and reducing their gradients, with its own copies:
    ``launch.profiler._fsdp_unit_ops``).
    """

    link: str
    op: str
    nranks: int
    nbytes: int
    time_s: float


#: the default network between nodes: 100 Gb/s, in GB/s
NET_GBPS = 12.5
#: the default link between the GPUs of a node: PCIe 4.0 x16, one way, in GB/s
PCIE4_GBPS = 32.0


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet numbers for the analytic fallback."""

    name: str
    mem_gb: float
    peak_tflops: float
    mem_bw_gbps: float
    intra_link: str = "pcie"
    intra_bw_gbps: float = PCIE4_GBPS
    inter_bw_gbps: float = NET_GBPS


#: joins a GPU type and a runtime in the layer records profiled as that runtime wraps its layers
RUNTIME_SEP = "@"


def runtime_gpu_type(gpu_type: str, runtime: str) -> str:
    """The GPU type the layers of `gpu_type` profiled as `runtime` wraps them
    are stored under (``launch.profiler.profile_layers(runtime=...)``): the
    estimator prices that runtime's plans from them where they exist."""
    return f"{gpu_type}{RUNTIME_SEP}{runtime}"
