"""`cellsched status` (managed jobs, from the controller's state) and
`cellsched plan` (what the next round would do, without doing it)."""

from __future__ import annotations

import json
import os
import pwd
import re
import sys
import time
from pathlib import Path
from typing import Any

import click

from slurm_ext.cli.controller_cmd import ControllerError, load_config, new_controller, open_state
from slurm_ext.controller.progress import FROM_ESTIMATE, FROM_FILE
from slurm_ext.records import FINISHED
from slurm_ext.state import HistoryEvent, RoundStatus, SpeedRow, StateStore, restart_stats
from slurm_ext.textsafe import printable
from solver.contract.plan import JobPlan, PlanError
from solver.site import parse_reason

_CONFIG = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Config file (default: $CELLSCHED_CONFIG, else /etc/cellsched/cellsched.toml).",
)
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def slurm_user(conf: str | None = None) -> str:
    """SlurmUser from slurm.conf ($SLURM_CONF, else /etc/slurm/slurm.conf); "root" when unset."""
    path = Path(conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    try:
        for line in path.read_text().splitlines():
            m = re.match(r"^\s*SlurmUser\s*=\s*(\S+)", line, re.IGNORECASE)
            if m:
                return m.group(1)
    except OSError:
        pass
    return "root"


def viewer() -> str | None:
    """The user whose jobs the caller may see; None = everyone's (root or SlurmUser)."""
    uid = os.getuid()
    name = pwd.getpwuid(uid).pw_name if uid != 0 else "root"
    return None if uid == 0 or name == slurm_user() else name


#: the STATE of a finished job whose end Slurm never showed (it vanished from squeue while live)
ENDED = "ENDED"


def shown_state(slurm_state: str | None, finished: bool) -> str | None:
    """The state to show: Slurm's, its final one for a finished job (ENDED when
    Slurm dropped the job before its end was seen); None when never seen."""
    if finished and slurm_state not in FINISHED:
        return ENDED
    return slurm_state or None


def progress_text(done: float | None, total: int | None, source: str | None, state: str | None) -> str:
    """PROGRESS as known: "done/total" from the job's progress file, "~done/total"
    for a live job's estimate from its run time, "-" when not known (no count,
    only an estimate for a job that has ended, or a job whose end was not seen)."""
    if done is None or not total or source not in (FROM_FILE, FROM_ESTIMATE) or state == ENDED:
        return "-"
    if source == FROM_ESTIMATE:
        return "-" if state in FINISHED else f"~{int(done)}/{total}"
    return f"{int(done)}/{total}"


def speed_fields(sp: SpeedRow | None) -> dict[str, Any]:
    """A job's seconds per iteration on its last GPU type: the profile's
    estimate, the controller's calibrated estimate and what the job reported."""
    return {
        "iter_s_profile": round(sp.estimated_s, 4) if sp else None,
        "iter_s_estimated": round(sp.calibrated_s, 4) if sp and sp.calibrated_s else None,
        "iter_s_observed": round(sp.observed_s, 4) if sp else None,
    }


def job_rows(
    state: StateStore, *, now: float, only_user: str | None = None, include_finished: bool = False
) -> list[dict[str, Any]]:
    """One dict per managed job: id, user, state (`shown_state`), phase, cell,
    nodes, plan (pp/dp/tp ...), estimated samples/s, seconds per iteration
    (`speed_fields`), progress (raw, and as `progress_text`), time in queue,
    reason. Unknown values are None."""
    plans = state.latest_plans(applied_only=True)
    speeds: dict[str, SpeedRow] = {}
    for sp in state.speeds():  # newest first: the job's last GPU type
        speeds.setdefault(sp.job_id, sp)
    rows = []
    for job in state.jobs(include_finished=include_finished).values():
        if only_user is not None and job.user != only_user:
            continue
        spec = json.loads(job.spec) if job.spec else {}
        p = plans.get(job.job_id)
        plan: JobPlan | None = None
        if p is not None:
            try:
                plan = JobPlan.from_json(p.plan)
            except PlanError:
                plan = None
        iterations = spec.get("iterations")
        shown = shown_state(job.slurm_state, job.finished)
        queued_until = job.start_time if job.start_time else (job.end_time if job.finished else now)
        rows.append(
            {
                "job_id": job.job_id,
                "user": job.user,
                "state": shown,
                "finished": job.finished,
                "phase": job.phase,
                "model": spec.get("model"),
                "cell": p.cell if p else None,
                "gpu_type": plan.gpu_types[0] if plan and plan.gpu_types else None,
                "gpus": plan.world_size if plan else None,
                "nodes": [f"{n}:{g}" for n, g in p.nodes] if p else [],
                "partition": p.partition if p else None,
                "pp": plan.pp if plan else None,
                "dp": plan.dp if plan else None,
                "tp": plan.tp if plan else None,
                "plan": json.loads(p.plan) if p else None,
                "samples_per_s": round(plan.global_batch / plan.iter_time_s, 3)
                if plan and plan.global_batch and plan.iter_time_s
                else None,
                **speed_fields(speeds.get(job.job_id)),
                "iterations_done": job.iterations_done,
                "iterations": iterations,
                "progress_source": job.progress_source,
                "progress": progress_text(job.iterations_done, iterations, job.progress_source, shown),
                "queued_s": round(max(0.0, queued_until - job.submit_time), 1)
                if job.submit_time and queued_until
                else None,
                "reason": job.bad_reason or job.reason,
                "exit_code": job.exit_code,
            }
        )
    return rows


def _fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


#: the columns of the `status` table (REASON, the last, is the only one whose values hold spaces)
HEADER = (
    "JOBID",
    "USER",
    "STATE",
    "CELL",
    "NODES",
    "PP/DP/TP",
    "SAMPLES/S",
    "S/IT(EST/OBS)",
    "PROGRESS",
    "QUEUED",
    "REASON",
)


def _table(rows: list[dict[str, Any]]) -> str:
    """The `status` table; every cell escaped (users name jobs and write reasons)."""
    head = HEADER
    lines: list[tuple[str, ...]] = [head]
    for r in rows:
        lines.append(
            (
                r["job_id"],
                r["user"],
                r["state"] or "-",
                r["cell"] or "-",
                ",".join(r["nodes"]) or "-",
                f"{r['pp']}/{r['dp']}/{r['tp']}" if r["pp"] else "-",
                f"{r['samples_per_s']:.1f}" if r["samples_per_s"] else "-",
                f"{r['iter_s_estimated'] or r['iter_s_profile']:.3g}/{r['iter_s_observed']:.3g}"
                if r["iter_s_observed"]
                else "-",
                r["progress"],
                _fmt_time(r["queued_s"]),
                r["reason"] or "",
            )
        )
    lines = [tuple(printable(c) for c in line) for line in lines]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]  # the last column is not padded
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=False)) + "  " + line[-1] for line in lines
    )


