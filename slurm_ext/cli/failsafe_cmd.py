"""`cellsched failsafe`: release the held managed jobs when no controller runs."""

from __future__ import annotations

import json
import sys
import threading
from functools import partial

import click

from slurm_ext.cli.controller_cmd import ControllerError, load_config
from slurm_ext.textsafe import printable

#: seconds between checks without --once (the timer unit runs --once every minute instead)
DEFAULT_INTERVAL_S = 60.0


@click.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Config file (default: $CELLSCHED_CONFIG, else /etc/cellsched/cellsched.toml).",
)
@click.option(
    "--once", is_flag=True, help="Check once, print the report as JSON, exit (0 done, 3 Slurm unavailable, 1 error)."
)
@click.option(
    "--after",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds without a completed controller round before it acts (overrides failsafe_after_s).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=DEFAULT_INTERVAL_S,
    show_default=True,
    help="Seconds between checks (without --once).",
)
@click.option("--backend", help="Slurm backend (cli, pyslurm, auto; overrides the config).")
def failsafe(config_path: str | None, once: bool, after: float | None, interval: float, backend: str | None) -> None:
    """Release the jobs the controller holds, on their static request, once no
    controller round has completed for failsafe_after_s; stand down while one does."""
    from slurm_ext.backends import SlurmError, SlurmUnavailable, get_backend
    from slurm_ext.controller import daemon, logs
    from slurm_ext.failsafe.check import CheckReport, check, run
    from slurm_ext.state import StateError

    config = load_config(config_path, backend=backend)
    logs.setup(config.log.format, config.log.level)
    cc = config.controller
    after_s = cc.failsafe_after_s if after is None else after
    if after_s <= 2 * cc.interval_s:
        click.echo(
            f"cellsched failsafe: warning: acting after {after_s:g} s, not much more than the controller's "
            f"interval ({cc.interval_s:g} s): it may act between two rounds of a controller that runs",
            err=True,
        )
    opts = {"timeout": cc.slurm_timeout_s, "workers": cc.slurm_workers} if cc.backend == "cli" else {}
    try:
        slurm = get_backend(cc.backend, **opts)
    except (ValueError, SlurmError) as exc:
        raise ControllerError(printable(exc)) from None
    check_once = partial(check, cc.state_path, slurm, after_s, cc.checkpoint_root, lease_path=cc.lease_path)
    if not once:
        stop = threading.Event()
        daemon.stop_on_signals(stop)
        run(check_once, interval, stop)
        return
    try:
        report: CheckReport = check_once()
    except StateError as exc:
        raise ControllerError(str(exc)) from None
    except SlurmUnavailable as exc:
        click.echo(f"cellsched failsafe: Slurm unavailable: {printable(exc)}", err=True)
        sys.exit(3)
    json.dump(report.to_dict(), sys.stdout)
    sys.stdout.write("\n")
    sys.exit(1 if report.failed else 0)
