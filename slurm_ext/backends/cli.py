"""The default backend: Slurm's own commands, JSON where the version has it.

- Slurm >= 23.02: ``scontrol --json show node``, ``squeue --json`` (data_parser
  shapes; recorded on 24.11 at v0.0.40 to v0.0.42), partitions from ``scontrol
  -o show partition`` (24.11's JSON has no Default flag for them). A round's
  jobs: every job's fields in one ``squeue --Format`` query and whole JSON
  records only of the few jobs whose text does not say all
  (`CliBackend._round_jobs`, slurm_ext.parse.squeue_fields). A read-back
  asks for its jobs only: ``scontrol --json show job ID`` for one,
  ``squeue --json --jobs=...`` for several (22.05's squeue ignores --jobs).
- Slurm 21.08 - 22.05: ``sinfo --json``, ``squeue --json``, and partitions
  from ``scontrol show -o partition`` (22.05 has no JSON for them).
- Older, or ``mode="text"``: ``scontrol [-d] -o show node|job|partition``.

Every call is an argument list with a timeout; a slurmctld that does not
answer raises SlurmUnavailable within about `ping_timeout` seconds.

Many jobs at once (a round placing hundreds): one ``scontrol`` reads the
updates of UPDATES_PER_CALL jobs from its standard input (a process per job
costs ~10 ms of CPU; see `_stdin_line` for why a line is read exactly as the
argument list it stands for), `workers` such calls at a time, then one
read-back checks every job;
``scontrol hold|release|requeuehold`` take the whole list in one call, and
only when that call fails is each job it left undone tried alone, for its own
error.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slurm_ext.backends.base import (
    ALL,
    BATCH,
    START_SOON,
    STEPS,
    JobUpdate,
    SlurmCommandError,
    SlurmUnavailable,
    SubmitRequest,
    UpdateNotApplied,
    check_job_id,
    check_signal,
    check_signal_target,
    update_mismatches,
)
from slurm_ext.parse import json_output, scontrol_text, squeue_fields
from slurm_ext.parse.values import ParseError
from slurm_ext.records import ClusterSnapshot, SlurmJob, compress_hostlist
from slurm_ext.site import SiteReader, SiteReading

#: stderr fragments that mean "slurmctld is not there" rather than "bad request"
UNREACHABLE = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "Zero Bytes were transmitted",
    "Could not establish a configuration source",
    "Communication connection failure",
    "Connection reset by peer",  # 24.11 under load: slurmctld closed the connection unanswered
)
#: a job update refused "for now": Slurm 24.11 answers some updates of a held job's partition and
#: nodes so (the same update on a fresh job passing at other times); tried again, TRANSIENT_TRIES
#: times in all, 0.1 s, 0.2 s, ... apart, then split (CliBackend._update_alone)
_TRANSIENT = ("Resource temporarily unavailable", "Interrupted system call")
TRANSIENT_TRIES = 5
#: what Slurm says of a job id it does not know (purged, or never was)
_UNKNOWN_JOB = "Invalid job id specified"
_ALREADY_DONE = ("already completing or completed", "Job/step already completing")
#: what runs a command: subprocess.run, or a stand-in taking the same arguments
Runner = Callable[..., subprocess.CompletedProcess[str]]
#: job ids per ``scontrol hold|release|requeuehold`` call
IDS_PER_CALL = 200
#: job ids per ``squeue --json --jobs`` of a round's read (the list is one argument: at most 128 KiB)
IDS_PER_READ = 5000
#: job updates one ``scontrol`` reads from its standard input
UPDATES_PER_CALL = 50
#: a token scontrol's command reader takes verbatim: printable ASCII, no blank
_VERBATIM = re.compile(r"^[\x21-\x7e]+$")
#: the longest command line fed to scontrol (its reader without readline takes 4095 bytes)
_LINE_MAX = 4000


def slurm_version(text: str) -> tuple[int, int] | None:
    """(major, minor) from ``slurm 23.11.4`` / ``slurm-wlm 22.05.8``."""
    m = re.search(r"(\d+)\.(\d+)\.\d+", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class CliBackend:
    """Backend over sbatch / squeue / sinfo / scontrol / scancel.

    `run` runs each command (subprocess.run; tests pass a stand-in that
    records the argument lists); `workers`: how many ``scontrol update``
    run at once in `update_many` (slurmctld serialises job updates under
    one lock: more only adds waiting; benchmarks/controller_round.py);
    `compact`: on Slurm 23.02+, read a round's jobs as `_round_jobs` does
    (False: every job's whole JSON record, as benchmarks/observe_live.py
    compares)."""

    name = "cli"

    def __init__(
        self,
        *,
        timeout: float = 10.0,
        ping_timeout: float = 3.0,
        mode: str = "auto",
        slurm_conf: str | None = None,
        workers: int = 4,
        compact: bool = True,
        run: Runner = subprocess.run,
    ) -> None:
        if mode not in ("auto", "json", "text"):
            raise ValueError(f"mode must be 'auto', 'json' or 'text', got {mode!r}")
        if timeout <= 0 or ping_timeout <= 0:
            raise ValueError("timeout and ping_timeout must be > 0")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self.compact = compact
        self._compact = squeue_fields.Reader()  # keeps the last round's records
        self.timeout = timeout
        self.ping_timeout = ping_timeout
        self.mode = mode
        self.slurm_conf = slurm_conf
        self._runner = run
        self._version: tuple[int, int] | None = None
        self._site = SiteReader(self._run)

    # --- running commands --------------------------------------------------

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        env.update(extra or {})
        return env

    def _run(
        self,
        args: list[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
    ) -> str:
        """Run a Slurm command (fed `stdin`); its stdout, or a SlurmError."""
        limit = timeout or self.timeout
        extra = {"input": stdin} if stdin is not None else {}
        try:
            proc = self._runner(
                args, capture_output=True, text=True, timeout=limit, env=self._env(env), check=False, **extra
            )
        except subprocess.TimeoutExpired as exc:
            raise SlurmUnavailable(f"{args[0]} did not answer within {limit:g} s (is slurmctld up?)") from exc
        except FileNotFoundError as exc:
            raise SlurmUnavailable(f"{args[0]} not found: are the Slurm client commands installed?") from exc
        if proc.returncode < 0:  # killed: SIGPIPE when slurmctld closed the connection under load
            raise SlurmUnavailable(f"{args[0]} was killed by {_signal_name(-proc.returncode)} before it answered")
        if proc.returncode != 0:
            err = (proc.stderr or proc.stdout).strip()
            if any(s in err for s in UNREACHABLE):
                raise SlurmUnavailable(f"{args[0]}: {err.splitlines()[-1] if err else 'controller unreachable'}")
            raise SlurmCommandError(args, proc.returncode, err)
        return proc.stdout

    def ping(self) -> None:
        """SlurmUnavailable unless slurmctld answers within ping_timeout."""
        try:
            out = self._run(["scontrol", "ping"], timeout=self.ping_timeout)
        except SlurmCommandError as exc:
            first = (exc.stderr or "scontrol ping failed").splitlines()[0]
            raise SlurmUnavailable(f"slurmctld is not responding ({first})") from exc
        if "is UP" not in out:
            first = (out.strip() or "no answer").splitlines()[0]
            raise SlurmUnavailable(f"slurmctld is not responding ({first})")

    def version(self) -> tuple[int, int] | None:
        """The Slurm release (major, minor) of the client commands, cached."""
        if self._version is None:
            try:
                self._version = slurm_version(self._run(["sinfo", "--version"], timeout=self.ping_timeout))
            except (SlurmUnavailable, SlurmCommandError):
                self._version = None
        return self._version

    def _style(self) -> str:
        """ "scontrol-json" (23.02+), "sinfo-json" (21.08-22.05) or "text"."""
        if self.mode == "text":
            return "text"
        v = self.version()
        if v is None:
            return "sinfo-json" if self.mode == "json" else "text"
        if v >= (23, 2):
            return "scontrol-json"
        if v >= (21, 8) or self.mode == "json":
            return "sinfo-json"
        return "text"

    # --- reading -------------------------------------------------------------

    def observe(self) -> ClusterSnapshot:
        taken_at = time.time()
        self.ping()
        style = self._style()
        try:
            if style == "text":
                nodes = scontrol_text.parse_nodes(self._run(["scontrol", "-d", "-o", "show", "node"]))
                partitions = scontrol_text.parse_partitions(self._run(["scontrol", "-o", "show", "partition"]))
                jobs = scontrol_text.parse_jobs(self._run(["scontrol", "-o", "show", "job"]))
            else:
                if style == "scontrol-json":
                    nodes = json_output.parse_nodes(self._run(["scontrol", "--json", "show", "node"]))
                else:
                    nodes = json_output.parse_nodes(self._run(["sinfo", "--json"]))
                # text: the JSON of 23.02+ leaves out which partition is the default (recorded on 24.11)
                partitions = scontrol_text.parse_partitions(self._run(["scontrol", "-o", "show", "partition"]))
                jobs = self._round_jobs() if style == "scontrol-json" and self.compact else self._all_jobs_json()
        except ParseError as exc:
            raise SlurmCommandError(f"observe ({style})", 0, f"unexpected Slurm output: {exc}") from exc
        return ClusterSnapshot(nodes=nodes, partitions=partitions, jobs=jobs, taken_at=taken_at)

    def _all_jobs_json(self) -> tuple[SlurmJob, ...]:
        """Every job's whole record: ``squeue --json --states=all``."""
        return json_output.parse_jobs(self._run(["squeue", "--json", "--states=all"]))

    def _round_jobs(self) -> tuple[SlurmJob, ...]:
        """Every job, as a round reads them (Slurm 23.02+, where ``squeue --json
        --jobs`` answers with those jobs only): each one's fields in one
        ``squeue --Format`` query (slurm_ext.parse.squeue_fields: every field
        of a SlurmJob; a job printed as last round is last round's record), and
        the whole JSON records of the few jobs whose text does not say all in
        one ``squeue --json --jobs``."""
        fmt = squeue_fields.Format.draw()
        compact = self._compact.parse(self._run(squeue_fields.argv(fmt), env=squeue_fields.TIME_ENV), fmt)
        wanted = sorted((j.job_id for j in compact if squeue_fields.needs_full_record(j)), key=int)
        full: dict[str, SlurmJob] = {}
        for k in range(0, len(wanted), IDS_PER_READ):
            chunk = wanted[k : k + IDS_PER_READ]
            found = json_output.parse_jobs(self._run(["squeue", "--json", "--states=all", f"--jobs={','.join(chunk)}"]))
            asked = set(chunk)  # 22.05's squeue would answer with every job
            full.update((j.job_id, j) for j in found if j.job_id in asked)
        return squeue_fields.merge(compact, full)

    def read_site(self) -> SiteReading:
        """The site's standing policy (slurm_ext.site): sacctmgr, sshare and
        scontrol; SlurmError or ParseError when accounting cannot be read."""
        return self._site.read(time.time())

    def job(self, job_id: str) -> SlurmJob:
        """One job, read now."""
        check_job_id(job_id)
        found = self.jobs([job_id])
        if job_id not in found:
            raise SlurmCommandError(["squeue", f"--jobs={job_id}"], 0, f"job {job_id} not found")
        return found[job_id]

    def jobs(self, job_ids: Sequence[str]) -> dict[str, SlurmJob]:
        """These jobs, read now in one call (those Slurm no longer knows are missing)."""
        wanted = {check_job_id(j) for j in job_ids}
        style = self._style()
        if style == "text":
            one = [next(iter(wanted))] if len(wanted) == 1 else []
            found = scontrol_text.parse_jobs(self._run(["scontrol", "-o", "show", "job", *one]))
        elif style == "scontrol-json" and len(wanted) == 1 and (one_job := self._one_job_json(next(iter(wanted)))):
            found = one_job  # one job: 20 ms where squeue takes 35 (24.11); squeue asked again when it says none
        else:  # 22.05 answers with every job whatever --jobs says; later ones filter
            found = json_output.parse_jobs(
                self._run(["squeue", "--json", "--states=all", f"--jobs={','.join(sorted(wanted))}"])
            )
        return {j.job_id: j for j in found if j.job_id in wanted}

    def _one_job_json(self, job_id: str) -> tuple[SlurmJob, ...]:
        """``scontrol --json show job ID``; () for a job Slurm does not know."""
        try:
            return json_output.parse_jobs(self._run(["scontrol", "--json", "show", "job", job_id]))
        except SlurmCommandError as exc:
            if _UNKNOWN_JOB in exc.stderr:
                return ()
            raise
        except ParseError as exc:
            if _UNKNOWN_JOB in str(exc):
                return ()
            raise

    def _jobs_or_none(self, job_ids: Sequence[str]) -> dict[str, SlurmJob]:
        """`jobs`, but {} when Slurm refuses to show them (one job it no longer knows)."""
        try:
            return self.jobs(job_ids)
        except SlurmCommandError:
            return {}

    def _partition_nodes(self) -> dict[str, set[str]]:
        """partition -> its nodes, read now."""
        parts = scontrol_text.parse_partitions(self._run(["scontrol", "-o", "show", "partition"]))
        return {p.name: set(p.nodes) for p in parts}

    # --- writing -------------------------------------------------------------

    def submit(self, req: SubmitRequest) -> str:
        if not os.path.isfile(req.script):
            raise ValueError(f"SubmitRequest.script: no such file {req.script!r}")
        args = ["sbatch", "--parsable"]
        opt = {
            "--job-name": req.job_name,
            "--partition": req.partition,
            "--nodes": req.nodes,
            "--ntasks-per-node": req.ntasks_per_node,
            "--cpus-per-task": req.cpus_per_task,
            "--time": req.time_limit,
            "--comment": req.comment,
            "--constraint": req.constraint,
            "--output": req.output,
            "--error": req.error,
            "--export": req.export,
            "--account": req.account,
            "--qos": req.qos,
            "--chdir": req.workdir,
        }
        args += [f"{k}={v}" for k, v in opt.items() if v is not None]
        if req.gres_per_node:
            args.append(f"--gres=gpu:{req.gres_per_node}")
        if req.hold:
            args.append("--hold")
        args += [*req.extra_args, "--", req.script, *req.script_args]
        out = self._run(args, env=req.env).strip()
        job_id = out.split(";", 1)[0].strip()
        if not job_id.isdigit():
            raise SlurmCommandError(args, 0, f"sbatch printed no job id: {out!r}")
        return job_id

    def update(self, job_id: str, change: JobUpdate) -> SlurmJob:
        result = self.update_many({job_id: change})[job_id]
        if isinstance(result, Exception):
            raise result
        return result

    def update_many(self, changes: Mapping[str, JobUpdate]) -> dict[str, SlurmJob | Exception]:
        argvs = {check_job_id(j): _update_args(j, c) for j, c in changes.items()}
        if not argvs:
            return {}
        lines = {j: _stdin_line(a) for j, a in argvs.items()}
        fed = [j for j, line in lines.items() if line is not None] if len(argvs) > 1 else []
        chunks = [fed[k : k + UPDATES_PER_CALL] for k in range(0, len(fed), UPDATES_PER_CALL)]
        failures = dict.fromkeys(argvs, "")
        with ThreadPoolExecutor(max_workers=min(self.workers, len(argvs))) as pool:  # SlurmUnavailable comes through
            # a chunk whose scontrol failed: its jobs again, each alone, for each one's own message
            alone = [j for j in argvs if j not in fed]
            fed_ok = pool.map(self._feed, [[lines[j] for j in chunk] for chunk in chunks])
            alone += [j for chunk, ok in zip(chunks, fed_ok, strict=True) if not ok for j in chunk]
            failures.update(zip(alone, pool.map(self._update_alone, [argvs[j] for j in alone]), strict=True))
        jobs = self._jobs_or_none(list(argvs))
        members = self._partition_nodes() if any(j.required_nodes for j in jobs.values()) else {}
        out: dict[str, SlurmJob | Exception] = {}
        for job_id, change in changes.items():
            args, failure, job = argvs[job_id], failures[job_id], jobs.get(job_id)
            if job is None:  # e.g. no such job: Slurm's own message says it best
                out[job_id] = SlurmCommandError(
                    args if failure else ["squeue", f"--jobs={job_id}"], 1, failure or f"job {job_id} not found"
                )
                continue
            nodes = (
                set().union(*(members.get(p, set()) for p in job.partition.split(","))) if job.required_nodes else None
            )
            bad = update_mismatches(job, change, nodes)
            if bad:  # some fields may have been applied despite a failure, others ignored without one
                out[job_id] = UpdateNotApplied(job_id, bad, job, failure)
            elif failure:
                out[job_id] = SlurmCommandError(args, 1, failure)
            else:
                out[job_id] = job
        return out

    def _feed(self, lines: list[str]) -> bool:
        """One ``scontrol`` reading these command lines; did every one succeed?
        INPUTRC=/dev/null: no site or user readline bindings (scontrol reads
        its input through readline when it is built with it)."""
        limit = self.timeout + 0.1 * len(lines)
        return not self._try(["scontrol"], stdin="\n".join(lines) + "\n", timeout=limit, env={"INPUTRC": "/dev/null"})

    def _update_alone(self, args: list[str]) -> str:
        """One job's ``scontrol update``; "" when it succeeded, else Slurm's message. When
        Slurm keeps answering "not now" (_TRANSIENT) to an update that changes the partition
        with other fields, the other fields go first and the partition after them: Slurm 24.11
        refuses a partition and a node list in one update of a job pinned to other nodes, and
        takes them one after the other (measured on the dev cluster)."""
        failure = self._try(args)
        partition = [a for a in args[3:] if a.startswith("Partition=")]
        rest = [a for a in args if a not in partition]
        if failure and partition and len(rest) > 3 and any(t in failure for t in _TRANSIENT):
            failure = self._try(rest) or self._try([*args[:3], *partition])
        return failure

    def _try(self, args: list[str], **run: Any) -> str:
        """Run a command; "" when it succeeded, else Slurm's message. A refusal
        that only says "not now" (_TRANSIENT) is tried again, TRANSIENT_TRIES in all."""
        for attempt in range(TRANSIENT_TRIES):
            try:
                self._run(args, **run)
            except SlurmCommandError as exc:
                message = exc.stderr or str(exc)
                if attempt + 1 == TRANSIENT_TRIES or not any(t in message for t in _TRANSIENT):
                    return message
                time.sleep(0.1 * 2**attempt)
            else:
                return ""
        raise AssertionError("unreachable")

    def _many(self, verb: list[str], job_ids: Sequence[str], done: Callable[[SlurmJob], bool]) -> dict[str, Exception]:
        """`verb` for the whole list, IDS_PER_CALL ids a call. When a call
        fails, the jobs it left undone (read back; `done` tells) are tried
        one at a time, so each failure carries that job's own message."""
        ids = [check_job_id(j) for j in job_ids]
        failed: dict[str, Exception] = {}
        for k in range(0, len(ids), IDS_PER_CALL):
            chunk = ids[k : k + IDS_PER_CALL]
            if not self._try([*verb, *chunk]):
                continue
            now = self._jobs_or_none(chunk)
            for job_id in chunk:
                if job_id in now and done(now[job_id]):
                    continue
                try:
                    self._run([*verb, job_id])
                except SlurmCommandError as exc:
                    failed[job_id] = exc
        return failed

    def hold(self, job_id: str) -> None:
        self._run(["scontrol", "hold", check_job_id(job_id)])

    def release(self, job_id: str) -> None:
        self._run(["scontrol", "release", check_job_id(job_id)])

    def requeue(self, job_id: str, *, hold: bool = False) -> None:
        self._run(["scontrol", "requeuehold" if hold else "requeue", check_job_id(job_id)])

    def hold_many(self, job_ids: Sequence[str]) -> dict[str, Exception]:
        return self._many(["scontrol", "hold"], job_ids, lambda j: j.held)

    def release_many(self, job_ids: Sequence[str]) -> dict[str, Exception]:
        return self._many(["scontrol", "release"], job_ids, lambda j: not j.held and not j.finished)

    def requeue_many(self, job_ids: Sequence[str], *, hold: bool = False) -> dict[str, Exception]:
        verb = ["scontrol", "requeuehold" if hold else "requeue"]
        # requeued: on its way out (COMPLETING, REQUEUE*), or pending again (and held, if asked)
        return self._many(
            verb, job_ids, lambda j: j.state.startswith(("COMPLETING", "REQUEUE")) or (j.pending and j.held == hold)
        )

    def cancel(self, job_id: str) -> None:
        """Cancel; a job that already finished counts as cancelled."""
        try:
            self._run(["scancel", check_job_id(job_id)])
        except SlurmCommandError as exc:
            if not any(s in exc.stderr for s in _ALREADY_DONE):
                raise

    def signal(self, job_id: str, signal: str, *, target: str = BATCH) -> None:
        check_job_id(job_id)
        check_signal(signal)
        # scancel --signal without --batch/--full signals the steps only
        where = {BATCH: ["--batch"], STEPS: [], ALL: ["--full"]}[check_signal_target(target)]
        self._run(["scancel", f"--signal={signal}", *where, job_id])


