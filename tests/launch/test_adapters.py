"""The framework adapters' option lists, worked out by hand from the plan."""

import pytest

from launch import adapters
from launch.adapters import AdapterError, command_for, megatron, torchtitan
from solver.contract.plan import JobPlan

TITAN = ["python", "-m", "torchtitan.train", "--module", "llama3", "--config", "llama3_debugmodel"]
MEGATRON = ["python", "pretrain_gpt.py", "--num-layers", "4"]


def pairs(opts):
    """{option: value} of an option list; flags map to True."""
    out, i = {}, 0
    while i < len(opts):
        if i + 1 < len(opts) and not opts[i + 1].startswith("--"):
            out[opts[i]] = opts[i + 1]
            i += 2
        else:
            out[opts[i]] = True
            i += 1
    return out


def test_megatron_options_dp2_tp2_pp2():
    plan = JobPlan(
        pp=2, dp=2, tp=2, micro_batches=4, global_batch=64, checkpoint_dir="/ck", state_sharding="even",
        runtime="megatron",
    )  # fmt: skip
    # 64 samples / dp 2 = 32 per rank, / 4 micro-batches = 8 per micro-batch
    assert megatron.options(plan) == [
        "--tensor-model-parallel-size", "2",
        "--pipeline-model-parallel-size", "2",
        "--micro-batch-size", "8",
        "--global-batch-size", "64",
        "--use-distributed-optimizer",
        "--save", "/ck", "--load", "/ck", "--exit-signal-handler",
        "--ckpt-format", "torch_dist", "--dist-ckpt-optim-fully-reshardable",
    ]  # fmt: skip


def test_megatron_options_without_batch_or_checkpoint_dir_leave_them_to_the_script():
    plan = JobPlan(pp=1, dp=4, tp=2, runtime="megatron")
    assert megatron.options(plan) == [
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1", "--use-distributed-optimizer",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "plan",
    [
        JobPlan(dp=4, state_sharding="even", checkpoint_dir="/ck", runtime="megatron"),
        JobPlan(dp=4, checkpoint_dir="/ck", runtime="megatron"),  # an older plan that names no sharding
        JobPlan(dp=1, checkpoint_dir="/ck", runtime="megatron"),  # one rank: the same state either way
        JobPlan(dp=2, state_sharding="memory", state_shares=(1.0, 1.0), checkpoint_dir="/ck", runtime="megatron"),
    ],
    ids=["sharded", "unnamed", "dp1", "equal-shares"],
)
def test_megatron_always_runs_the_distributed_optimizer_as_its_plans_are_priced(plan):
    """One decision: the runtime table says Megatron's state is always
    sharded (ZeRO-1), the estimator prices every plan of dp > 1 so, and the
    adapter always asks for the distributed optimizer, with the distributed
    checkpoint that lets the next run have another dp, tp or pp."""
    from solver.cost.runtime import pricing_of

    assert pricing_of("megatron").always_shards_optimizer
    got = pairs(megatron.options(plan))
    assert got["--use-distributed-optimizer"] is True
    assert got["--ckpt-format"] == "torch_dist" and got["--dist-ckpt-optim-fully-reshardable"] is True


def test_megatron_refuses_state_shares_its_optimizer_cannot_split():
    plan = JobPlan(dp=2, state_sharding="memory", state_shares=(2.0, 1.0), runtime="megatron")
    with pytest.raises(AdapterError, match=r"shards its state evenly over dp, not by \[2.0, 1.0\]"):
        megatron.options(plan)


def test_megatron_save_interval_from_checkpoint_every():
    plan = JobPlan(dp=2, global_batch=8, checkpoint_dir="/ck", checkpoint_every=50, runtime="megatron")
    assert pairs(megatron.options(plan))["--save-interval"] == "50"
    assert pairs(megatron.options(plan))["--micro-batch-size"] == "4"


