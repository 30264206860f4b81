"""`cellsched simulate`: replay a trace through the real controller and
policies on the simulated Slurm, and write a report."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import click

from slurm_ext.errors import CellschedError
from slurm_ext.sim.recorded import RECORDED
from slurm_ext.sim.types import ClusterSpec, SimRun, TraceJob
from solver.contract.extras import MissingExtra, require

PROG = "cellsched simulate"
EXIT_USAGE = 2


class SimulateError(click.ClickException, CellschedError):
    """Bad input: printed as one line, exit status 2."""

    exit_code = EXIT_USAGE

    def show(self, file: Any = None) -> None:
        click.echo(f"{PROG}: error: {self.message}", err=True)


@dataclass(frozen=True)
class Job:
    """Everything one worker needs to simulate one policy (picklable):
    `label` is the --policy string, `policy` its name, `options` the
    SimOptions with its solver and job keys set."""

    label: str
    policy: str
    trace: tuple[TraceJob, ...]
    cluster: ClusterSpec
    conditions: Any
    options: Any
    checkpoint: str | None = None
    checkpoint_every_s: float = 600.0


#: --policy keys that say how that run's trace jobs are submitted (SimOptions
#: fields, rules of the jobs, not of the solver): rigid=true|false
JOB_KEYS = ("rigid",)


def split_job_keys(text: str) -> tuple[dict[str, bool], str]:
    """(the job keys, JOB_KEYS, of a ``NAME[:key=value,...]`` string, the
    rest of its keys: the solver's); SimulateError for a bad job key's value."""
    _, colon, rest = text.partition(":")
    job: dict[str, bool] = {}
    solver = []
    for item in rest.split(",") if colon else ():
        key, _, raw = (part.strip() for part in item.partition("="))
        if key not in JOB_KEYS:
            solver.append(item)
            continue
        if raw not in ("true", "false"):
            raise SimulateError(f"--policy {text}: {key} must be true or false, got {raw!r}")
        if key in job:
            raise SimulateError(f"--policy {text}: {key} is given twice")
        job[key] = raw == "true"
    return job, ",".join(solver)


def parse_policies(texts: Sequence[str], base: Any) -> list[tuple[str, str, Any]]:
    """(label, policy name, SolverConfig) of each ``NAME[:key=value,...]``
    (its job keys, `split_job_keys`, checked and left out)."""
    from slurm_ext.config import ConfigError, solver_options
    from solver.policies import POLICIES

    out = []
    for text in texts:
        name = text.partition(":")[0]
        if name not in POLICIES:
            raise SimulateError(f"--policy: unknown policy {name!r} (known: {', '.join(sorted(POLICIES))})")
        job, rest = split_job_keys(text)
        try:
            cfg = solver_options(base, rest, f"--policy {text}") if rest or (":" in text and not job) else base
        except ConfigError as exc:
            raise SimulateError(str(exc)) from None
        out.append((text, name, cfg))
    if len({label for label, _, _ in out}) != len(out):
        raise SimulateError("--policy: a policy is given twice")
    return out


def _run_one(job: Job, progress: Any = None) -> SimRun:
    """Simulate one policy (in a worker process or here)."""
    from slurm_ext.sim.engine import Simulator

    logging.getLogger("cellsched").setLevel(logging.WARNING)
    sim = Simulator(job.trace, job.cluster, job.policy, conditions=job.conditions, options=job.options, label=job.label)

    def report(p: Any) -> None:
        if progress is not None:
            progress.put((job.label, p.finished, p.total, p.time - p.start, p.rounds))

    return sim.run(report, checkpoint=job.checkpoint, checkpoint_every_s=job.checkpoint_every_s)


class ProgressBar:
    """Per-policy progress on stderr: one rewritten line on a terminal,
    a plain line per 10 % otherwise."""

    def __init__(self, policies: Sequence[str], stream: TextIO, tty: bool | None = None) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.state = {p: (0, 0, 0.0, 0) for p in policies}
        self.printed: dict[str, int] = {p: -1 for p in policies}
        self.t0 = time.perf_counter()

    def update(self, policy: str, finished: int, total: int, sim_s: float, rounds: int) -> None:
        self.state[policy] = (finished, total, sim_s, rounds)
        if self.tty:
            parts = []
            for p, (f, t, _, _) in self.state.items():
                parts.append(f"{p} {100 * f / t if t else 0:3.0f}%")
            wall = time.perf_counter() - self.t0
            self.stream.write("\r" + " | ".join(parts) + f"  ({wall:.0f} s)\x1b[K")
            self.stream.flush()
            return
        decile = int(10 * finished / total) if total else 10
        if decile > self.printed[policy]:
            self.printed[policy] = decile
            self.stream.write(
                f"{PROG}: {policy}: {finished}/{total} jobs finished, {sim_s:.0f} simulated s, {rounds} rounds\n"
            )
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def run_all(jobs: Sequence[Job], workers: int, bar: ProgressBar | None) -> list[SimRun]:
    """Every policy's run, in the order given; `workers` > 1 runs them in parallel processes."""
    if workers <= 1 or len(jobs) == 1:
        runs = []
        for j in jobs:
            sink = _Sink(bar)
            runs.append(_run_one(j, sink))
        return runs
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        queue = manager.Queue()
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as pool:
            futures = [pool.submit(_run_one, j, queue) for j in jobs]
            while not all(f.done() for f in futures):
                _drain(queue, bar, timeout=0.5)
            _drain(queue, bar, timeout=0.0)
            return [f.result() for f in futures]


class _Sink:
    """A queue-like progress sink that updates the bar directly."""

    def __init__(self, bar: ProgressBar | None) -> None:
        self.bar = bar

    def put(self, item: tuple[str, int, int, float, int]) -> None:  # ProgressBar.update's arguments
        if self.bar is not None:
            self.bar.update(*item)


def _drain(queue: Any, bar: ProgressBar | None, timeout: float) -> None:
    import queue as q

    try:
        item = queue.get(timeout=timeout) if timeout else queue.get_nowait()
        while True:
            if bar is not None:
                bar.update(*item)
            item = queue.get_nowait()
    except q.Empty:
        return


def _plots_missing() -> MissingExtra | None:
    """Why the plots cannot be drawn (matplotlib, the `sim` extra, is missing), or None."""
    try:
        require("matplotlib.figure")
    except MissingExtra as exc:
        return exc
    return None


def load_trace(
    path: str | None, fmt: str, iteration_scale: int | None, limit: int | None, arrival_rate: float = 1.0
) -> tuple[TraceJob, ...]:
    """The trace's jobs (the first `limit`), arrivals `arrival_rate` times as
    frequent: each submit time's distance from the first one divided by it."""
    from slurm_ext.sim.traces import TraceError, read_arena_trace, read_sacct
    from solver.contract.profiles.arena import TRACE_FILE, shipped_path

    try:
        if fmt == "arena":
            scale = 5 if iteration_scale is None else iteration_scale
            trace = read_arena_trace(path or shipped_path(TRACE_FILE), iteration_scale=scale)
        else:
            if path is None:
                raise SimulateError("--trace is required with --trace-format sacct")
            trace = read_sacct(path)
    except (TraceError, ValueError, FileNotFoundError) as exc:
        raise SimulateError(f"--trace: {exc}") from None
    if not trace:
        raise SimulateError(f"--trace: {path} holds no usable job")
    trace = trace[:limit] if limit else trace
    if arrival_rate != 1.0:
        t0 = min(j.submit_time for j in trace)
        trace = tuple(dataclasses.replace(j, submit_time=t0 + (j.submit_time - t0) / arrival_rate) for j in trace)
    return trace


def workload_options(
    realistic: bool, arena_compat: bool, mix: str | None, hook_fraction: float | None, declared_error: float | None
) -> dict[str, Any]:
    """SimOptions' runtime_mix, hook_fraction and declared_error from the
    options (slurm_ext.sim.workload: --realistic's defaults; Arena's
    adaptive jobs, declaring their exact work, otherwise)."""
    from slurm_ext.sim.workload import (
        DEFAULT_BADNESS,
        DEFAULT_HOOK_FRACTION,
        DEFAULT_MIX,
        WorkloadError,
        parse_runtime_mix,
    )

    given = [name for name, v in (("--runtime-mix", mix), ("--declared-error", declared_error)) if v is not None]
    if arena_compat and given:
        raise SimulateError(f"{given[0]}: --arena-compat runs Arena's assumption (adaptive jobs, exact work)")
    try:
        runtime_mix = parse_runtime_mix(mix) if mix is not None else (DEFAULT_MIX if realistic else ())
    except WorkloadError as exc:
        raise SimulateError(str(exc)) from None
    return {
        "runtime_mix": runtime_mix,
        "hook_fraction": DEFAULT_HOOK_FRACTION if hook_fraction is None else hook_fraction,
        "declared_error": (DEFAULT_BADNESS if realistic else 0.0) if declared_error is None else declared_error,
    }


def load_cluster(path: str | None) -> ClusterSpec:
    from slurm_ext.sim.clusterspec import ClusterSpecError, arena_cluster, load_cluster_spec

    try:
        return arena_cluster() if path is None else load_cluster_spec(path)
    except (ClusterSpecError, ValueError, FileNotFoundError) as exc:
        raise SimulateError(f"--cluster: {exc}") from None


def with_site_files(
    cluster: ClusterSpec, dump: str | None, partitions: str | None, qos: str | None
) -> tuple[ClusterSpec, tuple[str, ...]]:
    """`cluster` with the site of a dump, its partitions and QOS files
    (slurm_ext.sim.sitefiles), and what of them is not applied."""
    if dump is None:
        if partitions or qos:
            raise SimulateError(f"{'--partitions' if partitions else '--site-qos'}: needs --site-dump")
        return cluster, ()
    from slurm_ext.parse.sitefiles import SiteFileError
    from slurm_ext.sim.sitefiles import load_site_files

    if cluster.site is not None:
        raise SimulateError("--site-dump: the --cluster file has a [site] table already; give one of them")
    try:
        files = load_site_files(cluster, dump, partitions, qos)
    except SiteFileError as exc:
        raise SimulateError(f"--site-dump: {exc}") from None
    return dataclasses.replace(cluster, site=files.site), files.notes


def recorded_of(
    policies: Sequence[str], trace_format: str, trace: tuple[TraceJob, ...], cluster: ClusterSpec, arrival_rate: float
) -> SimRun | None:
    """The recorded run when `recorded` is among the policies (a sacct trace
    at its own arrival rate only: the record is of those arrivals)."""
    if RECORDED not in policies:
        return None
    if trace_format != "sacct":
        raise SimulateError("--policy recorded: needs a recorded run, --trace-format sacct")
    if arrival_rate != 1.0:
        raise SimulateError("--policy recorded: the record is of the trace's own arrivals, not --arrival-rate's")
    from slurm_ext.sim.recorded import RecordedError, recorded_run

    try:
        return recorded_run(trace, cluster)
    except RecordedError as exc:
        raise SimulateError(f"--policy recorded: {exc}") from None


@click.command("simulate", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Trace file. Default: Arena's Philly trace shipped with cellsched (1,938 jobs).",
)
@click.option(
    "--trace-format",
    type=click.Choice(["arena", "sacct"]),
    default="arena",
    show_default=True,
    help="arena: Arena's CSV; sacct: a `sacct -P` export (iterations from run times at the requested cell's speed).",
)
@click.option(
    "--iteration-scale",
    type=click.IntRange(min=1),
    default=None,
    help="Arena traces: iterations = num_iteration // this (default 5, Arena's own convention).",
)
@click.option(
    "--cluster",
    "cluster_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Cluster spec (Arena's cluster_spec.json or our TOML/JSON node groups). Default: Arena's cluster, 1,280 GPUs.",
)
@click.option(
    "--site-dump",
    type=click.Path(dir_okay=False),
    default=None,
    help="The site's policy from its own `sacctmgr dump CLUSTER` file: accounts, their tree, shares, GrpTRES, "
    "GrpJobs, MaxJobs, QOS (instead of a [site] table in --cluster). A bad or unknown line is an error naming it.",
)
@click.option(
    "--partitions",
    "partitions_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --site-dump: the site's `scontrol show partition` output (who may use each partition).",
)
@click.option(
    "--site-qos",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --site-dump: the QOS limits a dump leaves out, as `sacctmgr -n -P show qos "
    "format=name,priority,grptres,maxtres,maxtrespu,maxtrespa,grpjobs,maxjobspu,maxjobspa` prints them.",
)
@click.option(
    "--truth",
    default=None,
    metavar="arena|arena-filled|PATH",
    help="How fast jobs really run: arena (Arena's measured optimal-plan table, the default), arena-filled "
    "(that table, its gaps filled by our estimator over it), an Arena profiles_optimal.json, or a "
    "profile-store SQLite file (our estimator over it).",
)
@click.option("--profiles", type=click.Path(dir_okay=False), default=None, help="Same as --truth PATH.")
@click.option(
    "--estimates",
    type=click.Choice(["truth", "arena-estimated", "store"]),
    default=None,
    help="What the policies believe: truth (the truth's own table: estimation error costs nothing; the default), "
    "arena-estimated (Arena's profiler estimates, our estimator where Arena has none), store (our estimator "
    "over the truth's store, or the default profile store).",
)
@click.option(
    "--noise",
    type=click.FloatRange(0, 2),
    default=None,
    metavar="SIGMA",
    help="Seeded per-job multiplicative noise on the truth, exp(N(0, SIGMA)) per job and half that per GPU type "
    "(default 0).",
)
@click.option(
    "--restart-cost",
    default=None,
    metavar="model|SECONDS",
    help="The restart cost every policy pays: seconds per (re)start, or 'model' (start-up measured on the dev "
    "cluster + the training state written and read at 2 GB/s). Default: min(10 s x GPUs, 40 s) for every "
    "policy; with --arena-compat, Arena's per-policy charges.",
)
@click.option(
    "--realistic",
    is_flag=True,
    help="Estimates are not the truth: --estimates arena-estimated, --truth arena-filled, --noise 0.1 and "
    "--restart-cost model for every policy (each can still be set), contention where the cluster gives NICs, and "
    "jobs that run the default --runtime-mix and declare their work with --declared-error 3.",
)
@click.option(
    "--runtime-mix",
    default=None,
    metavar="NAME=SHARE,...",
    help="The shipped runtimes trace jobs run, e.g. ddp=0.6,megatron=0.4 (shares summing to 1; a job whose trace "
    "names its runtime keeps it). Default with --realistic: ddp=0.4,megatron=0.25,torchtitan=0.15,sharded=0.15,"
    "exact=0.05 (an assumption: docs/simulator.md); otherwise every job runs adaptive (Arena's assumption).",
)
@click.option(
    "--hook-fraction",
    type=click.FloatRange(0, 1),
    default=None,
    help="The fraction of ddp jobs whose script registers the checkpoint hook (the others are never moved while "
    "they run). Default 0.5 (an assumption).",
)
@click.option(
    "--declared-error",
    type=click.FloatRange(min=0),
    default=None,
    metavar="F",
    help="Trace jobs declare ceil(true iterations x (1 + F u)), u uniform in [0, 1) per job (the badness-factor "
    "model of user runtime estimates); they run their true iterations. 0: exact. Default 3 with --realistic, "
    "else 0.",
)
@click.option(
    "--contention/--no-contention",
    default=None,
    help="Jobs that share network cards or rack uplinks slow each other (the truth), and the controller knows "
    "the cluster's NICs. Default: on when the --cluster file gives nic_gbps (never with --arena-compat); "
    "--contention on a cluster without NICs gives each GPU type's default (100 Gb/s).",
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    metavar="NAME[:KEY=VALUE,...]",
    help="Policy to simulate; repeat for several (cellsched, cellsched-static, fcfs, fcfs-backfill, gavel, sia, "
    "slurm-multifactor (Slurm's multifactor priority and backfill), "
    "and Wang et al.'s srsf-avoid, srsf-accept, ada-srsf; with --trace-format sacct, recorded: what the "
    "site's Slurm really did, each job's recorded start and end). Solver keys after a colon set that run's "
    "configuration, e.g. cellsched:calibrate=false, cellsched:mixed_cells=false (no cells spanning GPU types) "
    "or ada-srsf:node_placement=first-fit; the key rigid=true submits that run's trace jobs rigid, as "
    "--rigid does (the whole string labels the run). Default: cellsched and fcfs.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    required=True,
    help="Directory for results.json, results.md and the plots (the plots need the `sim` extra: matplotlib).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead of a Markdown table.")
@click.option(
    "--arena-compat",
    is_flag=True,
    help="Arena's conventions: fixed 300 s rounds, quantized arrivals, completions seen at round boundaries, "
    "executed-seconds progress, Arena's restart charges.",
)
@click.option(
    "--progress-model",
    type=click.Choice(["executed-seconds", "iterations"]),
    default="executed-seconds",
    show_default=True,
    help="With --arena-compat: Arena's progress quirk, or strict iteration counting.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds between controller rounds (default 60; 300 with --arena-compat, which fixes it).",
)
@click.option("--limit-jobs", type=click.IntRange(min=1), default=None, help="Simulate only the first N jobs.")
@click.option(
    "--arrival-rate",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Scale the trace's arrival rate: 2 submits the same jobs twice as often (a heavier load).",
)
@click.option(
    "--max-time",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Stop this many simulated seconds after the first arrival.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Policies simulated in parallel processes.",
)
@click.option("--no-plots", is_flag=True, help="Do not draw the PNG plots.")
@click.option("--seed", type=int, default=0, show_default=True, help="Solver seed.")
@click.option(
    "--checkpoint-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Save each policy's run there (POLICY.ckpt) every --checkpoint-every seconds, and go on from a "
    "checkpoint of the same run found there instead of starting over: a long run survives being stopped. "
    "A checkpoint is a pickle: keep the directory your own. Removed when the run ends.",
)
@click.option(
    "--checkpoint-every",
    type=click.FloatRange(min=0),
    default=600.0,
    show_default=True,
    help="Wall seconds between two checkpoints.",
)
@click.option(
    "--rigid",
    is_flag=True,
    help="Every trace job rigid for every policy (a policy's rigid=false key excepted): not elastic, its "
    "requested GPUs as its least and most; a policy chooses only its GPU type and nodes.",
)
def simulate(
    trace_path: str | None,
    trace_format: str,
    iteration_scale: int | None,
    cluster_path: str | None,
    site_dump: str | None,
    partitions_path: str | None,
    site_qos: str | None,
    truth: str | None,
    profiles: str | None,
    estimates: str | None,
    noise: float | None,
    restart_cost: str | None,
    realistic: bool,
    runtime_mix: str | None,
    hook_fraction: float | None,
    declared_error: float | None,
    contention: bool | None,
    policies: tuple[str, ...],
    out_dir: str,
    as_json: bool,
    arena_compat: bool,
    progress_model: str,
    interval: float | None,
    limit_jobs: int | None,
    arrival_rate: float,
    max_time: float | None,
    workers: int,
    no_plots: bool,
    seed: int,
    checkpoint_dir: str | None,
    checkpoint_every: float,
    rigid: bool,
) -> None:
    """Replay a job trace through the real controller and policies on a
    simulated Slurm cluster, and write a report (results.json, results.md,
    plots) to --out. Progress goes to stderr; the summary table to stdout.

    Every trace job is submitted like `cellsched sbatch` does (held, with
    its spec): elastic, 1 to 16 GPUs, its requested GPUs as the static
    request (with --rigid or a policy's rigid=true: rigid at its requested
    GPUs). Without options this replays Arena's Philly trace on Arena's
    cluster with Arena's profiles.
    """
    from slurm_ext.sim.checkpoint import CheckpointError
    from slurm_ext.sim.conditions import Conditions, ConditionsError, RestartModel, truth_problem
    from slurm_ext.sim.engine import ARENA_ROUND_S, SimError, SimOptions, file_stem

    if arena_compat and interval not in (None, ARENA_ROUND_S):
        raise SimulateError(f"--interval: --arena-compat fixes rounds at {ARENA_ROUND_S:g} s")
    if arena_compat and realistic:
        raise SimulateError("--realistic: Arena's conventions (--arena-compat) are not realistic ones; choose one")
    if arena_compat and contention:
        raise SimulateError("--contention: Arena's simulator has no contention (--arena-compat); choose one")
    if truth and profiles:
        raise SimulateError("--profiles: give --truth or --profiles, not both")
    source = truth or profiles
    problem = truth_problem(source) if source else None
    if problem:  # named by the option it came from
        raise SimulateError(f"{'--truth' if truth else '--profiles'}: {problem}")
    try:
        given: dict[str, Any] = {  # keyword arguments of Conditions (None: its default)
            "truth": source,
            "estimates": estimates,
            "noise": noise,
            "restart": RestartModel.parse(restart_cost) if restart_cost else None,
            "seed": seed,
        }
        conditions = (
            Conditions.realistic(**given)
            if realistic
            else Conditions(**{k: v for k, v in given.items() if v is not None})
        )
        conditions.speed_and_estimator()  # fail here, not in a worker
    except ConditionsError as exc:
        raise SimulateError(str(exc)) from None
    except (ValueError, OSError) as exc:
        raise SimulateError(f"--truth: {exc}") from None
    trace = load_trace(trace_path, trace_format, iteration_scale, limit_jobs, arrival_rate)
    cluster, site_notes = with_site_files(load_cluster(cluster_path), site_dump, partitions_path, site_qos)
    try:
        options = SimOptions(
            interval_s=interval or 60.0,
            arena_compat=arena_compat,
            progress_model=progress_model,
            max_time_s=max_time,
            seed=seed,
            contention=contention,
            rigid=rigid,
            **workload_options(realistic, arena_compat, runtime_mix, hook_fraction, declared_error),
        )
    except SimError as exc:
        raise SimulateError(str(exc)) from None
    policies = policies or ("cellsched", "fcfs")
    recorded = recorded_of(policies, trace_format, trace, cluster, arrival_rate)
    runs_of = parse_policies([p for p in policies if p != RECORDED], options.solver)
    if checkpoint_dir is not None:
        Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    jobs = [
        Job(
            label,
            name,
            trace,
            cluster,
            conditions,
            dataclasses.replace(options, solver=cfg, rigid=split_job_keys(label)[0].get("rigid", options.rigid)),
            checkpoint=str(Path(checkpoint_dir) / f"{file_stem(label)}.ckpt") if checkpoint_dir else None,
            checkpoint_every_s=checkpoint_every,
        )
        for label, name, cfg in runs_of
    ]
    bar = ProgressBar(tuple(label for label, _, _ in runs_of), sys.stderr)
    t0 = time.perf_counter()
    try:
        runs = run_all(jobs, workers, bar)
    except (SimError, CheckpointError) as exc:
        raise SimulateError(str(exc)) from None
    finally:
        bar.close()
    if recorded is not None:  # in the order the policies were given
        runs.insert(policies.index(RECORDED), recorded)
    from slurm_ext.sim.report import (
        against_recorded,
        kinds_table,
        markdown_table,
        recorded_table,
        summaries,
        write_report,
    )

    meta = {
        "trace": trace_path or "shipped Philly trace (Arena)",
        "trace_format": trace_format,
        "arrival_rate": arrival_rate,
        "jobs": len(trace),
        "cluster": cluster_path or "Arena's cluster",
        **({"site_dump": site_dump, "partitions": partitions_path, "site_qos": site_qos} if site_dump else {}),
        **({"site_files_not_applied": list(site_notes)} if site_notes else {}),
        "gpus": cluster.total_gpus,
        **conditions.describe(),
        "mode": "arena-compat" if arena_compat else ("realistic" if realistic else "event"),
        "interval_s": options.effective().interval_s,
        "contention": contention if contention is not None else cluster.has_network and not arena_compat,
        "runtimes": dict(options.runtime_mix) or options.runtime,
        "hook_fraction": options.hook_fraction,
        "declared_error": options.declared_error,
        **({"rigid": [j.label for j in jobs if j.options.rigid]} if any(j.options.rigid for j in jobs) else {}),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    results = summaries(runs)
    plots_missing = None if no_plots else _plots_missing()
    written = write_report(runs, out_dir, plots=not no_plots and plots_missing is None, meta=meta, results=results)
    if plots_missing is not None:
        click.echo(f"{PROG}: plots skipped: {plots_missing}", err=True)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "meta": meta,
                    "summary": {r.policy: r.to_dict() for r in results},
                    "files": {k: str(v) for k, v in written.items()},
                },
                indent=1,
                default=str,
            )
        )
    else:
        click.echo(markdown_table(results), nl=False)
        click.echo("\nCells chosen, by kind (state-sharded overlaps the others):\n")
        click.echo(kinds_table(results), nl=False)
        if (comparison := against_recorded(runs)) is not None:
            click.echo("\nAgainst the recorded run (the site's own Slurm):\n")
            click.echo(recorded_table(comparison), nl=False)
        click.echo(f"\nwritten: {', '.join(str(v) for v in written.values())}", err=True)


__all__ = ["simulate", "run_all", "parse_policies", "ProgressBar", "SimulateError"]
