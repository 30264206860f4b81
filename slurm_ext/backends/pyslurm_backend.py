"""The Backend protocol over pyslurm's object API (pyslurm 24.x / 25.x).

pyslurm is imported lazily: it only builds against the Slurm release whose
major.minor it carries. The mapping between pyslurm's objects and our
records / requests is pure functions (``job_record``, ``node_record``,
``partition_record``, ``submit_fields``, ``update_fields``), so it is tested
without pyslurm; the class only moves objects through them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from slurm_ext.backends.base import (
    ALL,
    BATCH,
    START_SOON,
    STEPS,
    JobUpdate,
    OneAtATime,
    SlurmCommandError,
    SlurmUnavailable,
    SubmitRequest,
    UpdateNotApplied,
    check_job_id,
    check_signal,
    check_signal_target,
    update_mismatches,
)
from slurm_ext.parse.values import epoch, gpu_gres, integer, job_state, minutes, node_state, text, words
from slurm_ext.records import (
    FINISHED,
    ClusterSnapshot,
    SlurmJob,
    SlurmNode,
    SlurmPartition,
    compress_hostlist,
    expand_hostlist,
)
from slurm_ext.site import SiteReading
from solver.contract.extras import require


def gres_dict_gpus(gres: Mapping[str, Any] | None) -> tuple[str | None, int]:
    """pyslurm GRES dicts -> (gpu type or None, count).

    ``{"gpu:a100": 4}``, ``{"gpu": 2}``, and the allocated form
    ``{"gpu:a100": {"count": 3, "indexes": "0-2"}}``.
    """
    gtype: str | None = None
    total = 0
    for key, val in (gres or {}).items():
        name, _, typ = str(key).partition(":")
        if name != "gpu":
            continue
        count = val.get("count", 0) if isinstance(val, Mapping) else val
        total += int(count or 0)
        if typ:
            gtype = gtype or typ
    return gtype, total


def _get(obj: Any, name: str, default: Any = None) -> Any:
    return getattr(obj, name, default)


def job_record(job: Any) -> SlurmJob:
    """A pyslurm.Job -> SlurmJob."""
    state, _ = job_state(_get(job, "state"))
    reason = text(_get(job, "state_reason"))
    reason = "" if reason == "None" else reason
    gres = _get(job, "gres_per_node")
    gtype, gcount = gres_dict_gpus(gres) if isinstance(gres, Mapping) else gpu_gres(gres)
    nodes = expand_hostlist(text(_get(job, "allocated_nodes")))
    priority = _get(job, "priority")
    pending = state == "PENDING"
    time_limit = minutes(_get(job, "time_limit"))
    end = epoch(_get(job, "end_time"))
    if state not in FINISHED and time_limit is None:
        end = None
    exit_code = None
    if state in FINISHED:
        sig = integer(_get(job, "exit_code_signal"))
        exit_code = 128 + sig if sig else integer(_get(job, "exit_code"))
    features = _get(job, "constraints")
    return SlurmJob(
        job_id=str(_get(job, "id")),
        name=text(_get(job, "name")),
        user=text(_get(job, "user_name")),
        uid=integer(_get(job, "user_id")),
        state=state,
        reason=reason,
        partition=text(_get(job, "partition")),
        nodes=nodes,
        num_nodes=integer(_get(job, "num_nodes")) or len(nodes),
        gpus_per_node=gcount or None,
        gpu_type=gtype,
        held=pending and (priority == 0 or reason.startswith("JobHeld")),
        features=",".join(features) if isinstance(features, (list, tuple)) else text(features),
        required_nodes=expand_hostlist(text(_get(job, "required_nodes"))),
        excluded_nodes=expand_hostlist(text(_get(job, "excluded_nodes"))),
        comment=text(_get(job, "comment")),
        admin_comment=text(_get(job, "admin_comment")),
        submit_time=epoch(_get(job, "submit_time")),
        start_time=epoch(_get(job, "start_time")),
        eligible_time=epoch(_get(job, "eligible_time")),
        end_time=end,
        exit_code=exit_code,
        time_limit=time_limit,
        batch_host=text(_get(job, "batch_host")),
        num_tasks=integer(_get(job, "ntasks")) or None,
        tasks_per_node=integer(_get(job, "ntasks_per_node")) or None,
        work_dir=text(_get(job, "working_directory")),
        account=text(_get(job, "account")),
        qos=text(_get(job, "qos")),
        priority=integer(priority),
        reservation=text(_get(job, "reservation")),
    )


def node_record(node: Any) -> SlurmNode:
    """A pyslurm.Node -> SlurmNode (state text like ``IDLE+DRAIN``)."""
    state, flags = node_state(_get(node, "state"))
    gtype, total = gres_dict_gpus(_get(node, "configured_gres"))
    _, used = gres_dict_gpus(_get(node, "allocated_gres"))
    return SlurmNode(
        name=text(_get(node, "name")),
        address=text(_get(node, "address")),
        port=integer(_get(node, "slurmd_port")),
        partitions=words(_get(node, "partitions")),
        features=words(_get(node, "active_features")) or words(_get(node, "available_features")),
        gpu_type=gtype,
        gpus_total=total,
        gpus_alloc=used,
        cpus_total=integer(_get(node, "total_cpus")) or 0,
        cpus_alloc=integer(_get(node, "allocated_cpus")) or 0,
        memory_mb=integer(_get(node, "real_memory")) or 0,
        state=state,
        flags=flags,
        reason=text(_get(node, "reason")),
    )


def partition_record(part: Any) -> SlurmPartition:
    """A pyslurm.Partition -> SlurmPartition."""
    nodes = _get(part, "nodes")
    return SlurmPartition(
        name=text(_get(part, "name")),
        nodes=tuple(nodes) if isinstance(nodes, (list, tuple)) else expand_hostlist(text(nodes)),
        state=(text(_get(part, "state")) or "UP").upper(),
        default=bool(_get(part, "is_default", False)),
        max_time=minutes(_get(part, "max_time")),
    )


def submit_fields(req: SubmitRequest) -> dict[str, Any]:
    """SubmitRequest -> keyword arguments of pyslurm.JobSubmitDescription."""
    if req.extra_args:
        raise ValueError("SubmitRequest.extra_args: raw sbatch arguments are not supported by the pyslurm backend")
    with open(req.script, encoding="utf-8") as fh:
        script = fh.read()
    kw: dict[str, Any] = {
        "script": script,
        "script_args": list(req.script_args),
        "name": req.job_name,
        "partitions": req.partition,
        "nodes": req.nodes,
        "ntasks_per_node": req.ntasks_per_node,
        "cpus_per_task": req.cpus_per_task,
        "time_limit": req.time_limit,
        "comment": req.comment,
        "constraints": req.constraint,
        "standard_output": req.output,
        "standard_error": req.error,
        "account": req.account,
        "qos": req.qos,
        "working_directory": req.workdir,
    }
    if req.gres_per_node:
        kw["gres_per_node"] = {"gpu": req.gres_per_node}
    if req.hold:
        kw["priority"] = 0
    if req.export is not None:
        raise ValueError("SubmitRequest.export: not supported by the pyslurm backend (use env)")
    if req.env:
        kw["environment"] = dict(req.env)
    return {k: v for k, v in kw.items() if v is not None}


def update_fields(change: JobUpdate) -> dict[str, Any]:
    """JobUpdate -> keyword arguments of pyslurm.JobSubmitDescription for Job.modify."""
    kw: dict[str, Any] = {}
    if change.partition is not None:
        kw["partitions"] = change.partition
    if change.features is not None:
        kw["constraints"] = change.features
    if change.num_nodes is not None:
        kw["nodes"] = f"{change.num_nodes}-{change.num_nodes}"
    if change.req_nodes is not None:
        kw["required_nodes"] = compress_hostlist(change.req_nodes)
    if change.exc_nodes is not None:
        kw["excluded_nodes"] = compress_hostlist(change.exc_nodes)
    if change.gres_per_node is not None:
        kw["gres_per_node"] = {"gpu": change.gres_per_node}
    if change.num_tasks is not None:
        kw["ntasks"] = change.num_tasks
    if change.tasks_per_node is not None:
        kw["ntasks_per_node"] = change.tasks_per_node
    if change.min_cpus_per_node is not None:
        kw["min_cpus_per_node"] = change.min_cpus_per_node
    if change.admin_comment is not None:
        kw["admin_comment"] = change.admin_comment
    if change.start_soon:
        kw["begin_time"] = START_SOON
    return kw


def pyslurm_version(module: Any) -> tuple[int, int] | None:
    """(major, minor) of an imported pyslurm (its version follows Slurm's)."""
    raw = module.version() if callable(getattr(module, "version", None)) else getattr(module, "__version__", "")
    parts = str(raw).split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def import_pyslurm() -> Any:
    """The pyslurm module; MissingExtra (one line naming the `pyslurm` extra) when it does not import."""
    return require("pyslurm")


class PyslurmBackend(OneAtATime):
    """Backend over pyslurm's object API."""

    name = "pyslurm"

    def __init__(self, *, module: Any = None) -> None:
        self.ps = module or import_pyslurm()

    def _call(self, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except Exception as exc:  # pyslurm raises RPCError for everything
            msg = str(exc)
            if "Unable to contact slurm controller" in msg or "Socket timed out" in msg or "Connection refused" in msg:
                raise SlurmUnavailable(f"{what}: {msg}") from exc
            raise SlurmCommandError(what, getattr(exc, "errno", 1) or 1, msg) from exc

    def observe(self) -> ClusterSnapshot:
        taken_at = time.time()
        nodes = self._call("Nodes.load", self.ps.Nodes.load)
        parts = self._call("Partitions.load", self.ps.Partitions.load)
        jobs = self._call("Jobs.load", self.ps.Jobs.load)
        return ClusterSnapshot(
            nodes=tuple(node_record(n) for n in nodes.values()),
            partitions=tuple(partition_record(p) for p in parts.values()),
            jobs=tuple(job_record(j) for j in jobs.values()),
            taken_at=taken_at,
        )

    def read_site(self) -> SiteReading:
        """The site's standing policy, read with Slurm's commands
        (slurm_ext.site; pyslurm has no stable accounting API across releases)."""
        from slurm_ext.backends.cli import CliBackend

        return CliBackend().read_site()

    def _job(self, job_id: str) -> Any:
        if not check_job_id(job_id).isdigit():
            raise ValueError(f"job_id {job_id!r}: array tasks are not supported by the pyslurm backend")
        return self._call(f"Job.load({job_id})", self.ps.Job.load, int(job_id))

    def submit(self, req: SubmitRequest) -> str:
        desc = self.ps.JobSubmitDescription(**submit_fields(req))
        return str(self._call("JobSubmitDescription.submit", desc.submit))

    def update(self, job_id: str, change: JobUpdate) -> SlurmJob:
        failure = ""
        try:
            self._call("Job.modify", self._job(job_id).modify, self.ps.JobSubmitDescription(**update_fields(change)))
        except SlurmCommandError as exc:
            failure = exc.stderr
        job = job_record(self._job(job_id))
        part_nodes = None
        if job.required_nodes:
            parts = self._call("Partitions.load", self.ps.Partitions.load)
            wanted = set(job.partition.split(","))
            part_nodes = {
                n for p in parts.values() if text(_get(p, "name")) in wanted for n in partition_record(p).nodes
            }
        bad = update_mismatches(job, change, part_nodes)
        if bad:
            raise UpdateNotApplied(job_id, bad, job, failure)
        if failure:
            raise SlurmCommandError("Job.modify", 1, failure)
        return job

    def hold(self, job_id: str) -> None:
        self._call("Job.hold", self._job(job_id).hold)

    def release(self, job_id: str) -> None:
        self._call("Job.release", self._job(job_id).release)

    def requeue(self, job_id: str, *, hold: bool = False) -> None:
        self._call("Job.requeue", self._job(job_id).requeue, hold=hold)

    def cancel(self, job_id: str) -> None:
        self._call("Job.cancel", self._job(job_id).cancel)

    def signal(self, job_id: str, signal: str, *, target: str = BATCH) -> None:
        check_signal(signal)
        self._call(
            "Job.send_signal",
            self._job(job_id).send_signal,
            signal,
            steps={BATCH: "batch", STEPS: "children", ALL: "all"}[check_signal_target(target)],
        )