def test_torchtitan_options_with_pipeline_cut_the_rank_batch_into_microbatches():
    plan = JobPlan(pp=2, dp=2, tp=2, micro_batches=4, global_batch=64, checkpoint_dir="/ck", runtime="torchtitan")
    assert torchtitan.options(plan) == [
        "--parallelism.data_parallel_replicate_degree", "1",
        "--parallelism.data_parallel_shard_degree", "2",
        "--parallelism.tensor_parallel_degree", "2",
        "--parallelism.pipeline_parallel_degree", "2",
        "--training.disable_cuda_graphs",
        "--training.local_batch_size", "32",
        "--parallelism.pipeline_parallel_microbatch_size", "8",
        "--training.global_batch_size", "64",
        "--checkpoint.enable", "--checkpoint.folder", "/ck",
        "--override.imports", "launch.adapters.titan_bridge.signal_checkpoint",
    ]  # fmt: skip


def test_torchtitan_options_without_pipeline_accumulate_micro_batches():
    plan = JobPlan(
        dp=4, micro_batches=2, global_batch=32, checkpoint_every=10, checkpoint_dir="/c", runtime="torchtitan"
    )
    got = pairs(torchtitan.options(plan))
    # 32 / 4 ranks = 8 per rank, 2 accumulation steps of 4: torchtitan accumulates global / (local * dp) = 2
    assert got["--training.local_batch_size"] == "4" and got["--training.global_batch_size"] == "32"
    assert "--parallelism.pipeline_parallel_microbatch_size" not in got and "--training.disable_cuda_graphs" not in got
    assert got["--checkpoint.interval"] == "10"


def test_uneven_batch_split_is_refused_with_the_numbers():
    plan = JobPlan(dp=3, micro_batches=2, global_batch=32, runtime="megatron")
    with pytest.raises(
        AdapterError, match=r"global batch 32 does not split into dp=3 ranks x 2 micro-batches .*multiple of 6"
    ):
        megatron.options(plan)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("batch_shares", (1.0, 2.0), "splits the batch evenly"),
        ("stage_layers", (3, 1), "splits layers evenly"),
        ("gpu_types", ("a100", "v100"), "runs on one GPU type"),
    ],
)
def test_plans_the_framework_cannot_run_are_refused(field, value, message):
    kw = {"pp": 2 if field == "stage_layers" else 1, "dp": 2, field: value}
    for runtime, mod in (("megatron", megatron), ("torchtitan", torchtitan)):
        with pytest.raises(AdapterError, match=f"runtime {runtime} {message}"):
            mod.options(JobPlan(runtime=runtime, **kw))


def test_command_for_appends_after_the_users_command():
    plan = JobPlan(tp=2, runtime="megatron")
    assert command_for(plan, MEGATRON) == [*MEGATRON, *megatron.options(plan)]


@pytest.mark.parametrize("runtime", [None, "ddp", "exact", "sharded"])
def test_runtimes_without_adapter_keep_the_command(runtime):
    assert adapters.get_adapter(runtime) is None
    assert command_for(JobPlan(dp=2, runtime=runtime), ["python", "train.py", "--x"]) == ["python", "train.py", "--x"]


@pytest.mark.parametrize(
    ("runtime", "cmd", "option"),
    [
        ("megatron", [*MEGATRON, "--tensor-model-parallel-size", "4"], "--tensor-model-parallel-size"),
        ("megatron", [*MEGATRON, "--save=/mine"], "--save"),
        ("torchtitan", [*TITAN, "--parallelism.tensor_parallel_degree=2"], "--parallelism.tensor_parallel_degree"),
    ],
)
def test_a_command_that_sets_an_adapter_option_itself_is_refused(runtime, cmd, option):
    with pytest.raises(AdapterError, match=f"the command sets {option} itself, but under runtime {runtime}"):
        command_for(JobPlan(tp=2, runtime=runtime), cmd)


def test_options_that_only_start_like_an_owned_one_are_not_taken_for_it():
    cmd = [*MEGATRON, "--save-retain-interval", "3", "--load-main-params-from-ckpt"]
    assert command_for(JobPlan(runtime="megatron"), cmd)[: len(cmd)] == cmd
