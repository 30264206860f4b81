"""Issue 15, single-type side: every pp > 1 plan carries the layer split it
was priced with (as the trainer counts layers), and Cephalo's memory side:
optimizer state sharded over dp ranks (ZeRO-1) where a cell fits only that
way."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launch.layout import split_layers
from slurm_ext.config import solver_options
from solver.contract.models import ModelSpec, get_model
from solver.contract.profiles.records import CellRecord, CommRecord, GpuSpec, LayerRecord
from solver.contract.profiles.seed import open_store
from solver.contract.profiles.store import ProfileStore
from solver.cost.comm import Links
from solver.cost.layers import layers_from_records, split_stages, stage_layers_for, uniform_sizes
from solver.cost.pipeline import Ranks, sharded_memory, sharded_step_time, state_split
from solver.estimator import Estimator
from solver.policies.cellsched import CellschedPolicy
from solver.types import Cell, ClusterView, JobRequest, NodeView, ParallelPlan, ScheduleRequest, SolverConfig

HAND = ModelSpec("hand", "gpt", num_layers=4, hidden=64, heads=4, seq_len=8, vocab=16, params=1e6)
TIMES = (1.0, 2.0, 3.0, 2.0)  # fwd + bwd of each block at micro-batch 2
PARAMS = (2000, 4000, 4000, 2000)  # bytes of each block (fp16: 6000 parameters in all)


def spec(name: str, mem_gb: float) -> GpuSpec:
    return GpuSpec(
        name,
        mem_gb=mem_gb,
        peak_tflops=100.0,
        mem_bw_gbps=1000.0,
        intra_link="nvlink",
        intra_bw_gbps=100.0,
        inter_bw_gbps=10.0,
    )


def profile(gpu: str, embed_s: float = 0.1, head_s: float = 0.1) -> list[LayerRecord]:
    """A profile as launch.profiler writes it: embed, one record per block, head."""
    recs = [LayerRecord(HAND.signature, gpu, 1, 2, 0, "embed", embed_s * 0.25, embed_s * 0.75, 0, 10, 1500)]
    recs += [
        LayerRecord(HAND.signature, gpu, 1, 2, i + 1, "block", t * 0.25, t * 0.75, p, 200, 1500)
        for i, (t, p) in enumerate(zip(TIMES, PARAMS, strict=True))
    ]
    recs.append(LayerRecord(HAND.signature, gpu, 1, 2, 5, "head", head_s * 0.25, head_s * 0.75, 0, 10, 1500))
    return recs


def store(*gpus: GpuSpec, embed_s: float = 0.1) -> ProfileStore:
    s = ProfileStore(":memory:")
    for g in gpus:
        s.put_gpu(g)
        s.put_layers(profile(g.name, embed_s=embed_s))
    s.put_comm([CommRecord("nvlink", "allreduce", 2, 10000, 0.01), CommRecord("nvlink", "allreduce", 2, 20000, 0.02)])
    return s


# ---- stage_layers ------------------------------------------------------------------------------------


def test_analytic_plans_carry_the_even_split_of_the_trainers_layers():
    est = Estimator(open_store(":memory:"))
    model = get_model("gpt-1.3b")
    for pp in (2, 4, 8):
        e = est.estimate_model(model, 32, Cell("a100", 2, 4, pp))
        assert e.feasible and e.plan.stage_layers == uniform_sizes(model.num_layers, pp)
        assert sum(e.plan.stage_layers) == model.num_layers
        assert [len(r) for r in split_layers(model.num_layers, pp, e.plan.stage_layers)] == list(e.plan.stage_layers)
    one = est.estimate_model(model, 32, Cell("a100", 2, 4, 1))
    assert one.plan.stage_layers == ()
    # stage_layers is not part of a plan's identity: plans built without it still compare equal
    assert one.plan == ParallelPlan(1, one.plan.dp, one.plan.tp, one.plan.micro_batches)


def test_composed_split_counts_blocks_not_embedding_and_head():
    """The profile has 6 records (embed, 4 blocks, head); the trainer counts the 4 blocks."""
    est = Estimator(store(spec("g", 80.0)))
    e = est.estimate_model(HAND, 8, Cell("g", 1, 2, pp=2))
    assert e.feasible and e.source == "composed"
    # blocks 1 2 | 3 2 by time (embed and head ride along): 2 blocks per stage
    assert e.plan.stage_layers == (2, 2) and sum(e.plan.stage_layers) == HAND.num_layers
    split_layers(HAND.num_layers, 2, e.plan.stage_layers)  # what the launcher checks


def test_a_stage_without_a_block_is_split_again():
    """A heavy embedding alone would make a stage of its own: the split joins it to the first block."""
    costs = layers_from_records(profile("g", embed_s=10.0))
    st_ = split_stages(costs, 2, 2.0, num_layers=HAND.num_layers)
    assert min(st_.blocks) >= 1 and sum(st_.blocks) == HAND.num_layers
    assert st_.layers[0] >= 2  # embed + at least one block
    plain = split_stages(costs, 2, 2.0)  # without the trainer's count: the profile's blocks
    assert plain.blocks == st_.blocks
    est = Estimator(store(spec("g", 80.0), embed_s=10.0))
    e = est.estimate_model(HAND, 8, Cell("g", 1, 2, pp=2))
    assert e.plan.stage_layers == st_.blocks


def test_measured_estimates_carry_the_models_split():
    s = store(spec("g", 80.0))
    s.put_cells([CellRecord("hand", 8, "g", 1, 2, 3.0, source="measured")])
    est = Estimator(s)
    for pp in (1, 2):
        e = est.estimate_model(HAND, 8, Cell("g", 1, 2, pp))
        assert e.feasible and e.source.startswith("measured")
        assert e.plan.stage_layers == (() if pp == 1 else (2, 2))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.05, 20.0), min_size=1, max_size=6), st.data())
def test_stage_layers_for_respects_caps_and_sums(weights, data):
    n = len(weights)
    num_layers = data.draw(st.integers(n, 64))
    caps = data.draw(st.lists(st.integers(1, 64), min_size=n, max_size=n))
    if sum(min(c, num_layers) for c in caps) < num_layers:
        with pytest.raises(ValueError):
            stage_layers_for(num_layers, weights, caps)
        return
    out = stage_layers_for(num_layers, weights, caps)
    assert sum(out) == num_layers and all(1 <= k <= c for k, c in zip(out, caps, strict=True))
    if all(c >= num_layers for c in caps):  # no cap binds: within one layer of the proportional quota
        quota = [num_layers * w / sum(weights) for w in weights]
        assert all(k >= 1 and (k <= q + 1 or k == 1) for k, q in zip(out, quota, strict=True))


def test_stage_layers_for_by_hand():
    assert stage_layers_for(10, (1, 1), (10, 10)) == (5, 5)
    assert stage_layers_for(10, (3, 1), (10, 10)) == (8, 2)  # 7.5 / 2.5: the tie goes to the first stage
    assert stage_layers_for(10, (3, 1), (5, 10)) == (5, 5)  # the fast stage's memory holds 5
    assert stage_layers_for(4, (100, 100, 1), (4, 4, 4)) == (2, 1, 1)  # every stage at least one
    with pytest.raises(ValueError):
        stage_layers_for(10, (1, 1), (4, 4))
    with pytest.raises(ValueError):
        stage_layers_for(1, (1, 1), (4, 4))


# ---- state sharding (ZeRO-1) -----------------------------------------------------------------------------


def test_sharded_memory_by_hand():
    """fp16, 16 B per parameter: 4 B (parameters + gradients) stay, 12 B of optimizer
    state plus a 2 B copy of the slice are split."""
    assert state_split(2, 16.0) == (4.0, 12.0)
    assert state_split(4, 16.0) == (8.0, 8.0)
    st_ = split_stages(layers_from_records(profile("g")), 1, 2.0)  # one stage: 12000 B = 6000 parameters
    act = st_.act_per_sample[0] * 1.0
    mem, state = sharded_memory(st_, m=1, b=1.0, dtype_bytes=2, optimizer_bytes_per_param=16.0, fraction=0.5)
    assert mem == pytest.approx(6000 * (4 + 14 / 2) + act) and state == pytest.approx(6000 * 14 / 2)


def test_sharded_step_by_hand():
    """Each owner gathers its slice of every rank's gradients (an all-gather's bytes), updates its
    slice, and the slices are all-gathered: no all-gather curve, so the nvlink datasheet."""
    st_ = split_stages(layers_from_records(profile("g")), 1, 2.0)  # 12000 B
    links = Links(spec("g", 80.0), {})
    t = sharded_step_time(
        st_, Ranks(2, 1, 2, links, 2), units=1, fraction=0.5, update_bytes_per_param=32.0, mem_bw_gbps=1000.0
    )
    gather = 1e-5 + 12000 / 100e9
    slices = 1e-5 + 6000 / 100e9
    update = 6000 * 0.5 * 32 / 1000e9
    assert t == pytest.approx(gather + slices + update, rel=1e-12)


#: 0.9 x 1e-4 GB = 90000 B: 6000 parameters x 16 B (96000 B) do not fit; x (4 + 14 / 2) B (66000 B) do
SMALL = spec("s", 1e-4)
BIG = spec("s", 80.0)


def test_a_cell_that_fits_only_sharded_becomes_feasible():
    cell = Cell("s", 1, 2, pp=1)
    off = Estimator(store(SMALL), state_sharding=False).estimate_model(HAND, 8, cell)
    assert not off.feasible and off.note.startswith("OOM")
    est = Estimator(store(SMALL))
    on = est.estimate_model(HAND, 8, cell)
    assert on.feasible and on.plan.sharded and on.plan.state_shares == (1.0,) and on.plan.dp == 2
    assert on.mem_per_gpu_gb * 1e9 <= est.mem_limit_gb("s") * 1e9
    assert on.state_gb * 1e9 == pytest.approx(6000 * 14 / 2)
    # the job may refuse sharding (and a policy clears it when config.state_sharding is false)
    job = JobRequest("j", HAND, 8, 10, state_sharding=False, runtime="adaptive")
    assert not est.estimate(job, cell).feasible
    # priced: the replicated plan's time (same compute) with the sharded step instead of the all-reduce
    big = Estimator(store(BIG)).estimate_model(HAND, 8, cell)
    assert not big.plan.sharded and (big.plan.dp, big.plan.tp, big.plan.micro_batches) == (
        on.plan.dp,
        on.plan.tp,
        on.plan.micro_batches,
    )
    replicated_step = 0.012 + 6000 * 32 / 1000e9  # the all-reduce curve at 12000 B + the full update
    sharded_step = (1e-5 + 12000 / 100e9) + (1e-5 + 6000 / 100e9) + 6000 * 0.5 * 32 / 1000e9
    assert on.iter_time_s == pytest.approx(big.iter_time_s - replicated_step + sharded_step, rel=1e-9)


def test_sharding_is_not_chosen_where_the_replicated_plan_fits_and_is_as_fast():
    est = Estimator(open_store(":memory:"))
    off = Estimator(open_store(":memory:"), state_sharding=False)
    model = get_model("gpt-1.3b")
    for cell in (Cell("a100", 1, 4, 1), Cell("a40", 2, 2, 1), Cell("v100", 1, 8, 2)):
        a, b = est.estimate_model(model, 32, cell), off.estimate_model(model, 32, cell)
        assert a.feasible and not a.plan.sharded and a == b


def test_gpt13b_fits_a40s_only_sharded():
    """gpt-13b on 16 a40s in 4 stages: replicated, a stage's 40 / 4 layers at tp 2 need
    1.6e9 x 16 B + activations (49.6 GB > 43.2); sharded over dp = 2 it fits."""
    model = get_model("gpt-13b")
    cell = Cell("a40", 8, 2, 4)
    assert not Estimator(open_store(":memory:"), state_sharding=False).estimate_model(model, 32, cell).feasible
    e = Estimator(open_store(":memory:")).estimate_model(model, 32, cell)
    assert e.feasible and e.plan.sharded and e.plan.dp >= 2 and e.plan.stage_layers == (10, 10, 10, 10)


def test_policy_option_turns_sharding_off():
    cfg = solver_options(SolverConfig(), "state_sharding=false,max_mixed_types=3")
    assert cfg.state_sharding is False and cfg.max_mixed_types == 3
    with pytest.raises(Exception, match="max_mixed_types"):
        solver_options(SolverConfig(), "max_mixed_types=1")
    cfg = solver_options(SolverConfig(max_pp=1), "state_sharding=false")  # pp 2 would fit replicated
    cluster = ClusterView((NodeView("n1", "s", 2, 2, ("p",)),))
    job = JobRequest("j", HAND, 8, 10, min_gpus=2, max_gpus=2, runtime="adaptive")
    est = Estimator(store(SMALL))
    on = CellschedPolicy().schedule(ScheduleRequest(cluster, (job,), config=SolverConfig(max_pp=1)), est)
    assert on.placements["j"].plan.sharded
    off = CellschedPolicy().schedule(ScheduleRequest(cluster, (job,), config=cfg), est)
    assert "j" not in off.placements


@settings(max_examples=60, deadline=None)
@given(
    times=st.lists(st.floats(0.01, 5.0), min_size=4, max_size=4),
    batch=st.sampled_from([4, 8, 16]),
    pp=st.sampled_from([1, 2]),
    mem_kb=st.floats(40.0, 200.0),
)
def test_estimate_is_replicated_unless_sharding_fits_alone_or_clearly_faster(times, batch, pp, mem_kb):
    s = ProfileStore(":memory:")
    s.put_gpu(spec("r", mem_kb * 1e-6))
    s.put_layers(
        [
            LayerRecord(HAND.signature, "r", 1, 2, i, "block", t * 0.25, t * 0.75, p, 200, 1500)
            for i, (t, p) in enumerate(zip(times, PARAMS, strict=True))
        ]
    )
    est = Estimator(s)
    cell = Cell("r", 2, 2, pp)
    e = est.estimate_model(HAND, batch, cell)
    limit = est.mem_limit_gb("r")
    fits = [
        (t, p) for p, t, mem in est.plans(JobRequest("j", HAND, batch, 1, runtime="adaptive"), cell) if mem <= limit
    ]
    plain = min((t for t, p in fits if not p.sharded), default=None)
    sharded = min((t for t, p in fits if p.sharded), default=None)
    if plain is None and sharded is None:
        assert not e.feasible
    elif sharded is not None and (plain is None or sharded < plain * (1 - est.settings.shard_min_gain)):
        assert e.plan.sharded and e.iter_time_s == pytest.approx(sharded, rel=1e-12)
    else:
        assert not e.plan.sharded and e.iter_time_s == pytest.approx(plain, rel=1e-12)
    assert not e.feasible or e.mem_per_gpu_gb <= limit
