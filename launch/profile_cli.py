"""`cellsched profile`: profile a model's layers on this node's GPU type into
the profile store (run it as an ordinary one-GPU job per GPU type).

It lives in launch (it runs torch on the job's device) and is registered in
slurm_ext's command table by module path only, so neither package imports
the other. torch loads when the command runs, not when the CLI starts;
without it the command says which extra to install.
"""

from __future__ import annotations

import json
import pathlib

import click

from solver.contract.extras import require
from solver.contract.models import ModelSpecError, get_model
from solver.contract.profiles.seed import open_store
from solver.contract.profiles.store import ENV_VAR, ProfileStoreError


def _ints(_ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        out = ()
    if not out or any(v < 1 for v in out):
        raise click.BadParameter(f"expected positive integers separated by commas, got {value!r}", param=param)
    return out


@click.command()
@click.option("--model", "model_name", required=True, help="Model preset name or spec file (.json/.toml).")
@click.option("--tp", default="1", callback=_ints, show_default=True, help="Tensor-parallel degrees to simulate.")
@click.option("--micro-batch", default="1,2,4", callback=_ints, show_default=True, help="Micro-batch sizes.")
@click.option(
    "--gpu-type",
    default="auto",
    show_default=True,
    help='GPU type to store the profile under; "auto": from NVML, "cpu" without a GPU.',
)
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=pathlib.Path),
    help=f"Profile store. Default: ${ENV_VAR}, else ~/.local/share/cellsched/profiles.sqlite.",
)
@click.option(
    "--comm/--no-comm",
    default=None,
    help="Also profile p2p and all-reduce (default: when this node has >= 2 GPUs; "
    "on CPU among --comm-ranks local gloo processes over loopback).",
)
@click.option(
    "--comm-ranks",
    type=click.IntRange(min=2),
    default=None,
    help="Processes for --comm (default: the GPU count, 2 on CPU).",
)
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--repeat", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch CPU threads (default: torch's).")
@click.option(
    "--runtime",
    "runtimes",
    multiple=True,
    type=click.Choice(["sharded"]),
    help="Also profile the layers as RUNTIME wraps them (sharded: FSDP2 over one rank, its hooks and copies), "
    "stored under GPU type TYPE@RUNTIME, which prices that runtime's plans; tp=1 only here (one process). Repeatable.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON lines.")
def profile(
    model_name: str,
    tp: tuple[int, ...],
    micro_batch: tuple[int, ...],
    gpu_type: str,
    db: pathlib.Path | None,
    comm: bool | None,
    comm_ranks: int | None,
    warmup: int,
    repeat: int,
    threads: int | None,
    runtimes: tuple[str, ...],
    as_json: bool,
) -> None:
    """Profile MODEL's layers (forward, backward, memory) per tp degree and
    micro-batch on one device, and optionally the interconnect. Needs PyTorch (the `torch` extra)."""
    torch = require("torch")

    from launch import profiler

    try:
        model = get_model(model_name)
    except ModelSpecError as exc:
        raise click.UsageError(str(exc)) from None
    if threads:
        torch.set_num_threads(threads)
    on_gpu = torch.cuda.is_available()
    if gpu_type == "auto":
        gpu_type = profiler.detect_gpu_type(torch.cuda.current_device()) if on_gpu else "cpu"
    try:
        store = open_store(db)
    except ProfileStoreError as exc:
        raise click.ClickException(str(exc)) from None
    with store:
        try:
            layers = profiler.profile_layers(
                model, tps=tp, micro_batches=micro_batch, gpu_type=gpu_type, warmup=warmup, repeat=repeat
            )
            for runtime in runtimes:
                layers += profiler.profile_layers(
                    model,
                    micro_batches=micro_batch,
                    gpu_type=gpu_type,
                    device="cpu",
                    warmup=warmup,
                    repeat=repeat,
                    stack=model.num_layers,
                    runtime=runtime,
                )
        except profiler.ProfileError as exc:
            raise click.UsageError(str(exc)) from None
        store.put_layers(layers)
        rows = [{"model": model.name, "gpu_type": gpu_type, **row} for row in profiler.summarize(layers)]
        ranks = comm_ranks or (torch.cuda.device_count() if on_gpu else 2)
        if comm is None:
            comm = on_gpu and ranks >= 2
        if comm:
            spec = store.gpu(gpu_type)
            link = (spec.intra_link if spec else "pcie") if on_gpu else profiler.LOOPBACK
            try:
                recs = profiler.profile_comm(ranks, link=link, warmup=warmup, repeat=repeat)
            except profiler.ProfileError as exc:
                raise click.UsageError(str(exc)) from None
            store.put_comm(recs)
            rows.append(
                {
                    "link": link,
                    "ranks": ranks,
                    "records": len(recs),
                    "p2p_gbps": round(profiler.curve_bandwidth_gbps(recs), 3),
                    "allreduce_gbps": round(profiler.curve_bandwidth_gbps(recs, "allreduce"), 3),
                }
            )
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    click.echo(f"profiled {model.name} on {gpu_type} ({len(layers)} layer records) into {store.path}")
    for row in rows:
        click.echo("  " + "  ".join(f"{k}={v}" for k, v in row.items() if k not in ("model", "gpu_type")))
