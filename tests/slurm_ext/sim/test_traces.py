"""Trace readers: Arena's shipped Philly trace and a Slurm accounting export.

tests/slurm_ext/sim/data/sacct_sample.txt is hand-written after the sacct man page
(`sacct -a -P -X -o JobID,JobName,User,Submit,Start,End,State,AllocTRES,NNodes,Comment`,
plus step rows as printed without -X); the reference folder has no real
sacct output (the dev cluster runs without slurmdbd).
"""

from __future__ import annotations

import itertools
import pathlib

import pytest

from slurm_ext.sim.traces import TraceError, load_sacct, parse_tres_gpus, read_arena_trace, read_sacct
from solver.contract.profiles.arena import shipped_path

PHILLY = shipped_path("traces/simulate_trace_philly.csv")
SACCT = pathlib.Path(__file__).parent / "data" / "sacct_sample.txt"


def test_philly_trace_reads():
    jobs = read_arena_trace(PHILLY)
    assert len(jobs) == 1938
    first = jobs[0]
    assert (
        first.job_id,
        first.submit_time,
        first.iterations,
        first.model,
        first.deadline,
        first.global_batch,
        first.requested_gpus,
        first.requested_gpu_type,
        first.line,
    ) == ("f043f272-f7a0-6861-353c-30479e8fffc1", 1945645.0, 119965, "bert__2.6B", 1956739.0, 256, 4, "a40", 2)
    assert all(a.submit_time <= b.submit_time for a, b in itertools.pairwise(jobs))
    assert len({j.job_id for j in jobs}) == 1938
    assert {j.requested_gpu_type for j in jobs} == {"a100", "v100", "a40", "a10"}


