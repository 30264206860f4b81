"""torchtitan's own checkpoint manager with the launcher's signal bridge, on
CPU (tests/launch/test_frameworks.py): parse the adapter's options with
torchtitan's ConfigManager, let torchtitan apply the override, build the
manager, and call ``save(step)`` after each of 3 steps as torchtitan's trainer
does; SIGUSR1 arrives during step SIGNAL_AT (0: never). With --resume, load
the newest checkpoint first and print the step loaded. Prints one JSON line
per step before exiting."""

import json
import os
import signal
import sys
import warnings

import torch
import torch.distributed as dist
from torchtitan.config import ConfigManager
from torchtitan.config.override import apply_overrides

from launch.adapters import torchtitan as adapter
from solver.contract.plan import JobPlan

warnings.filterwarnings("ignore")
folder, port, signal_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
plan = JobPlan(dp=1, global_batch=8, checkpoint_dir=folder, checkpoint_every=100, runtime="torchtitan")
cfg = ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel", *adapter.options(plan)])
apply_overrides(cfg.override, cfg)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
opt = cfg.optimizer.build(model_parts=[model])
sched = cfg.lr_scheduler.build(optimizers=opt, training_steps=10)
mgr = cfg.checkpoint.build(
    dataloader=None, model_parts=[model], optimizers=opt, lr_schedulers=sched, states={}, sd_adapter=None
)
if "--resume" in sys.argv:
    print(json.dumps({"loaded": bool(mgr.load()), "weight": model[1].weight.flatten().tolist()}), flush=True)
for step in range(1, 4):
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
    if step == signal_at:
        os.kill(os.getpid(), signal.SIGUSR1)
    mgr.save(step)
    saved = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    print(
        json.dumps(
            {"manager": type(mgr).__name__, "step": step, "saved": saved, "weight": model[1].weight.flatten().tolist()}
        ),
        flush=True,
    )
# as torchtitan's trainer ends: the manager's threads joined and the process group gone before the
# interpreter's own teardown (left to it, one run in a fresh-clone suite ended in SIGABRT after its last step)
mgr.close()
dist.destroy_process_group()
