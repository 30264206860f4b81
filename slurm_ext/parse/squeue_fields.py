"""Every job in one compact ``squeue --Format`` query: a round's read of the jobs.

Slurm 24.11's ``squeue --json`` is about 7.8 KB a job, and slurmctld's
squeue spends about 2.5 ms of CPU dumping each (measured on the dev cluster:
25 s for 10,000 jobs on a loaded machine). The fields a SlurmJob holds print
in about 400 bytes a job with ``squeue --Format`` (0.2 s for the same 10,000).
So the cli backend asks for `FIELDS` of every job (`argv`), and the whole JSON
record only of the few jobs whose text does not say all (`needs_full_record`:
a state flag, a reason Slurm printed as a sentence).

Names, comments, AdminComments and working directories are the users' and
admins' own text: Slurm prints them raw, newlines and any delimiter included
(measured on 24.11: a Comment of ``"\\n123|RUNNING"`` prints as a line of its
own). So the fields are separated by `Format.sep` and each record ends with
`Format.end`, both made from a random token drawn for each query: a job
submitted before the query cannot contain them, so no text can end a field or
a record early. Times are printed as epoch seconds (``SLURM_TIME_FORMAT=%s``:
no time zone to guess).

A compact record equals the job's JSON record (json_output.job_record) in
every field but `state_flags`, which it leaves empty: the flags the records'
properties read (COMPLETING, REQUEUED, ...) are those Slurm prints in place
of the base state, and such a job is read whole
(tests/slurm_ext/backends/test_slurm_compact.py compares both reads of the
same jobs, recorded on Slurm 22.05 and 24.11, field by field and as the
controller reads them).
"""

from __future__ import annotations

import functools
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_ext.parse.values import ParseError, epoch, exit_status, gpu_gres, integer, minutes, text
from slurm_ext.records import FINISHED, SlurmJob, expand_hostlist

#: (``squeue --Format`` field, the SlurmJob attribute it fills): every attribute but
#: state_flags (a job whose state has a flag Slurm prints is read whole), gpu_type and held
FIELDS = (
    ("JobId", "job_id"),
    ("State", "state"),
    ("Reason", "reason"),
    ("Partition", "partition"),
    ("NodeList", "nodes"),
    ("NumNodes", "num_nodes"),
    ("tres-per-node", "gpus_per_node"),
    ("UserName", "user"),
    ("UserId", "uid"),
    ("Account", "account"),
    ("QOS", "qos"),
    ("PriorityLong", "priority"),
    ("Reservation", "reservation"),
    ("SubmitTime", "submit_time"),
    ("EligibleTime", "eligible_time"),
    ("StartTime", "start_time"),
    ("EndTime", "end_time"),
    ("PreemptTime", "preempted_at"),
    ("TimeLimit", "time_limit"),
    ("exit_code", "exit_code"),
    ("ReqNodes", "required_nodes"),
    ("ExcNodes", "excluded_nodes"),
    ("BatchHost", "batch_host"),
    ("NumTasks", "num_tasks"),
    ("NTPerNode", "tasks_per_node"),
    ("Feature", "features"),
    ("WorkDir", "work_dir"),
    ("Name", "name"),
    ("Comment", "comment"),
    ("admin_comment", "admin_comment"),
)
#: the SlurmJob fields a compact record carries as the whole record has them
COMPACT = (*(attr for _, attr in FIELDS), "gpu_type", "held")
#: what Slurm 22.05's ``squeue --Format`` offers of them (no ExcNodes: its records say none excluded).
#: The backend reads 22.05's jobs whole (its ``squeue --json`` ignores --jobs); the tests compare
#: both reads there too
FIELDS_22_05 = tuple(f for f in FIELDS if f[0] != "ExcNodes")
#: the env that makes squeue print times as epoch seconds
TIME_ENV = {"SLURM_TIME_FORMAT": "%s"}
#: base job states as ``squeue -O State`` prints them; any other word is a state flag that Slurm
#: prints instead of the base state (COMPLETING, REQUEUED, CONFIGURING, ...): such a job is read whole
BASE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
#: what the name of a reason looks like (Resources, JobHeldUser, ...)
_REASON_NAME = re.compile(r"[A-Za-z0-9_]*")
#: a pending job held by a user or an admin (its priority is 0 too)
_HELD_REASON = "JobHeld"


@dataclass(frozen=True)
class Format:
    """One query's separators: `sep` between fields, `end` after a record."""

    token: str
    fields: tuple[tuple[str, str], ...] = FIELDS

    @classmethod
    def draw(cls) -> Format:
        return cls(secrets.token_hex(16))

    @property
    def sep(self) -> str:
        return f"#{self.token}#"

    @property
    def end(self) -> str:
        return f"#{self.token}$"

    def spec(self) -> str:
        """The ``--Format`` value: every field unpadded and untruncated (size 0)."""
        last = len(self.fields) - 1
        return ",".join(f"{name}:0{self.end if k == last else self.sep}" for k, (name, _) in enumerate(self.fields))


