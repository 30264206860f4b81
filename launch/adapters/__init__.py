"""Framework adapters: a plan turned into the framework's own options.

When the plan's runtime is ``torchtitan`` or ``megatron``, ``cellsched-launch``
appends the framework's options for the plan's parallel degrees, batch sizes
and checkpoint folder to the user's command (``command_for``), and bridges the
controller's checkpoint signal to the framework's own save-and-exit
(``Adapter.supervise``: whether the launcher stays as the command's parent to
translate the signal and the exit status; see the adapter modules).

Stdlib only: this runs on the launcher's path (the torchtitan bridge module,
``launch.adapters.titan_bridge``, is imported by torchtitan itself, never here).
"""

from __future__ import annotations

from collections.abc import Sequence

from launch.adapters import megatron, torchtitan
from launch.adapters.base import Adapter, AdapterError, BatchSizes, batch_sizes, check_plan, sets_option
from solver.contract.plan import JobPlan

__all__ = [
    "ADAPTERS",
    "Adapter",
    "AdapterError",
    "BatchSizes",
    "batch_sizes",
    "check_plan",
    "command_for",
    "get_adapter",
]

#: runtime name -> its adapter
ADAPTERS: dict[str, Adapter] = {a.runtime: a for a in (megatron.ADAPTER, torchtitan.ADAPTER)}


def get_adapter(runtime: str | None) -> Adapter | None:
    """The adapter of RUNTIME; None for a runtime whose code reads the plan itself."""
    return ADAPTERS.get(runtime or "")


def command_for(plan: JobPlan, cmd: Sequence[str]) -> list[str]:
    """CMD with the plan's framework options appended (CMD as it is for a runtime without an adapter)."""
    adapter = get_adapter(plan.runtime)
    if adapter is None:
        return list(cmd)
    given = [name for name in adapter.owned if sets_option(cmd[1:], name)]
    if given:
        raise AdapterError(
            f"the command sets {', '.join(given)} itself, but under runtime {adapter.runtime} the launcher sets "
            "it from the plan: remove it from the command"
        )
    return [*cmd, *adapter.options(plan)]
