"""Reference trainer: a small GPT with pipeline, data and tensor parallelism.

Run one process per GPU through the launcher::

    srun cellsched-launch -- python contrib/examples/train_gpt.py --steps 20 --out losses.json

The layout comes from the job's plan (pp, dp, tp, micro-batches, batch
shares, virtual workers, checkpoints). The model is built whole from the
seed and then sliced (stage layers, tensor-parallel shards), so every layout
starts from the same weights; the data is synthetic and seeded. Rank 0 prints
one JSON line per step and writes ``{"steps": [...], "losses": [...]}`` to
--out.

The model and the trainer are the ``minigpt`` package next to this script
(``minigpt.model``, ``minigpt.trainer``); this file is the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from minigpt.model import GPTConfig
from minigpt.trainer import DTYPES, TrainConfig, Trainer

from launch import checkpoint
from launch.parallel import ParallelContext, init_parallel, plan_from_env
from launch.progress import write_progress
from launch.sharding import state_numel
from solver.contract import EXIT_CHECKPOINTED


def _write_json(path: str, obj: object) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, p)


def _report(ctx: ParallelContext, directory: str) -> None:
    """Where this rank sits: node, coordinates, group members, stage layers, batch slice."""
    b = ctx.batch
    _write_json(
        os.path.join(directory, f"rank-{ctx.rank}.json"),
        {
            "rank": ctx.rank,
            "node": os.environ.get("SLURMD_NODENAME") or os.uname().nodename,
            "coords": [ctx.pp_rank, ctx.dp_rank, ctx.tp_rank],
            "groups": {d: ctx.group_ranks(d) for d in ("pp", "dp", "tp")},
            "stage_layers": list(ctx.stage_layers),
            "batch": [b.offset, b.size, b.micro_batch_size, b.num_micro_batches, list(b.virtual_workers)],
        },
    )


def _report_state(trainer: Trainer, directory: str) -> None:
    """This rank's optimizer state: sharding mode, owned slice, state elements."""
    s = trainer.sharded
    _write_json(
        os.path.join(directory, f"state-{trainer.ctx.rank}.json"),
        {
            "mode": trainer.sharding,
            "param_numel": sum(p.numel() for p in trainer.params),
            "slice": list(s.layout.bounds[s.dp_rank]) if s else None,
            "bounds": [list(b) for b in s.layout.bounds] if s else None,
            "state_numel": state_numel(trainer.optimizer),
        },
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="model preset name (solver.models); overrides the shape flags")
    for k, v in asdict(GPTConfig()).items():
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--steps", type=int, default=20, help="train until this step (counting resumed steps)")
    ap.add_argument("--global-batch", type=int, help="samples per step (default: plan.global_batch, else 8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--dataset-size", type=int, default=512)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--out", help="write the loss sequence here (rank 0)")
    ap.add_argument(
        "--step-delay",
        type=float,
        default=0.0,
        help="sleep this many seconds after each step (to watch a job being moved)",
    )
    ap.add_argument("--report", help="directory for one JSON file per rank describing its layout")
    ap.add_argument(
        "--shard-state",
        choices=("none", "even", "memory"),
        help="optimizer state over the dp ranks (default: the plan's state_sharding, else none)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = checkpoint.StopRequest()  # before anything slow: a signal must not kill us
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = (
        GPTConfig.from_preset(args.model)
        if args.model
        else GPTConfig(args.layers, args.hidden, args.heads, args.seq, args.vocab)
    )
    plan = plan_from_env()
    batch = args.global_batch or plan.global_batch or 8
    ctx = init_parallel(plan, num_layers=cfg.layers, global_batch=batch)
    tc = TrainConfig(args.seed, batch, args.lr, args.dataset_size, args.dtype)
    if args.report:
        _report(ctx, args.report)
    trainer = Trainer(ctx, cfg, tc, shard_state=args.shard_state)
    if plan.checkpoint_dir:
        state = checkpoint.load_latest(plan.checkpoint_dir)
        if state is not None:
            trainer.load_full_state(state)
    status = 0
    while trainer.step < args.steps:
        loss = trainer.train_step()
        if ctx.rank == 0:
            print(json.dumps({"step": trainer.step, "loss": loss}), flush=True)
            if plan.checkpoint_dir:
                write_progress(plan.checkpoint_dir, trainer.step, loss=loss)
        if args.step_delay > 0:
            time.sleep(args.step_delay)
        stopping = stop.agreed(device=ctx.device)
        due = plan.checkpoint_every and trainer.step % plan.checkpoint_every == 0
        if plan.checkpoint_dir and (stopping or due or trainer.step == args.steps):
            trainer.save_checkpoint(plan.checkpoint_dir)
        if stopping:
            status = EXIT_CHECKPOINTED
            break
    if args.report:
        _report_state(trainer, args.report)
    if ctx.rank == 0 and args.out:
        _write_json(args.out, {"steps": list(range(1, trainer.step + 1)), "losses": trainer.losses})
    if ctx.world_size > 1:
        dist.barrier()  # nobody tears down while a peer still talks (gloo aborts otherwise)
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without C++ static destructors: under load gloo's worker threads
    # can still be joinable then, and the runtime aborts a finished run.
    os._exit(code)
