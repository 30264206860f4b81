"""The options `cellsched sbatch` knows, those it refuses and why, the error it
reports, and its usage text."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_ext.errors import CellschedError
from solver.contract.runtimes import DEFAULT_RUNTIME, RUNTIMES, SUBMITTABLE

PROG = "cellsched sbatch"


class WrapperError(ValueError, CellschedError):
    """Bad input; `field` names what is wrong (an option, the script, a line)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True)
class Setting:
    """A raw option value and where it came from ("command line" or "script line N")."""

    value: str | bool
    origin: str


@dataclass(frozen=True)
class Option:
    """One supported option. kind: "value" (takes an argument), "flag"
    (--x sets True, --no-x False when negatable) or "switch" (invocation
    only: not allowed in directive lines)."""

    name: str
    kind: str
    help: str
    short: str | None = None
    negatable: bool = False
    passthrough: bool = False


OPTIONS: tuple[Option, ...] = (
    Option("model", "value", "model preset (e.g. gpt-1.3b) or spec file (.json/.toml)"),
    Option("global-batch", "value", "global batch size (samples per iteration)"),
    Option("iterations", "value", "training iterations"),
    Option("gpu-types", "value", "GPU types the job may use, comma-separated (default: all)"),
    Option("min-gpus", "value", "fewest GPUs the job can run on (default 1)"),
    Option("max-gpus", "value", "most GPUs the job can use (default: no limit)"),
    Option("elastic", "flag", "the job may be resized while it runs (--no-elastic: never)", negatable=True),
    Option("gpus", "value", "static request: GPU count (a hint; the FCFS baseline uses it)"),
    Option("gpu-type", "value", "static request: GPU type (a hint)"),
    Option("virtual-workers", "value", "virtual data-parallel workers (must divide the global batch)"),
    Option(
        "runtime",
        "value",
        f"what the job's code can carry out: {', '.join(SUBMITTABLE)} (default {DEFAULT_RUNTIME}; see Runtimes below)",
    ),
    Option("job-name", "value", "job name", short="J", passthrough=True),
    Option("output", "value", "stdout file pattern", short="o", passthrough=True),
    Option("error", "value", "stderr file pattern", short="e", passthrough=True),
    Option(
        "open-mode",
        "value",
        "append or truncate the output files (append keeps the log of every run of a job that is moved or requeued)",
        passthrough=True,
    ),
    Option("time", "value", "time limit (minutes, or [D-]H:M:S)", short="t", passthrough=True),
    Option("account", "value", "account to charge", short="A", passthrough=True),
    Option("qos", "value", "quality of service", short="q", passthrough=True),
    Option("mail-type", "value", "mail events (BEGIN,END,FAIL,...)", passthrough=True),
    Option("mail-user", "value", "mail address", passthrough=True),
    Option("export", "value", "environment to export (ALL, NONE, or VAR[=value],...)", passthrough=True),
    Option("partition", "value", "partitions the job may use, comma-separated", short="p", passthrough=True),
    Option("parsable", "switch", "print only the job id"),
    Option("dry-run", "switch", "validate and print what would be submitted; submit nothing"),
    Option("backend", "value", "Slurm backend: auto, cli or pyslurm (command line only)"),
)
BY_LONG = {o.name: o for o in OPTIONS}
BY_SHORT = {o.short: o for o in OPTIONS if o.short}
#: directive keys (for #CELLSCHED lines): everything but invocation switches and --backend
DIRECTIVE_KEYS = tuple(o.name for o in OPTIONS if o.kind != "switch" and o.name != "backend")
#: sbatch options the scheduler decides; refused with a reason
_REFUSED = {
    (
        "gres",
        "gpus",
        "gpus-per-node",
        "gpus-per-task",
        "gpus-per-socket",
        "cpus-per-gpu",
        "mem-per-gpu",
        "G",
        "tres-per-task",
    ): "GPU counts and types are the scheduler's business: use --min-gpus/--max-gpus/"
    "--gpu-types (--gpus N for a static hint)",
    (
        "nodes",
        "N",
        "nodelist",
        "w",
        "exclude",
        "x",
        "ntasks",
        "n",
        "ntasks-per-node",
        "constraint",
        "C",
        "cluster-constraint",
        "exclusive",
        "switches",
    ): "nodes, node lists and constraints are the scheduler's business:"
    " restrict GPU types with --gpu-types and partitions with -p",
    (
        "hold",
        "H",
        "comment",
        "admin-comment",
        "priority",
        "nice",
        "dependency",
        "d",
        "begin",
        "b",
        "array",
        "a",
        "requeue",
        "no-requeue",
    ): "the scheduler holds, orders and releases managed jobs itself",
}
REFUSED_BY_NAME = {name: why for names, why in _REFUSED.items() for name in names}


def supported_text() -> str:
    """One line listing the supported options."""
    names = [f"-{o.short}/--{o.name}" if o.short else f"--{o.name}" for o in OPTIONS]
    return "supported: " + ", ".join(names) + ", --no-elastic, -h/--help"


def usage_text() -> str:
    """The `--help` text."""
    lines = [
        f"Usage: {PROG} [OPTIONS] [--] SCRIPT [ARGS...]",
        "",
        "Submit a training job that cellsched schedules: it is held, and the controller picks its",
        "GPU type, count, nodes and parallel plan. Settings may also come from '#CELLSCHED key=value'",
        "lines at the top of SCRIPT (key = a long option name, e.g. '#CELLSCHED global-batch=512');",
        "the command line wins.",
        "",
        "Options:",
    ]
    for o in OPTIONS:
        flag = (f"-{o.short}, " if o.short else "    ") + f"--{o.name}" + ("/--no-" + o.name if o.negatable else "")
        flag += " VALUE" if o.kind == "value" else ""
        lines.append(f"  {flag:<34} {o.help}")
    lines.append(f"  {'-h, --help':<34} show this message")
    lines += ["", "Runtimes (--runtime NAME; the solver offers a job only the plans its runtime carries out):"]
    for name in SUBMITTABLE:
        mark = " (default)" if name == DEFAULT_RUNTIME else ""
        lines.append(f"  {name:<34} {RUNTIMES[name].doc}{mark}")
    return "\n".join(lines)
