"""`cellsched sbatch`: parse, validate and submit a managed job.

Settings come from three places, the first that has a setting wins:

1. the command line: ``cellsched sbatch [options] [--] SCRIPT [ARGS...]``;
   option parsing stops at the script, whose arguments pass through as is;
2. ``#CELLSCHED key=value`` lines of the script (key = a long option name
   without the dashes, e.g. ``#CELLSCHED global-batch=512``);
3. ``#SBATCH`` lines of the script, for the pass-through options.

Directive lines are read, like sbatch reads ``#SBATCH``, from the script's
leading block of comments and blank lines; a directive after the first
command is refused. ``#SBATCH`` lines and ``SBATCH_*`` variables that would
set what the scheduler decides (GPUs, nodes, constraints, holds, comment)
are refused too, so nothing reaches Slurm behind the wrapper's back.

Everything is checked before Slurm sees anything (`prepare`): an error is a
`WrapperError` naming the field, and the CLI prints it as one line
``cellsched sbatch: error: <field>: <message>`` and exits with status 2.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import pathlib
import re
import shlex
import stat
import sys
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Mapping, TextIO

from slurm_ext.backends.base import Backend, SlurmError, SubmitRequest
from slurm_ext.jobspec import JobSpec, JobSpecError
from slurm_ext.records import ClusterSnapshot
from solver.models import ModelSpec, ModelSpecError, aliases, get_model, list_presets, load_spec_file

PROG = "cellsched sbatch"
EXIT_USAGE = 2
MAX_SCRIPT_BYTES = 4 << 20
MAX_MODEL_FILE_BYTES = 64 << 10
MAX_ARG_CHARS = 4096
_INT = re.compile(r"^[0-9]{1,12}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^UNLIMITED$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MAIL_TYPES = frozenset({"NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT",
                         "TIME_LIMIT", "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS"})
_TRUE, _FALSE = frozenset({"true", "yes", "1", "on"}), frozenset({"false", "no", "0", "off"})


class WrapperError(ValueError):
    """Bad input; `field` names what is wrong (an option, the script, a line)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


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
    Option("job-name", "value", "job name", short="J", passthrough=True),
    Option("output", "value", "stdout file pattern", short="o", passthrough=True),
    Option("error", "value", "stderr file pattern", short="e", passthrough=True),
    Option("open-mode", "value", "append or truncate the output files (append keeps the log of every run of a job"
           " that is moved or requeued)", passthrough=True),
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
_BY_LONG = {o.name: o for o in OPTIONS}
_BY_SHORT = {o.short: o for o in OPTIONS if o.short}
#: options the scheduler decides; refused with a reason
_REFUSED = {
    ("gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket", "cpus-per-gpu", "mem-per-gpu",
     "G", "tres-per-task"): "GPU counts and types are the scheduler's business: use --min-gpus/--max-gpus/--gpu-types (--gpus N for a static hint)",
    ("nodes", "N", "nodelist", "w", "exclude", "x", "ntasks", "n", "ntasks-per-node", "constraint", "C",
     "cluster-constraint", "exclusive", "switches"): "nodes, node lists and constraints are the scheduler's business: restrict GPU types with --gpu-types and partitions with -p",
    ("hold", "H", "comment", "admin-comment", "priority", "nice", "dependency", "d", "begin", "b", "array", "a",
     "requeue", "no-requeue"): "the scheduler holds, orders and releases managed jobs itself",
}
_REFUSED_BY_NAME = {name: why for names, why in _REFUSED.items() for name in names}
#: directive keys (for #CELLSCHED lines): everything but invocation switches and --backend
_DIRECTIVE_KEYS = tuple(o.name for o in OPTIONS if o.kind != "switch" and o.name != "backend")
#: SBATCH_* input variables that only set pass-through options (sbatch reads them itself)
_ALLOWED_ENV = frozenset({"SBATCH_ACCOUNT", "SBATCH_QOS", "SBATCH_JOB_NAME", "SBATCH_TIMELIMIT", "SBATCH_EXPORT",
                          "SBATCH_MAIL_TYPE", "SBATCH_MAIL_USER", "SBATCH_OUTPUT", "SBATCH_ERROR", "SBATCH_DEBUG",
                          "SBATCH_EXPORT_ENV", "SBATCH_GET_USER_ENV", "SBATCH_IGNORE_PBS", "SBATCH_NO_REQUEUE"})


