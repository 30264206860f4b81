"""One 20-job trace replayed on the simulated backend and on the real dev
cluster: the same jobs, policy, solver settings and profiles; the order and
the cells (and nodes) of placement must agree, because the simulator runs
the real controller (`Controller.round()`), not a model of it.

Both runs share one clock convention: a job runs ITER_S seconds per
iteration whatever its cell, from the round that placed it, and a round runs
right after each event (arrivals, job ends), with every event of one instant
first. The simulator gets this as its truth speed, no restart or start
delay, and event-driven rounds (no interval rounds). On the real cluster a
harness is that clock: it submits each job with `cellsched sbatch` at its
arrival time (wall clock from the start), ends each job (SIGUSR1 to its
batch script, which then exits 0) when its run time from its placing round
is over, waits until Slurm is quiet, then calls `controller.round()`. Events
happen strictly in the trace's order even when the machine is slow (it then
runs late, never reordered), so jitter cannot make the two runs differ.
"""

from __future__ import annotations

import difflib
import heapq
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from support import ADMIN, SHAPE, read_shape, wait_for

from slurm_ext.backends import get_backend
from slurm_ext.backends.base import Backend
from slurm_ext.config import Config, ControllerConfig, NetworkConfig
from slurm_ext.controller.round import Controller
from slurm_ext.records import SlurmJob
from slurm_ext.sim.clusterspec import load_cluster_spec, node_names
from slurm_ext.sim.engine import SimOptions, Simulator
from slurm_ext.sim.types import TraceJob
from slurm_ext.state import RoundStatus, StateStore
from solver.contract.jobspec import JobSpec
from solver.contract.plan import JobPlan
from solver.contract.profiles.seed import open_store
from solver.estimator import Estimator
from solver.mixed import MixedEstimator
from solver.types import SolverConfig

pytestmark = pytest.mark.slurm

POLICY = "cellsched"
#: the same solver settings on both sides: deterministic CP-SAT (the
#: default), no age bonus (it grows with wall time), a generous wall-clock
#: safety net so that a loaded machine does not cut a solve short, and no
#: calibration (ITER_S below is a stand-in clock, not a speed to learn)
SOLVER = SolverConfig(w_age=0.0, time_limit_s=30.0, calibrate=False)
#: the same network on both sides: none modelled, as the simulator's controller has it for a cluster
#: spec without NICs (slurm_ext/admin/sim-cluster.toml; slurm_ext.sim.engine.network_config), where the live
#: controller's default would price every node's NIC (100 Gb/s) and the solver the jobs sharing them
NETWORK = NetworkConfig(modelled=False)
#: every job: not elastic, 1 to MAX_GPUS GPUs (what the simulator's specs say)
MAX_GPUS = 8
#: seconds per iteration, on every cell: a job's run time is its iterations x ITER_S
ITER_S = 1.0
#: ITER_S is a stand-in clock, up to 30 times faster than the estimates: the
#: simulated jobs' progress (exact) is believed as it is
RATE_FACTOR = 1000.0
#: (arrival s, model, global batch, iterations, static GPU request); 22 GPUs are
#: not enough for all of it at once, so jobs queue and the placement order matters
TRACE = (
    (0, "gpt-1.3b", 256, 30, 4),
    (0, "bert__760M", 256, 20, 2),
    (0, "gpt-350m", 128, 25, 2),
    (0, "moe__690M", 256, 35, 4),
    (0, "wide_resnet__500M", 256, 45, 2),
    (0, "gpt-2.7b", 256, 40, 8),
    (5, "gpt-125m", 64, 10, 1),
    (5, "bert__1.3B", 256, 20, 4),
    (10, "gpt-1.3b", 128, 25, 4),
    (10, "gpt-350m", 256, 15, 2),
    (15, "moe__690M", 128, 20, 2),
    (15, "wide_resnet__500M", 128, 30, 4),
    (20, "gpt-125m", 128, 10, 1),
    (20, "bert__760M", 128, 25, 2),
    (25, "gpt-2.7b", 128, 20, 8),
    (25, "gpt-350m", 64, 15, 1),
    (30, "bert__1.3B", 128, 15, 4),
    (30, "gpt-1.3b", 64, 20, 2),
    (35, "moe__690M", 64, 10, 2),
    (35, "gpt-125m", 256, 15, 2),
)
#: the replayed job: runs until the harness says its time is over (SIGUSR1), at most 10 minutes
JOB_SCRIPT = """#!/bin/bash
trap 'kill "$pid" 2>/dev/null; exit 0' USR1
sleep 600 & pid=$!
wait "$pid"
exit 1
"""
#: seconds to wait for Slurm to start, end or settle a job (a loaded machine is slow)
SLURM_WAIT_S = 90.0

