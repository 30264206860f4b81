"""Reference trainer: a small GPT with pipeline, data and tensor parallelism.

Run one process per GPU through the launcher::

    srun cellsched-launch -- python contrib/examples/train_gpt.py --steps 20 --out losses.json

The layout comes from the job's plan (runtime, pp, dp, tp, micro-batches,
batch shares, virtual workers, checkpoints); ``launch.Trainer`` carries it
out in the plan's runtime (``exact`` by default, or ``sharded``). The model is built whole from the
seed and then sliced (stage layers, tensor-parallel shards), so every layout
starts from the same weights; the data is synthetic and seeded. Rank 0 prints
one JSON line per step and writes ``{"steps": [...], "losses": [...]}`` to
--out.

The model and data are the ``minigpt`` package next to this script
(``minigpt.model``, ``minigpt.data``; ``minigpt.trainer.workload`` plugs them
into ``launch.Trainer``); this file is the command line.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path

import torch
from minigpt.model import GPTConfig
from minigpt.trainer import DTYPES, TrainConfig, workload

from launch import checkpoint
from launch.exact import ExactEngine
from launch.parallel import plan_from_env
from launch.sharded import ShardedEngine
from launch.sharding import state_numel
from launch.trainer import Trainer, exit_now, runtime_of


def _write_json(path: str, obj: object) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, p)


def _report(trainer: Trainer, directory: str) -> None:
    """Where this rank sits: node, coordinates, group members, stage layers, batch slice."""
    ctx, e = trainer.ctx, trainer.engine
    if isinstance(e, ShardedEngine):  # its own split: [offset, size, micro-batch size, micro-batches, no workers]
        size = e.sizes[ctx.dp_rank]
        batch = [e.offset, size, size // e.micro_batches, e.micro_batches, []]
    else:
        b = ctx.batch
        assert b is not None
        batch = [b.offset, b.size, b.micro_batch_size, b.num_micro_batches, list(b.virtual_workers)]
    _write_json(
        os.path.join(directory, f"rank-{ctx.rank}.json"),
        {
            "rank": ctx.rank,
            "node": os.environ.get("SLURMD_NODENAME") or os.uname().nodename,
            "coords": [ctx.pp_rank, ctx.dp_rank, ctx.tp_rank],
            "groups": {d: ctx.group_ranks(d) for d in ("pp", "dp", "tp")},
            "stage_layers": list(ctx.stage_layers),
            "batch": batch,
        },
    )


def _report_state(engine: ExactEngine | ShardedEngine, directory: str) -> None:
    """This rank's optimizer state: sharding mode, owned slice, state elements."""
    if isinstance(engine, ShardedEngine):
        local = [getattr(p, "_local_tensor", p) for p in engine.stage.parameters()]
        record = {"mode": "fsdp", "param_numel": sum(t.numel() for t in local), "slice": None, "bounds": None}
    else:
        s = engine.sharded
        record = {
            "mode": engine.sharding,
            "param_numel": sum(p.numel() for p in engine.params),
            "slice": list(s.layout.bounds[s.dp_rank]) if s else None,
            "bounds": [list(b) for b in s.layout.bounds] if s else None,
        }
    _write_json(
        os.path.join(directory, f"state-{engine.ctx.rank}.json"),
        {**record, "state_numel": state_numel(engine.optimizer)},
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="model preset name (solver.contract.models); overrides the shape flags")
    for k, v in asdict(GPTConfig()).items():
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--steps", type=int, default=20, help="train until this step (counting resumed steps)")
    ap.add_argument("--global-batch", type=int, help="samples per step (default: plan.global_batch, else 8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--dataset-size", type=int, default=512)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        help="dropout rate of the embedding and of every block's attention and MLP outputs, drawn from each "
        "virtual worker's own stream (the exact runtime only)",
    )
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
    if not 0.0 <= args.dropout < 1.0 or (args.dropout and runtime_of(plan) != "exact"):
        raise SystemExit(f"--dropout {args.dropout}: a rate in [0, 1), under the exact runtime only")
    batch = args.global_batch or plan.global_batch or 8
    tc = TrainConfig(args.seed, batch, args.lr, args.dataset_size, args.dtype, args.dropout)
    trainer = Trainer(workload(cfg, tc), plan=plan, global_batch=batch, shard_state=args.shard_state, stop=stop)
    if args.report:
        _report(trainer, args.report)

    def on_step(step: int, loss: float) -> None:
        print(json.dumps({"step": step, "loss": loss}), flush=True)

    status = trainer.run(args.steps, on_step=on_step, step_delay=args.step_delay)
    if args.report:
        _report_state(trainer.engine, args.report)
    if trainer.ctx.rank == 0 and args.out:
        _write_json(args.out, {"steps": list(range(1, trainer.step + 1)), "losses": trainer.losses})
    trainer.close()
    return status


if __name__ == "__main__":
    exit_now(main())
