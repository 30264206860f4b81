"""The controller's configuration: one TOML file, every key checked.

Found at ``--config FILE``, else ``$CELLSCHED_CONFIG``, else
``/etc/cellsched/cellsched.toml``; when none exists, the defaults apply.
Sections: ``[controller]`` (the ControllerConfig fields), ``[solver]`` (the
solver.types.SolverConfig fields), ``[network]`` (the nodes' NICs and
racks), ``[metrics]``, ``[log]``. An unknown
section or key is an error that names it. etc/cellsched.toml documents them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from slurm_ext.errors import CellschedError
from solver.hostlist import expand_hostlist
from solver.network import default_nic_gbps
from solver.types import SolverConfig

DEFAULT_PATH = "/etc/cellsched/cellsched.toml"
ENV_VAR = "CELLSCHED_CONFIG"


class ConfigError(ValueError, CellschedError):
    """A configuration that cannot be used; the message names the key."""


@dataclass(frozen=True)
class ControllerConfig:
    """[controller]: how the daemon runs.

    interval_s: seconds between rounds. watch_s: how often the cheap watch
    looks for new or ended jobs (and the kick file) to start a round early;
    min_gap_s: the least time between two rounds. checkpoint_root: where
    checkpoints go when a job's working directory is unknown. Moving a
    running elastic job: the round waits up to checkpoint_wait_s (polling
    every checkpoint_poll_s) for it to checkpoint; a job still running
    checkpoint_timeout_s after the signal is requeued anyway.
    max_cell_failures: a job whose placement or run failed this often in a
    cell is not placed there again. max_relaunches: how often a job whose run
    ended before its first step is requeued from its checkpoint before it is
    left to end FAILED, or, for a job that has trained, how many such
    failures in a row since it last trained are relaunched before it is
    parked: requeued held (a user hold), never failed, until someone
    releases it (slurm_ext.controller.relaunch). A job's progress
    file (in the user's directory) is read within read_timeout_s, and all of
    a round's within read_budget_s; a job may report at most
    progress_rate_factor times the iterations its cell's estimate allows, and
    a measured restart counts at most max_restart_cost_s (README: security
    model). Carrying a round out: placements go to Slurm apply_batch jobs per
    step (slurm_workers ``scontrol update`` at a time with the cli backend);
    once a round has applied for apply_budget_s, the rest are journalled and
    carried out by the next round. failsafe_after_s: once no round has
    completed for this long, `cellsched failsafe` releases the jobs the
    controller holds on their static request (slurm_ext.failsafe).
    Two controllers, active and standby (slurm_ext.controller.lease):
    lease_path, a file on storage both hosts see ("" = one controller, no
    lease); the active one renews it, and a standby takes it once it has not
    been renewed for lease_s (a round begins only under the lease, and each
    change to Slurm is fenced by it); lease_settle_s: how long a contender
    waits before reading its claim back (more than a write takes; the hosts'
    clocks must agree within it).
    """

    backend: str = "cli"
    policy: str = "cellsched"
    interval_s: float = 60.0
    watch_s: float = 5.0
    min_gap_s: float = 2.0
    slurm_timeout_s: float = 10.0
    slurm_workers: int = 4
    apply_batch: int = 1000
    apply_budget_s: float = 30.0
    state_path: str = "/var/lib/cellsched/state.sqlite"
    profiles_path: str = ""
    kick_file: str = "/run/cellsched/kick"
    checkpoint_root: str = "/tmp/cellsched"
    max_cell_failures: int = 2
    max_relaunches: int = 3
    checkpoint_wait_s: float = 60.0
    checkpoint_timeout_s: float = 600.0
    checkpoint_poll_s: float = 1.0
    read_timeout_s: float = 0.5
    read_budget_s: float = 5.0
    progress_rate_factor: float = 10.0
    max_restart_cost_s: float = 1800.0
    #: 10 rounds of the default interval, and past the unit's WatchdogSec (300 s) plus its restart: a
    #: controller that hangs or restarts comes back before the fail-safe acts
    failsafe_after_s: float = 600.0
    lease_path: str = ""
    #: half the default interval: a standby takes over within lease_s + interval_s of the active's end
    lease_s: float = 30.0
    lease_settle_s: float = 1.0

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
    prices when jobs share it (solver.network; SolverConfig.contention_aware).

    A node's NIC: its entry in `nodes` (hostlist -> Gb/s), else
    `nic_gbps_by_type` of its GPU type, else `nic_gbps`, else the GPU type's
    default (solver.network.NIC_GBPS_BY_TYPE, 100 Gb/s). `racks` maps a rack
    name to its nodes (hostlist); `uplink_gbps` a rack to its uplink, for
    racks whose uplink is oversubscribed. `modelled = false`: no NICs at all
    (every job is priced as if alone on the network).
    """

    modelled: bool = True
    nic_gbps: float = 0.0
    nic_gbps_by_type: Mapping[str, float] = field(default_factory=dict)
    nodes: Mapping[str, float] = field(default_factory=dict)
    racks: Mapping[str, str] = field(default_factory=dict)
    uplink_gbps: Mapping[str, float] = field(default_factory=dict)

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
    """[metrics]: Prometheus text exposition; port 0 = off."""

    port: int = 9464
    address: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"metrics.port must be in 0..65535, got {self.port}")


@dataclass(frozen=True)
class LogConfig:
    """[log]: lines on stderr, "json" or "text"."""

    format: str = "json"
    level: str = "info"

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


_SECTIONS: dict[str, type] = {
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
    unknown = sorted(set(data) - set(_SECTIONS))
    if unknown:
        raise ConfigError(f"{source or 'config'}: unknown section [{unknown[0]}] (known: {', '.join(_SECTIONS)})")
    defaults = Config()
    built: dict[str, Any] = {}
    for section, cls in _SECTIONS.items():
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