#: (round time s, trace job, cell key, nodes as "node:gpus" with the dev cluster's names)
Placement = tuple[float, str, str, str]


#: the runtime of every job in both runs: a submission cannot name the simulator's own
#: (adaptive), so both name exact (the reference trainer's), which carries out the same plans
RUNTIME = "exact"


def trace() -> list[TraceJob]:
    """TRACE as the simulator's trace jobs j00..j19."""
    return [
        TraceJob(f"j{i:02d}", float(t), model, batch, iterations, gpus, line=i + 1)
        for i, (t, model, batch, iterations, gpus) in enumerate(TRACE)
    ]


def constant_speed(spec: JobSpec, gpu_type: str, num_nodes: int, gpus_per_node: int, plan: JobPlan | None) -> float:
    """The simulator's truth: ITER_S per iteration on any cell."""
    return ITER_S


def estimator(profiles: Path) -> MixedEstimator:
    """What the controller builds from its config's profiles_path (speeds.make_estimator)."""
    return MixedEstimator(Estimator(open_store(str(profiles))))


def placements(
    state_path: Path, ids: Mapping[str, str], round_time: Mapping[int, float], node_name: Mapping[str, str]
) -> list[Placement]:
    """Every "placed" event of the trace's jobs in a controller's state,
    sorted by round, then trace job."""
    out: list[Placement] = []
    with StateStore(state_path, readonly=True) as state:
        for trace_id, slurm_id in ids.items():
            for e in state.history(slurm_id):
                if e["event"] == "placed":
                    nodes = ",".join(
                        f"{node_name.get(n, n)}:{g}"
                        for n, _, g in (part.partition(":") for part in e["nodes"].split(","))
                    )
                    out.append((round_time[e["round_id"]], trace_id, e["cell"], nodes))
    return sorted(out)


def specs(state_path: Path, ids: Mapping[str, str]) -> dict[str, str | None]:
    """Trace job -> the spec its controller accepted (JSON)."""
    with StateStore(state_path, readonly=True) as state:
        rows = state.jobs()
    return {t: rows[s].spec if s in rows else None for t, s in ids.items()}


def show(placed: list[Placement]) -> list[str]:
    return [f"t={t:5.1f}s  {job}  {cell:<16} {nodes}" for t, job, cell, nodes in placed]


# --- the simulated run ---------------------------------------------------------------


