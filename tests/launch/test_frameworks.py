"""The launcher and its adapters against the frameworks' own code from PyPI
(megatron-core, torchtitan, lightning; the ``frameworks`` extra), not mocks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from srun_local import REPO, srun, start, task_envs, wait
from support import free_port

from launch.adapters import torchtitan as titan_adapter
from solver.contract.plan import JobPlan

pytestmark = pytest.mark.slow  # real processes or a package build: left out of the quick layer

LIGHTNING_EXAMPLE = REPO / "contrib" / "examples" / "lightning" / "train_lightning.py"


def test_megatron_core_builds_the_same_groups_as_init_parallel_dp2_tp2_pp2():
    pytest.importorskip("megatron.core.parallel_state")
    tasks = srun(
        [sys.executable, str(Path(__file__).with_name("mcore_groups.py"))],
        8,
        env={"CELLSCHED_PLAN": json.dumps({"pp": 2, "dp": 2, "tp": 2}), "CELLSCHED_MASTER_PORT": str(free_port())},
        timeout=300,
    )
    bad = [t for t in tasks if t.returncode]
    assert not bad, bad[0].stderr[-3000:]
    seen = [json.loads(t.stdout.strip().splitlines()[-1]) for t in tasks]
    for rank, s in enumerate(seen):
        assert s["rank"] == rank
        assert s["ours"] == s["megatron"], f"rank {rank}: ours {s['ours']}, megatron-core {s['megatron']}"
        assert s["our_ranks"] == s["megatron_ranks"], rank
    # and both are Megatron's rank order (tp fastest, then dp, then pp), written out for dp2 x tp2 x pp2
    assert [s["megatron"]["tp"] for s in seen] == [[0, 1]] * 2 + [[2, 3]] * 2 + [[4, 5]] * 2 + [[6, 7]] * 2
    assert [s["megatron"]["dp"] for s in seen] == [[0, 2], [1, 3]] * 2 + [[4, 6], [5, 7]] * 2
    assert [s["megatron"]["pp"] for s in seen] == [[0, 4], [1, 5], [2, 6], [3, 7]] * 2


TITAN_PLANS = [
    # (plan, parsed values expected: worked out by hand)
    (
        JobPlan(
            pp=2,
            dp=2,
            tp=2,
            micro_batches=4,
            global_batch=64,
            checkpoint_dir="/ck/a",
            checkpoint_every=5,
            runtime="torchtitan",
        ),
        {"dp": 2, "tp": 2, "pp": 2, "local": 32, "micro": 8, "global": 64, "folder": "/ck/a", "interval": 5},
    ),
    (
        JobPlan(
            dp=4, micro_batches=2, global_batch=32, checkpoint_dir="/ck/b", checkpoint_every=7, runtime="torchtitan"
        ),
        {"dp": 4, "tp": 1, "pp": 1, "local": 4, "micro": 1, "global": 32, "folder": "/ck/b", "interval": 7},
    ),
    (
        JobPlan(
            dp=1,
            tp=4,
            micro_batches=1,
            global_batch=8,
            checkpoint_dir="/ck/c",
            checkpoint_every=3,
            runtime="torchtitan",
        ),
        {"dp": 1, "tp": 4, "pp": 1, "local": 8, "micro": 1, "global": 8, "folder": "/ck/c", "interval": 3},
    ),
]


@pytest.mark.parametrize(("plan", "want"), TITAN_PLANS, ids=["dp2-tp2-pp2", "dp4-accumulate", "tp4"])
def test_torchtitans_own_parser_accepts_the_adapters_options(plan, want):
    pytest.importorskip("torchtitan.models.llama3.config_registry")
    from torchtitan.config import ConfigManager
    from torchtitan.config.override import apply_overrides

    from launch.adapters.titan_bridge import SignalCheckpointManager

    cfg = ConfigManager().parse_args(
        ["--module", "llama3", "--config", "llama3_debugmodel", *titan_adapter.options(plan)]
    )
    par, tr, ck = cfg.parallelism, cfg.training, cfg.checkpoint
    got = {
        "dp": par.data_parallel_shard_degree,
        "tp": par.tensor_parallel_degree,
        "pp": par.pipeline_parallel_degree,
        "local": tr.local_batch_size,
        "micro": par.pipeline_parallel_microbatch_size,
        "global": tr.global_batch_size,
        "folder": ck.folder,
        "interval": ck.interval,
    }
    assert got == want
    assert par.data_parallel_replicate_degree == 1 and ck.enable
    if plan.pp > 1:
        assert tr.disable_cuda_graphs  # torchtitan refuses pp with CUDA graphs
    # torchtitan's gradient accumulation: global / (local * dp) steps, the plan's micro-batches when pp = 1
    assert tr.global_batch_size // (tr.local_batch_size * par.data_parallel_shard_degree) == (
        plan.micro_batches if plan.pp == 1 else 1
    )
    apply_overrides(cfg.override, cfg)  # torchtitan swaps in the signal bridge, settings kept
    assert isinstance(cfg.checkpoint, SignalCheckpointManager.Config)
    assert (cfg.checkpoint.folder, cfg.checkpoint.interval, cfg.checkpoint.enable) == (
        want["folder"],
        want["interval"],
        True,
    )


def _launched(code: str, task: dict, plan: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CELLSCHED_", "TORCHELASTIC_"))}
    env.update(task)
    env.update({"CELLSCHED_PLAN": json.dumps(plan), "CELLSCHED_MASTER_ADDR": "127.0.0.1", "PYTHONPATH": str(REPO)})
    return subprocess.run(
        [sys.executable, "-m", "launch", "--", sys.executable, "-c", code],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


LIGHTNING_PROBE = """
import json, os, lightning as L
t = L.Trainer(accelerator="cpu", strategy="ddp", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
              num_nodes=int(os.environ["GROUP_WORLD_SIZE"]), logger=False)
