"""Each job is priced the way its runtime runs (solver.cost.runtime), and
never offered a plan its runtime cannot carry out or that does not fit.

The oracles are hand computations from the model's size, the GPU's
datasheet and the runtime's code (launch.elastic.ordered_sum holds every
rank's unit gradients; FSDP2 keeps 1/dp of the state), not the estimator's
functions."""

from __future__ import annotations

import math

import pytest

from solver.contract.models import get_model
from solver.contract.profiles.gpus import default_gpu_specs
from solver.contract.profiles.seed import open_store
from solver.estimator import Estimator
from solver.mixed import MixedEstimator
from solver.types import Cell, JobRequest

MODEL = get_model("gpt-1.3b")
CELL = Cell("a100", 4, 4, 1)  # one 4x4 A100 cell, no pipelining
BATCH, V = 128, 16
GB = 1e9
OBPP = 16.0  # the estimator's default optimizer bytes per parameter


@pytest.fixture(scope="module")
def est(tmp_path_factory: pytest.TempPathFactory) -> Estimator:
    return Estimator(open_store(tmp_path_factory.mktemp("store") / "profiles.sqlite"))


def job(runtime: str, vw: int | None = V, shard: bool = False) -> JobRequest:
    return JobRequest("j", MODEL, BATCH, 100, virtual_workers=vw, runtime=runtime, state_sharding=shard)


def limit_bytes() -> float:
    return 0.9 * default_gpu_specs()["a100"].mem_gb * GB


def per_gpu(tp: int) -> tuple[float, float, float]:
    """(parameters, gradient bytes, activation bytes per sample) of one GPU's share at tp (one stage)."""
    params = MODEL.params / tp
    return params, params * MODEL.dtype_bytes, MODEL.act_bytes_per_sample_per_layer() * MODEL.num_layers / tp