_SCOPES = {
    "account": "account {name}",
    "user": "user association {name} (account/user)",
    "qos": "QOS {name}",
    "qos-per-user": "QOS {name} per user",
    "qos-per-account": "QOS {name} per account",
    "partition": "partition {name}'s QOS",
}


def why(reason: str) -> dict[str, Any]:
    """The binding constraint a job's reason names (solver.site.parse_reason):
    {"kind", "fields", "text"}, `text` one line that says it with its numbers.
    A reason with a note after "; " is read by its first part."""
    kind, fields = parse_reason(reason)
    if kind == "other" and "; " in reason:
        kind, fields = parse_reason(reason.split("; ", 1)[0])
        if kind == "other":
            fields = {"text": reason}
    f = fields
    if kind == "limit":
        who = _SCOPES.get(f["scope"], f["scope"] + " {name}").format(name=f["name"])
        if f.get("unit") == "jobs":
            text = f"job limit: {who} {f['kind']} allows {f['allowed']} running jobs, {f['used']} running or planned"
        else:
            gpus = f"{f['gpu_type']} GPUs" if f.get("gpu_type") else "GPUs"
            text = f"GPU limit: {who} {f['kind']} allows {f['allowed']} {gpus}, {f['used']} in use or planned"
    elif kind == "fairshare":
        text = (
            f"fair share: account {f['account']} has used {f['usage']} of the cluster against a share of {f['share']}"
        )
    elif kind == "reservation":
        text = f"reservation {f['name']} takes the nodes from {f['start']}; the job would end about {f['end']}"
    elif kind == "partition":
        text = (
            f"partition access: account {f['account'] or '-'} (QOS {f['qos'] or '-'}) may use none of {f['partitions']}"
        )
    elif kind == "unmanaged":
        gtype = "" if f["gpu_type"] == "any" else f"{f['gpu_type']} "
        text = f"plain sbatch job {f['job']} (Slurm priority {f['priority']}) claims {f['gpus']} {gtype}GPUs first"
    elif kind == "no cell fits":
        text = f"no cell fits: {f['why']}"
    elif kind == "outbid":
        text = f"the GPUs are worth more to other jobs: {reason.split(' by ', 1)[1]}"
    elif kind == "preempted":
        text = f"preempted to zero GPUs for job {f['job']}, which outranks it: {f['why']}"
    elif kind == "preempting":
        text = f"takes the GPUs of jobs of lower rank, preempted to zero: {f['jobs'].replace(',', ', ')}"
    elif kind == "governor":
        text = (
            f"the restart governor keeps it where it runs: its run is {f['ran']} s old, min_run_s is {f['min_run']} s"
        )
    elif kind == "stays":
        text = f"runs on in {f['cell']}: {f['why']}"
    else:
        text = reason or "no reason recorded"
    return {"kind": kind, "fields": fields, "text": text}


