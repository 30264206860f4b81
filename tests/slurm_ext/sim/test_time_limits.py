"""A job's time limit, from a sacct export's Timelimit to what slurm-multifactor's
backfill plans with: Slurm reserves by time limits, not by how long jobs really run."""

from __future__ import annotations

import pytest

from slurm_ext.backends.base import SubmitRequest
from slurm_ext.sim.backend import SimBackend
from slurm_ext.sim.engine import SimOptions, Simulator
from slurm_ext.sim.traces import TraceError, read_sacct
from slurm_ext.sim.types import ClusterSpec, NodeGroup, TraceJob
from slurm_ext.sim.world import SimWorld
from solver.estimator import EstimatorBase
from solver.types import Estimate, ParallelPlan

HEAD = "JobID|Submit|Start|End|AllocTRES|Timelimit\n"
ROW = "{id}|2024-05-01T10:00:00|2024-05-01T10:00:00|2024-05-01T10:01:00|gres/gpu:a100=1|{limit}\n"


def test_the_timelimit_column_is_read_in_seconds(tmp_path):
    path = tmp_path / "s.txt"
    limits = ("00:05:00", "1-02:00:00", "00:00:30", "UNLIMITED", "Partition_Limit", "")
    path.write_text(HEAD + "".join(ROW.format(id=i, limit=v) for i, v in enumerate(limits, 1)))
    got = {j.job_id: j.time_limit_s for j in read_sacct(path)}
    # Slurm rounds a limit with seconds up to the next minute
    assert got == {"1": 300.0, "2": 26 * 3600.0, "3": 60.0, "4": None, "5": None, "6": None}


def test_a_bad_timelimit_names_its_line(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text(HEAD + ROW.format(id=1, limit="00:05:00") + ROW.format(id=2, limit="soon"))
    with pytest.raises(TraceError, match=r"s.txt:3: field 'Timelimit': must be a Slurm time"):
        read_sacct(path)


def test_the_simulated_slurm_shows_the_limit():
    backend = SimBackend(SimWorld(ClusterSpec((NodeGroup("a100", 1, 4),))))
    jid = backend.submit(SubmitRequest(script="x.sh", gres_per_node=1, time_limit=7))
    (job,) = [j for j in backend.observe().jobs if j.job_id == jid]
    assert job.time_limit == 7


class Table(EstimatorBase):
    """1 s per iteration on any cell: truth and estimate."""

    def speed(self, spec, gpu_type, num_nodes, gpus_per_node, plan):
        return 1.0

    def estimate(self, job, cell):
        return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), 1.0, 1.0, "measured")


def third_start(limit_s: float | None) -> float | None:
    """One node of 4 GPUs: j1 (2 GPUs, 100 s, limit 10 min) at 0, j2 (4 GPUs, 100 s,
    limit 10 min) at 10, j3 (2 GPUs, 50 s, `limit_s`) at 20; j3's first start."""
    trace = [
        TraceJob("j1", 0.0, "bert__760M", 64, 100, 2, "a100", time_limit_s=600.0),
        TraceJob("j2", 10.0, "bert__760M", 64, 100, 4, "a100", time_limit_s=600.0),
        TraceJob("j3", 20.0, "bert__760M", 64, 50, 2, "a100", time_limit_s=limit_s),
    ]
    opts = SimOptions(restart_per_gpu_s=0.0, restart_max_s=0.0, elastic=False, interval_s=1.0)
    cluster = ClusterSpec((NodeGroup("a100", 1, 4),))
    run = Simulator(trace, cluster, "slurm-multifactor", speed=Table().speed, estimator=Table(), options=opts).run()
    return {j.job_id: j.first_start for j in run.jobs}["j3"]


def test_backfill_plans_with_the_time_limit():
    # j2 waits for j1 and holds a reservation from j1's expected end: 600 s by j1's limit.
    # j3 fits beside j1 now; Slurm backfills it only if it ends (by its limit) before then.
    assert third_start(300.0) == pytest.approx(20.0, abs=2)  # ends by 320 < 600: backfilled
    assert third_start(1200.0) == pytest.approx(200.0, abs=2)  # would end at 1220: after j2 (100 to 200)