c = t.strategy.cluster_environment
print(json.dumps({"env": type(c).__name__, "rank": t.global_rank, "local": t.local_rank,
                  "node": t.node_rank, "world": t.world_size, "external": c.creates_processes_externally}))
"""


def test_lightning_takes_its_ranks_from_the_launcher_and_starts_no_processes():
    pytest.importorskip("lightning")
    tasks = task_envs(4, nnodes=2, job_id="31")
    seen = []
    for t in tasks:
        r = _launched(LIGHTNING_PROBE, t, {"dp": 4, "runtime": "ddp"})
        assert r.returncode == 0, r.stderr[-2000:]
        seen.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert {s["env"] for s in seen} == {"TorchElasticEnvironment"}
    assert [(s["rank"], s["local"], s["node"]) for s in seen] == [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
    # its DDP launcher starts no worker processes when the environment creates them externally
    assert {s["world"] for s in seen} == {4} and all(s["external"] for s in seen)


def test_lightning_example_stops_on_the_signal_and_resumes_on_more_ranks(tmp_path):
    """The example (plain Lightning + launch.on_checkpoint) on 2 local ranks:
    SIGUSR1 to one rank stops both with 75 at the same step (checkpoint
    written); the next run, on 3 ranks, resumes from that step and finishes."""
    pytest.importorskip("lightning")
    ck, log = tmp_path / "ck", tmp_path / "runs.jsonl"
    plan = {"dp": 2, "global_batch": 32, "runtime": "ddp", "checkpoint_dir": str(ck)}
    cmd = [sys.executable, str(LIGHTNING_EXAMPLE), "--steps", "300", "--log", str(log)]
    procs = start(cmd, 2, env={"CELLSCHED_PLAN": json.dumps(plan), "CELLSCHED_MASTER_PORT": str(free_port())})
    deadline = time.monotonic() + 240
    progress = ck / "progress.json"
    while not (progress.exists() and json.loads(progress.read_text())["step"] >= 5):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), wait(procs, 10)[0].stderr[-3000:]
        time.sleep(0.05)
    assert json.loads((ck / "checkpoint-hook.json").read_text())["job_id"] == "4242"
    procs[1].send_signal(signal.SIGUSR1)
    stopped = wait(procs, timeout=240)
    assert [t.returncode for t in stopped] == [75, 75], stopped[0].stderr[-3000:]
    import torch

    saved_step = torch.load(ck / "lightning.ckpt", map_location="cpu", weights_only=False)["global_step"]
    assert 5 <= saved_step < 300 and not log.exists()

    plan.update(dp=3, global_batch=48)
    done = srun(
        cmd, 3, env={"CELLSCHED_PLAN": json.dumps(plan), "CELLSCHED_MASTER_PORT": str(free_port())}, timeout=300
    )
    assert [t.returncode for t in done] == [0, 0, 0], done[0].stderr[-3000:]
    assert [json.loads(line) for line in log.read_text().splitlines()] == [
        {"world_size": 3, "start": saved_step, "end": 300}
    ]


def _titan_bridge(folder: Path, signal_at: int, *flags: str) -> tuple[int, list[dict]]:
    r = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("titan_bridge_run.py")), str(folder), str(free_port())]
        + [str(signal_at), *flags],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert lines or r.returncode in (0, 75), r.stderr[-3000:]
    return r.returncode, lines


def test_torchtitans_checkpoint_manager_saves_and_exits_75_on_the_signal(tmp_path):
    """The bridge the adapter installs, inside torchtitan's own DCP checkpoint
    manager: no save before the signal (interval 100), the step during which
    SIGUSR1 came is saved and the process exits 75; a new run loads it."""
    pytest.importorskip("torchtitan.models.llama3.config_registry")
    code, steps = _titan_bridge(tmp_path / "ck", 2)
    assert code == 75
    assert [s["manager"] for s in steps] == ["SignalCheckpointManager"]
    assert steps[0]["saved"] == []  # step 1: not due, no signal yet
    assert sorted(os.listdir(tmp_path / "ck")) == ["step-2"]
    code, resumed = _titan_bridge(tmp_path / "ck", 0, "--resume")
    assert code == 0 and resumed[0]["loaded"] is True
    code, uninterrupted = _titan_bridge(tmp_path / "fresh", 0)
    assert code == 0 and [s["saved"] for s in uninterrupted] == [[], [], []]
    assert resumed[0]["weight"] == uninterrupted[1]["weight"]  # the weights after step 2, restored exactly


def test_torchtitan_has_no_cpu_device_path(monkeypatch):
    """Why torchtitan's trainer is not run on CPU here: with no accelerator,
    its device type falls back to "cuda" (torchtitan/tools/utils.py), and
    Trainer.__init__ calls torch.cuda.set_device, which a CPU torch lacks.
    When this fails, torchtitan gained a CPU path: run the debug model."""
    pytest.importorskip("torchtitan.tools.utils")
    import torch
    from torchtitan.tools import utils

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert utils.device_type == "cuda"
    monkeypatch.setenv("LOCAL_RANK", "0")
    device = utils.get_local_device()
    assert str(device) == "cuda:0"
    with pytest.raises(AttributeError, match="_cuda_setDevice"):  # what Trainer.__init__ dies of on CPU
        utils.device_module.set_device(device)


def test_megatron_core_has_no_cpu_path():
    """Why no Megatron training runs here: with a CPU torch, megatron-core
    0.16.1's transformer attention takes its scratch buffers from
    ``torch.cuda.current_device()`` (``GlobalMemoryBuffer.get_tensor``, which
    ``DotProductAttention.forward`` calls), its schedule without pipelining
    counts tokens in a ``device="cuda"`` tensor, and its
    DistributedDataParallel puts the gradient buffers on
    ``torch.cuda.current_device()``. When this fails, megatron-core gained a
    CPU path: run a small GPT with the adapter's options."""
    pytest.importorskip("megatron.core.utils")
    import inspect

    import torch
    from megatron.core.distributed import param_and_grad_buffer
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.utils import GlobalMemoryBuffer

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(AssertionError, match="Torch not compiled with CUDA enabled"):
        GlobalMemoryBuffer().get_tensor((2, 2), torch.float32, "mpu")
    assert 'device="cuda"' in inspect.getsource(schedules.forward_backward_no_pipelining)
    assert "device=torch.cuda.current_device()" in inspect.getsource(param_and_grad_buffer._ParamAndGradBuffer)


