"""The one protocol through which everything talks to Slurm, its request
types and its errors.

Backends: ``cli`` (Slurm's commands), ``pyslurm`` (the C API through
pyslurm), and a simulated cluster. The controller, the sbatch wrapper and
the CLI only ever see this surface.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Protocol

from slurm_ext.errors import CellschedError
from slurm_ext.records import ClusterSnapshot, SlurmJob
from slurm_ext.site import SiteReading

_JOB_ID = re.compile(r"^\d+(_\d+)?$")
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SIGNAL = re.compile(r"^(SIG)?[A-Z][A-Z0-9+]*$|^\d+$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: the begin time `JobUpdate.start_soon` sends: the next whole second (see JobUpdate)
START_SOON = "now+1"


# --- errors ----------------------------------------------------------------


class SlurmError(RuntimeError, CellschedError):
    """Anything that went wrong talking to Slurm."""


class SlurmUnavailable(SlurmError):
    """slurmctld cannot be reached (down, or a command timed out)."""


class SlurmCommandError(SlurmError):
    """A Slurm command or API call failed."""

    def __init__(self, command: list[str] | str, returncode: int, stderr: str) -> None:
        self.command = command
        self.returncode = returncode
        self.stderr = stderr.strip()
        shown = " ".join(command) if isinstance(command, list) else command
        super().__init__(f"{shown!r} failed (exit {returncode}): {self.stderr or 'no error message'}")


class UpdateNotApplied(SlurmError):
    """An update that Slurm did not (fully) apply.

    `mismatches` maps each field that did not stick to (expected, actual);
    `job` is the job as read back after the update.
    """

    def __init__(
        self, job_id: str, mismatches: Mapping[str, tuple[object, object]], job: SlurmJob | None, detail: str = ""
    ) -> None:
        self.job_id = job_id
        self.mismatches = dict(mismatches)
        self.job = job
        self.detail = detail
        parts = ", ".join(f"{k}: wanted {e!r}, got {a!r}" for k, (e, a) in self.mismatches.items())
        msg = f"job {job_id}: update not applied ({parts})"
        super().__init__(f"{msg}; Slurm said: {detail}" if detail else msg)


# --- requests --------------------------------------------------------------


def check_job_id(job_id: str) -> str:
    """A job id as Slurm prints it ("123" or "123_4"), or ValueError."""
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise ValueError(f"job_id must look like '123' or '123_4', got {job_id!r}")
    return job_id


#: signal targets
BATCH, STEPS, ALL = "batch", "steps", "all"


def check_signal_target(target: str) -> str:
    if target not in (BATCH, STEPS, ALL):
        raise ValueError(f"signal target must be one of {BATCH!r}, {STEPS!r}, {ALL!r}, got {target!r}")
    return target


def check_signal(signal: str) -> str:
    if not isinstance(signal, str) or not _SIGNAL.match(signal):
        raise ValueError(f"signal must be a name like 'USR1' / 'SIGTERM' or a number, got {signal!r}")
    return signal


def _check(cond: bool, where: str, msg: str, value: object) -> None:
    if not cond:
        raise ValueError(f"{where} {msg}, got {value!r}")


def _positive(where: str, value: int | None, minimum: int = 1) -> None:
    if value is not None:
        _check(
            isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
            where,
            f"must be an integer >= {minimum}",
            value,
        )


def _one_line(where: str, value: str | None) -> None:
    if value is not None:
        _check(
            isinstance(value, str) and "\n" not in value and "\r" not in value, where, "must be one line of text", value
        )


def _nodes(where: str, value: tuple[str, ...] | None) -> None:
    if value is not None:
        _check(
            isinstance(value, tuple) and all(isinstance(n, str) and _NODE.match(n) for n in value),
            where,
            "must be a tuple of node names",
            value,
        )


@dataclass(frozen=True)
class SubmitRequest:
    """A batch job to submit. GPUs are requested UNTYPED (``--gres=gpu:N``)
    so that the job's GPU type can still be changed while it is pending;
    the type is chosen with `constraint` (node features) or later by update.

    `time_limit` is in Slurm's syntax (``"30"``, ``"1:00:00"``, ``"2-00:00:00"``)
    or minutes as an int. `env` is added to the submitting environment.
    """

    script: str
    script_args: tuple[str, ...] = ()
    job_name: str | None = None
    partition: str | None = None
    gres_per_node: int = 0
    nodes: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    time_limit: str | int | None = None
    hold: bool = False
    comment: str | None = None
    constraint: str | None = None
    output: str | None = None
    error: str | None = None
    export: str | None = None
    account: str | None = None
    qos: str | None = None
    extra_args: tuple[str, ...] = ()
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        w = "SubmitRequest."
        _check(isinstance(self.script, str) and bool(self.script.strip()), w + "script", "must be a path", self.script)
        for name in ("script_args", "extra_args"):
            v = getattr(self, name)
            _check(
                isinstance(v, tuple) and all(isinstance(a, str) for a in v), w + name, "must be a tuple of strings", v
            )
        _positive(w + "gres_per_node", self.gres_per_node, minimum=0)
        for name in ("nodes", "ntasks_per_node", "cpus_per_task"):
            _positive(w + name, getattr(self, name))
        for name in ("job_name", "account", "qos"):
            v = getattr(self, name)
            if v is not None:
                _check(isinstance(v, str) and bool(_NAME.match(v)), w + name, "must be a plain name", v)
        if self.partition is not None:
            _check(
                isinstance(self.partition, str) and all(_NAME.match(p) for p in self.partition.split(",")),
                w + "partition",
                "must be a partition name or a comma-separated list of them",
                self.partition,
            )
        for name in ("comment", "constraint", "output", "error", "export", "workdir"):
            _one_line(w + name, getattr(self, name))
        if self.time_limit is not None:
            ok = (
                isinstance(self.time_limit, int) and not isinstance(self.time_limit, bool) and self.time_limit > 0
            ) or (
                isinstance(self.time_limit, str)
                and bool(re.match(r"^(\d+-)?\d+(:\d+){0,2}$|^UNLIMITED$", self.time_limit))
            )
            _check(ok, w + "time_limit", "must be minutes > 0 or Slurm time text like '1:00:00'", self.time_limit)
        _check(isinstance(self.hold, bool), w + "hold", "must be a bool", self.hold)
        _check(
            isinstance(self.env, Mapping)
            and all(isinstance(k, str) and _ENV_KEY.match(k) and isinstance(v, str) for k, v in self.env.items()),
            w + "env",
            "must map variable names to strings",
            self.env,
        )


@dataclass(frozen=True)
class JobUpdate:
    """Changes to a (pending) job; only fields that are not None are sent.

    `num_nodes` is sent as ``NumNodes=a-a``; `gres_per_node` as the UNTYPED
    ``Gres=gpu:N``; `num_tasks` / `tasks_per_node` as ``NumTasks=`` /
    ``TasksPerNode=`` (one task per GPU for ``srun cellsched-launch``);
    `min_cpus_per_node` as ``MinCPUsNode=`` (NumTasks alone does not grow the
    job's CPUs, and srun then refuses to start that many tasks; not read
    back); `req_nodes=()` / `exc_nodes=()` / `features=""` clear the field.
    `start_soon` lifts the BeginTime a requeue sets (cred_expire, 120 s by
    default) with ``StartTime=now+1``: the next whole second, never the
    second the job ended in, because slurmd refuses a credential created in
    the second of the job's credential revocation ("Job credential revoked",
    and the restarted job dies). Not read back: Slurm only keeps it for a job
    that is already pending.
    """

    partition: str | None = None
    features: str | None = None
    num_nodes: int | None = None
    req_nodes: tuple[str, ...] | None = None
    exc_nodes: tuple[str, ...] | None = None
    gres_per_node: int | None = None
    num_tasks: int | None = None
    tasks_per_node: int | None = None
    min_cpus_per_node: int | None = None
    admin_comment: str | None = None
    start_soon: bool = False

    def __post_init__(self) -> None:
        w = "JobUpdate."
        if self.partition is not None:
            _check(
                isinstance(self.partition, str) and bool(_NAME.match(self.partition)),
                w + "partition",
                "must be a partition name",
                self.partition,
            )
        if self.features is not None:
            _check(
                isinstance(self.features, str) and bool(re.match(r"^[A-Za-z0-9_.,&|\[\]()*:-]*$", self.features)),
                w + "features",
                "must be a feature expression",
                self.features,
            )
        _positive(w + "num_nodes", self.num_nodes)
        _positive(w + "gres_per_node", self.gres_per_node, minimum=0)
        _positive(w + "num_tasks", self.num_tasks)
        _positive(w + "tasks_per_node", self.tasks_per_node)
        _positive(w + "min_cpus_per_node", self.min_cpus_per_node)
        _nodes(w + "req_nodes", self.req_nodes)
        _nodes(w + "exc_nodes", self.exc_nodes)
        _one_line(w + "admin_comment", self.admin_comment)
        _check(isinstance(self.start_soon, bool), w + "start_soon", "must be a bool", self.start_soon)
        if all(getattr(self, f.name) in (None, False) for f in fields(self)):
            raise ValueError("JobUpdate: no field to change")


def update_mismatches(
    job: SlurmJob, change: JobUpdate, partition_nodes: Collection[str] | None = None
) -> dict[str, tuple[object, object]]:
    """Fields of `change` that `job` (read back after the update) does not show.

    With `partition_nodes` (the nodes of the job's partition(s)), required
    nodes outside them count too: Slurm accepts such a ReqNodeList and the
    job then never starts (BadConstraints once released).
    """
    out: dict[str, tuple[object, object]] = {}

    def cmp(name: str, want: object, got: object) -> None:
        if want is not None and want != got:
            out[name] = (want, got)

    cmp("partition", change.partition, job.partition)
    cmp("features", change.features, job.features)
    pinned = (
        change.req_nodes is not None
        and len(change.req_nodes) == change.num_nodes
        and sorted(change.req_nodes) == sorted(job.required_nodes)
    )
    if not pinned:  # a requeued job shows its old node count until it starts; ReqNodeList pins the count
        cmp("num_nodes", change.num_nodes, job.num_nodes)
    if change.req_nodes is not None:
        cmp("req_nodes", tuple(sorted(change.req_nodes)), tuple(sorted(job.required_nodes)))
    if change.exc_nodes is not None:
        cmp("exc_nodes", tuple(sorted(change.exc_nodes)), tuple(sorted(job.excluded_nodes)))
    if change.gres_per_node is not None:
        cmp("gres_per_node", change.gres_per_node, job.gpus_per_node or 0)
    cmp("num_tasks", change.num_tasks, job.num_tasks)
    cmp("tasks_per_node", change.tasks_per_node, job.tasks_per_node)
    cmp("admin_comment", change.admin_comment, job.admin_comment)
    if partition_nodes is not None and "req_nodes" not in out:
        outside = tuple(sorted(set(job.required_nodes) - set(partition_nodes)))
        if outside:
            out["req_nodes"] = (f"nodes of partition {job.partition}", f"{','.join(outside)} outside it")
    return out


# --- the protocol ----------------------------------------------------------


class Backend(Protocol):
    """Every Slurm interaction goes through one of these."""

    name: str

    def observe(self) -> ClusterSnapshot:
        """Nodes, partitions and jobs now; SlurmUnavailable fast when
        slurmctld does not answer."""
        ...

    def submit(self, req: SubmitRequest) -> str:
        """Submit a batch job; returns its job id."""
        ...

    def update(self, job_id: str, change: JobUpdate) -> SlurmJob:
        """Apply `change`, read the job back, and return it; raises
        UpdateNotApplied listing the fields that did not stick."""
        ...

    def read_site(self) -> SiteReading:
        """The site's standing policy (slurm_ext.site: GPU limits, fair share,
        reservations, partition access); SlurmError or ParseError when the
        accounting cannot be read. A backend without accounting returns an
        empty SiteReading (no site policy)."""
        ...

    def hold(self, job_id: str) -> None: ...

    def release(self, job_id: str) -> None: ...

    def requeue(self, job_id: str, *, hold: bool = False) -> None: ...

    def cancel(self, job_id: str) -> None: ...

    def signal(self, job_id: str, signal: str, *, target: str = BATCH) -> None:
        """Send `signal` to `target`: the batch shell ("batch"), every step
        but not the batch shell ("steps": how a running ``srun
        cellsched-launch`` is asked to checkpoint), or both ("all")."""
        ...

    # Many jobs at once: how a round carries out hundreds of placements. Each
    # job's result stands alone (one bad job does not fail the others);
    # SlurmUnavailable still stops the whole call.

    def update_many(self, changes: Mapping[str, JobUpdate]) -> dict[str, SlurmJob | Exception]:
        """`update` for each job: its read-back, or why its update failed."""
        ...

    def hold_many(self, job_ids: Sequence[str]) -> dict[str, Exception]:
        """Hold the jobs; the ones that failed, and why."""
        ...

    def release_many(self, job_ids: Sequence[str]) -> dict[str, Exception]:
        """Release the jobs; the ones that failed, and why."""
        ...

    def requeue_many(self, job_ids: Sequence[str], *, hold: bool = False) -> dict[str, Exception]:
        """Requeue the jobs; the ones that failed, and why."""
        ...


#: what a failed step of one job in a `*_many` call may raise (SlurmUnavailable is not one)
JOB_FAILURES = (SlurmCommandError, UpdateNotApplied, ValueError)


class OneAtATime:
    """The `*_many` calls as one call per job, for backends whose calls are
    cheap in-process requests (pyslurm, the simulated cluster)."""

    def _each(self, call: Callable[[str], object], job_ids: Iterable[str]) -> dict[str, object]:
        """job -> what `call(job)` returned, or the JOB_FAILURES it raised."""
        out: dict[str, object] = {}
        for job_id in job_ids:
            try:
                out[job_id] = call(job_id)
            except JOB_FAILURES as exc:
                out[job_id] = exc
        return out

    def _failed(self, call: Callable[[str], object], job_ids: Iterable[str]) -> dict[str, Exception]:
        return {j: r for j, r in self._each(call, job_ids).items() if isinstance(r, Exception)}

    def update_many(self, changes: Mapping[str, JobUpdate]) -> dict[str, SlurmJob | Exception]:
        return self._each(lambda j: self.update(j, changes[j]), changes)  # type: ignore[attr-defined,return-value]

    def hold_many(self, job_ids: Sequence[str]) -> dict[str, Exception]:
        return self._failed(self.hold, job_ids)  # type: ignore[attr-defined]

    def release_many(self, job_ids: Sequence[str]) -> dict[str, Exception]:
        return self._failed(self.release, job_ids)  # type: ignore[attr-defined]

    def requeue_many(self, job_ids: Sequence[str], *, hold: bool = False) -> dict[str, Exception]:
        return self._failed(lambda j: self.requeue(j, hold=hold), job_ids)  # type: ignore[attr-defined]
