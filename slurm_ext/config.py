"""The controller's configuration: one TOML file, every key checked.

Found at ``--config FILE``, else ``$CELLSCHED_CONFIG``, else
``/etc/cellsched/cellsched.toml``; when none exists, the defaults apply.
Sections: ``[controller]`` (ControllerConfig), ``[solver]``
(solver.types.SolverConfig), ``[network]`` (the nodes' NICs and racks),
``[metrics]``, ``[log]``; a key is a field of its section's dataclass. An
unknown section or key is an error that names it.

Every field carries its documentation where it is declared
(``knob(default, doc)``, solver.types: its ``metadata["doc"]``); ``python -m slurm_ext.config
--markdown > docs/config.md`` writes the reference page from them
(tests/slurm_ext/test_config_docs.py checks that the page is current).
slurm_ext/admin/cellsched.toml is an example with the defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import json
import math
import os
import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from slurm_ext.errors import CellschedError
from solver.contract.hostlist import expand_hostlist
from solver.network import default_nic_gbps
from solver.types import SolverConfig, knob, knob_factory

DEFAULT_PATH = "/etc/cellsched/cellsched.toml"
ENV_VAR = "CELLSCHED_CONFIG"


class ConfigError(ValueError, CellschedError):
    """A configuration that cannot be used; the message names the key."""


@dataclass(frozen=True)
class ControllerConfig:
    """[controller]: how the daemon runs: its rounds, how it carries them out
    in Slurm, how it moves jobs and reads their progress, and the lease that
    an active and a standby controller share."""

    backend: str = knob(
        "cli", 'Slurm backend: "cli" (Slurm\'s commands), "pyslurm", or "auto" (pyslurm when it imports).'
    )
    policy: str = knob(
        "cellsched",
        "Scheduling policy (solver.policies.POLICIES): cellsched, cellsched-static, fcfs, fcfs-backfill, "
        "gavel, sia, slurm-multifactor, srsf-avoid, srsf-accept, ada-srsf.",
    )
    interval_s: float = knob(60.0, "Seconds between rounds (> 0).")
    watch_s: float = knob(
        5.0,
        "How often (s, > 0) a cheap look at Slurm checks for new or ended jobs, and for a touched "
        "kick_file, which start a round early.",
    )
    min_gap_s: float = knob(2.0, "The least time (s, >= 0) between the starts of two rounds.")
    slurm_timeout_s: float = knob(10.0, "Timeout (s, > 0) of every Slurm command.")
    slurm_workers: int = knob(
        4,
        "Carrying a round out with the cli backend: this many `scontrol update`s at a time (>= 1; "
        "slurmctld takes job updates one at a time, so more only queue).",
    )
    apply_batch: int = knob(
        1000,
        "Carrying a round out: its placements go to Slurm this many jobs per step (>= 1; journal, hold, "
        "update, release: one call or transaction per step).",
    )
    apply_budget_s: float = knob(
        30.0,
        "A round that has applied placements for this long (s, > 0) journals the rest, and the next "
        "round carries them out (the systemd watchdog is 300 s).",
    )
    state_path: str = knob(
        "/var/lib/cellsched/state.sqlite",
        "The controller's state (SQLite, WAL): accepted specs, plans, rounds. Not empty; on local disk "
        "(with two controllers too: see lease_path).",
    )
    profiles_path: str = knob(
        "", 'Profile store; "" = $CELLSCHED_PROFILES, else ~/.local/share/cellsched/profiles.sqlite.'
    )
    kick_file: str = knob(
        "/run/cellsched/kick",
        "Touching this file starts a round early (the watch, every watch_s, sees it); `cellsched sbatch` may touch it.",
    )
    checkpoint_root: str = knob(
        "/tmp/cellsched",
        "Checkpoint directory root for jobs whose working directory is unknown "
        "(`<root>/<user>/<job id>`; otherwise `<work dir>/.cellsched/<job id>`).",
    )
    max_cell_failures: int = knob(
        2,
        "A cell whose apply, or a run in it, failed this many times (>= 1) for a job is not tried again for that job.",
    )
    max_relaunches: int = knob(
        3,
        "A job whose run ends before its first step (a launch failure, a revoked credential, a crash at "
        "start-up) is requeued from its checkpoint and placed again, at most this many times (>= 0); then it is "
        "left to end FAILED with a reason. A job that has trained is never failed: once its runs have failed "
        "more than this many times in a row since it last trained, it is parked: requeued held (a user hold, "
        "`scontrol requeuehold`), with the reason in `cellsched status` and the log, and left held until its "
        "user (or an operator) releases it with `scontrol release JOBID`; then it is managed again and its "
        "count starts over (slurm_ext.controller.relaunch).",
    )
    checkpoint_wait_s: float = knob(
        60.0,
        "Moving a running elastic job (one submitted --elastic): it is signalled (SIGUSR1 to its steps: "
        "cellsched-launch checkpoints and exits 75); the round waits up to this long (s, >= 0) for that, "
        "polling every checkpoint_poll_s, then requeues it held, updates it and releases it.",
    )
    checkpoint_timeout_s: float = knob(
        600.0,
        "A job being moved that is still running this long (s, > 0) after the signal is requeued anyway "
        "(Slurm's SIGTERM makes the launcher checkpoint too).",
    )
    checkpoint_poll_s: float = knob(1.0, "How often (s, > 0) the round looks whether a signalled job has checkpointed.")
    read_timeout_s: float = knob(
        0.5,
        "A job's progress file lies in the user's directory and is never trusted: it is read only if it "
        "is a regular file of the job's user (no FIFO, no symbolic link, at most 64 KiB), within this "
        "time (s, > 0).",
    )
    read_budget_s: float = knob(
        5.0, "All of a round's progress-file reads within this time (s, > 0); the jobs over the budget are estimated."
    )
    progress_rate_factor: float = knob(
        10.0,
        "A job's reported progress may run at most this many times (>= 1) faster than its cell's "
        "estimate (estimates from profiles of other machines can be a few times off); beyond that it is "
        "ignored: the job is scheduled on the estimate and its status says so (docs/security.md).",
    )
    learn_declared_work: bool = knob(
        False,
        "Schedule each job on its expected total iterations given its progress, learned from how much of "
        "their declared iterations the jobs that completed trained (slurm_ext.controller.declared), instead "
        "of its declared iterations.",
    )
    max_restart_cost_s: float = knob(
        1800.0, "A measured restart (signal to first step) counts at most this long (s, > 0)."
    )
    failsafe_after_s: float = knob(
        600.0,
        "The fail-safe (`cellsched failsafe`, cellsched-failsafe.timer; slurm_ext.failsafe): once no "
        "controller round has completed for this long (s, > 0), it releases the jobs the controller holds on "
        "their static request (the GPU type and count the user asked for, else a conservative default) and "
        "logs why; it stands down as soon as a round completes again. The default, 600 s: 10 rounds of the "
        "default interval, and longer than the service's WatchdogSec (300 s) plus its restart, so a controller "
        "that hangs or restarts comes back before the fail-safe acts.",
    )
    lease_path: str = knob(
        "",
        "Two controllers, active and standby (docs/controller.md; slurm_ext.controller.lease): the "
        "lease file, the same for both hosts, on storage both mount (NFS is fine: the lease is a file replaced "
        "whole and read back, no flock/fcntl lock), with state_path on local disk; add the lease's directory "
        'to the unit\'s ReadWritePaths=. "" = one controller, no lease. A round begins only under the lease '
        "and checks it again before each change to Slurm.",
    )
    lease_s: float = knob(
        30.0,
        "The active controller renews the lease every round (and every lease_s / 4 between); a standby "
        "takes it once it has not been renewed for this long (s, > 0), trying every min(interval_s, "
        "lease_s / 2): it acts within 1.5 lease_s + lease_settle_s of the active one's end (SIGKILL included). "
        "The default is half the default interval_s.",
    )
    lease_settle_s: float = knob(
        1.0,
        "How long (s, > 0) a contender for the lease waits before reading its claim back: more than a write "
        "to the shared storage takes, and at most lease_s / 4; the hosts' clocks must agree within it (NTP).",
    )

    def __post_init__(self) -> None:
        for name in ("interval_s", "watch_s", "slurm_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"controller.{name} must be > 0, got {getattr(self, name)}")
        if self.min_gap_s < 0:
            raise ConfigError(f"controller.min_gap_s must be >= 0, got {self.min_gap_s}")
        for name in (
            "checkpoint_poll_s",
            "checkpoint_timeout_s",
            "read_timeout_s",
            "read_budget_s",
            "max_restart_cost_s",
            "apply_budget_s",
            "failsafe_after_s",
            "lease_s",
            "lease_settle_s",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"controller.{name} must be > 0, got {getattr(self, name)}")
        if self.checkpoint_wait_s < 0:
            raise ConfigError(f"controller.checkpoint_wait_s must be >= 0, got {self.checkpoint_wait_s}")
        if self.progress_rate_factor < 1:
            raise ConfigError(f"controller.progress_rate_factor must be >= 1, got {self.progress_rate_factor}")
        if self.max_relaunches < 0:
            raise ConfigError(f"controller.max_relaunches must be >= 0, got {self.max_relaunches}")
        for name in ("slurm_workers", "apply_batch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"controller.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_cell_failures < 1:
            raise ConfigError(f"controller.max_cell_failures must be >= 1, got {self.max_cell_failures}")
        if not self.state_path:
            raise ConfigError("controller.state_path must not be empty")
        if self.lease_settle_s * 4 > self.lease_s:
            raise ConfigError(
                f"controller.lease_settle_s ({self.lease_settle_s}) must be at most lease_s / 4 ({self.lease_s})"
            )


@dataclass(frozen=True)
class NetworkConfig:
    """[network]: the network between the nodes (Gb/s), which the solver
    prices when jobs share it (solver.network; solver.contention_aware). A
    node's NIC: its entry in `nodes`, else `nic_gbps_by_type` of its GPU
    type, else `nic_gbps`, else the GPU type's default
    (solver.network.NIC_GBPS_BY_TYPE, 100 Gb/s); `devcluster.sh network`
    prints this section for the dev cluster."""

    modelled: bool = knob(True, "false: no NICs at all (nothing is priced: every job as if alone on the network).")
    nic_gbps: float = knob(
        0.0, "Every node's NIC (Gb/s, >= 0) unless `nodes` or `nic_gbps_by_type` says otherwise; 0: unset."
    )
    nic_gbps_by_type: Mapping[str, float] = knob_factory(
        dict,
        "The NIC (Gb/s, > 0) of the nodes of a GPU type, unless `nodes` names the node: "
        "`{ a100 = 200.0, a40 = 25.0 }`.",
    )
    nodes: Mapping[str, float] = knob_factory(
        dict, 'The NIC (Gb/s, > 0) of the nodes of a hostlist: `{ "gpu[001-016]" = 10.0 }`.'
    )
    racks: Mapping[str, str] = knob_factory(
        dict,
        'Racks: name = hostlist, `{ r1 = "gpu[001-008]", r2 = "gpu[009-016]" }`; a job spanning racks '
        "sends one card's rate over each uplink it crosses (see uplink_gbps).",
    )
    uplink_gbps: Mapping[str, float] = knob_factory(
        dict,
        "The uplinks (Gb/s, > 0) of oversubscribed racks, by rack name (a rack of `racks`): "
        "`{ r1 = 40.0, r2 = 40.0 }`; a rack not named here is not oversubscribed (its uplink never limits).",
    )

    def __post_init__(self) -> None:
        if not (math.isfinite(self.nic_gbps) and self.nic_gbps >= 0):
            raise ConfigError(f"network.nic_gbps must be a number >= 0 (0: by GPU type), got {self.nic_gbps!r}")
        for key in ("nic_gbps_by_type", "nodes", "uplink_gbps"):
            table = getattr(self, key)
            if not isinstance(table, Mapping):
                raise ConfigError(f"network.{key} must be a table of Gb/s, got {table!r}")
            for k, v in table.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                    raise ConfigError(f"network.{key}.{k} must be a positive number of Gb/s, got {v!r}")
        if not isinstance(self.racks, Mapping):
            raise ConfigError(f"network.racks must be a table of rack = hostlist, got {self.racks!r}")
        for rack, hosts in self.racks.items():
            if not isinstance(hosts, str) or not hosts:
                raise ConfigError(f"network.racks.{rack} must be a hostlist string, got {hosts!r}")
            try:
                expand_hostlist(hosts)
            except ValueError as exc:
                raise ConfigError(f"network.racks.{rack}: {exc}") from None
        for hosts in self.nodes:
            try:
                expand_hostlist(hosts)
            except ValueError as exc:
                raise ConfigError(f"network.nodes.{hosts}: {exc}") from None
        unknown = sorted(set(self.uplink_gbps) - set(self.racks))
        if unknown:
            raise ConfigError(f"network.uplink_gbps.{unknown[0]}: no such rack in network.racks")

    @functools.cached_property
    def _node_nic(self) -> dict[str, float]:
        return {n: float(v) for hosts, v in self.nodes.items() for n in expand_hostlist(hosts)}

    @functools.cached_property
    def _node_rack(self) -> dict[str, str]:
        return {n: rack for rack, hosts in self.racks.items() for n in expand_hostlist(hosts)}

    def nic_of(self, node: str, gpu_type: str) -> float:
        """The NIC (Gb/s) of `node`; 0 when the network is not modelled."""
        if not self.modelled:
            return 0.0
        return float(
            self._node_nic.get(node)
            or self.nic_gbps_by_type.get(gpu_type)
            or self.nic_gbps
            or default_nic_gbps(gpu_type)
        )

    def rack_of(self, node: str) -> str:
        return self._node_rack.get(node, "")


@dataclass(frozen=True)
class MetricsConfig:
    """[metrics]: the controller's Prometheus metrics, on
    ``http://ADDRESS:PORT/metrics`` (slurm_ext/admin/grafana/cellsched.json shows them)."""

    port: int = knob(9464, "TCP port of the metrics endpoint (0..65535); 0 = off.")
    address: str = knob("127.0.0.1", "Address the metrics endpoint listens on.")

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"metrics.port must be in 0..65535, got {self.port}")


