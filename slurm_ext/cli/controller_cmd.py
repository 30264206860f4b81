"""`cellsched controller run`: the scheduling daemon."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from pathlib import Path

import click

from slurm_ext.config import Config, ConfigError, load
from slurm_ext.errors import CellschedError
from slurm_ext.state import RoundStatus, StateError, StateStore
from slurm_ext.textsafe import printable


class ControllerError(click.ClickException, CellschedError):
    exit_code = 2


def load_config(path: str | None, *, interval: float | None = None, backend: str | None = None) -> Config:
    """The configuration with command-line overrides; a ClickException when unusable."""
    try:
        config = load(path)
        if interval is not None or backend is not None:
            controller = dataclasses.replace(
                config.controller,
                interval_s=config.controller.interval_s if interval is None else interval,
                backend=config.controller.backend if backend is None else backend,
            )
            config = dataclasses.replace(config, controller=controller)
        return config
    except ConfigError as exc:
        raise ControllerError(str(exc)) from None


def open_state(config: Config, *, readonly: bool) -> StateStore:
    """The state DB; read-only use of a DB that does not exist yet gets an empty one."""
    path = config.controller.state_path
    try:
        if readonly and not Path(path).exists():
            return StateStore(":memory:")
        return StateStore(path, readonly=readonly)
    except StateError as exc:
        raise ControllerError(str(exc)) from None


def new_controller(config: Config, state: StateStore, *, readonly: bool):
    """The Controller; a one-line error for an unknown backend or a missing pyslurm."""
    from slurm_ext.backends import SlurmError
    from slurm_ext.controller.round import Controller

    try:
        return Controller(config, state=state, readonly=readonly)
    except (ValueError, SlurmError) as exc:
        raise ControllerError(printable(exc)) from None


@click.group()
def controller() -> None:
    """The cellsched scheduling daemon."""


@controller.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Config file (default: $CELLSCHED_CONFIG, else /etc/cellsched/cellsched.toml).",
)
@click.option(
    "--once", is_flag=True, help="Run one round, print its report as JSON, exit (0 ok, 3 Slurm unavailable, 1 error)."
)
@click.option("--dry-run", is_flag=True, help="Decide but change nothing (neither Slurm nor the state).")
@click.option("--interval", type=click.FloatRange(min=0.1), help="Seconds between rounds (overrides the config).")
@click.option("--backend", help="Slurm backend (cli, pyslurm, auto; overrides the config).")
def run(config_path: str | None, once: bool, dry_run: bool, interval: float | None, backend: str | None) -> None:
    """Observe the cluster, place managed jobs, release them; every interval."""
    from slurm_ext.controller import daemon, logs
    from slurm_ext.controller.lock import LockError, StateLock
    from slurm_ext.controller.metrics import serve

    config = load_config(config_path, interval=interval, backend=backend)
    logs.setup(config.log.format, config.log.level)
    stop = threading.Event()
    daemon.stop_on_signals(stop)
    state = open_state(config, readonly=dry_run)
    try:
        lock = None if dry_run else StateLock(config.controller.state_path).__enter__()
    except LockError as exc:
        raise ControllerError(str(exc)) from None
    try:
        ctl = new_controller(config, state, readonly=dry_run)
        if config.metrics.port and not once:
            try:
                serve(ctl.metrics, config.metrics.port, config.metrics.address)
            except OSError as exc:
                raise ControllerError(
                    f"metrics on {config.metrics.address}:{config.metrics.port}: {exc.strerror}"
                ) from None
        report = daemon.run(ctl, once=once, dry_run=dry_run, stop=stop)
    finally:
        if lock is not None:
            lock.__exit__()
        state.close()
    if once and report is not None:
        json.dump(report.to_dict(), sys.stdout, default=str)
        sys.stdout.write("\n")
        sys.exit({RoundStatus.OK: 0, RoundStatus.UNAVAILABLE: 3}.get(report.status, 1))