def _history_text(job_id: str, events: list[dict[str, Any]]) -> str:
    lines = [f"job {printable(job_id)}: history of its cells"]
    for e in events:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"]))
        what = e["event"]
        if e["cell"]:
            what += f" {e['cell']}"
        if e["nodes"]:
            what += f" on {e['nodes']}"
        if e["event"] == "resumed" and e["value"] is not None:
            what += f" (restart cost {e['value']:.1f} s)"
        if e["event"] == HistoryEvent.YIELDED:
            what = f"preempted for job {e['cell']}"
        lines.append(f"  {when}  {printable(what)}")
    return "\n".join(lines)


def _json_out(obj: Any) -> None:
    """`obj` as one line of ASCII JSON: controls, C1 and bidi characters as \\uXXXX."""
    json.dump(obj, sys.stdout, default=str, ensure_ascii=True)
    sys.stdout.write("\n")


def restarts_text(stats: dict[str, float], jobs: int) -> str:
    """The `status` line about restarts per job (requeues by the controller) over the jobs shown."""
    return (
        f"restarts per job: mean {stats['mean']:.2f}, p99 {stats['p99']:.0f}, max {stats['max']:.0f} "
        f"over {jobs} jobs (moves, resizes, preemptions, runs placed again)"
    )


def _round_text(r: dict[str, Any]) -> str:
    """The `status` line about the last round (its error may quote users' text)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started"]))
    return (
        f"last round {r['id']} at {when}: {r['status']}, {len(r['actions'])} actions"
        + (f", {r['duration_s']:.2f} s" if r["duration_s"] is not None else "")
        + (f" ({printable(r['error'])})" if r["error"] else "")
    )


def plan_text(report: Any) -> str:
    """`cellsched plan` in plain text for a RoundReport, users' text escaped."""
    out = []
    if report.error:
        out.append(f"round {report.status}: {printable(report.error)}")
    for a in report.actions:
        where = f" -> {a['cell']} on {','.join(a['nodes'])} ({a.get('partition', '')})" if "cell" in a else ""
        out.append(printable(f"{a['kind']} job {a['job']}{where}" + (f" [{a['why']}]" if a.get("why") else "")))
    if not report.actions and report.status == RoundStatus.OK:
        out.append("nothing to do")
    for j in report.jobs:
        if j.reason and j.phase in ("held", "loose", "bad", "operator-hold", "parked"):
            out.append(f"job {printable(j.job_id)} waits: {printable(j.reason)}")
    return "\n".join(out)


