"""The memory side of a candidate plan: what a GPU may hold, and what the
plan holds there as its runtime runs it (``solver.cost.pipeline``'s model,
plus ``solver.cost.runtime``'s buffers for a runtime priced as its own),
replicated or with the optimizer state sharded over the dp ranks."""

from __future__ import annotations

from solver.contract.models import ModelSpec
from solver.cost.layers import StageCosts
from solver.cost.pipeline import replicated_state, sharded_memory
from solver.cost.runtime import Pricing, runtime_memory, zero1_gather_bytes
from solver.estimator.profiles import GB, Profiles


class Memory:
    """Memory limits and a plan's peak memory per GPU, in bytes (module doc)."""

    def __init__(self, profiles: Profiles) -> None:
        self.profiles = profiles
        self.settings = profiles.settings

    def limit(self, gpu_type: str) -> float:
        """Bytes a plan may use per GPU of `gpu_type` (inf when the type is unknown)."""
        return self.profiles.mem_limit_gb(gpu_type) * GB

    def replicated(
        self, pr: Pricing, st: StageCosts, model: ModelSpec, *, dp: int, tp: int, m: int, b: float, k: int, base: float
    ) -> float:
        """Peak bytes per GPU of a plan with replicated state (FSDP: fully
        sharded), `base` the pipeline model's: the runtime's own on top for a
        runtime priced as its own, the embedding and one block as FSDP's units
        where the layer costs do not tell them apart."""
        if not pr.own:
            return base
        root = model.vocab * model.hidden * model.dtype_bytes if model.heads > 1 else 0.0
        block = (model.params * model.dtype_bytes - root) / max(1, model.num_layers) if root else 0.0
        return runtime_memory(
            pr,
            st,
            dp=dp,
            m=m,
            b=b,
            units=k,
            dtype_bytes=model.dtype_bytes,
            optimizer_bytes_per_param=self.settings.optimizer_bytes_per_param,
            base=base,
            root_bytes=root / tp,
            block_bytes=block / tp,
        )

    def sharded(
        self, pr: Pricing, st: StageCosts, model: ModelSpec, *, dp: int, m: int, b: float, k: int
    ) -> tuple[float, float]:
        """(peak bytes per GPU, optimizer state bytes per GPU) of a plan with
        its optimizer state sharded evenly over `dp` ranks (ZeRO-1); the exact
        runtime's owners also gather every unit's slices (no activations held then)."""
        obpp = self.settings.optimizer_bytes_per_param
        mem, st_bytes = sharded_memory(
            st, m=m, b=b, dtype_bytes=model.dtype_bytes, optimizer_bytes_per_param=obpp, fraction=1.0 / dp
        )
        gather = zero1_gather_bytes(pr, st, units=k)
        if gather > 0:
            state_only, _ = sharded_memory(
                st, m=m, b=0.0, dtype_bytes=model.dtype_bytes, optimizer_bytes_per_param=obpp, fraction=1.0 / dp
            )
            mem = max(mem, state_only + gather)
        return mem, st_bytes

    def state_gb(self, pr: Pricing, st: StageCosts, model: ModelSpec, *, dp: int, m: int, b: float) -> float:
        """The optimizer state (GB per GPU, at the stage of peak memory) of a
        replicated plan (FSDP runtimes: the dp-th each rank holds)."""
        state = replicated_state(
            st,
            m=m,
            b=b,
            dtype_bytes=model.dtype_bytes,
            optimizer_bytes_per_param=self.settings.optimizer_bytes_per_param,
        )
        return state / (dp if pr.fsdp else 1) / GB
