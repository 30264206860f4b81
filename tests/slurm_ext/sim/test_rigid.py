"""Rigid trace jobs (SimOptions.rigid, `cellsched simulate --policy
NAME:rigid=true`): every job submitted not elastic at exactly its requested
GPUs, so that a policy chooses only its GPU type and nodes."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest

from slurm_ext.cli.simulate_cmd import SimulateError, parse_policies, split_job_keys
from slurm_ext.sim.engine import SimError, SimOptions, Simulator
from slurm_ext.sim.types import ClusterSpec, JobOutcome, NodeGroup, TraceJob
from solver.types import SolverConfig
from tests.slurm_ext.sim.test_engine import Table
from tests.slurm_ext.sim.test_simulate_cli import TRACE, cellsched, inputs

#: more GPUs run faster: an elastic cellsched grows a job, a rigid one may not
FAST = Table({(t, n): 8.0 / n for t in ("a100", "v100") for n in (1, 2, 4, 8)})
TWO_TYPES = ClusterSpec((NodeGroup("a100", 1, 8), NodeGroup("v100", 1, 8)))


def simulator(trace: list[TraceJob], **opts: object) -> Simulator:
    return Simulator(
        trace,
        TWO_TYPES,
        "cellsched",
        speed=FAST.speed,
        estimator=FAST,
        options=SimOptions(restart_per_gpu_s=0.0, restart_max_s=0.0, **opts),  # type: ignore[arg-type]
    )


def simulate(trace: list[TraceJob], **opts: object) -> dict[str, JobOutcome]:
    """Each trace job's outcome of a cellsched run."""
    return {j.job_id: j for j in simulator(trace, **opts).run().jobs}


def test_every_submitted_spec_is_rigid_at_its_request_and_the_default_stays_elastic():
    trace = [TraceJob(f"j{g}", 10.0 * g, "bert__760M", 64, 100, g, "v100") for g in (1, 2, 4)]
    for opts, want in (({"rigid": True}, lambda g: (False, g, g, g)), ({}, lambda g: (True, 1, 16, g))):
        sim = simulator(trace, **opts)
        for tj in trace:
            sim.submitter.submit(tj)
            spec = sim.world.jobs[sim.slurm_ids[tj.job_id]].spec  # as the simulated Slurm read its comment
            assert spec is not None
            assert (spec.elastic, spec.min_gpus, spec.max_gpus, spec.requested_gpus) == want(tj.requested_gpus)


def test_a_rigid_job_runs_its_request_for_its_whole_life():
    """One job of 1 GPU alone on two 8-GPU nodes: elastic, cellsched runs it
    on more GPUs (faster by the table); rigid, on 1 GPU for 100 x 8 s."""
    trace = [TraceJob("a", 0.0, "bert__760M", 64, 100, 1, "v100")]
    a = simulate(trace, rigid=True)["a"]
    assert len(a.cells) == 1 and held(a.cells[0]) == 1 and a.restarts == 0
    assert (a.first_start, a.end_time, a.gpu_seconds) == (0.0, 800.0, 800.0)
    grown = simulate(trace)["a"]
    assert any(held(c) > 1 for c in grown.cells), grown  # the elastic run is not rigid