@click.command()
@_CONFIG
@_JSON
@click.option("--all", "include_finished", is_flag=True, help="Include finished jobs.")
@click.option(
    "--why",
    "why_of",
    metavar="JOBID",
    help="Say why one job waits: the binding constraint with its numbers (a GPU limit, fair share, a "
    "reservation, partition access, a plain sbatch job's claim, no cell that fits, or the jobs the GPUs are worth "
    "more to).",
)
@click.option(
    "--history",
    "history_of",
    metavar="JOBID",
    help="Show one job's history: cells it was placed in, moves (signalled, requeued, resumed with the "
    "measured restart cost), end.",
)
def status(
    config_path: str | None, as_json: bool, include_finished: bool, why_of: str | None, history_of: str | None
) -> None:
    """Managed jobs: cell, plan, speed, progress, time in queue, why pending.

    S/IT(EST/OBS): seconds per iteration the controller now estimates for the
    job's cell (its profile's estimate corrected by what jobs reach), and
    what the job itself reported.

    Root and the SlurmUser see every job; other users see their own. A
    finished job (--all) shows the state it ended in. PROGRESS is iterations
    done/total from the job's progress file, ~done/total the controller's
    estimate for a running job, and - where it is not known."""
    config = load_config(config_path)
    if not Path(config.controller.state_path).exists():
        raise ControllerError(f"no controller state at {config.controller.state_path} (has the controller run?)")
    state = open_state(config, readonly=True)
    try:
        if why_of is not None:
            _why_out(state, why_of, as_json)
            return
        if history_of is not None:
            job = state.jobs().get(history_of)
            who = viewer()
            if job is None or (who is not None and job.user != who):
                raise ControllerError(f"no managed job {printable(history_of)} of yours in the controller's state")
            events = state.history(history_of)
            if as_json:
                _json_out({"job_id": history_of, "history": events})
            else:
                click.echo(_history_text(history_of, events))
            return
        rows = job_rows(state, now=time.time(), only_user=viewer(), include_finished=include_finished)
        restarts = state.restart_counts([r["job_id"] for r in rows])
        last = state.rounds(limit=1)
    finally:
        state.close()
    stats = restart_stats(restarts.values())
    if as_json:
        _json_out({"jobs": rows, "last_round": last[0] if last else None, "restarts_per_job": stats})
        return
    click.echo(_table(rows))
    click.echo("\n" + restarts_text(stats, len(restarts)))
    if last:
        click.echo(_round_text(last[0]))


def _why_out(state: StateStore, job_id: str, as_json: bool) -> None:
    """`status --why JOBID`: the job's phase and the constraint its reason names."""
    job = state.jobs(include_finished=True).get(job_id)
    who = viewer()
    if job is None or (who is not None and job.user != who):
        raise ControllerError(f"no managed job {printable(job_id)} of yours in the controller's state")
    reason = job.bad_reason or job.reason or ""
    w = why(reason)
    took = state.preempted_for(job_id)
    gave = _yielded(state, job_id)
    lines = [f"job {job_id} ({job.phase}): {w['text']}"]
    if gave:
        lines.append("  preempted for: " + ", ".join(f"job {b} at {_when(t)}" for t, b in gave))
    if took:
        lines.append("  preempted for it: " + ", ".join(f"job {v} at {_when(t)}" for t, v in took))
    if as_json:
        _json_out(
            {
                "job_id": job_id,
                "phase": job.phase,
                "state": job.slurm_state,
                "reason": reason,
                **w,
                "preempted_by": [{"job": b, "time": t} for t, b in gave],
                "preempted_for_it": [{"job": v, "time": t} for t, v in took],
            }
        )
    else:
        click.echo("\n".join(printable(line) for line in lines))


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _yielded(state: StateStore, job_id: str) -> list[tuple[float, str]]:
    """(when, for which job) of each preemption of `job_id` by cellsched."""
    return [(e["time"], e["cell"]) for e in state.history(job_id) if e["event"] == HistoryEvent.YIELDED]


@click.command()
@_CONFIG
@_JSON
def plan(config_path: str | None, as_json: bool) -> None:
    """What the next controller round would do (the `controller run --dry-run` path).

    For root and the SlurmUser only: it shows every user's placements."""
    if viewer() is not None:
        raise ControllerError(
            "`cellsched plan` shows every user's jobs and is for root and the SlurmUser; use `cellsched status`"
        )
    config = load_config(config_path)
    state = open_state(config, readonly=True)
    try:
        report = new_controller(config, state, readonly=True).round(dry_run=True)
    finally:
        state.close()
    if as_json:
        _json_out(report.to_dict())
    else:
        text = plan_text(report)
        if text:
            click.echo(text)
    if report.status != "ok":
        sys.exit(3 if report.status == RoundStatus.UNAVAILABLE else 1)