def supported_text() -> str:
    """One line listing the supported options."""
    names = [f"-{o.short}/--{o.name}" if o.short else f"--{o.name}" for o in OPTIONS]
    return "supported: " + ", ".join(names) + ", --no-elastic, -h/--help"


def usage_text() -> str:
    lines = [f"Usage: {PROG} [OPTIONS] [--] SCRIPT [ARGS...]", "",
             "Submit a training job that cellsched schedules: it is held, and the controller picks its",
             "GPU type, count, nodes and parallel plan. Settings may also come from '#CELLSCHED key=value'",
             "lines at the top of SCRIPT (key = a long option name, e.g. '#CELLSCHED global-batch=512');",
             "the command line wins.", "", "Options:"]
    for o in OPTIONS:
        flag = (f"-{o.short}, " if o.short else "    ") + f"--{o.name}" + ("/--no-" + o.name if o.negatable else "")
        flag += " VALUE" if o.kind == "value" else ""
        lines.append(f"  {flag:<34} {o.help}")
    lines.append(f"  {'-h, --help':<34} show this message")
    return "\n".join(lines)


# ---- parsing ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """A raw option value and where it came from ("command line" or "script line N")."""

    value: str | bool
    origin: str


@dataclass(frozen=True)
class Invocation:
    """The command line split into option settings, the script and its arguments."""

    settings: Mapping[str, Setting]
    script: str | None
    script_args: tuple[str, ...]
    help: bool = False


def _check_text(field: str, value: str) -> None:
    if "\x00" in value:
        raise WrapperError(field, "contains a NUL byte")
    if len(value) > MAX_ARG_CHARS:
        raise WrapperError(field, f"is {len(value)} characters, more than {MAX_ARG_CHARS}")


def _unknown_option(token: str, where: str) -> WrapperError:
    shown = token.split("=", 1)[0]
    name = shown.lstrip("-")
    if not re.match(r"^-{1,2}[A-Za-z0-9][A-Za-z0-9_-]{0,63}$", shown):
        return WrapperError("option", f"{shown[:80]!r} is not an option ({where}); {supported_text()}")
    if name in _REFUSED_BY_NAME:
        return WrapperError(shown, f"not accepted by {PROG} ({where}): {_REFUSED_BY_NAME[name]}")
    return WrapperError(shown, f"unknown option ({where}); {supported_text()}")


def _parse_options(tokens: list[str], origin: str, *, stop_at_script: bool, sbatch_line: bool = False
                   ) -> tuple[dict[str, Setting], list[str], bool]:
    """Options from `tokens`; returns (settings, the rest from the script on, help asked)."""
    settings: dict[str, Setting] = {}
    i, help_asked = 0, False
    while i < len(tokens):
        tok = tokens[i]
        if tok == "--" and stop_at_script:
            return settings, tokens[i + 1:], help_asked
        if not tok.startswith("-") or tok == "-":
            if stop_at_script:
                return settings, tokens[i:], help_asked
            raise WrapperError(origin, f"unexpected argument {tok!r}")
        if tok in ("-h", "--help") and not sbatch_line and origin == "command line":
            help_asked, i = True, i + 1
            continue
        if tok.startswith("--"):
            name, eq, inline = tok[2:].partition("=")
            negated = name.startswith("no-") and name[3:] in _BY_LONG and _BY_LONG[name[3:]].negatable
            opt = _BY_LONG.get(name[3:] if negated else name)
        else:
            name, inline, eq = tok[1:2], tok[2:], ""
            if inline.startswith("="):
                inline = inline[1:]
            eq = "=" if inline else ""
            negated = False
            opt = _BY_SHORT.get(name)
        if opt is None or (sbatch_line and not opt.passthrough):
            raise _unknown_option(tok, origin)
        if opt.kind in ("flag", "switch"):
            if eq:
                raise WrapperError(f"--{opt.name}", f"takes no value ({origin}), got {inline!r}")
            value: str | bool = not negated
            i += 1
        elif eq:
            value, i = inline, i + 1
        else:
            if i + 1 >= len(tokens):
                raise WrapperError(f"--{opt.name}", f"needs a value ({origin})")
            value, i = tokens[i + 1], i + 2
        if isinstance(value, str):
            _check_text(f"--{opt.name}", value)
        settings[opt.name] = Setting(value, origin)
    return settings, [], help_asked