def simulate(workdir: Path, profiles: Path) -> tuple[list[Placement], dict[str, str | None]]:
    """The trace on the simulated dev cluster: placements and accepted specs."""
    cluster = load_cluster_spec(ADMIN / "sim-cluster.toml")
    shape = read_shape(SHAPE)
    sim_nodes = node_names(cluster)
    assert [(t, g) for _, t, g in sim_nodes] == list(shape.values()), "sim-cluster.toml is not the dev cluster"
    real_names = dict(zip((name for name, _, _ in sim_nodes), shape, strict=True))
    options = SimOptions(
        interval_s=1e6,
        min_gap_s=0.0,
        early_rounds=True,
        skip_idle_rounds=True,
        start_delay_s=0.0,
        restart_per_gpu_s=0.0,
        restart_max_s=0.0,
        elastic=False,
        min_gpus=1,
        max_gpus=MAX_GPUS,
        progress_rate_factor=RATE_FACTOR,
        runtime=RUNTIME,
        solver=SOLVER,
    )
    workdir.mkdir()
    sim = Simulator(
        trace(),
        cluster,
        POLICY,
        speed=constant_speed,
        estimator=estimator(profiles),
        options=options,
        state_dir=workdir,
    )
    run = sim.run()
    assert all(o.finished for o in run.jobs), [o for o in run.jobs if not o.finished]
    assert not run.meta["controller_warnings"], run.meta["controller_warning_examples"]
    state_path = workdir / f"state-{POLICY}.sqlite"
    with StateStore(state_path, readonly=True) as state:
        round_time = {r["id"]: r["started"] - sim.t0 for r in state.rounds(limit=10_000)}
    return placements(state_path, sim.slurm_ids, round_time, real_names), specs(state_path, sim.slurm_ids)


# --- the real run -----------------------------------------------------------------------


