"""Trace readers for the simulator: Arena's CSV traces and Slurm accounting
exports. Both return TraceJobs sorted by submit time (stable: ties keep the
file's order) and raise TraceError naming the file, line and field.

Arena CSV (``job_id,submission_time,num_iteration,model_name,deadline,
batch_size,num_gpu,gpu_type``): submit times are kept as in the file
(seconds; Arena's Philly trace starts at 1,945,645 s); iterations =
num_iteration // iteration_scale, at least 1 (Arena's simulator uses 5).

Slurm accounting (``sacct -a -P -X -o JobID,JobName,User,Account,QOS,Submit,
Start,End,State,AllocTRES,NNodes,Comment``; any column order, extra columns
allowed, JobID/Submit/AllocTRES required; ReqTRES is used when AllocTRES is
empty; User, Account, QOS and Timelimit are the job's when given):
submit times are relative to the earliest kept job's submit, and so is
each job's Start (`recorded_start`: the recorded run). A job whose
Comment carries a cellsched spec takes model, batch, iterations and runtime from it;
any other job gets the default model and batch, iterations None and
duration_s = End - Start. Rows that are well-formed but unusable are
skipped and counted (`load_sacct(...).skipped`): job steps, jobs without
GPUs (unless include_non_gpu; those kept have requested_gpus 0), jobs
whose Start is Unknown (never started), jobs without a spec whose duration
is unknown (not ended, or no Start column). Malformed rows (bad timestamp,
TRES, duplicate JobID, a tagged but invalid spec) raise TraceError.
"""

from __future__ import annotations

import csv
import datetime as dt
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from slurm_ext.errors import CellschedError
from slurm_ext.parse.values import minutes
from slurm_ext.sim.types import TraceJob
from solver.contract.jobspec import GPU_TYPE, JobSpec, JobSpecError
from solver.contract.models import ModelSpecError, get_model

ARENA_COLUMNS = (
    "job_id",
    "submission_time",
    "num_iteration",
    "model_name",
    "deadline",
    "batch_size",
    "num_gpu",
    "gpu_type",
)
SACCT_REQUIRED = ("JobID", "Submit", "AllocTRES")
DEFAULT_MODEL = "gpt-1.3b"
DEFAULT_BATCH = 128
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}$")
_NO_TIME = ("", "unknown", "none")