def _stdin_line(args: list[str]) -> str | None:
    """An ``scontrol update`` argument list as one line of scontrol's command
    reader, or None when the line might not read back as exactly these
    arguments. scontrol splits a line at blanks only (quotes just keep blanks
    inside a token) and reads every other byte as it is: measured on Slurm
    22.05 with quotes, backslashes, ``#!$(`` and unbalanced quotes in an
    AdminComment. So a line of tokens that are printable ASCII without blanks
    (no control character a line editor might act on, no newline) and shorter
    than scontrol's line buffer is these arguments and nothing else: no token
    can reach another job. Every job is read back afterwards anyway."""
    if not all(_VERBATIM.match(a) for a in args[1:]):
        return None
    line = " ".join(args[1:])
    return line if len(line) <= _LINE_MAX else None


def _update_args(job_id: str, change: JobUpdate) -> list[str]:
    """The ``scontrol update`` argument list carrying `change` (its fields that are set)."""
    c = change

    def given(value: Any, shown: Callable[[Any], object] = str) -> str | None:
        return None if value is None else str(shown(value))

    fields = (
        ("Partition", given(c.partition)),
        ("Features", given(c.features)),
        ("NumNodes", given(c.num_nodes, lambda n: f"{n}-{n}")),
        ("ReqNodeList", given(c.req_nodes, compress_hostlist)),
        ("ExcNodeList", given(c.exc_nodes, compress_hostlist)),
        ("Gres", given(c.gres_per_node, "gpu:{}".format)),
        ("NumTasks", given(c.num_tasks)),
        ("TasksPerNode", given(c.tasks_per_node)),
        ("MinCPUsNode", given(c.min_cpus_per_node)),
        ("AdminComment", given(c.admin_comment)),
        ("StartTime", START_SOON if c.start_soon else None),
    )
    return ["scontrol", "update", f"JobId={job_id}", *(f"{k}={v}" for k, v in fields if v is not None)]
