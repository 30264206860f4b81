"""`cellsched status` reads right: a finished job shows the state it ended in,
progress shows only where it is known (the job's progress file; ~ for a live
job's estimate), and unknown values are "-", never None or a 0."""

from __future__ import annotations

import json

import pytest

from slurm_ext.cli import status_cmd
from slurm_ext.state import JobStatus, SpeedRow, StateStore
from solver.contract.jobspec import JobSpec

SPEC = JobSpec(model="gpt-350m", global_batch=64, iterations=100).to_json()
HEAD = list(status_cmd.HEADER)

#: job id -> (what the controller saw: slurm state, phase, start, end, exit, iterations done, source, finished)
SEEN = {
    "10": ("COMPLETED", "finished", 950.0, 990.0, 0, 100.0, "file", True),  # its file said 100
    "11": ("COMPLETED", "finished", 950.0, 990.0, 0, 7.0, "estimate", True),  # only the run-time estimate
    "12": ("FAILED", "finished", 950.0, 960.0, 1, 7.0, "file", True),  # the file said 7 when it failed
    "13": ("CANCELLED", "finished", None, 930.0, None, None, None, True),  # cancelled before it ran
    "14": ("RUNNING", "running", 950.0, None, None, 40.0, "file", False),
    "15": ("RUNNING", "running", 950.0, None, None, 30.5, "estimate", False),
    "16": ("PENDING", "held", None, None, None, None, None, False),  # never ran
    "17": ("RUNNING", "running", 950.0, None, None, 20.0, "file", False),  # vanishes from Slurm (below)
}


@pytest.fixture
def rows(tmp_path):
    with StateStore(tmp_path / "s.sqlite") as st:
        for job_id in SEEN:
            st.accept_spec(job_id, "alice", SPEC, "comment", 1.0)
        st.save_statuses(
            [
                JobStatus(job_id, "alice", state, phase, "", 900.0, start, end, code, done, src, fin)
                for job_id, (state, phase, start, end, code, done, src, fin) in SEEN.items()
            ],
            2.0,
        )
        assert st.mark_vanished([j for j in SEEN if j != "17"], 3.0) == ["17"]
        # job 14 reported 0.8 s per iteration on a40 (then on a10: the newest row is shown), its profile said 0.4
        st.record_speeds([SpeedRow("14", "a40", "alice", "gpt-350m", "a40:1x2:pp1", 0.4, 0.8, 2.0, 3, 0.79, 2.0)])
        st.record_speeds([SpeedRow("14", "a10", "alice", "gpt-350m", "a10:1x2:pp1", 0.5, 1.5, 3.0, 1, 1.25, 2.5)])
        yield status_cmd.job_rows(st, now=1000.0, include_finished=True)


def table_columns(table: str) -> dict[str, dict[str, str]]:
    """job id -> {column: value} of a `status` table (no value holds spaces but REASON, the last)."""
    lines = table.splitlines()
    assert lines[0].split() == HEAD
    out = {}
    for line in lines[1:]:
        cells = line.split(maxsplit=len(HEAD) - 1)
        out[cells[0]] = dict(zip(HEAD, cells + [""] * (len(HEAD) - len(cells)), strict=True))
    return out


def test_finished_jobs_show_their_final_state_and_progress_only_when_known(rows):
    cols = table_columns(status_cmd._table(rows))
    shown = {j: (c["STATE"], c["PROGRESS"]) for j, c in cols.items()}
    assert shown == {
        "10": ("COMPLETED", "100/100"),
        "11": ("COMPLETED", "-"),  # an estimate is no count for a job that ended
        "12": ("FAILED", "7/100"),
        "13": ("CANCELLED", "-"),
        "14": ("RUNNING", "40/100"),
        "15": ("RUNNING", "~30/100"),
        "16": ("PENDING", "-"),  # not "0/100": it never ran
        "17": (status_cmd.ENDED, "-"),  # Slurm dropped it while running: its end and last count are unknown
    }
    assert cols["17"]["REASON"] == "no longer listed by Slurm"


def test_unknown_values_are_dashes_never_none_or_zero(rows):
    table = status_cmd._table(rows)
    assert "None" not in table and "?" not in table
    cols = table_columns(table)
    for job_id in ("13", "16"):  # never placed, never ran: nothing about a cell, speed or progress is known
        keys = ("CELL", "NODES", "PP/DP/TP", "SAMPLES/S", "S/IT(EST/OBS)", "PROGRESS")
        assert [cols[job_id][k] for k in keys] == ["-"] * 6
    assert cols["13"]["QUEUED"] == "0:00:30"  # submitted at 900, cancelled at 930 without running
    assert cols["16"]["QUEUED"] == "0:01:40"  # still waiting at now=1000


def test_the_estimated_speed_stands_against_the_observed_one(rows):
    """The newest GPU type's speeds: the calibrated estimate against what the job reported."""
    cols = table_columns(status_cmd._table(rows))
    assert cols["14"]["S/IT(EST/OBS)"] == "1.25/1.5" and cols["15"]["S/IT(EST/OBS)"] == "-"
    by_id = {r["job_id"]: r for r in rows}
    assert [by_id["14"][k] for k in ("iter_s_profile", "iter_s_estimated", "iter_s_observed")] == [0.5, 1.25, 1.5]


def test_json_rows_carry_the_same_state_and_progress(rows):
    by_id = {r["job_id"]: json.loads(json.dumps(r)) for r in rows}
    assert (by_id["17"]["state"], by_id["17"]["finished"], by_id["17"]["progress"]) == ("ENDED", True, "-")
    assert (by_id["10"]["progress"], by_id["10"]["iterations_done"], by_id["10"]["progress_source"]) == (
        "100/100",
        100.0,
        "file",
    )
    assert by_id["16"]["iterations_done"] is None and by_id["16"]["finished"] is False


@pytest.mark.parametrize(
    "done, total, source, state, text",
    [
        (100.0, 100, "file", "COMPLETED", "100/100"),
        (99.9, 100, "file", "RUNNING", "99/100"),  # never rounds up to "done"
        (0.0, 100, "file", "RUNNING", "0/100"),  # a real count of 0 (the file said so)
        (12.0, 100, "estimate", "RUNNING", "~12/100"),
        (12.0, 100, "estimate", "TIMEOUT", "-"),
        (12.0, 100, "file", status_cmd.ENDED, "-"),  # the count before an end nobody saw
        (None, 100, None, "PENDING", "-"),
        (5.0, None, "file", "RUNNING", "-"),  # no total known
    ],
)
def test_progress_text(done, total, source, state, text):
    assert status_cmd.progress_text(done, total, source, state) == text