class TraceError(ValueError, CellschedError):
    """A malformed trace: ``<path>:<line>: field '<field>': <message>``."""

    def __init__(self, path: str | os.PathLike, line: int, field_name: str | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.field = field_name
        where = f"{self.path}:{line}" if line else self.path
        super().__init__(f"{where}: field {field_name!r}: {message}" if field_name else f"{where}: {message}")


def _by_submit(jobs: list[TraceJob]) -> tuple[TraceJob, ...]:
    return tuple(sorted(jobs, key=lambda j: j.submit_time))


# ---- Arena CSV -------------------------------------------------------------------------


def read_arena_trace(path: str | os.PathLike, *, iteration_scale: int = 1) -> tuple[TraceJob, ...]:
    """Read an Arena trace CSV; see the module doc."""
    if isinstance(iteration_scale, bool) or not isinstance(iteration_scale, int) or iteration_scale < 1:
        raise ValueError(f"iteration_scale must be a positive integer, got {iteration_scale!r}")
    try:
        fh = open(path, newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(path, 0, None, f"cannot read ({exc.strerror})") from None
    jobs: list[TraceJob] = []
    seen: dict[str, int] = {}
    with fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise TraceError(path, 1, None, "empty file (expected a header line)")
        cols = [c.strip() for c in header]
        for name in ARENA_COLUMNS:
            if name not in cols:
                raise TraceError(path, 1, name, f"missing column (header has {', '.join(cols)})")
        idx = {name: cols.index(name) for name in ARENA_COLUMNS}
        for row in reader:
            line = reader.line_num
            if not any(c.strip() for c in row):
                continue
            if len(row) != len(cols):
                raise TraceError(path, line, None, f"expected {len(cols)} fields, got {len(row)}")
            raw = {name: row[i].strip() for name, i in idx.items()}
            fields = _Fields(path, line, raw)
            job_id = fields.text("job_id")
            if job_id in seen:
                raise TraceError(path, line, "job_id", f"duplicate job id {job_id!r} (first on line {seen[job_id]})")
            seen[job_id] = line
            gpu_type = raw["gpu_type"] or None
            if gpu_type is not None and not GPU_TYPE.match(gpu_type):
                raise TraceError(path, line, "gpu_type", f"must be a lower-case GPU type name, got {gpu_type!r}")
            jobs.append(
                TraceJob(
                    job_id=job_id,
                    submit_time=fields.number("submission_time"),
                    model=fields.model("model_name"),
                    global_batch=fields.positive_int("batch_size"),
                    iterations=max(1, fields.positive_int("num_iteration") // iteration_scale),
                    requested_gpus=fields.positive_int("num_gpu"),
                    requested_gpu_type=gpu_type,
                    deadline=fields.number("deadline") if raw["deadline"] else None,
                    line=line,
                )
            )
    return _by_submit(jobs)


@dataclass(frozen=True)
class _Fields:
    """Typed access to one row's raw fields, raising TraceError."""

    path: str | os.PathLike
    line: int
    raw: Mapping[str, str]

    def fail(self, name: str, message: str) -> TraceError:
        return TraceError(self.path, self.line, name, message)

    def text(self, name: str) -> str:
        if not self.raw[name]:
            raise self.fail(name, "must not be empty")
        return self.raw[name]

    def positive_int(self, name: str) -> int:
        value = self.raw[name]
        if not re.fullmatch(r"[0-9]+", value) or int(value) < 1:
            raise self.fail(name, f"must be a positive integer, got {value!r}")
        return int(value)

    def number(self, name: str) -> float:
        value = self.raw[name]
        try:
            out = float(value)
        except ValueError:
            out = float("nan")
        if not out >= 0 or out == float("inf"):
            raise self.fail(name, f"must be a non-negative number, got {value!r}")
        return out

    def model(self, name: str) -> str:
        value = self.text(name)
        if "/" in value or value.lower().endswith((".json", ".toml")):
            raise self.fail(name, f"must name a model preset, got the path {value!r}")
        try:
            return get_model(value).name
        except ModelSpecError as exc:
            raise self.fail(name, str(exc).removeprefix("model: ")) from None


# ---- Slurm accounting ------------------------------------------------------------------


@dataclass(frozen=True)
class SacctTrace:
    """The jobs of an accounting export and the rows skipped, by reason."""

    jobs: tuple[TraceJob, ...]
    skipped: Mapping[str, int] = field(default_factory=dict)


def read_sacct(
    path: str | os.PathLike,
    *,
    default_model: str = DEFAULT_MODEL,
    default_batch: int = DEFAULT_BATCH,
    include_non_gpu: bool = False,
) -> tuple[TraceJob, ...]:
    """The jobs of a ``sacct -P`` export (see the module doc)."""
    return load_sacct(
        path, default_model=default_model, default_batch=default_batch, include_non_gpu=include_non_gpu
    ).jobs


def load_sacct(
    path: str | os.PathLike,
    *,
    default_model: str = DEFAULT_MODEL,
    default_batch: int = DEFAULT_BATCH,
    include_non_gpu: bool = False,
) -> SacctTrace:
    """Like read_sacct, also counting the rows it skipped."""
    model = get_model(default_model).name
    if isinstance(default_batch, bool) or not isinstance(default_batch, int) or default_batch < 1:
        raise ValueError(f"default_batch must be a positive integer, got {default_batch!r}")
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise TraceError(path, 0, None, f"cannot read ({exc.strerror})") from None
    numbered = [(i, ln) for i, ln in enumerate(lines, 1) if ln.strip()]
    if not numbered:
        raise TraceError(path, 1, None, "empty file (expected a header line)")
    head_line, head = numbered[0]
    cols = head.split("|")
    if cols and cols[-1] == "":
        cols.pop()  # `sacct -p` ends every line with '|'
    lower = [c.strip().lower() for c in cols]
    for name in SACCT_REQUIRED:
        if name.lower() not in lower:
            raise TraceError(path, head_line, name, f"missing column (header has {', '.join(cols)})")
    idx = {name: i for i, name in enumerate(lower)}
    skipped: Counter[str] = Counter()
    rows: list[tuple[TraceJob, dt.datetime, dt.datetime | None]] = []
    seen: dict[str, int] = {}
    for line, text in numbered[1:]:
        values = _split_row(path, line, text, len(cols), idx.get("comment") == len(cols) - 1)
        raw = {name: values[i].strip() for name, i in idx.items()}
        row = _SacctRow(path, line, raw)
        job_id = raw["jobid"]
        if not job_id:
            raise row.fail("jobid", "must not be empty")
        if "." in job_id:
            skipped["job step"] += 1
            continue
        if job_id in seen:
            raise TraceError(path, line, "JobID", f"duplicate job id {job_id!r} (first on line {seen[job_id]})")
        seen[job_id] = line
        built = row.job(job_id, model, default_batch, include_non_gpu)
        if isinstance(built, str):
            skipped[built] += 1
        else:
            rows.append((*built, row.time("start", False)))
    if not rows:
        return SacctTrace((), dict(skipped))
    t0 = min(submit for _, submit, _ in rows)
    jobs = [
        replace(job, submit_time=(submit - t0).total_seconds(), recorded_start=_since(start, t0))
        for job, submit, start in rows
    ]
    return SacctTrace(_by_submit(jobs), dict(skipped))


def _since(t: dt.datetime | None, t0: dt.datetime) -> float | None:
    return None if t is None else (t - t0).total_seconds()


def _split_row(path: str | os.PathLike, line: int, text: str, ncols: int, comment_last: bool) -> list[str]:
    values = text.split("|")
    if len(values) == ncols + 1 and values[-1] == "":
        values.pop()
    if len(values) > ncols and comment_last:
        values = values[: ncols - 1] + ["|".join(values[ncols - 1 :])]  # a '|' inside the Comment
    if len(values) != ncols:
        raise TraceError(path, line, None, f"expected {ncols} '|'-separated fields, got {len(values)}")
    return values


_FIELD_NAMES = {
    "jobid": "JobID",
    "submit": "Submit",
    "start": "Start",
    "end": "End",
    "alloctres": "AllocTRES",
    "reqtres": "ReqTRES",
    "comment": "Comment",
    "user": "User",
    "timelimit": "Timelimit",
}


@dataclass(frozen=True)
class _SacctRow:
    path: str | os.PathLike
    line: int
    raw: Mapping[str, str]

    def fail(self, key: str, message: str) -> TraceError:
        return TraceError(self.path, self.line, _FIELD_NAMES.get(key, key), message)

    def time(self, key: str, required: bool) -> dt.datetime | None:
        value = self.raw.get(key, "")
        if value.lower() in _NO_TIME and not required:
            return None
        if not _TIMESTAMP.match(value):
            raise self.fail(key, f"must be a timestamp like 2024-05-01T10:00:00, got {value!r}")
        try:
            return dt.datetime.fromisoformat(value)
        except ValueError:
            raise self.fail(key, f"not a valid date/time: {value!r}") from None

    def time_limit_s(self) -> float | None:
        """Its Timelimit in seconds (``1:00:00``, ``2-00:00:00``; UNLIMITED, Partition_Limit or none: None)."""
        value = self.raw.get("timelimit", "")
        if value.lower() in ("", "unlimited", "partition_limit", "invalid"):
            return None
        if not re.fullmatch(r"(\d+-)?\d+(:\d{1,2}){0,2}", value):
            raise self.fail("timelimit", f"must be a Slurm time like 1:00:00 or 2-00:00:00, got {value!r}")
        got = minutes(value)
        return None if got is None else got * 60.0

    def gpus(self) -> tuple[int, str | None]:
        key = "alloctres" if self.raw["alloctres"] or "reqtres" not in self.raw else "reqtres"
        return parse_tres_gpus(self.raw[key], lambda msg: self.fail(key, msg))

    def job(self, job_id: str, model: str, batch: int, include_non_gpu: bool) -> tuple[TraceJob, dt.datetime] | str:
        """The row's TraceJob and absolute submit time, or why it is skipped."""
        submit = self.time("submit", required=True)
        assert submit is not None  # required
        start, end = self.time("start", False), self.time("end", False)
        gpus, gpu_type = self.gpus()
        try:
            spec = JobSpec.from_comment(self.raw.get("comment") or None)
        except JobSpecError as exc:
            raise self.fail("comment", f"malformed cellsched spec: {exc}") from None
        if start is None and "start" in self.raw:
            return "never started"
        if gpus == 0 and not include_non_gpu:
            return "no GPU"
        duration = None
        if end is not None and start is not None:
            duration = (end - start).total_seconds()
            if duration < 0:
                raise self.fail("end", f"is before Start ({end.isoformat()} < {start.isoformat()})")
        user = self.raw.get("user") or "sim"
        account, qos, limit = self.raw.get("account", ""), self.raw.get("qos", ""), self.time_limit_s()
        if spec is not None:
            return TraceJob(
                job_id,
                0.0,
                spec.model,
                spec.global_batch,
                spec.iterations,
                spec.requested_gpus or gpus,
                spec.requested_gpu_type or gpu_type,
                duration_s=duration,
                user=user,
                line=self.line,
                account=account,
                qos=qos,
                time_limit_s=limit,
                runtime=spec.runtime,
            ), submit
        if duration is None:
            return "not ended" if end is None else "no start time"
        return TraceJob(
            job_id,
            0.0,
            model,
            batch,
            None,
            gpus,
            gpu_type,
            duration_s=duration,
            user=user,
            line=self.line,
            account=account,
            qos=qos,
            time_limit_s=limit,
        ), submit


def parse_tres_gpus(tres: str, fail: Callable[[str], Exception] | None = None) -> tuple[int, str | None]:
    """(GPU count, GPU type or None) of a TRES string such as
    ``billing=4,cpu=4,gres/gpu:a100=4,gres/gpu=4,mem=16G,node=1``.

    The count is ``gres/gpu=N`` when given, else the sum of the typed
    entries; the type is the single typed entry's (None when untyped or
    several types). `fail(message)` builds the exception raised on a
    malformed value (default ValueError).
    """
    fail = fail or ValueError
    total: int | None = None
    typed: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in tres.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise fail(f"TRES entry {item!r} is not key=value")
        if key != "gres/gpu" and not key.startswith("gres/gpu:"):
            continue
        if not re.fullmatch(r"[0-9]+", value):
            raise fail(f"GPU count in {item!r} must be a non-negative integer")
        if key == "gres/gpu":
            total = int(value)
        else:
            kind = key.split(":", 1)[1].lower()
            typed[kind] = typed.get(kind, 0) + int(value)
    count = total if total is not None else sum(typed.values())
    kinds = [t for t, n in typed.items() if n > 0]
    return count, kinds[0] if len(kinds) == 1 else None
