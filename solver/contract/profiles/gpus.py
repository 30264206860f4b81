"""Datasheet numbers of the GPU types a new profile store is seeded with.

For Arena's four types (a100, v100, a40, a10) memory (GB) and memory
bandwidth (GB/s) come from Arena's simulator specs
(``device_specs.json: simulator_gpu_specs``); peak dense fp16 tensor
TFLOP/s and the intra-node link from the public NVIDIA datasheets
(A100-40GB SXM 312 + NVLink 600 GB/s, V100 125 + NVLink 300 GB/s,
A40 149.7 + PCIe 4.0 x16, A10 125 + PCIe 4.0 x16, ~32 GB/s one way).
H100 (SXM5 80GB) and H200 (SXM 141GB) are datasheet-only (989 dense fp16
TFLOP/s, NVLink 900 GB/s). Nodes are joined by a 100 Gb/s network
(12.5 GB/s).

``cpu`` is a placeholder for CPU-only runs (tests, the reference trainer on
gloo): a small, round guess of one socket (16 GB, 1 TFLOP/s, 20 GB/s memory,
5 GB/s "loopback" between ranks), not a measurement.
"""

from __future__ import annotations

from typing import Any

from solver.contract.profiles.arena import load_device_specs
from solver.contract.profiles.records import NET_GBPS, PCIE4_GBPS, GpuSpec

#: name -> (peak fp16 TFLOP/s, intra link, intra GB/s); Arena's four types
#: take memory and memory bandwidth from Arena's specs.
_DATASHEET: dict[str, tuple[float, str, float]] = {
    "a100": (312.0, "nvlink", 600.0),
    "v100": (125.0, "nvlink", 300.0),
    "a40": (149.7, "pcie", PCIE4_GBPS),
    "a10": (125.0, "pcie", PCIE4_GBPS),
}

_DATASHEET_ONLY: tuple[GpuSpec, ...] = (
    GpuSpec(
        "h100",
        mem_gb=80.0,
        peak_tflops=989.0,
        mem_bw_gbps=3350.0,
        intra_link="nvlink",
        intra_bw_gbps=900.0,
        inter_bw_gbps=NET_GBPS,
    ),
    GpuSpec(
        "h200",
        mem_gb=141.0,
        peak_tflops=989.0,
        mem_bw_gbps=4800.0,
        intra_link="nvlink",
        intra_bw_gbps=900.0,
        inter_bw_gbps=NET_GBPS,
    ),
    GpuSpec(
        "cpu",
        mem_gb=16.0,
        peak_tflops=1.0,
        mem_bw_gbps=20.0,
        intra_link="loopback",
        intra_bw_gbps=5.0,
        inter_bw_gbps=NET_GBPS,
    ),
)


def default_gpu_specs(arena_specs: dict[str, dict[str, Any]] | None = None) -> dict[str, GpuSpec]:
    """The seeded GPU specs, by name.

    `arena_specs` is ``simulator_gpu_specs`` of Arena's device_specs.json
    (read from the shipped copy when None).
    """
    if arena_specs is None:
        arena_specs = load_device_specs()["simulator_gpu_specs"]
    specs: dict[str, GpuSpec] = {}
    for name, (tflops, link, link_bw) in _DATASHEET.items():
        arena = arena_specs[name]
        specs[name] = GpuSpec(
            name,
            mem_gb=float(arena["max_mem_gb"]),
            peak_tflops=tflops,
            mem_bw_gbps=float(arena["max_bw_gb_per_s"]),
            intra_link=link,
            intra_bw_gbps=link_bw,
            inter_bw_gbps=NET_GBPS,
        )
    for spec in _DATASHEET_ONLY:
        specs[spec.name] = spec
    return specs
