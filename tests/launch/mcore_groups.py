"""One rank of the megatron-core comparison (tests/launch/test_frameworks.py):
print this rank's tp/pp/dp groups as launch.init_parallel builds them and as
megatron.core.parallel_state.initialize_model_parallel builds them, same plan."""

import json
import warnings

import torch.distributed as dist

import launch

warnings.filterwarnings("ignore")  # megatron-core: no Transformer Engine / Apex on CPU

ctx = launch.init_parallel()
from megatron.core import parallel_state as ps  # noqa: E402  (after the process group exists)

ps.initialize_model_parallel(
    tensor_model_parallel_size=ctx.tp, pipeline_model_parallel_size=ctx.pp, create_gloo_process_groups=False
)
print(
    json.dumps(
        {
            "rank": ctx.rank,
            "ours": {d: ctx.group_ranks(d) for d in ("tp", "pp", "dp")},
            "megatron": {
                "tp": dist.get_process_group_ranks(ps.get_tensor_model_parallel_group()),
                "pp": dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group()),
                "dp": dist.get_process_group_ranks(ps.get_data_parallel_group()),
            },
            "megatron_ranks": {
                "tp": ps.get_tensor_model_parallel_rank(),
                "pp": ps.get_pipeline_model_parallel_rank(),
                "dp": ps.get_data_parallel_rank(),
            },
            "our_ranks": {"tp": ctx.tp_rank, "pp": ctx.pp_rank, "dp": ctx.dp_rank},
        }
    )
)
ps.destroy_model_parallel()
dist.destroy_process_group()