def parse_argv(argv: Iterable[str]) -> Invocation:
    """Split the command line; the script and its arguments end option parsing."""
    args = list(argv)
    for a in args:
        if not isinstance(a, str):
            raise WrapperError("arguments", f"must be strings, got {a!r}")
        _check_text("arguments", a)
    settings, rest, help_asked = _parse_options(args, "command line", stop_at_script=True)
    script = rest[0] if rest else None
    return Invocation(settings, script, tuple(rest[1:]), help_asked)


def parse_directives(text: str) -> tuple[dict[str, Setting], dict[str, Setting]]:
    """(#CELLSCHED settings, #SBATCH settings) of a script's leading block."""
    cellsched: dict[str, Setting] = {}
    sbatch: dict[str, Setting] = {}
    in_header = True
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"script line {number}"
        stripped = line.strip()
        is_cs = line.startswith("#CELLSCHED")
        if not in_header:
            if is_cs:
                raise WrapperError(where, "#CELLSCHED after the first command is not read; move it to the top of the script")
            continue
        if stripped and not stripped.startswith("#"):
            in_header = False
            continue
        if is_cs:
            body = line[len("#CELLSCHED"):]
            if not body[:1].isspace():
                raise WrapperError(where, "malformed directive: write '#CELLSCHED key=value'")
            key, eq, value = body.strip().partition("=")
            key, value = key.strip(), value.strip()
            if not eq or not key or not value:
                raise WrapperError(where, "malformed directive: write '#CELLSCHED key=value'")
            if key not in _DIRECTIVE_KEYS:
                raise WrapperError(where, f"unknown key {key!r}; known: {', '.join(_DIRECTIVE_KEYS)}")
            if key in cellsched:
                raise WrapperError(where, f"{key!r} is already set on {cellsched[key].origin}")
            _check_text(where, value)
            if _BY_LONG[key].kind == "flag":
                low = value.lower()
                if low not in _TRUE | _FALSE:
                    raise WrapperError(where, f"{key} must be true or false, got {value!r}")
                cellsched[key] = Setting(low in _TRUE, where)
            else:
                cellsched[key] = Setting(value, where)
        elif line.startswith("#SBATCH"):
            try:
                tokens = shlex.split(line[len("#SBATCH"):], comments=True)
            except ValueError as exc:
                raise WrapperError(where, f"malformed #SBATCH line ({exc})") from None
            found, _, _ = _parse_options(tokens, where, stop_at_script=False, sbatch_line=True)
            sbatch.update(found)
    return cellsched, sbatch


# ---- typed values ---------------------------------------------------------------------


def _field(name: str, s: Setting) -> str:
    return name if s.origin == "command line" else f"{name} ({s.origin})"


def _int(name: str, s: Setting | None, lo: int = 1, hi: int = 10**12) -> int | None:
    if s is None:
        return None
    text = str(s.value).strip()
    if not _INT.match(text):
        raise WrapperError(_field(name, s), f"must be a whole number, got {s.value!r}")
    value = int(text)
    if not lo <= value <= hi:
        raise WrapperError(_field(name, s), f"must be between {lo} and {hi}, got {value}")
    return value