def test_iteration_scale():
    plain = read_arena_trace(PHILLY)
    scaled = read_arena_trace(PHILLY, iteration_scale=5)
    assert scaled[0].iterations == 119965 // 5 == 23993
    assert all(s.iterations == max(1, p.iterations // 5) for p, s in zip(plain, scaled, strict=True))
    with pytest.raises(ValueError, match="iteration_scale"):
        read_arena_trace(PHILLY, iteration_scale=0)


def test_sort_is_stable_by_submit(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(
        "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"
        "b,20,10,bert__760M,,128,1,a100\n"
        "a,10,10,bert__760M,,128,1,a100\n"
        "c,20,10,bert-760m,,128,2,\n"
    )
    jobs = read_arena_trace(path)
    assert [j.job_id for j in jobs] == ["a", "b", "c"]
    assert jobs[2].model == "bert__760M" and jobs[2].requested_gpu_type is None and jobs[2].deadline is None


def _mutated(tmp_path, line_no: int, column: str, value: str) -> pathlib.Path:
    lines = PHILLY.read_text().splitlines()
    header = lines[0].split(",")
    row = lines[line_no - 1].split(",")
    row[header.index(column)] = value
    lines[line_no - 1] = ",".join(row)
    out = tmp_path / "trace.csv"
    out.write_text("\n".join(lines) + "\n")
    return out


@pytest.mark.parametrize(
    "column,value,message",
    [
        ("num_gpu", "x", "must be a positive integer, got 'x'"),
        ("batch_size", "0", "must be a positive integer"),
        ("submission_time", "-3", "non-negative number"),
        ("model_name", "bert__999B", "unknown preset"),
        ("gpu_type", "A100", "lower-case"),
    ],
)
def test_malformed_field_names_line_and_field(tmp_path, column, value, message):
    path = _mutated(tmp_path, 17, column, value)
    with pytest.raises(TraceError) as err:
        read_arena_trace(path)
    assert (err.value.line, err.value.field, err.value.path) == (17, column, str(path))
    assert f"trace.csv:17: field '{column}': " in str(err.value) and message in str(err.value)


def test_duplicate_job_id(tmp_path):
    first_id = PHILLY.read_text().splitlines()[1].split(",")[0]
    path = _mutated(tmp_path, 9, "job_id", first_id)
    with pytest.raises(TraceError, match=r"trace.csv:9: field 'job_id': duplicate .*first on line 2") as err:
        read_arena_trace(path)
    assert err.value.line == 9


def test_missing_column(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text(
        "job_id,submission_time,num_iteration,model_name,deadline,batch_size,gpu_type\na,1,10,bert__760M,,128,a100\n"
    )
    with pytest.raises(TraceError, match="trace.csv:1: field 'num_gpu': missing column") as err:
        read_arena_trace(path)
    assert err.value.field == "num_gpu"


def test_sacct_sample():
    trace = load_sacct(SACCT)
    assert trace.skipped == {"job step": 3, "no GPU": 1, "never started": 1, "not ended": 1}
    by_id = {j.job_id: j for j in trace.jobs}
    assert [j.job_id for j in trace.jobs] == ["102", "101", "106"]  # by submit; 102 came first
    assert by_id["102"].submit_time == 0.0 and by_id["101"].submit_time == 60.0
    # typed TRES -> type; untyped -> None; duration = End - Start; defaults for unmanaged jobs
    a, b = by_id["101"], by_id["102"]
    assert (a.requested_gpus, a.requested_gpu_type, a.duration_s) == (4, "a100", 3600.0)
    assert (b.requested_gpus, b.requested_gpu_type, b.duration_s) == (8, None, 930.0)
    assert (by_id["101"].model, by_id["101"].global_batch, by_id["101"].iterations, by_id["101"].user) == (
        "gpt-1.3b",
        128,
        None,
        "alice",
    )
    # the cellsched spec in the Comment wins
    managed = by_id["106"]
    assert (
        managed.model,
        managed.global_batch,
        managed.iterations,
        managed.requested_gpus,
        managed.requested_gpu_type,
        managed.submit_time,
    ) == ("moe__2.4B", 256, 500, 4, "a40", 3060.0)
    assert read_sacct(SACCT, default_model="bert__760M", default_batch=64)[0].model == "bert__760M"
    with_cpu = load_sacct(SACCT, include_non_gpu=True)
    assert "103" in {j.job_id for j in with_cpu.jobs} and "no GPU" not in with_cpu.skipped


def test_sacct_other_column_order_and_trailing_pipe(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text(
        "AllocTRES|Partition|Submit|JobID|Start|End|\n"
        "gres/gpu:v100=2,cpu=2|v100|2024-05-01T10:00:00|7|2024-05-01T10:01:00|2024-05-01T10:02:00|\n"
    )
    (job,) = read_sacct(path)
    assert (job.job_id, job.requested_gpus, job.requested_gpu_type, job.duration_s) == ("7", 2, "v100", 60.0)


def test_tres_parsing():
    assert parse_tres_gpus("billing=4,cpu=4,gres/gpu:a100=4,gres/gpu=4,mem=16G,node=1") == (4, "a100")
    assert parse_tres_gpus("cpu=16,gres/gpu=8,mem=64G,node=2") == (8, None)
    assert parse_tres_gpus("gres/gpu:a40=2,gres/gpu:a10=2") == (4, None)
    assert parse_tres_gpus("cpu=2,mem=4G") == (0, None)
    with pytest.raises(ValueError, match="gres/gpu=two"):
        parse_tres_gpus("gres/gpu=two")


def test_sacct_malformed_timestamp_names_line(tmp_path):
    lines = SACCT.read_text().splitlines()
    lines[5] = lines[5].replace("2024-05-01T09:59:00", "01/05/2024 09:59")
    path = tmp_path / "sacct.txt"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=r"sacct.txt:6: field 'Submit': must be a timestamp") as err:
        read_sacct(path)
    assert (err.value.line, err.value.field) == (6, "Submit")


def test_sacct_errors(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text("JobID|Submit|Start\n1|2024-05-01T10:00:00|Unknown\n")
    with pytest.raises(TraceError, match="s.txt:1: field 'AllocTRES': missing column"):
        read_sacct(path)
    path.write_text("JobID|Submit|AllocTRES\n1|2024-05-01T10:00:00|gres/gpu=x\n")
    with pytest.raises(TraceError, match="s.txt:2: field 'AllocTRES'"):
        read_sacct(path)
    path.write_text(
        "JobID|Submit|AllocTRES|Start|End\n1|2024-05-01T10:00:00|gres/gpu=1|2024-05-01T10:00:00|"
        "2024-05-01T10:00:00\n1|2024-05-01T10:00:00|gres/gpu=1|2024-05-01T10:00:00|2024-05-01T10:00:00\n"
    )
    with pytest.raises(TraceError, match="s.txt:3: field 'JobID': duplicate"):
        read_sacct(path)
    path.write_text(
        "JobID|Submit|AllocTRES|Start|End|Comment\n"
        "1|2024-05-01T10:00:00|gres/gpu=1|2024-05-01T10:00:00|2024-05-01T10:00:00|cellsched/v1 {bad\n"
    )
    with pytest.raises(TraceError, match="s.txt:2: field 'Comment': malformed cellsched spec"):
        read_sacct(path)


def test_sacct_without_start_column_keeps_managed_jobs(tmp_path):
    spec = 'cellsched/v1 {"global_batch":128,"iterations":10,"model":"bert__760M","requested_gpus":2,"version":1}'
    path = tmp_path / "s.txt"
    path.write_text(
        f"JobID|Submit|AllocTRES|Comment\n1|2024-05-01T10:00:00|gres/gpu=2|{spec}\n2|2024-05-01T10:00:30|gres/gpu=1|\n"
    )
    trace = load_sacct(path)
    assert [(j.job_id, j.model, j.iterations, j.duration_s) for j in trace.jobs] == [("1", "bert__760M", 10, None)]
    assert trace.skipped == {"not ended": 1}  # no End column either: the unmanaged job has no duration