def test_rigid_key_per_policy_in_one_run(tmp_path):
    """Two cellsched runs in one invocation, one rigid: the rigid run's jobs
    each hold exactly the GPUs the trace file asks for from first start to
    end (the run's per-job records, against the trace's num_gpu column),
    in one cell, never restarted; the other run's jobs are resized or moved."""
    trace, cluster = inputs(tmp_path)
    out = tmp_path / "out"
    proc = cellsched(
        *("--trace", str(trace), "--cluster", str(cluster), "--realistic", "--interval", "30", "--no-plots"),
        *("--policy", "cellsched", "--policy", "cellsched:rigid=true", "--out", str(out), "--json"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    asked = {r["job_id"]: (int(r["num_gpu"]), r["gpu_type"]) for r in csv.DictReader(io.StringIO(TRACE))}
    doc = json.loads((out / "results.json").read_text())
    assert doc["meta"]["rigid"] == ["cellsched:rigid=true"]
    runs = doc["runs"]
    assert [runs[p]["meta"]["options"]["rigid"] for p in ("cellsched", "cellsched:rigid=true")] == [False, True]
    other_type = 0
    for j in runs["cellsched:rigid=true"]["jobs"]:
        gpus, gpu_type = asked[j["job_id"]]
        assert j["finished"] and j["restarts"] == 0 and len(j["cells"]) == 1, j
        assert held(j["cells"][0]) == gpus, j
        assert math.isclose(j["gpu_seconds"], gpus * (j["end_time"] - j["first_start"]), rel_tol=1e-9), j
        other_type += j["cells"][0].partition(":")[0] != gpu_type
    assert other_type > 0  # the requested type does not pin cellsched's choice
    elastic = [
        j
        for j in runs["cellsched"]["jobs"]
        if j["restarts"] or any(held(c) != asked[j["job_id"]][0] for c in j["cells"])
    ]
    assert elastic  # the other run's jobs stayed elastic


def held(cell: str) -> int:
    """The GPUs of a run's cell as the run records it, TYPE[+TYPE]:NODESxGPUS_PER_NODE."""
    nodes, per = cell.partition(":")[2].split("x")
    return int(nodes) * int(per)


def test_job_keys_are_split_from_the_solver_keys():
    assert split_job_keys("cellsched") == ({}, "")
    assert split_job_keys("cellsched:rigid=true,calibrate=false") == ({"rigid": True}, "calibrate=false")
    assert split_job_keys("gavel:rigid=false") == ({"rigid": False}, "")
    ((label, name, cfg),) = parse_policies(["cellsched:calibrate=false,rigid=true"], SolverConfig())
    assert (label, name, cfg.calibrate) == ("cellsched:calibrate=false,rigid=true", "cellsched", False)
    assert parse_policies(["cellsched:rigid=true"], SolverConfig())[0][2] == SolverConfig()
    with pytest.raises(SimulateError, match="expected key=value"):
        parse_policies(["cellsched:"], SolverConfig())


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("cellsched:rigid=maybe", "--policy cellsched:rigid=maybe: rigid must be true or false, got 'maybe'"),
        ("cellsched:rigid=1", "rigid must be true or false, got '1'"),
        ("cellsched:rigid", "rigid must be true or false, got ''"),
        ("cellsched:rigid=true,rigid=false", "rigid is given twice"),
    ],
)
def test_a_bad_rigid_value_is_a_clear_error(text, words):
    with pytest.raises(SimulateError) as exc:
        parse_policies([text], SolverConfig())
    assert words in exc.value.message


def test_a_bad_rigid_value_on_the_command_line_exits_2(tmp_path):
    trace, _ = inputs(tmp_path)
    proc = cellsched("--trace", str(trace), "--policy", "fcfs:rigid=yes", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "cellsched simulate: error: --policy fcfs:rigid=yes: rigid must be true or false, got 'yes'"
    ]


def test_sim_options_refuse_a_rigid_that_is_not_a_bool():
    with pytest.raises(SimError, match="SimOptions.rigid must be true or false"):
        SimOptions(rigid="yes")  # type: ignore[arg-type]


def test_run_wide_rigid_flag_and_a_policy_that_opts_out(tmp_path):
    trace, cluster = inputs(tmp_path)
    out = tmp_path / "out"
    proc = cellsched(
        *("--trace", str(trace), "--cluster", str(cluster), "--limit-jobs", "2", "--rigid", "--no-plots"),
        *("--policy", "fcfs", "--policy", "cellsched:rigid=false", "--out", str(out), "--json"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["meta"]["rigid"] == ["fcfs"]
    assert [doc["runs"][p]["meta"]["options"]["rigid"] for p in ("fcfs", "cellsched:rigid=false")] == [True, False]