def _names(name: str, s: Setting, pattern: re.Pattern[str], what: str) -> tuple[str, ...]:
    items = tuple(x.strip() for x in str(s.value).split(","))
    for x in items:
        if not pattern.match(x):
            raise WrapperError(_field(name, s), f"{x!r} is not a {what}")
    return tuple(dict.fromkeys(items))


def _text(name: str, s: Setting | None, pattern: re.Pattern[str] | None = None, what: str = "") -> str | None:
    if s is None:
        return None
    value = str(s.value)
    if _CONTROL.search(value):
        raise WrapperError(_field(name, s), "must not contain control characters (newlines, tabs, ...)")
    if not value.strip():
        raise WrapperError(_field(name, s), "must not be empty")
    if pattern is not None and not pattern.match(value):
        raise WrapperError(_field(name, s), f"{value!r} is not {what}")
    return value


def _preset_names() -> dict[str, str]:
    """lower-case name or alias -> preset name."""
    return {a.lower(): p for p in list_presets() for a in aliases(p)}


def load_model(s: Setting, cwd: pathlib.Path) -> tuple[str, dict | None, ModelSpec]:
    """(name for the spec, inline definition or None, ModelSpec) of --model:
    a preset (any case, aliases), else a spec file, read only when it is a
    small regular file."""
    name = _text("model", s)
    assert name is not None
    presets = _preset_names()
    if name.strip().lower() in presets:
        return presets[name.strip().lower()], None, get_model(presets[name.strip().lower()])
    path = pathlib.Path(name).expanduser()
    path = path if path.is_absolute() else cwd / path
    if not os.path.lexists(path):
        if "/" in name or path.suffix.lower() in (".json", ".toml"):
            raise WrapperError(_field("model", s), f"no such spec file {name!r}")
        close = difflib.get_close_matches(name.strip().lower(), list(presets), n=4, cutoff=0.6)
        hint = f"; did you mean {', '.join(dict.fromkeys(presets[c] for c in close))}?" if close else ""
        raise WrapperError(_field("model", s), f"unknown model {name!r}{hint} (presets: {', '.join(list_presets())}; "
                           "or give a .json/.toml spec file)")
    try:
        st = path.stat()
    except OSError as exc:
        raise WrapperError(_field("model", s), f"cannot read spec file {name!r} ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise WrapperError(_field("model", s), f"spec file {name!r} is not a regular file")
    if st.st_size > MAX_MODEL_FILE_BYTES:
        raise WrapperError(_field("model", s), f"spec file {name!r} is {st.st_size} bytes, more than {MAX_MODEL_FILE_BYTES}")
    try:
        spec = load_spec_file(path)
    except ModelSpecError as exc:
        raise WrapperError(_field("model", s), str(exc)) from None
    definition = {"name": spec.name, "family": spec.family, "num_layers": spec.num_layers, "hidden": spec.hidden,
                  "heads": spec.heads, "seq_len": spec.seq_len, "vocab": spec.vocab, "params": spec.params,
                  "dtype": spec.dtype, "num_experts": spec.num_experts, "moe_top_k": spec.moe_top_k}
    return path.name, definition, spec


# ---- the submission -----------------------------------------------------------------


@dataclass(frozen=True)
class Submission:
    """What `cellsched sbatch` submits: the spec and the held sbatch request."""

    spec: JobSpec
    request: SubmitRequest
    parsable: bool = False
    dry_run: bool = False
    backend: str = "auto"

    def describe(self) -> str:
        """The dry-run report: spec and request as JSON."""
        req = {k: v for k, v in asdict(self.request).items() if v not in (None, (), {}, False) or k == "hold"}
        return json.dumps({"spec": json.loads(self.spec.to_json()), "sbatch": req}, indent=2, sort_keys=True)


_SPEC_TO_OPTION = {"global_batch": "global-batch", "gpu_types": "gpu-types", "min_gpus": "min-gpus",
                   "max_gpus": "max-gpus", "requested_gpus": "gpus", "requested_gpu_type": "gpu-type",
                   "virtual_workers": "virtual-workers", "model_def": "model", "partitions": "partition"}


def read_script(path_text: str, cwd: pathlib.Path) -> tuple[pathlib.Path, str]:
    """The script's absolute path and text; WrapperError("script", ...) when
    it is missing, unreadable, not a regular file or not a batch script."""
    if not path_text:
        raise WrapperError("script", "is empty")
    path = pathlib.Path(path_text).expanduser()
    path = (path if path.is_absolute() else cwd / path).absolute()
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise WrapperError("script", f"{path_text!r} is not a regular file")
        if st.st_size > MAX_SCRIPT_BYTES:
            raise WrapperError("script", f"{path_text!r} is {st.st_size} bytes, more than {MAX_SCRIPT_BYTES}")
        with open(path, "rb") as f:
            data = f.read(MAX_SCRIPT_BYTES + 1)
    except OSError as exc:
        raise WrapperError("script", f"cannot read {path_text!r} ({exc.strerror})") from None
    if not data.startswith(b"#!"):
        raise WrapperError("script", f"{path_text!r} does not start with '#!' (an interpreter line, as sbatch requires)")
    if b"\x00" in data:
        raise WrapperError("script", f"{path_text!r} contains NUL bytes (not a text script)")
    if b"\r\n" in data:
        raise WrapperError("script", f"{path_text!r} has DOS line breaks (\\r\\n), which sbatch refuses")
    try:
        return path, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WrapperError("script", f"{path_text!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuse SBATCH_* variables that would set what the scheduler decides."""
    for key in sorted(environ):
        if key.startswith("SBATCH_") and key not in _ALLOWED_ENV:
            raise WrapperError("environment", f"{key} is set; sbatch would apply it behind {PROG}'s back. "
                               "Unset it (GPUs, nodes and holds are the scheduler's business)")


def build_spec(settings: Mapping[str, Setting], cwd: pathlib.Path) -> JobSpec:
    """The JobSpec from merged settings (no cluster checks yet)."""
    get = settings.get
    for required in ("model", "global-batch", "iterations"):
        if required not in settings:
            raise WrapperError(required, f"is required (--{required} or '#CELLSCHED {required}=...')")
    model, model_def, model_spec = load_model(settings["model"], cwd)
    global_batch = _int("global-batch", get("global-batch"), 1, 10**9)
    iterations = _int("iterations", get("iterations"), 1, 10**12)
    min_gpus = _int("min-gpus", get("min-gpus"), 1, 100_000)
    max_gpus = _int("max-gpus", get("max-gpus"), 1, 100_000)
    gpus = _int("gpus", get("gpus"), 1, 100_000)
    workers = _int("virtual-workers", get("virtual-workers"), 1, 100_000)
    if min_gpus is not None and max_gpus is not None and min_gpus > max_gpus:
        raise WrapperError(_field("min-gpus", settings["min-gpus"]), f"{min_gpus} is more than max-gpus ({max_gpus})")
    if gpus is not None:
        if min_gpus is not None and gpus < min_gpus:
            raise WrapperError(_field("gpus", settings["gpus"]), f"{gpus} is less than min-gpus ({min_gpus})")
        if max_gpus is not None and gpus > max_gpus:
            raise WrapperError(_field("gpus", settings["gpus"]), f"{gpus} is more than max-gpus ({max_gpus})")
    if workers is not None and global_batch is not None and global_batch % workers:
        raise WrapperError(_field("virtual-workers", settings["virtual-workers"]),
                           f"{workers} does not divide global-batch ({global_batch})")
    type_pattern = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
    gpu_types = _names("gpu-types", settings["gpu-types"], type_pattern, "GPU type name") if "gpu-types" in settings else None
    gpu_type = _text("gpu-type", get("gpu-type"), type_pattern, "a GPU type name")
    if gpu_type is not None and gpu_types is not None and gpu_type not in gpu_types:
        raise WrapperError(_field("gpu-type", settings["gpu-type"]), f"{gpu_type!r} is not among gpu-types ({','.join(gpu_types)})")
    partitions = _names("partition", settings["partition"], _NAME, "partition name") if "partition" in settings else None
    elastic = get("elastic")
    try:
        spec = JobSpec(model=model, global_batch=global_batch, iterations=iterations, model_def=model_def,
                       gpu_types=gpu_types, min_gpus=min_gpus or 1, max_gpus=max_gpus,
                       elastic=bool(elastic.value) if elastic else False, requested_gpus=gpus,
                       requested_gpu_type=gpu_type, virtual_workers=workers, partitions=partitions)
        spec.to_json()  # the size limit
        return spec
    except JobSpecError as exc:
        name = _SPEC_TO_OPTION.get(exc.field, exc.field)
        raise WrapperError(_field(name, settings[name]) if name in settings else name,
                           str(exc).removeprefix(f"{exc.field}: ")) from None


def check_against_cluster(spec: JobSpec, snapshot: ClusterSnapshot, settings: Mapping[str, Setting],
                          fits: Callable[[JobSpec, ClusterSnapshot], str | None] | None = None) -> None:
    """GPU types and partitions exist; the job fits some cell of the cluster."""

    def where(name: str) -> str:
        return _field(name, settings[name]) if name in settings else name

    known_types = sorted({n.gpu_type for n in snapshot.nodes if n.gpu_type and n.gpus_total > 0})
    for t in spec.gpu_types or ():
        if t not in known_types:
            raise WrapperError(where("gpu-types"), f"no {t!r} GPUs in this cluster; it has: {', '.join(known_types) or 'none'}")
    if spec.requested_gpu_type is not None and spec.requested_gpu_type not in known_types:
        raise WrapperError(where("gpu-type"), f"no {spec.requested_gpu_type!r} GPUs in this cluster; it has: {', '.join(known_types) or 'none'}")
    known_parts = {p.name: p for p in snapshot.partitions}
    for p in spec.partitions or ():
        if p not in known_parts:
            raise WrapperError(where("partition"), f"no partition {p!r}; partitions: {', '.join(sorted(known_parts))}")
    capacity: dict[str, int] = {}
    for node in snapshot.nodes:
        if not node.gpu_type or node.gpus_total <= 0:
            continue
        if spec.gpu_types is not None and node.gpu_type not in spec.gpu_types:
            continue
        if spec.partitions is not None and not any(
                p in node.partitions or node.name in known_parts[p].nodes for p in spec.partitions):
            continue
        capacity[node.gpu_type] = capacity.get(node.gpu_type, 0) + node.gpus_total
    scope = "the allowed GPU types" + (" in the chosen partitions" if spec.partitions else "")
    if not capacity:
        raise WrapperError(where("gpu-types") if spec.gpu_types else where("partition") if spec.partitions else "gpu-types",
                           f"{scope} have no GPU nodes")
    largest = max(capacity.values())
    mixed = sum(sorted(capacity.values())[-2:]) if len(capacity) > 1 else 0  # two types as one cell (solver.mixed)
    if largest < spec.min_gpus <= mixed:
        pass
    elif spec.min_gpus > largest:
        detail = ", ".join(f"{t}: {n}" for t, n in sorted(capacity.items()))
        raise WrapperError(where("min-gpus"), f"{spec.min_gpus} GPUs of one type can never be had: {scope} have at most {largest} ({detail})")
    if spec.requested_gpus is not None and spec.requested_gpus > largest:
        raise WrapperError(where("gpus"), f"{spec.requested_gpus} GPUs of one type can never be had: {scope} have at most {largest}")
    if spec.requested_gpu_type is not None and spec.requested_gpus is not None and spec.requested_gpus > capacity.get(spec.requested_gpu_type, 0):
        raise WrapperError(where("gpus"), f"{spec.requested_gpus} {spec.requested_gpu_type} GPUs can never be had: {scope} have {capacity.get(spec.requested_gpu_type, 0)}")
    reason = (fits or fits_some_cell)(spec, snapshot)
    if reason:
        raise WrapperError(where("model"), reason)


def fits_some_cell(spec: JobSpec, snapshot: ClusterSnapshot) -> str | None:
    """None when the model fits at least one cell of the cluster (or when
    that cannot be known: a GPU type without specs); else why not.

    Uses the cell enumeration and the estimator's memory model with the
    profile store in $CELLSCHED_PROFILES when that file exists, else the
    shipped profiles and GPU specs (in memory).
    """
    from slurm_ext.view import to_cluster_view
    from solver.cells import enumerate_cells
    from solver.estimator import Estimator
    from solver.mixed import MixedEstimator
    from solver.profiles import ProfileStore
    from solver.profiles.store import ENV_VAR
    from solver.types import JobRequest, SolverConfig

    model = spec.model_spec()
    job = JobRequest(job_id="new", model=model, global_batch=spec.global_batch, iterations=spec.iterations,
                     gpu_types=spec.gpu_types, min_gpus=spec.min_gpus, max_gpus=spec.max_gpus,
                     partitions=spec.partitions, requested_gpus=spec.requested_gpus)
    cells = enumerate_cells(job, to_cluster_view(snapshot, ()), SolverConfig())
    if not cells:
        return f"no cell of this cluster can hold {model.name} with min-gpus={spec.min_gpus} on one GPU type"
    env_path = os.environ.get(ENV_VAR)
    store = ProfileStore(env_path if env_path and os.path.isfile(env_path) else ":memory:")
    try:
        estimator = MixedEstimator(Estimator(store))
        notes: list[str] = []
        for cell in sorted(cells, key=lambda c: (-c.num_gpus, c.num_nodes, c.pp, c.gpu_type)):
            est = estimator.estimate(job, cell)
            if est.feasible or not math.isfinite(estimator.mem_limit_gb(cell.gpu_type)) or est.source == "none":
                return None
            notes.append(f"{cell.key()}: {est.note}")
    finally:
        store.close()
    return (f"{model.name} with global batch {spec.global_batch} fits no cell of this cluster "
            f"({len(cells)} tried, largest first: {'; '.join(notes[:2])})")


def provisional_gres(spec: JobSpec, snapshot: ClusterSnapshot) -> int:
    """The untyped GPUs per node the held job is submitted with: min_gpus on
    one node, capped by the largest allowed node (the controller sets the
    real layout before it releases the job)."""
    sizes = [n.gpus_total for n in snapshot.nodes if n.gpu_type and n.gpus_total > 0
             and (spec.gpu_types is None or n.gpu_type in spec.gpu_types)
             and (spec.partitions is None or set(spec.partitions) & set(n.partitions))]
    return max(1, min(spec.min_gpus, max(sizes, default=1)))


def merge(*layers: Mapping[str, Setting]) -> dict[str, Setting]:
    """Settings of several sources; the first source that has a key wins."""
    merged: dict[str, Setting] = {}
    for layer in reversed(layers):
        merged.update(layer)
    return merged


def prepare(argv: Iterable[str], backend_for: Callable[[str], Backend], *, environ: Mapping[str, str] | None = None,
            cwd: str | os.PathLike[str] | None = None,
            fits: Callable[[JobSpec, ClusterSnapshot], str | None] | None = None) -> Submission:
    """Parse and validate everything; the Submission to hand to the backend.

    `backend_for(name)` gives the backend (its `observe` is called once).
    Raises WrapperError (bad input) or SlurmError (cannot read the cluster).
    """
    inv = parse_argv(argv)
    if inv.script is None:
        raise WrapperError("script", f"missing: {PROG} [OPTIONS] [--] SCRIPT [ARGS...]")
    environ = os.environ if environ is None else environ
    check_environment(environ)
    base = pathlib.Path(cwd) if cwd is not None else pathlib.Path.cwd()
    script, text = read_script(inv.script, base)
    from_script, from_sbatch = parse_directives(text)
    settings = merge(inv.settings, from_script, from_sbatch)
    spec = build_spec(settings, base)
    name = _text("job-name", settings.get("job-name"), _NAME, "a job name (letters, digits, '.', '_', '-'; at most 128)")
    output = _text("output", settings.get("output"))
    error = _text("error", settings.get("error"))
    time_limit = _text("time", settings.get("time"), _TIME, "a time limit (minutes, or [D-]H:M:S, or UNLIMITED)")
    account = _text("account", settings.get("account"), _NAME, "an account name")
    qos = _text("qos", settings.get("qos"), _NAME, "a QOS name")
    export = _text("export", settings.get("export"))
    extra: list[str] = []
    open_mode = _text("open-mode", settings.get("open-mode"), re.compile(r"^(append|truncate)$"), "append or truncate")
    if open_mode is not None:
        extra.append(f"--open-mode={open_mode}")
    if "mail-type" in settings:
        types = _names("mail-type", settings["mail-type"], re.compile(r"^[A-Za-z_0-9]+$"), "mail type")
        types = tuple(t.upper() for t in types)
        bad = [t for t in types if t not in _MAIL_TYPES]
        if bad:
            raise WrapperError(_field("mail-type", settings["mail-type"]), f"{bad[0]!r} is not one of {', '.join(sorted(_MAIL_TYPES))}")
        extra.append("--mail-type=" + ",".join(types))
    mail_user = _text("mail-user", settings.get("mail-user"), re.compile(r"^[^\s,;'\"<>()`$\\]{1,254}$"), "a mail address")
    if mail_user is not None:
        extra.append(f"--mail-user={mail_user}")
    backend_name = str(settings["backend"].value) if "backend" in settings else "auto"
    try:
        backend = backend_for(backend_name)
    except ValueError as exc:
        raise WrapperError("backend", str(exc)) from None
    snapshot = backend.observe()
    check_against_cluster(spec, snapshot, settings, fits)
    partition = None
    if spec.partitions is not None:
        if len(spec.partitions) == 1:
            partition = spec.partitions[0]
        else:
            extra.append("--partition=" + ",".join(spec.partitions))
    comment = spec.to_comment()
    try:
        request = SubmitRequest(script=str(script), script_args=inv.script_args, job_name=name, partition=partition,
                                gres_per_node=provisional_gres(spec, snapshot), nodes=1, time_limit=time_limit,
                                hold=True, comment=comment,
                                constraint="|".join(spec.gpu_types) if spec.gpu_types else None,
                                output=output, error=error, export=export, account=account, qos=qos,
                                extra_args=tuple(extra))
    except ValueError as exc:  # the request's own checks: name what it names
        raise WrapperError("request", str(exc)) from None
    return Submission(spec, request, parsable=bool(settings.get("parsable", Setting(False, "")).value),
                      dry_run=bool(settings.get("dry-run", Setting(False, "")).value), backend=backend_name)


def main(argv: Iterable[str], *, backend_for: Callable[[str], Backend] | None = None,
         stdout: TextIO | None = None, stderr: TextIO | None = None,
         environ: Mapping[str, str] | None = None) -> int:
    """Run `cellsched sbatch`; returns the exit status (0, 1 Slurm error, 2 bad input)."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    args = list(argv)
    if backend_for is None:
        from slurm_ext.backends import get_backend

        backend_for = get_backend
    made: dict[str, Backend] = {}

    def backend(name: str) -> Backend:
        if name not in made:
            made[name] = backend_for(name)
        return made[name]

    try:
        if parse_argv(args).help:
            print(usage_text(), file=out)
            return 0
        sub = prepare(args, backend, environ=environ)
        if sub.dry_run:
            print(sub.describe(), file=out)
            return 0
        job_id = backend(sub.backend).submit(sub.request)
    except WrapperError as exc:
        print(f"{PROG}: error: {_one_line(str(exc))}", file=err)
        return EXIT_USAGE
    except SlurmError as exc:
        print(f"{PROG}: error: slurm: {_one_line(str(exc))}", file=err)
        return 1
    print(job_id if sub.parsable else f"Submitted batch job {job_id}", file=out)
    return 0


def _one_line(text: str) -> str:
    return " | ".join(part.strip() for part in text.splitlines() if part.strip())
