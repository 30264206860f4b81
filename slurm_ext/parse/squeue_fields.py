"""Every job in one compact ``squeue --Format`` query: a round's read of the jobs.

Slurm 24.11's ``squeue --json`` is about 7.8 KB a job and takes 1.3 to 2.5 ms
a job (measured on the dev cluster: 13 to 25 s for 10,000 jobs on a loaded
machine). The fields a SlurmJob holds print in about 210 bytes a job with
``squeue --Format`` (0.2 to 0.4 s for the same 10,000).
So the cli backend asks for `FIELDS` of every job (`argv`), and the whole JSON
record only of the few jobs whose text does not say all (`needs_full_record`:
a state flag, a reason Slurm printed as a sentence).

Names, comments, AdminComments and working directories are the users' and
admins' own text: Slurm prints them raw, newlines and any delimiter included
(measured on 24.11: a Comment of ``"\\n123|RUNNING"`` prints as a line of its
own). So each record ends with `Format.end`, made from a random token drawn
for each query: a job submitted before the query cannot contain it, so no
text can end a record early or forge one. Within a record the fields are
separated by one unit separator (0x1F, `Format.sep`): a text holding it only
adds fields, so a record of exactly len(FIELDS) fields is read as printed,
and one of more is read whole, by its job id (the first field, Slurm's own).
Times are printed as epoch seconds (``SLURM_TIME_FORMAT=%s``: no time zone to
guess).

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

from slurm_ext.parse.values import NO_VAL, ParseError, epoch, exit_status, gpu_gres, integer, minutes
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
#: the state of a job whose record could not be read field by field (needs_full_record)
UNREADABLE = "(unreadable)"
#: what the name of a reason looks like (Resources, JobHeldUser, ...)
_REASON_NAME = re.compile(r"[A-Za-z0-9_]*")
#: how squeue prints a time that is not set
_UNSET = frozenset({"N/A", "NONE", "None", "Unknown", "(null)", ""})
#: a pending job held by a user or an admin (its priority is 0 too)
_HELD_REASON = "JobHeld"


@dataclass(frozen=True)
class Format:
    """One query's separators: `sep` between fields, `end` after a record."""

    token: str
    fields: tuple[tuple[str, str], ...] = FIELDS

    @classmethod
    def draw(cls) -> Format:
        return cls(secrets.token_hex(8))  # 64 bits: no job's text guesses it

    #: between two fields: short (it is printed 29 times a job); a text holding it adds a field
    sep = "\x1f"

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
    return Reader().parse(output, fmt)


class Reader:
    """Parses `argv`'s output round after round, keeping the last round's
    records: a job whose fields Slurm prints as it did last time is that
    record again (most of a long queue does not change between two rounds),
    so a round parses only the jobs that changed. A record's text is the key
    (the token is in none: it is only in `Format.end`)."""

    def __init__(self) -> None:
        self._last: dict[str, SlurmJob] = {}

    def parse(self, output: str, fmt: Format) -> tuple[SlurmJob, ...]:
        chunks = output.split(fmt.end + "\n")
        if chunks[-1].strip():
            raise ParseError(f"squeue --Format: output does not end with a whole record: {chunks[-1][:80]!r}")
        last, now = self._last, {}
        for chunk in chunks[:-1]:
            job = last.get(chunk)
            now[chunk] = job if job is not None else _record(chunk.split(fmt.sep), fmt)
        self._last = now
        return tuple(now.values())


def _record(values: list[str], fmt: Format) -> SlurmJob:
    if len(values) != len(fmt.fields):
        # a text holding the separator: the job id (printed first, by Slurm) says which job to read whole
        if not values[0].isdigit():
            raise ParseError(f"squeue --Format: a record of {len(values)} fields, not {len(fmt.fields)}")
        return SlurmJob(job_id=values[0], state=UNREADABLE)
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
        reason = "" if reason == "None" else _text(reason)
        gtype, gcount = _gres(gres)
        on = _hosts(nodes)
        prio = _int(priority)
        time_limit = _minutes(limit)
        return SlurmJob(
            job_id=job_id,
            name=_text(name),
            user=_text(user) or _text(uid),
            uid=_int(uid),
            state=state,
            reason=reason,
            partition=_text(partition),
            nodes=on,
            num_nodes=_int(num_nodes) or len(on),
            gpus_per_node=gcount or None,
            gpu_type=gtype,
            held=state == "PENDING" and (prio == 0 or reason.startswith(_HELD_REASON)),
            features=_text(features),
            required_nodes=_hosts(req),
            excluded_nodes=_hosts(exc),
            comment=_text(comment),
            admin_comment=_text(admin_comment),
            submit_time=_when(submit),
            start_time=_when(start),
            eligible_time=_when(eligible),
            # as the JSON reader: no end for a job that runs unlimited (Slurm says start + 1 year)
            end_time=_when(end) if state in FINISHED or time_limit is not None else None,
            exit_code=exit_status(exit_code) if state in FINISHED else None,
            time_limit=time_limit,
            batch_host="" if host == "n/a" else _text(host),
            num_tasks=_int(tasks) or None,
            tasks_per_node=_int(per_node) or None,
            work_dir=_text(work_dir),
            account=_text(account),
            qos=_text(qos),
            priority=prio,
            reservation=_text(resv),
            preempted_at=_when(preempt),
        )
    except (ParseError, ValueError, TypeError) as exc_:
        raise ParseError(f"squeue --Format: job {job_id}: {exc_}") from exc_


# The decoders of slurm_ext.parse.values, with a short way for the common case (10,000 jobs a round)


def _text(value: str) -> str:
    """values.text of a printed field."""
    s = value.strip()
    return "" if s == "(null)" else s


def _int(value: str) -> int | None:
    """values.integer of a printed field."""
    return integer(value) if not value.isdigit() else (None if int(value) in NO_VAL else int(value))


def _when(value: str) -> float | None:
    """values.epoch of a time printed as epoch seconds (SLURM_TIME_FORMAT=%s); 0: unset."""
    if value.isdigit():
        return float(value) or None
    return None if value in _UNSET else epoch(value)


@functools.lru_cache(maxsize=4096)
def _minutes(value: str) -> int | None:
    return minutes(value)


@functools.lru_cache(maxsize=4096)
def _gres(value: str) -> tuple[str | None, int]:
    """gpu_gres of a tres-per-node text (a few distinct ones among many jobs: kept)."""
    return gpu_gres(_text(value))


@functools.lru_cache(maxsize=4096)
def _hosts(value: str) -> tuple[str, ...]:
    return expand_hostlist(_text(value))


def needs_full_record(job: SlurmJob) -> bool:
    """Whether the round needs the job's whole JSON record: a text of it held
    the field separator (state UNREADABLE), its state is a flag that Slurm
    prints in place of the base state (`BASE_STATES`: COMPLETING,
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
