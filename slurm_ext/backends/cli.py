"""The default backend: Slurm's own commands, JSON where the version has it.

- Slurm >= 23.02: ``scontrol --json show node|partition``, ``squeue --json``.
- Slurm 21.08 - 22.05: ``sinfo --json``, ``squeue --json``, and partitions
  from ``scontrol show -o partition`` (22.05 has no JSON for them).
- Older, or ``mode="text"``: ``scontrol [-d] -o show node|job|partition``.

Every call is an argument list with a timeout; a slurmctld that does not
answer raises SlurmUnavailable within about `ping_timeout` seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping

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
from slurm_ext.parse import json_output, scontrol_text
from slurm_ext.parse.values import ParseError
from slurm_ext.records import ClusterSnapshot, SlurmJob, compress_hostlist

#: stderr fragments that mean "slurmctld is not there" rather than "bad request"
_UNREACHABLE = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "Zero Bytes were transmitted",
    "Could not establish a configuration source",
    "Communication connection failure",
)
_ALREADY_DONE = ("already completing or completed", "Job/step already completing")
#: what runs a command: subprocess.run, or a stand-in taking the same arguments
Runner = Callable[..., subprocess.CompletedProcess[str]]


def slurm_version(text: str) -> tuple[int, int] | None:
    """(major, minor) from ``slurm 23.11.4`` / ``slurm-wlm 22.05.8``."""
    m = re.search(r"(\d+)\.(\d+)\.\d+", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


class CliBackend:
    """Backend over sbatch / squeue / sinfo / scontrol / scancel.

    `run` runs each command (subprocess.run; tests pass a stand-in that
    records the argument lists)."""

    name = "cli"

    def __init__(
        self,
        *,
        timeout: float = 10.0,
        ping_timeout: float = 3.0,
        mode: str = "auto",
        slurm_conf: str | None = None,
        run: Runner = subprocess.run,
    ) -> None:
        if mode not in ("auto", "json", "text"):
            raise ValueError(f"mode must be 'auto', 'json' or 'text', got {mode!r}")
        if timeout <= 0 or ping_timeout <= 0:
            raise ValueError("timeout and ping_timeout must be > 0")
        self.timeout = timeout
        self.ping_timeout = ping_timeout
        self.mode = mode
        self.slurm_conf = slurm_conf
        self._runner = run
        self._version: tuple[int, int] | None = None

    # --- running commands --------------------------------------------------

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        env.update(extra or {})
        return env

    def _run(self, args: list[str], *, timeout: float | None = None, env: Mapping[str, str] | None = None) -> str:
        """Run a Slurm command; its stdout, or a SlurmError."""
        limit = timeout or self.timeout
        try:
            proc = self._runner(args, capture_output=True, text=True, timeout=limit, env=self._env(env), check=False)
        except subprocess.TimeoutExpired as exc:
            raise SlurmUnavailable(f"{args[0]} did not answer within {limit:g} s (is slurmctld up?)") from exc
        except FileNotFoundError as exc:
            raise SlurmUnavailable(f"{args[0]} not found: are the Slurm client commands installed?") from exc
        if proc.returncode != 0:
            err = (proc.stderr or proc.stdout).strip()
            if any(s in err for s in _UNREACHABLE):
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
                    partitions = json_output.parse_partitions(self._run(["scontrol", "--json", "show", "partition"]))
                else:
                    nodes = json_output.parse_nodes(self._run(["sinfo", "--json"]))
                    partitions = scontrol_text.parse_partitions(self._run(["scontrol", "-o", "show", "partition"]))
                jobs = json_output.parse_jobs(self._run(["squeue", "--json", "--states=all"]))
        except ParseError as exc:
            raise SlurmCommandError(f"observe ({style})", 0, f"unexpected Slurm output: {exc}") from exc
        return ClusterSnapshot(nodes=nodes, partitions=partitions, jobs=jobs, taken_at=taken_at)

    def job(self, job_id: str) -> SlurmJob:
        """One job, read now."""
        check_job_id(job_id)
        if self._style() == "text":
            found = scontrol_text.parse_jobs(self._run(["scontrol", "-o", "show", "job", job_id]))
        else:
            found = json_output.parse_jobs(self._run(["squeue", "--json", "--states=all", f"--jobs={job_id}"]))
        for j in found:
            if j.job_id == job_id:
                return j
        raise SlurmCommandError(["squeue", f"--jobs={job_id}"], 0, f"job {job_id} not found")

    def _partition_nodes(self, partitions: str) -> set[str]:
        """Nodes of a job's partition list ("a40" or "a40,all")."""
        nodes: set[str] = set()
        for name in filter(None, partitions.split(",")):
            for p in scontrol_text.parse_partitions(self._run(["scontrol", "-o", "show", "partition", name])):
                nodes.update(p.nodes)
        return nodes

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
        check_job_id(job_id)
        args = ["scontrol", "update", f"JobId={job_id}"]
        if change.partition is not None:
            args.append(f"Partition={change.partition}")
        if change.features is not None:
            args.append(f"Features={change.features}")
        if change.num_nodes is not None:
            args.append(f"NumNodes={change.num_nodes}-{change.num_nodes}")
        if change.req_nodes is not None:
            args.append(f"ReqNodeList={compress_hostlist(change.req_nodes)}")
        if change.exc_nodes is not None:
            args.append(f"ExcNodeList={compress_hostlist(change.exc_nodes)}")
        if change.gres_per_node is not None:
            args.append(f"Gres=gpu:{change.gres_per_node}")
        if change.num_tasks is not None:
            args.append(f"NumTasks={change.num_tasks}")
        if change.tasks_per_node is not None:
            args.append(f"TasksPerNode={change.tasks_per_node}")
        if change.min_cpus_per_node is not None:
            args.append(f"MinCPUsNode={change.min_cpus_per_node}")
        if change.admin_comment is not None:
            args.append(f"AdminComment={change.admin_comment}")
        if change.start_soon:
            args.append(f"StartTime={START_SOON}")
        failure = ""
        try:
            self._run(args)
        except SlurmCommandError as exc:
            failure = exc.stderr or str(exc)  # some fields may still have been applied
        try:
            job = self.job(job_id)
        except SlurmCommandError:
            if failure:  # e.g. no such job: Slurm's own message says it best
                raise SlurmCommandError(args, 1, failure) from None
            raise
        bad = update_mismatches(job, change, self._partition_nodes(job.partition) if job.required_nodes else None)
        if bad:
            raise UpdateNotApplied(job_id, bad, job, failure)
        if failure:
            raise SlurmCommandError(args, 1, failure)
        return job

    def hold(self, job_id: str) -> None:
        self._run(["scontrol", "hold", check_job_id(job_id)])

    def release(self, job_id: str) -> None:
        self._run(["scontrol", "release", check_job_id(job_id)])

    def requeue(self, job_id: str, *, hold: bool = False) -> None:
        self._run(["scontrol", "requeuehold" if hold else "requeue", check_job_id(job_id)])

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
