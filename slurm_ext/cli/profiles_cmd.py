"""`cellsched profiles`: inspect, import and export the profile store."""

from __future__ import annotations

import collections
import json
import os
import pathlib
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict

import click

from slurm_ext.errors import CellschedError
from solver.contract.models import ModelSpecError, get_model
from solver.contract.profiles.arena import ArenaFormatError
from solver.contract.profiles.exchange import ProfileFileError, export_jsonl, import_file
from solver.contract.profiles.records import CellRecord
from solver.contract.profiles.seed import open_store
from solver.contract.profiles.store import ENV_VAR, ProfileStore, ProfileStoreError


class ProfilesError(click.ClickException, CellschedError):
    """A clear one-line error; exit code 2, no traceback."""

    exit_code = 2


_DB_HELP = (
    f"Profile store (SQLite file). Default: ${ENV_VAR}, else ~/.local/share/cellsched/profiles.sqlite. "
    "A new store is seeded once with the shipped Arena profiles and GPU specs."
)


def _db_option(f):
    """`--db` on each subcommand too (`cellsched profiles list --db X`); it
    overrides the group's."""

    def remember(ctx: click.Context, _param: click.Parameter, value: pathlib.Path | None) -> None:
        if value is not None:
            ctx.ensure_object(dict)["db"] = value

    return click.option(
        "--db",
        type=click.Path(dir_okay=False, path_type=pathlib.Path),
        expose_value=False,
        callback=remember,
        help=_DB_HELP,
    )(f)


def _store(ctx: click.Context) -> ProfileStore:
    try:
        store = open_store(ctx.ensure_object(dict).get("db"))
    except ProfileStoreError as exc:
        raise ProfilesError(str(exc)) from None
    ctx.call_on_close(store.close)
    return store


def _model_name(name: str) -> str:
    """A preset alias -> the name profiles are stored under; others unchanged."""
    try:
        return get_model(name).name
    except ModelSpecError:
        return name


@click.group()
@click.option("--db", type=click.Path(dir_okay=False, path_type=pathlib.Path), envvar=ENV_VAR, help=_DB_HELP)
@click.pass_context
def profiles(ctx: click.Context, db: pathlib.Path | None) -> None:
    """Inspect, import and export cached profiles.

    The store holds cell-level iteration times (measured, or imported from
    Arena: source arena-optimal / arena-estimated), layer profiles,
    communication timings and GPU specs.
    """
    ctx.obj = {"db": db}


@profiles.command("list")
@_db_option
@click.option("--model", help="Only this model (preset name or alias, e.g. bert-2.6b).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def list_cmd(ctx: click.Context, model: str | None, as_json: bool) -> None:
    """Count the cell records per model, GPU type and source."""
    store = _store(ctx)
    recs = store.cells(model=_model_name(model) if model else None)
    groups: dict[tuple[str, str, str], list[CellRecord]] = collections.defaultdict(list)
    for rec in recs:
        groups[(rec.model, rec.gpu_type, rec.source)].append(rec)
    rows = [
        {"model": m, "gpu_type": g, "source": s, "records": len(v), "oom": sum(r.oom for r in v)}
        for (m, g, s), v in sorted(groups.items())
    ]
    totals = store.counts()
    if as_json:
        click.echo(json.dumps({"db": store.path, "cells": rows, "totals": totals}, indent=1))
        return
    click.echo(f"profile store {store.path}")
    if rows:
        _table(["model", "gpu_type", "source", "records", "oom"], [list(r.values()) for r in rows])
    else:
        click.echo("no cell records" + (f" for model {model}" if model else ""))
    click.echo("totals: " + ", ".join(f"{k} {v}" for k, v in totals.items()))


@profiles.command("import")
@_db_option
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path))
@click.pass_context
def import_cmd(ctx: click.Context, files: tuple[pathlib.Path, ...]) -> None:
    """Import profile files into the store (all of them, or none on error).

    A file is recognised by its shape: Arena's profiles_optimal.json or
    profiles_plans_estimated.json, or a JSON-lines file written by
    `cellsched profiles export`. Re-importing a file replaces its records.
    """
    store = _store(ctx)
    try:
        with store.transaction():
            reports = [import_file(store, path) for path in files]
    except (ProfileFileError, ArenaFormatError, ProfileStoreError, OSError) as exc:
        raise ProfilesError(f"{exc} (nothing imported)") from None
    for report in reports:
        click.echo(str(report))


@profiles.command("export")
@_db_option
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=pathlib.Path))
@click.pass_context
def export_cmd(ctx: click.Context, file: pathlib.Path) -> None:
    """Write every record (cells, layers, comm, GPUs) as JSON lines to FILE
    ("-" for stdout); `cellsched profiles import FILE` reads it back."""
    store = _store(ctx)
    if str(file) == "-":
        n = export_jsonl(store, sys.stdout)
        click.echo(f"exported {n} records", err=True)
        return
    if not file.parent.resolve().is_dir():
        raise ProfilesError(f"export: directory {file.parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", dir=file.parent.resolve())
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            n = export_jsonl(store, out)
        os.replace(tmp, file)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    click.echo(f"exported {n} records to {file}")


@profiles.command("show")
@_db_option
@click.argument("model")
@click.option("--batch", type=click.IntRange(min=1), help="Only this global batch size.")
@click.option("--gpu-type", help="Only this GPU type (e.g. a100).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON records instead of a table.")
@click.pass_context
def show_cmd(ctx: click.Context, model: str, batch: int | None, gpu_type: str | None, as_json: bool) -> None:
    """Show the cell records of MODEL (preset name, alias or stored name).

    iter_time_s is seconds per iteration (one global batch); "oom" marks a
    cell that ran out of memory; pp/dp/tp "-" is a best-plan record.
    """
    store = _store(ctx)
    recs = store.cells(model=_model_name(model), global_batch=batch, gpu_type=gpu_type)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in recs], indent=1))
        return
    if not recs:
        click.echo(
            f"no cell records for model {model}"
            + (f", batch {batch}" if batch else "")
            + (f", GPU type {gpu_type}" if gpu_type else "")
        )
        return
    dash = lambda v: "-" if v is None else v  # noqa: E731
    _table(
        ["model", "batch", "gpu_type", "layout", "pp", "dp", "tp", "source", "iter_time_s", "samples/s"],
        [
            [
                r.model,
                r.global_batch,
                r.gpu_type,
                f"{r.num_nodes}x{r.gpus_per_node}",
                dash(r.pp),
                dash(r.dp),
                dash(r.tp),
                r.source,
                "oom" if r.iter_time_s is None else f"{r.iter_time_s:.3f}",
                "-" if r.iter_time_s is None else f"{r.global_batch / r.iter_time_s:.3f}",
            ]
            for r in recs
        ],
    )


def _table(header: list[str], rows: list[list[object]]) -> None:
    table: list[Sequence[object]] = [header, *rows]
    cells = [[str(c) for c in row] for row in table]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