class Replay:
    """The harness on the real dev cluster: submits, ends jobs and runs rounds
    in the trace's event order, paced by the wall clock."""

    def __init__(self, workdir: Path, profiles: Path) -> None:
        self.workdir = workdir
        self.state_path = workdir / "state.sqlite"
        self.script = workdir / "replay_job.sh"
        self.script.write_text(JOB_SCRIPT)
        self.script.chmod(0o755)
        config = Config(
            controller=ControllerConfig(
                policy=POLICY,
                state_path=str(self.state_path),
                profiles_path=str(profiles),
                kick_file="",
                checkpoint_root=str(workdir / "ckpt"),
                slurm_timeout_s=60.0,
                progress_rate_factor=RATE_FACTOR,
            ),
            solver=SOLVER,
            network=NETWORK,
        )
        self.controller = Controller(config)
        self.backend: Backend = get_backend("cli", timeout=60.0)
        self.ids: dict[str, str] = {}  # trace job -> Slurm job id
        self.round_time: dict[int, float] = {}  # round id -> trace time
        self.late_s = 0.0  # the most a round ran after its trace time (wall clock)

    def submit(self, job: TraceJob) -> str:
        """`cellsched sbatch` with the spec the simulator gives the job."""
        args = [
            "--parsable",
            "--model",
            job.model,
            "--global-batch",
            str(job.global_batch),
            "--iterations",
            str(job.iterations),
            "--no-elastic",
            "--runtime",
            RUNTIME,
            "--min-gpus",
            "1",
            "--max-gpus",
            str(max(MAX_GPUS, job.requested_gpus)),
            "--gpus",
            str(job.requested_gpus),
            "-J",
            job.job_id,
            "-o",
            str(self.workdir / "%j.out"),
            "--",
            str(self.script),
        ]
        proc = subprocess.run(
            [sys.executable, "-m", "slurm_ext", "sbatch", *args],
            cwd=self.workdir,
            env=os.environ.copy(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, f"cellsched sbatch {job.job_id}: {proc.stderr[-2000:]}"
        job_id = proc.stdout.strip().splitlines()[-1]
        assert job_id.isdigit(), proc.stdout
        return job_id

    def jobs(self) -> dict[str, SlurmJob]:
        ours = set(self.ids.values())
        return {j.job_id: j for j in self.backend.observe().jobs if j.job_id in ours}

    def quiet(self) -> bool:
        """Every job of ours is held, running or finished, and the nodes'
        allocated GPUs are exactly those of the running jobs."""
        snap = self.backend.observe()
        ours = set(self.ids.values())
        running = 0
        for j in snap.jobs:
            if j.job_id not in ours or j.finished:
                continue
            if j.state == "RUNNING":
                running += (j.gpus_per_node or 0) * len(j.nodes)
            elif not (j.state == "PENDING" and j.held):
                return False
        return running == sum(n.gpus_alloc for n in snap.nodes)

    def wait_states(self, job_ids: list[str], want: str) -> None:
        def reached() -> bool:
            jobs = self.jobs()
            return all(
                i in jobs and (jobs[i].finished if want == "finished" else jobs[i].state == want) for i in job_ids
            )

        wait_for(reached, timeout=SLURM_WAIT_S, interval=0.3, what=f"jobs {job_ids} to be {want}")

    def run(self) -> None:
        jobs = {j.job_id: j for j in trace()}
        # (trace time, 0: the job ends / 1: it arrives, trace job)
        events: list[tuple[float, int, str]] = [(j.submit_time, 1, j.job_id) for j in jobs.values()]
        heapq.heapify(events)
        start = time.monotonic()
        while events:
            now = events[0][0]
            batch = []
            while events and events[0][0] == now:
                batch.append(heapq.heappop(events))
            wait = start + now - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            ending = [self.ids[j] for _, kind, j in batch if kind == 0]
            for job_id in ending:
                self.backend.signal(job_id, "USR1", target="batch")
            self.wait_states(ending, "finished")
            for _, kind, j in batch:
                if kind == 1:
                    self.ids[j] = self.submit(jobs[j])
            wait_for(self.quiet, timeout=SLURM_WAIT_S, interval=0.3, what="Slurm to settle before a round")
            self.late_s = max(self.late_s, time.monotonic() - start - now)
            report = self.controller.round()
            assert report.status == RoundStatus.OK, report.error
            assert report.round_id is not None
            self.round_time[report.round_id] = now
            assert all(a.get("ok") for a in report.actions), report.actions
            by_slurm = {s: t for t, s in self.ids.items()}
            placed = [a["job"] for a in report.actions if a["kind"] == "place"]
            for job_id in placed:
                t = by_slurm[job_id]
                heapq.heappush(events, (now + (jobs[t].iterations or 0) * ITER_S, 0, t))
            self.wait_states(placed, "RUNNING")

    def check_completed(self) -> None:
        jobs = self.jobs()
        bad = {
            t: (jobs[s].state, jobs[s].exit_code)
            for t, s in self.ids.items()
            if jobs[s].state != "COMPLETED" or jobs[s].exit_code != 0
        }
        assert not bad, f"replayed jobs that did not complete: {bad}"


# --- the test ----------------------------------------------------------------------------


def test_replay_on_sim_and_slurm_places_the_same(slurm_cluster, tmp_path):
    """Same trace, policy and profiles: the simulator and the real cluster
    place the same jobs in the same rounds, in the same cells and nodes."""
    profiles = tmp_path / "profiles.sqlite"
    open_store(str(profiles)).close()  # seeded once, read by both runs
    sim_placed, sim_specs = simulate(tmp_path / "sim", profiles)
    # the trace exercises queueing: several rounds place jobs, some jobs wait
    arrival = {j.job_id: j.submit_time for j in trace()}
    assert len({t for t, *_ in sim_placed}) >= 5, show(sim_placed)
    assert sum(1 for t, job, *_ in sim_placed if t > arrival[job]) >= 5, show(sim_placed)

    real_dir = tmp_path / "real"
    real_dir.mkdir()
    replay = Replay(real_dir, profiles)
    t0 = time.monotonic()
    replay.run()
    wall = time.monotonic() - t0
    replay.controller.state.close()
    replay.check_completed()
    real_placed = placements(replay.state_path, replay.ids, replay.round_time, {})
    print(f"\nreal replay: {wall:.0f} s wall; its rounds ran at most {replay.late_s:.1f} s after their trace time")

    if real_placed != sim_placed:
        diff = "\n".join(
            difflib.unified_diff(show(sim_placed), show(real_placed), "simulator", "real Slurm", lineterm="")
        )
        pytest.fail(f"placements differ (round time, job, cell, nodes):\n{diff}", pytrace=False)
    print("\n".join(show(real_placed)))
    assert specs(replay.state_path, replay.ids) == sim_specs, "the two runs did not get the same job specs"
