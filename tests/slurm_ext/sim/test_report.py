"""Simulation reports: summary numbers computed by hand, the markdown
table, and the files write_report produces (valid PNGs, even for a run in
which nothing finished)."""

from __future__ import annotations

import json
import struct

import pytest

from slurm_ext.sim.report import PLOTS, markdown_table, percentile, summaries, summarize, write_report
from slurm_ext.sim.types import JobOutcome, RoundStat, Sample, SimRun

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def hand_run(policy: str = "cellsched") -> SimRun:
    jobs = (
        JobOutcome("A", 0.0, 0.0, 100.0, True, restarts=1, gpu_seconds=400.0, cells=("a100:1x4:pp1",)),
        JobOutcome("B", 0.0, 50.0, 200.0, True, gpu_seconds=1200.0),
        JobOutcome("C", 100.0, 150.0, 400.0, True, restarts=2),
        JobOutcome("D", 300.0, None, None, False),
    )
    samples = (
        Sample(0.0, 1, 1, 150.0, {"a100": 4}),
        Sample(50.0, 0, 2, 250.0, {"a100": 4, "v100": 8}),
        Sample(100.0, 1, 1, 50.0, {"v100": 8}),
        Sample(200.0, 1, 1, 120.0, {"a100": 4}),
        Sample(350.0, 1, 0, 0.0, {}),
    )
    rounds = (RoundStat(0.0, 0.1, 0.5, 2), RoundStat(300.0, 0.3, 1.5, 3, actions=1))
    return SimRun(policy, jobs, samples, rounds, {"a100": 8, "v100": 16}, wall_s=2.5, meta={"seed": 0})


def fcfs_run() -> SimRun:
    return SimRun(
        "fcfs",
        (JobOutcome("A", 0.0, 100.0, 400.0, True),),
        (Sample(0.0, 1, 0, 0.0, {}), Sample(100.0, 0, 1, 90.0, {"a100": 8})),
        (),
        {"a100": 8},
    )


def empty_run() -> SimRun:
    return SimRun("empty", (JobOutcome("X", 10.0, None, None, False),), (), (), {"a40": 4})


def test_summarize_hand_computed():
    r = summarize(hand_run())
    assert (r.policy, r.jobs_total, r.jobs_finished) == ("cellsched", 4, 3)
    # JCTs 100, 200, 300; p95 = 200 + 0.9 * 100
    assert (r.avg_jct_s, r.median_jct_s) == (200.0, 200.0)
    assert r.p95_jct_s == pytest.approx(290.0)
    assert r.avg_queue_s == pytest.approx(100.0 / 3)  # 0, 50, 50; D never started
    assert r.makespan_s == 400.0
    # timeline [0, 400]: 150*50 + 250*50 + 50*100 + 120*150 + 0*50 = 43000
    assert r.avg_throughput == pytest.approx(43000 / 400)
    assert r.avg_throughput_arena == pytest.approx(38000 / 250)  # only the periods above 100 samples/s
    assert r.peak_throughput == 250.0
    # a100: 4*50 + 4*50 + 4*150 = 1000 GPU-s of 8*400; v100: 8*150 = 1200 of 16*400
    assert r.gpu_util_by_type == pytest.approx({"a100": 0.3125, "v100": 0.1875})
    assert (r.restarts, r.rounds, r.wall_s) == (3, 2, 2.5)
    assert (r.round_mean_s, r.round_max_s, r.solve_mean_s) == pytest.approx((1.0, 1.5, 0.2))
    assert r.to_dict()["gpu_util_by_type"] == pytest.approx({"a100": 0.3125, "v100": 0.1875})


def test_summarize_empty_run_has_no_statistics():
    r = summarize(empty_run())
    assert (r.jobs_total, r.jobs_finished, r.avg_jct_s, r.p95_jct_s, r.avg_queue_s, r.makespan_s) == (
        1,
        0,
        None,
        None,
        None,
        None,
    )
    assert r.peak_throughput is None and r.avg_throughput_arena is None and r.rounds == 0


def test_percentile_matches_linear_interpolation():
    assert percentile([], 50) is None
    assert percentile([5.0], 95) == 5.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(range(1, 101), 95) == pytest.approx(95.05)


def test_markdown_table_has_each_policy_and_fcfs_ratio():
    table = markdown_table([summarize(hand_run()), summarize(fcfs_run()), summarize(empty_run())])
    rows = table.strip().splitlines()
    assert len(rows) == 2 + 3
    assert "JCT vs fcfs" in rows[0]
    assert rows[2].startswith("| cellsched | 3/4 | 200 | 0.50x |")  # 200 / fcfs's 400
    assert rows[3].startswith("| fcfs | 1/1 | 400 | 1.00x |")
    assert rows[4].startswith("| empty | 0/1 | - | - |")
    assert "JCT vs fcfs" not in markdown_table([summarize(hand_run())])


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_write_report_files(tmp_path):
    runs = [hand_run(), fcfs_run(), empty_run()]
    written = write_report(runs, tmp_path / "out", meta={"trace": "hand", "cluster": "dev"})
    assert set(written) == {"results.json", "results.md", *PLOTS}
    doc = json.loads(written["results.json"].read_text())
    assert doc["meta"] == {"trace": "hand", "cluster": "dev"}
    assert set(doc["summary"]) == {"cellsched", "fcfs", "empty"}
    assert doc["summary"]["cellsched"]["avg_jct_s"] == 200.0 and doc["summary"]["empty"]["avg_jct_s"] is None
    jobs = doc["runs"]["cellsched"]["jobs"]
    assert [j["job_id"] for j in jobs] == ["A", "B", "C", "D"] and jobs[0]["jct"] == 100.0
    assert jobs[0]["cells"] == ["a100:1x4:pp1"] and doc["runs"]["cellsched"]["meta"] == {"seed": 0}
    md = written["results.md"].read_text()
    assert all(f"| {p} |" in md for p in ("cellsched", "fcfs", "empty")) and "- trace: hand" in md
    for name in PLOTS:
        data = written[name].read_bytes()
        width, height = _png_size(data)
        assert width > 300 and height > 200 and len(data) > 5000, name


def test_write_report_with_only_empty_runs_and_without_plots(tmp_path):
    written = write_report([empty_run()], tmp_path / "a")
    for name in PLOTS:
        assert written[name].read_bytes()[:8] == PNG_MAGIC
    bare = write_report([hand_run()], tmp_path / "b", plots=False)
    assert set(bare) == {"results.json", "results.md"} and not list((tmp_path / "b").glob("*.png"))


def test_common_jct_compares_only_jobs_every_policy_finished():
    """hand_run finished A, B, C (JCTs 100, 200, 300); fcfs_run only A (400):
    the common column averages A alone, and is absent when all finished."""
    mine, fcfs = summaries([hand_run(), fcfs_run()])
    assert (mine.jobs_common, mine.avg_jct_common_s, fcfs.avg_jct_common_s) == (1, 100.0, 400.0)
    assert "avg JCT s, 1 jobs all finished" in markdown_table([mine, fcfs])
    assert summaries([fcfs_run()])[0].jobs_common is None
