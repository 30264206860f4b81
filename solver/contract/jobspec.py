"""The spec of a managed job: what `cellsched sbatch` validates and submits,
and what the controller schedules from.

How it travels (the contract between the wrapper, job_submit.lua and the
controller):

* The wrapper submits the job HELD, with untyped gres, and its Comment set to
  ``cellsched/v1 <compact JSON of the spec>`` (the tag marks it managed).
* ``slurm_ext/admin/job_submit.lua`` (when installed) copies that JSON into the job's
  AdminComment as ``{"spec": {...}}``, replaces the Comment with
  ``ADMIN_MARKER`` (the tag and a marker), and keeps the job held: it refuses
  any release, hold, Comment or placement change by a non-admin, so the user
  can neither release the job nor change the spec afterwards.
* The controller reads the spec from AdminComment["spec"] when present,
  else from the Comment tag (`spec_of_job` does exactly that), re-validates
  it (never trusts it), and keeps the first accepted copy in its state DB; a
  later change of the Comment is ignored. When it places the job it writes AdminComment =
  ``{"spec": {...}, "plan": {...}}`` (solver.contract.plan.JobPlan), which the launch
  runtime reads.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields
from typing import Any

from solver import contract
from solver.contract.errors import SolverError
from solver.contract.models import ModelSpec, ModelSpecError, get_model, spec_from_dict
from solver.contract.runtimes import DEFAULT_RUNTIME, RUNTIMES, UnknownRuntime, get_runtime

TAG = "cellsched/v1 "
#: the Comment of a managed job once job_submit.lua moved its spec to AdminComment
ADMIN_MARKER = TAG + "@AdminComment"
SPEC_VERSION = 1
#: Slurm keeps at most 1024 bytes of a job's Comment (sbatch fails beyond:
#: "Pathname of a file, directory or other parameter too long")
MAX_COMMENT_BYTES = 1024
#: a spec travels in the Comment after TAG; anything larger is refused before it reaches Slurm
MAX_SPEC_BYTES = MAX_COMMENT_BYTES - len(TAG)
#: a GPU type name (a GRES type and node Feature): what every reader of one checks it against
GPU_TYPE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
#: a Slurm partition name
PARTITION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_PRINTABLE = re.compile(r"^[^\x00-\x1f\x7f]{1,255}$")


class JobSpecError(ValueError, SolverError):
    """A malformed job spec; the message names the field."""

    def __init__(self, field_name: str, message: str) -> None:
        self.field = field_name
        super().__init__(f"{field_name}: {message}")


@dataclass(frozen=True)
class JobSpec:
    """A managed job's scheduling spec.

    model: a preset name (``gpt-1.3b``, ``bert__760M``) or, for a spec file,
    the file's name with its content in `model_def` (so the controller never
    reads user files). gpu_types None = any type. requested_gpus /
    requested_gpu_type: the user's static request (a hint; FCFS uses it).
    virtual_workers: elastic data-parallel workers (EasyScale), None = auto.
    partitions: the Slurm partitions the job may run in, None = any.
    runtime: what the job's code can carry out (solver.contract.runtimes; docs/runtimes.md):
    DEFAULT_RUNTIME ("ddp") when the spec names none. `cellsched sbatch`
    accepts only the submittable names; a spec may also name ``adaptive``,
    the simulator's runtime for trace jobs.
    """

    model: str
    global_batch: int
    iterations: int
    model_def: dict[str, Any] | None = None
    gpu_types: tuple[str, ...] | None = None
    min_gpus: int = 1
    max_gpus: int | None = None
    elastic: bool = False
    requested_gpus: int | None = None
    requested_gpu_type: str | None = None
    virtual_workers: int | None = None
    partitions: tuple[str, ...] | None = None
    runtime: str = DEFAULT_RUNTIME
    version: int = SPEC_VERSION

    def __post_init__(self) -> None:
        _int_field("global_batch", self.global_batch, 1, 10**9)
        _int_field("iterations", self.iterations, 1, 10**12)
        _int_field("min_gpus", self.min_gpus, 1, 100_000)
        if self.max_gpus is not None:
            _int_field("max_gpus", self.max_gpus, 1, 100_000)
            if self.max_gpus < self.min_gpus:
                raise JobSpecError("max_gpus", f"must be >= min_gpus ({self.min_gpus}), got {self.max_gpus}")
        for name in ("requested_gpus", "virtual_workers"):
            if getattr(self, name) is not None:
                _int_field(name, getattr(self, name), 1, 100_000)
        if not isinstance(self.elastic, bool):
            raise JobSpecError("elastic", f"must be true or false, got {self.elastic!r}")
        _names("gpu_types", self.gpu_types, GPU_TYPE, "GPU type name", " (lower-case letters, digits, - or _)")
        _names("partitions", self.partitions, PARTITION, "partition name", " (letters, digits, '.', '_' or '-')")
        if self.requested_gpu_type is not None and (
            not isinstance(self.requested_gpu_type, str) or not GPU_TYPE.match(self.requested_gpu_type)
        ):
            raise JobSpecError("requested_gpu_type", f"{self.requested_gpu_type!r} is not a GPU type name")
        try:
            get_runtime(self.runtime)
        except UnknownRuntime as e:
            raise JobSpecError("runtime", str(e)) from None
        if self.virtual_workers is not None and not RUNTIMES[self.runtime].virtual_workers:
            raise JobSpecError(
                "virtual_workers",
                f"runtime {self.runtime} has no virtual workers (only "
                f"{', '.join(n for n, r in RUNTIMES.items() if r.virtual_workers and r.submittable)} has)",
            )
        if self.version != SPEC_VERSION:
            raise JobSpecError(
                "version", f"unsupported spec version {self.version!r} (this cellsched reads {SPEC_VERSION})"
            )
        self.model_spec()  # raises JobSpecError naming the model field

    def model_spec(self) -> ModelSpec:
        """The ModelSpec this job trains (preset or inline definition)."""
        if not isinstance(self.model, str) or not _PRINTABLE.match(self.model):
            raise JobSpecError("model", f"must be 1-255 printable characters, got {self.model!r}")
        try:
            if self.model_def is not None:
                if not isinstance(self.model_def, dict):
                    raise JobSpecError("model_def", "must be a JSON object")
                return spec_from_dict(self.model_def)
            if not isinstance(self.model, str) or not self.model:
                raise JobSpecError("model", "must name a model preset or a spec file")
            return get_model(self.model)
        except ModelSpecError as e:
            msg = str(e)
            raise JobSpecError("model", msg[len("model: ") :] if msg.startswith("model: ") else msg) from None

    def to_json(self) -> str:
        d = {k: v for k, v in asdict(self).items() if v is not None}
        text = json.dumps(d, separators=(",", ":"), sort_keys=True)
        if len(text.encode()) > MAX_SPEC_BYTES:
            raise JobSpecError(
                "spec",
                f"is {len(text.encode())} bytes, more than {MAX_SPEC_BYTES} (Slurm keeps "
                f"{MAX_COMMENT_BYTES} bytes of a job comment; use a smaller model spec file)",
            )
        return text

    def to_comment(self) -> str:
        return TAG + self.to_json()

    @classmethod
    def from_dict(cls, d: object) -> JobSpec:
        if not isinstance(d, dict):
            raise JobSpecError("spec", f"must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise JobSpecError(unknown[0], "unknown field")
        kw = dict(d)
        for name in ("gpu_types", "partitions"):
            if kw.get(name) is not None:
                if not isinstance(kw[name], (list, tuple)):
                    raise JobSpecError(name, "must be a list")
                kw[name] = tuple(kw[name])
        for req in ("model", "global_batch", "iterations"):
            if req not in kw:
                raise JobSpecError(req, "is required")
        return cls(**kw)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        if len(text.encode()) > MAX_SPEC_BYTES:
            raise JobSpecError("spec", f"is more than {MAX_SPEC_BYTES} bytes")
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise JobSpecError("spec", f"is not valid JSON ({e})") from None
        return cls.from_dict(d)

    @classmethod
    def from_comment(cls, comment: str | None) -> JobSpec | None:
        """The spec in a job's Comment; None when the job is not managed
        (no tag); JobSpecError when it is tagged but malformed, or when it
        holds only ADMIN_MARKER (the spec is in AdminComment: `spec_of_job`)."""
        if not comment or not comment.startswith(TAG):
            return None
        if comment == ADMIN_MARKER:
            raise JobSpecError("spec", "the Comment holds only the marker; the spec is in AdminComment")
        return cls.from_json(comment[len(TAG) :])


def spec_of_job(comment: str | None, admin_comment: str | None) -> JobSpec | None:
    """A job's spec by the contract above: AdminComment["spec"] when the
    AdminComment is a JSON object with a "spec" key, else the Comment's.
    None when the job is not managed; JobSpecError when it is, but the spec
    is malformed."""
    d = contract.admin_comment_dict(admin_comment)
    if contract.SPEC_KEY in d:
        return JobSpec.from_dict(d[contract.SPEC_KEY])
    return JobSpec.from_comment(comment)


def is_managed_comment(comment: str | None) -> bool:
    return comment is not None and comment.startswith(TAG)


def _names(field: str, value: object, pattern: re.Pattern[str], what: str, hint: str) -> None:
    """JobSpecError unless `value` is None or a non-empty tuple of names matching `pattern`."""
    if value is None:
        return
    if not isinstance(value, tuple) or not value:
        raise JobSpecError(field, f"must be a non-empty list of {what}s")
    for name in value:
        if not isinstance(name, str) or not pattern.match(name):
            raise JobSpecError(field, f"{name!r} is not a {what}{hint}")


def _int_field(name: str, value: object, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise JobSpecError(name, f"must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise JobSpecError(name, f"must be between {lo} and {hi}, got {value}")