def exact_memory(dp: int, tp: int, m: int) -> float:
    """The exact runtime's peak per GPU by hand: backward holds the state, the
    activations of a micro-batch and the k - 1 earlier units' flat
    gradients; the all-gather holds the state, the k flat gradients, the
    send buffer of k, dp x k received and the process group's flat buffer
    of the same dp x k (torch's all_gather into a list of tensors)."""
    k = -(-V // dp)
    params, grads, act = per_gpu(tp)
    b = BATCH / V / m
    backward = params * OBPP + act * b + (k - 1) * grads
    gather = params * OBPP + (2 * k + 2 * dp * k - 1) * grads  # no parameter holds its gradient then
    return max(backward, gather)


def test_the_case_priced_as_allreduce_picks_a_plan_whose_allgather_overflows(est: Estimator) -> None:
    # the simulator's runtime (all-reduce) picks dp8 x tp2 at 1.54 s, as before runtimes existed
    adaptive = est.estimate(job("adaptive"), CELL)
    assert adaptive.plan is not None
    assert (adaptive.plan.dp, adaptive.plan.tp) == (8, 2)
    assert adaptive.iter_time_s == pytest.approx(1.537, abs=0.001)
    # that plan under the exact runtime: 8 ranks x 2 units of 1.3 GB gradients received, 57 GB > 36 GB
    params, grads, _ = per_gpu(2)
    assert params * OBPP + (2 * 2 + 2 * 8 * 2 - 1) * grads > limit_bytes()
    # so the exact runtime never picks it: dp4 x tp4, the one plan whose buffers fit
    exact = est.estimate(job("exact"), CELL)
    assert exact.plan is not None
    assert (exact.plan.dp, exact.plan.tp) == (4, 4)
    assert exact.mem_per_gpu_gb * GB == pytest.approx(exact_memory(4, 4, exact.plan.micro_batches), rel=1e-9)
    assert exact.mem_per_gpu_gb * GB <= limit_bytes()
    for dp, tp in ((16, 1), (8, 2)):  # every other plan of the cell overflows at its all-gather
        assert min(exact_memory(dp, tp, m) for m in (1, 2, 4, 8)) > limit_bytes()


def test_exact_prices_the_allgather_of_every_unit(est: Estimator) -> None:
    """Exact's time over the all-reduce's for the same plan: the all-gather of
    k units in place of the ring all-reduce, the gathered sum's adds and the
    gradient's copies, by hand from the datasheet (the dp groups cross nodes:
    the network, each node's 4 tp rings sharing its card)."""
    spec = default_gpu_specs()["a100"]
    net_bw, lat = spec.inter_bw_gbps * 1e9, 2.5e-5
    dp, tp, m, k = 4, 4, 1, 4
    _, grads, _ = per_gpu(tp)
    nbytes = grads * tp
    allgather = (dp - 1) * lat + (dp - 1) * nbytes * k / net_bw
    allreduce = 2 * (dp - 1) * lat + 2 * (dp - 1) / dp * nbytes / net_bw
    d = MODEL.dtype_bytes
    sweeps = (4 * 2 * d + (dp * k - 1) * 3 * d) * MODEL.params / tp / (spec.mem_bw_gbps * 1e9)
    times: dict[str, float] = {}
    for rt in ("adaptive", "exact"):
        plans = est.plans(JobRequest("j", MODEL, BATCH, 1, virtual_workers=V, state_sharding=False, runtime=rt), CELL)
        (times[rt],) = [t for p, t, _ in plans if (p.dp, p.tp, p.micro_batches) == (dp, tp, m)]
    assert times["exact"] - times["adaptive"] == pytest.approx(allgather - allreduce + sweeps, rel=1e-6)


def test_sharded_runtime_holds_a_dp_th_of_the_state(est: Estimator) -> None:
    """FSDP2 (runtime sharded): no virtual workers, so dp = V = 16 on 16 GPUs
    (tp 1); per GPU 1/16 of the state, the root unit (embedding, head)
    gathered with its gradient, three blocks' worth in flight, one
    micro-batch's activations."""
    e = est.estimate(job("sharded"), CELL)
    assert e.plan is not None and (e.plan.dp, e.plan.tp) == (16, 1)
    assert e.plan.state_shares == ()  # FSDP shards on its own: no ZeRO-1 slices
    params, _, act = per_gpu(1)
    d = MODEL.dtype_bytes
    root = MODEL.vocab * MODEL.hidden * d
    block = (MODEL.params - MODEL.vocab * MODEL.hidden) * d / MODEL.num_layers
    want = params * OBPP / 16 + act * BATCH / 16 / e.plan.micro_batches + 2 * root + 3 * block
    assert e.mem_per_gpu_gb * GB == pytest.approx(want, rel=1e-9)
    # without V its dp is free: fewer, larger state shards cost more memory, never less than the dp-th
    free = est.estimate(job("sharded", vw=None), CELL)
    assert free.feasible and free.plan is not None
    assert free.mem_per_gpu_gb * GB >= params / free.plan.tp * OBPP / free.plan.dp


def test_ddp_gets_data_parallel_plans_only(est: Estimator) -> None:
    plans = est.plans(JobRequest("j", MODEL, BATCH, 1, state_sharding=False, runtime="ddp"), CELL)
    assert plans and {p.tp for p, _, _ in plans} == {1} and {p.dp for p, _, _ in plans} == {16}
    deep = est.estimate(job("ddp", vw=None), Cell("a100", 4, 4, 2))
    assert not deep.feasible and "no pipeline parallelism" in deep.note
    # DDP's buckets: a flat copy of the gradients beside the replicated state
    e = est.estimate(job("ddp", vw=None), CELL)
    assert e.plan is not None
    params, grads, act = per_gpu(1)
    want = params * OBPP + grads + act * BATCH / 16 / e.plan.micro_batches
    assert e.mem_per_gpu_gb * GB == pytest.approx(want, rel=1e-9)


def test_megatron_is_priced_with_its_distributed_optimizer_in_every_plan_of_dp_over_one(est: Estimator) -> None:
    """The adapter always runs Megatron with --use-distributed-optimizer, so
    every plan of dp > 1 is priced with the optimizer state sharded evenly
    (ZeRO-1), even for a job (or settings) that says no sharding: per GPU
    the parameters and gradients (2 x 2 bytes a parameter) whole, the rest of
    the 16 bytes plus the fp16 copy it updates over dp, and one micro-batch's
    activations; DDP, whose state is never sharded, holds all 16 bytes."""
    for shard in (False, True):
        e = est.estimate(job("megatron", vw=None, shard=shard), CELL)
        assert e.plan is not None and e.plan.dp > 1 and e.plan.state_shares == (1.0,), shard
        params, _, act = per_gpu(e.plan.tp)
        b = BATCH / e.plan.dp / e.plan.micro_batches
        want = params * (4 + (OBPP - 4 + 2) / e.plan.dp) + act * b
        assert e.mem_per_gpu_gb * GB == pytest.approx(want, rel=1e-9)
    plans = est.plans(job("megatron", vw=None), CELL)
    assert plans and all(p.state_shares == (1.0,) for p, _, _ in plans if p.dp > 1)
    ddp = est.plans(job("ddp", vw=None, shard=True), CELL)
    assert ddp and all(p.state_shares == () for p, _, _ in ddp)
    # one dp rank: nothing to shard over, the plan says replicated (the distributed optimizer is then the same)
    one = est.estimate(job("megatron", vw=None), Cell("a100", 1, 1, 1))
    assert one.plan is not None and one.plan.dp == 1 and one.plan.state_shares == ()


def test_no_virtual_workers_means_dp_equals_v(est: Estimator) -> None:
    e = est.estimate(job("megatron", vw=8), CELL)
    assert e.plan is not None and e.plan.dp == 8
    none = est.estimate(job("ddp", vw=8), CELL)  # 16 GPUs, tp 1: dp 16 != V
    assert not none.feasible and "no virtual workers" in none.note


def test_even_stages_where_the_runtime_cannot_split_unevenly(est: Estimator) -> None:
    cell = Cell("a100", 4, 4, 4)
    for rt in ("megatron", "torchtitan"):
        e = est.estimate(job(rt, vw=None), cell)
        assert e.plan is not None and e.plan.stage_layers == (6, 6, 6, 6), rt
    odd = est.estimate(job("megatron", vw=None), Cell("a100", 5, 1, 5))  # 24 layers over 5 stages
    assert not odd.feasible and "evenly" in odd.note
    uneven = est.estimate(job("exact", vw=None), Cell("a100", 5, 1, 5))
    assert uneven.feasible and uneven.plan is not None and sum(uneven.plan.stage_layers) == 24


def test_mixed_types_only_where_the_runtime_runs_them(est: Estimator) -> None:
    mixed = MixedEstimator(est)
    cell = Cell("a100+v100", 2, 4, 1, parts=(("a100", 1), ("v100", 1)))
    for rt in ("ddp", "megatron", "torchtitan"):
        e = mixed.estimate(job(rt, vw=None), cell)
        assert not e.feasible and "one GPU type" in e.note, rt
    for rt in ("exact", "sharded", "adaptive"):
        e = mixed.estimate(JobRequest("j", get_model("gpt-350m"), 64, 100, runtime=rt), cell)
        assert e.feasible, (rt, e.note)


def test_unknown_runtime_is_a_clear_error(est: Estimator) -> None:
    with pytest.raises(ValueError, match="unknown runtime 'jax'"):
        est.pricing("jax")
    assert math.isfinite(est.estimate(job("adaptive"), CELL).iter_time_s)


def _layer_store(path, *, wrapped: bool):  # noqa: ANN001, ANN202  (a test helper)
    """A store of gpt-tiny's layers on "cpu" at tp 1, micro-batch 2: each layer
    1 ms forward and 2 ms backward; with `wrapped`, also the same layers as
    the sharded runtime wraps them (``runtime_gpu_type``), 4 ms and 7 ms."""
    from solver.contract.profiles.records import GpuSpec, LayerRecord, runtime_gpu_type

    tiny = get_model("gpt-tiny")
    kinds = ["embed"] + ["block"] * tiny.num_layers + ["head"]
    types = [("cpu", 1e-3, 2e-3)] + ([(runtime_gpu_type("cpu", "sharded"), 4e-3, 7e-3)] if wrapped else [])
    store = open_store(path)
    store.put_gpu(GpuSpec("cpu", mem_gb=64.0, peak_tflops=0.1, mem_bw_gbps=10.0))
    store.put_layers(
        LayerRecord(tiny.signature, gpu, 1, 2, i, kind, fwd, bwd, 4096, 8192, 1024)
        for gpu, fwd, bwd in types
        for i, kind in enumerate(kinds)
    )
    return store


def test_sharded_plans_are_priced_from_the_layers_profiled_as_it_wraps_them(tmp_path) -> None:  # noqa: ANN001
    """Layers profiled as the sharded runtime wraps them (FSDP2's hooks and
    copies) price its plans: one GPU, one micro-batch of 2, no collectives,
    so the plan is slower by exactly the layers' extra time, (4 + 7) - (1 + 2)
    ms for each of the 6 layers; its memory, and every other runtime's
    prices, are those of the plain layers."""
    tiny = get_model("gpt-tiny")
    cell = Cell("cpu", 1, 1, 1)
    with (
        _layer_store(tmp_path / "plain.sqlite", wrapped=False) as a,
        _layer_store(tmp_path / "wrapped.sqlite", wrapped=True) as b,
    ):
        plain, wrapped = Estimator(a), Estimator(b)

        def one(est: Estimator, runtime: str) -> tuple[float, float]:
            [(plan, t, mem)] = [
                p
                for p in est.plans(JobRequest("j", tiny, 2, 1, state_sharding=False, runtime=runtime), cell)
                if p[0].micro_batches == 1
            ]
            return t, mem

        t0, m0 = one(plain, "sharded")
        t1, m1 = one(wrapped, "sharded")
        assert t1 - t0 == pytest.approx(6 * 8e-3, rel=1e-9)
        assert m1 == m0
        for runtime in ("exact", "adaptive", "ddp"):
            assert one(wrapped, runtime) == one(plain, runtime)


def test_a_micro_batch_between_two_profiled_sizes_is_priced_on_their_line(tmp_path) -> None:  # noqa: ANN001
    """Each layer takes 10 ms at micro-batch 1 and 16 ms at 4 (8 ms a
    micro-batch, 2 ms a sample): a runtime's plan at 2 is priced at 12 ms a
    layer, 4 ms under the plan at 4 for each of the 6 layers (one GPU, one
    micro-batch, the rest of the step alike); the simulator's `adaptive`
    keeps the nearest size's time per sample (4 ms: 8 ms at 2)."""
    from solver.contract.profiles.records import GpuSpec, LayerRecord

    tiny = get_model("gpt-tiny")
    kinds = ["embed"] + ["block"] * tiny.num_layers + ["head"]
    with open_store(tmp_path / "p.sqlite") as store:
        store.put_gpu(GpuSpec("cpu", mem_gb=64.0, peak_tflops=0.1, mem_bw_gbps=10.0))
        store.put_layers(
            LayerRecord(tiny.signature, "cpu", 1, b, i, kind, t / 2, t / 2, 4096, 8192 * b, 1024 * b)
            for b, t in ((1, 10e-3), (4, 16e-3))
            for i, kind in enumerate(kinds)
        )
        est = Estimator(store)
        cell = Cell("cpu", 1, 1, 1)

        def one(batch: int, runtime: str) -> float:
            return next(
                t
                for p, t, _ in est.plans(JobRequest("j", tiny, batch, 1, state_sharding=False, runtime=runtime), cell)
                if p.micro_batches == 1
            )

        for runtime in ("exact", "sharded"):
            assert one(4, runtime) - one(2, runtime) == pytest.approx(6 * 4e-3, rel=1e-9)
        assert one(4, "adaptive") - one(2, "adaptive") == pytest.approx(6 * 8e-3, rel=1e-9)


def test_fsdp_gathers_and_reduces_are_priced_from_fsdp_s_own_curves(tmp_path) -> None:  # noqa: ANN001
    """A sharded dp=2 plan (one micro-batch) gathers each FSDP unit (every
    block, and the stage as the root) twice and reduces it once. With the
    profile's curves of FSDP2's own gather (5 ms) and reduce (7 ms), against
    the plain all-gather (2 ms) and reduce-scatter (3 ms) curves alone, the
    step is slower by (blocks + 1) x (2 x 3 + 4) ms; no other runtime's
    price moves."""
    from solver.contract.profiles.records import CommRecord, GpuSpec, LayerRecord

    tiny = get_model("gpt-tiny")
    kinds = ["embed"] + ["block"] * tiny.num_layers + ["head"]
    flat = (1, 10**12)  # a flat curve: the same time at any size

    def store(path, fsdp: bool):  # noqa: ANN001, ANN202
        s = open_store(path)
        s.put_gpu(GpuSpec("cpu", mem_gb=64.0, peak_tflops=0.1, mem_bw_gbps=10.0, intra_link="loopback"))
        s.put_layers(
            LayerRecord(tiny.signature, "cpu", 1, 2, i, kind, 1e-3, 2e-3, 4096, 8192, 1024)
            for i, kind in enumerate(kinds)
        )
        ops = {"allgather": 2e-3, "reducescatter": 3e-3, "allreduce": 1e-3, "p2p": 1e-3}
        if fsdp:
            ops |= {"fsdp_unshard": 5e-3, "fsdp_reduce": 7e-3}
        s.put_comm(CommRecord("loopback", op, 2, n, t) for op, t in ops.items() for n in flat)
        return s

    cell = Cell("cpu", 1, 2, 1)
    with store(tmp_path / "plain.sqlite", False) as a, store(tmp_path / "fsdp.sqlite", True) as b:

        def one(est: Estimator, runtime: str) -> float:
            job = JobRequest("j", tiny, 4, 1, state_sharding=False, runtime=runtime)
            return next(t for p, t, _ in est.plans(job, cell) if (p.dp, p.micro_batches) == (2, 1) and not p.sharded)

        plain, own = Estimator(a), Estimator(b)
        assert one(own, "sharded") - one(plain, "sharded") == pytest.approx((tiny.num_layers + 1) * 10e-3, rel=1e-9)
        for runtime in ("exact", "adaptive", "ddp"):
            assert one(own, runtime) == one(plain, runtime)