# torchtitan's own MetricsProcessor.log / log_validation, its logger set up by its init_logger: the
# step lines it prints (its __init__ needs a CUDA device: the fields it would set are given instead)
TITAN_PRINTS = r"""
import time, types
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.tools import utils
from torchtitan.tools.logging import init_logger

init_logger()
mp = object.__new__(MetricsProcessor)
mp.config = MetricsProcessor.Config()
mp.logger = types.SimpleNamespace(log=lambda metrics, step: None)
mp.parallel_dims = types.SimpleNamespace(non_data_parallel_size=1)
stats = types.SimpleNamespace(max_active_gib=1.0, max_active_pct=2.0, max_reserved_gib=12.34, max_reserved_pct=15.43,
                              num_alloc_retries=0, num_ooms=0)
mp.device_memory_monitor = types.SimpleNamespace(get_peak_stats=lambda: stats, reset_peak_stats=lambda: None)
mp.gpu_peak_flops, mp.num_flops_per_token, mp.has_quantization = 1e15, 10**9, False
for color, step, tokens in ((utils.Color(), 7, 8192), (utils.NoColor(), 120, 1234567)):
    mp.color, mp.ntokens_since_last_log, mp.data_loading_times = color, tokens, [0.01]
    mp.time_last_log = time.perf_counter() - 1.0
    mp.log(step, 8.12345, 9.0, 2.3456)
    mp.log_validation(2.5, step)
"""