@dataclass(frozen=True)
class LogConfig:
    """[log]: the controller's log, lines on stderr."""

    format: str = knob("json", '"json" (one object per line) or "text".')
    level: str = knob("info", "The least level logged: debug, info, warning or error.")

    def __post_init__(self) -> None:
        if self.format not in ("json", "text"):
            raise ConfigError(f"log.format must be 'json' or 'text', got {self.format!r}")
        if self.level.lower() not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"log.level must be debug, info, warning or error, got {self.level!r}")


@dataclass(frozen=True)
class Config:
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    solver: SolverConfig = field(default_factory=SolverConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    log: LogConfig = field(default_factory=LogConfig)
    source: str = ""  # the file it was read from ("" = defaults)


#: TOML section -> its dataclass (a key is a field)
SECTIONS: Mapping[str, type] = {
    "controller": ControllerConfig,
    "solver": SolverConfig,
    "network": NetworkConfig,
    "metrics": MetricsConfig,
    "log": LogConfig,
}


def _typed(section: str, key: str, want: Any, value: Any) -> Any:
    """`value` checked against the field's default type (int accepted for float)."""
    where = f"{section}.{key}"
    if isinstance(want, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if isinstance(want, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if isinstance(want, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if isinstance(want, str):
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    return value


def from_dict(data: Mapping[str, Any], source: str = "") -> Config:
    """A Config from parsed TOML; ConfigError names the first bad key."""
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{source or 'config'}: unknown section [{unknown[0]}] (known: {', '.join(SECTIONS)})")
    defaults = Config()
    built: dict[str, Any] = {}
    for section, cls in SECTIONS.items():
        values = data.get(section, {})
        if not isinstance(values, Mapping):
            raise ConfigError(f"[{section}] must be a table")
        base = getattr(defaults, section)
        known = {f.name: f for f in fields(cls)}
        bad = sorted(set(values) - set(known))
        if bad:
            raise ConfigError(f"{source or 'config'}: unknown key {section}.{bad[0]}")
        kwargs = {k: _typed(section, k, getattr(base, k), v) for k, v in values.items()}
        try:
            built[section] = dataclasses.replace(base, **kwargs)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"[{section}]: {exc}") from None
    return Config(**built, source=source)


def solver_options(base: SolverConfig, text: str, where: str = "policy options") -> SolverConfig:
    """`base` with ``key=value[,key=value]`` solver keys set (values as in
    TOML, bare words as strings); ConfigError names a bad key or value."""
    known = {f.name for f in fields(SolverConfig)}
    changes: dict[str, Any] = {}
    for item in text.split(","):
        key, eq, raw = (part.strip() for part in item.partition("="))
        if not key or not eq or not raw:
            raise ConfigError(f"{where}: expected key=value, got {item.strip()!r}")
        if key not in known:
            raise ConfigError(f"{where}: unknown solver key {key!r}")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        changes[key] = _typed("solver", key, getattr(base, key), value)
    try:
        return dataclasses.replace(base, **changes)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """The configuration: `path`, else $CELLSCHED_CONFIG, else the system file
    when it exists, else the defaults. A named file that is missing is an error."""
    named = path or os.environ.get(ENV_VAR)
    if not named:
        if not Path(DEFAULT_PATH).is_file():
            return Config()
        named = DEFAULT_PATH
    p = Path(named)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {p}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p}: {exc}") from None
    return from_dict(data, str(p))


# --- the reference page (docs/config.md) --------------------------------------

#: TOML names of the fields' types (a number also takes an integer).
_TYPE_NAMES = {
    "bool": "boolean",
    "int": "integer",
    "float": "number",
    "str": "string",
    "Mapping[str, float]": "table of numbers",
    "Mapping[str, str]": "table of strings",
}


def _toml(value: Any) -> str:
    """`value` as written in TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }" if value else "{}"
    raise TypeError(f"no TOML form for {value!r}")


def key_docs(section: str) -> list[tuple[str, str, str, str]]:
    """(key, TOML type, TOML default, doc) of every key of `section`, in
    declaration order; ValueError for a field without a doc or of a type
    the page cannot name."""
    cls = SECTIONS[section]
    defaults = cls()
    out = []
    for f in fields(cls):
        doc = " ".join(str(f.metadata.get("doc", "")).split())
        if not doc:
            raise ValueError(f"{section}.{f.name} has no doc (declare it with knob(default, doc))")
        type_name = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        if type_name not in _TYPE_NAMES:
            raise ValueError(f"{section}.{f.name}: no TOML name for the type {type_name!r}")
        out.append((f.name, _TYPE_NAMES[type_name], _toml(getattr(defaults, f.name)), doc))
    return out


def _summary(cls: type) -> str:
    """The first paragraph of `cls`'s docstring, less its ``[section]:`` prefix, as Markdown."""
    first = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0]
    text = re.sub(r"^\[\w+\]:\s*", "", " ".join(first.split())).replace("``", "`")
    return text[:1].upper() + text[1:]


def markdown() -> str:
    """docs/config.md: every section and key, with its type, default and doc."""
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated from the config dataclasses (slurm_ext/config.py, solver/types.py) by",
        "     `python -m slurm_ext.config --markdown > docs/config.md`; do not edit by hand. -->",
        "",
        "The controller (and `cellsched failsafe`) read one TOML file: `--config FILE`, else `$CELLSCHED_CONFIG`,",
        "else `/etc/cellsched/cellsched.toml`; when none exists, the defaults apply. Every key is optional; an",
        "unknown section or key, or a value of the wrong type, is an error that names it. A number may be written",
        "as an integer. `slurm_ext/admin/cellsched.toml` is an example with the defaults (`cellsched admin files DIR`",
        "writes it).",
    ]
    for section, cls in SECTIONS.items():
        out += ["", f"## [{section}]", "", _summary(cls), ""]
        for key, type_name, default, doc in key_docs(section):
            out.append(f"- **`{key}`** ({type_name}, default `{default}`): {doc}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m slurm_ext.config", description="The config's reference page.")
    parser.add_argument("--markdown", action="store_true", required=True, help="write docs/config.md to stdout")
    parser.parse_args(argv)
    sys.stdout.write(markdown())


if __name__ == "__main__":
    main()
