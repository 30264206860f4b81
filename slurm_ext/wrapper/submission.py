"""From the command line to what is submitted: `prepare` checks everything and
builds the held, untyped sbatch request (`Submission`)."""

from __future__ import annotations

import json
import os
import pathlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass

from slurm_ext.backends.base import Backend, SubmitRequest
from slurm_ext.records import ClusterSnapshot
from slurm_ext.wrapper.argv import parse_argv
from slurm_ext.wrapper.directives import parse_directives
from slurm_ext.wrapper.environment import check_environment
from slurm_ext.wrapper.feasibility import check_against_cluster
from slurm_ext.wrapper.launched import launched_commands
from slurm_ext.wrapper.options import PROG, Setting, WrapperError
from slurm_ext.wrapper.script import read_script
from slurm_ext.wrapper.spec import build_spec
from slurm_ext.wrapper.values import NAME, field_name, name_list, one_line
from solver.contract.jobspec import JobSpec

_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^UNLIMITED$")
_OPEN_MODE = re.compile(r"^(append|truncate)$")
_MAIL_TYPE = re.compile(r"^[A-Za-z_0-9]+$")
_MAIL_TYPES = frozenset(
    {
        "NONE",
        "BEGIN",
        "END",
        "FAIL",
        "REQUEUE",
        "ALL",
        "INVALID_DEPEND",
        "STAGE_OUT",
        "TIME_LIMIT",
        "TIME_LIMIT_90",
        "TIME_LIMIT_80",
        "TIME_LIMIT_50",
        "ARRAY_TASKS",
    }
)
_MAIL_USER = re.compile(r"^[^\s,;'\"<>()`$\\]{1,254}$")


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


def provisional_gres(spec: JobSpec, snapshot: ClusterSnapshot) -> int:
    """The untyped GPUs per node the held job is submitted with: min_gpus on
    one node, capped by the largest allowed node (the controller sets the
    real layout before it releases the job)."""
    sizes = [
        n.gpus_total
        for n in snapshot.nodes
        if n.gpu_type
        and n.gpus_total > 0
        and (spec.gpu_types is None or n.gpu_type in spec.gpu_types)
        and (spec.partitions is None or set(spec.partitions) & set(n.partitions))
    ]
    return max(1, min(spec.min_gpus, max(sizes, default=1)))


def merge(*layers: Mapping[str, Setting]) -> dict[str, Setting]:
    """Settings of several sources; the first source that has a key wins."""
    merged: dict[str, Setting] = {}
    for layer in reversed(layers):
        merged.update(layer)
    return merged


def prepare(
    argv: Iterable[str],
    backend_for: Callable[[str], Backend],
    *,
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    fits: Callable[[JobSpec, ClusterSnapshot], str | None] | None = None,
) -> Submission:
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
    spec = build_spec(settings, base, launched_commands(text, inv.script_args))
    name = one_line(
        "job-name", settings.get("job-name"), NAME, "a job name (letters, digits, '.', '_', '-'; at most 128)"
    )
    output = one_line("output", settings.get("output"))
    error = one_line("error", settings.get("error"))
    time_limit = one_line("time", settings.get("time"), _TIME, "a time limit (minutes, or [D-]H:M:S, or UNLIMITED)")
    account = one_line("account", settings.get("account"), NAME, "an account name")
    qos = one_line("qos", settings.get("qos"), NAME, "a QOS name")
    export = one_line("export", settings.get("export"))
    extra: list[str] = []
    open_mode = one_line("open-mode", settings.get("open-mode"), _OPEN_MODE, "append or truncate")
    if open_mode is not None:
        extra.append(f"--open-mode={open_mode}")
    if "mail-type" in settings:
        types = name_list("mail-type", settings["mail-type"], _MAIL_TYPE, "mail type")
        types = tuple(t.upper() for t in types)
        bad = [t for t in types if t not in _MAIL_TYPES]
        if bad:
            raise WrapperError(
                field_name("mail-type", settings["mail-type"]),
                f"{bad[0]!r} is not one of {', '.join(sorted(_MAIL_TYPES))}",
            )
        extra.append("--mail-type=" + ",".join(types))
    mail_user = one_line("mail-user", settings.get("mail-user"), _MAIL_USER, "a mail address")
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
        request = SubmitRequest(
            script=str(script),
            script_args=inv.script_args,
            job_name=name,
            partition=partition,
            gres_per_node=provisional_gres(spec, snapshot),
            nodes=1,
            time_limit=time_limit,
            hold=True,
            comment=comment,
            constraint="|".join(spec.gpu_types) if spec.gpu_types else None,
            output=output,
            error=error,
            export=export,
            account=account,
            qos=qos,
            extra_args=tuple(extra),
        )
    except ValueError as exc:  # the request's own checks: name what it names
        raise WrapperError("request", str(exc)) from None
    return Submission(
        spec,
        request,
        parsable=bool(settings.get("parsable", Setting(False, "")).value),
        dry_run=bool(settings.get("dry-run", Setting(False, "")).value),
        backend=backend_name,
    )