def test_torchtitans_own_step_lines_are_read_as_recorded():
    """The lines the installed torchtitan prints read as the recorded ones
    (tests/launch/framework_logs.py): its steps; its validation lines, none."""
    pytest.importorskip("torchtitan.components.metrics")
    from framework_logs import TITAN_LINES

    from launch.steplog import Step, parse_torchtitan

    r = subprocess.run([sys.executable, "-c", TITAN_PRINTS], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert [parse_torchtitan(line) for line in lines] == [Step(7), None, Step(120), None]

    def body(line: str) -> str:  # the message up to its throughput (a measured figure)
        return line.split(" - INFO - ", 1)[1].split("tps:")[0]

    recorded = [line for line, _ in TITAN_LINES[:4]]
    assert [body(line) for line in lines[:2]] == [body(line) for line in (recorded[0], recorded[3])]
    assert lines[0].startswith("[titan] ") and " - root - INFO - \x1b[31mstep:  7  " in lines[0]


def test_lightning_reports_its_steps_and_their_time_with_gradient_accumulation(tmp_path):
    """The hook's callback reports Lightning's global step after every batch:
    with 3 batches per optimizer step it reports each step 3 times, which is
    no restart, so progress.json keeps the iteration time: 3 batches of at
    least 0.1 s each (the example's step delay) a step."""
    pytest.importorskip("lightning")
    ck = tmp_path / "ck"
    plan = {"dp": 1, "global_batch": 16, "runtime": "ddp", "checkpoint_dir": str(ck)}
    cmd = [sys.executable, str(LIGHTNING_EXAMPLE), "--steps", "12", "--accumulate", "3", "--step-delay", "0.1"]
    done = srun(cmd, 1, env={"CELLSCHED_PLAN": json.dumps(plan), "CELLSCHED_MASTER_PORT": str(free_port())})
    assert done[0].returncode == 0, done[0].stderr[-3000:]
    p = json.loads((ck / "progress.json").read_text())
    assert p["step"] == p["iterations_done"] == 12
    assert 0.3 <= p["iter_time_s"] < 0.45, p