def argv(fmt: Format) -> list[str]:
    """The query: every job Slurm still lists, no header (run with TIME_ENV)."""
    return ["squeue", "--noheader", "--states=all", f"--Format={fmt.spec()}"]


def parse(output: str, fmt: Format) -> tuple[SlurmJob, ...]:
    """The records of `argv(fmt)`'s output; ParseError when it is not made of
    whole records of its fields."""
    chunks = output.split(fmt.end + "\n")
    if chunks[-1].strip():
        raise ParseError(f"squeue --Format: output does not end with a whole record: {chunks[-1][:80]!r}")
    return tuple(_record(c, fmt) for c in chunks[:-1])


def _record(chunk: str, fmt: Format) -> SlurmJob:
    values = chunk.split(fmt.sep)
    if len(values) != len(fmt.fields):
        raise ParseError(f"squeue --Format: a record of {len(values)} fields, not {len(fmt.fields)}: {chunk[:80]!r}")
    if fmt.fields is not FIELDS:  # fewer (an older Slurm's): the missing ones empty
        given = dict(zip(fmt.fields, values, strict=True))
        values = [given.get(f, "") for f in FIELDS]
    (job_id, state, reason, partition, nodes, num_nodes, gres, user, uid, account, qos, priority, resv) = values[:13]
    (submit, eligible, start, end, preempt, limit, exit_code, req, exc, host, tasks, per_node) = values[13:25]
    features, work_dir, name, comment, admin_comment = values[25:]
    if not job_id.isdigit():
        raise ParseError(f"squeue --Format: not a job id: {job_id[:40]!r}")
    try:
        state = state.strip().upper()
        reason = "" if reason == "None" else text(reason)
        gtype, gcount = _gres(gres)
        on = _hosts(nodes)
        prio = integer(priority)
        time_limit = minutes(limit)
        return SlurmJob(
            job_id=job_id,
            name=text(name),
            user=text(user) or text(uid),
            uid=integer(uid),
            state=state,
            reason=reason,
            partition=text(partition),
            nodes=on,
            num_nodes=integer(num_nodes) or len(on),
            gpus_per_node=gcount or None,
            gpu_type=gtype,
            held=state == "PENDING" and (prio == 0 or reason.startswith(_HELD_REASON)),
            features=text(features),
            required_nodes=_hosts(req),
            excluded_nodes=_hosts(exc),
            comment=text(comment),
            admin_comment=text(admin_comment),
            submit_time=epoch(submit),
            start_time=epoch(start),
            eligible_time=epoch(eligible),
            # as the JSON reader: no end for a job that runs unlimited (Slurm says start + 1 year)
            end_time=epoch(end) if state in FINISHED or time_limit is not None else None,
            exit_code=exit_status(exit_code) if state in FINISHED else None,
            time_limit=time_limit,
            batch_host="" if host == "n/a" else text(host),
            num_tasks=integer(tasks) or None,
            tasks_per_node=integer(per_node) or None,
            work_dir=text(work_dir),
            account=text(account),
            qos=text(qos),
            priority=prio,
            reservation=text(resv),
            preempted_at=epoch(preempt),
        )
    except (ParseError, ValueError, TypeError) as exc_:
        raise ParseError(f"squeue --Format: job {job_id}: {exc_}") from exc_


@functools.lru_cache(maxsize=4096)
def _gres(value: str) -> tuple[str | None, int]:
    """gpu_gres of a tres-per-node text (a few distinct ones among many jobs: kept)."""
    return gpu_gres(text(value))


@functools.lru_cache(maxsize=4096)
def _hosts(value: str) -> tuple[str, ...]:
    return expand_hostlist(text(value))


def needs_full_record(job: SlurmJob) -> bool:
    """Whether the round needs the job's whole JSON record: its state is a flag
    that Slurm prints in place of the base state (`BASE_STATES`: COMPLETING,
    REQUEUED, ...; the JSON record tells both apart), or its reason is a
    sentence: ``squeue --Format=Reason`` prints the job's state description
    where it has one ("Nodes required for job are DOWN, DRAINED or reserved
    for jobs in higher priority partitions", measured on 24.11) in place of the
    reason's name (Resources), which the JSON record keeps."""
    return job.state not in BASE_STATES or not _REASON_NAME.fullmatch(job.reason)


def merge(compact: tuple[SlurmJob, ...], full: Mapping[str, SlurmJob]) -> tuple[SlurmJob, ...]:
    """The round's jobs, in job id order: each compact record, or its whole
    record from `full`; a job whose whole record was needed and not found (it
    left Slurm between the two queries) is gone."""
    out = [full.get(j.job_id, j) for j in compact if j.job_id in full or not needs_full_record(j)]
    return tuple(sorted(out, key=lambda j: int(j.job_id)))
