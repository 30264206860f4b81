"""benchmarks/lp_first_rounds.py on the first rounds of the 4x Philly run: each
compared round is solved both ways on the node-class model, and each way's plan
lies where the solvers promise, checked against numbers the two ways do not
share: never below the greedy plan CP-SAT is warm-started from (the whole
model) and never above the LP relaxation's optimum (either way). The summary
counts the rows as they are; the simulation stops once enough rounds are
compared, and a run that compares none still ends with a summary."""

from __future__ import annotations

import json

import lp_first_rounds  # benchmarks/ is on the path (conftest.py)
import pytest

SIM = ["--", "--realistic", "--seed", "0", "--arrival-rate", "4", "--policy", "cellsched", "--limit-jobs", "40"]


@pytest.mark.slow  # a simulation
def test_rounds_are_solved_both_ways_within_the_greedy_plan_and_the_lp_bound(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    assert lp_first_rounds.main(["--rounds", "3", "--every", "2", "--out", str(out), *SIM]) == 0
    lines = [json.loads(s) for s in out.read_text().splitlines()]
    rows, summary = lines[:-1], lines[-1]
    assert [r["round"] for r in rows] == [2, 4, 6]  # every 2nd node-class round, stopped at the third
    for r in rows:
        assert r["jobs"] >= 1 and r["cols"] >= r["jobs"]
        assert r["cp_status"] in ("OPTIMAL", "FEASIBLE") and r["lpf_status"] in ("OPTIMAL", "FEASIBLE")
        assert r["hint"] <= r["cp"] <= r["lpbound"], r
        assert r["lpf"] <= r["lpbound"], r
    assert summary["rounds"] == 3
    assert summary["lp_first_better"] + summary["whole_better"] + summary["equal"] == 3
    assert summary["equal"] == sum(r["cp"] == r["lpf"] for r in rows)
    assert summary["cp_s"] == round(sum(r["cp_s"] for r in rows), 2)
    assert capsys.readouterr().out.splitlines()[-1] == out.read_text().splitlines()[-1]


def test_the_summary_by_hand():
    rows = [
        {"jobs": 10, "hint": 90, "cp": 100, "lpf": 101, "cp_s": 1.0, "lpf_s": 0.25},
        {"jobs": 90, "hint": 200, "cp": 200, "lpf": 199, "cp_s": 2.0, "lpf_s": 0.5},
        {"jobs": 120, "hint": 50, "cp": 50, "lpf": 50, "cp_s": 3.0, "lpf_s": 1.0},
    ]
    s = lp_first_rounds.summary(rows)
    assert (s["lp_first_better"], s["whole_better"], s["equal"], s["whole_returned_hint"]) == (1, 1, 1, 2)
    assert s["max_gain_pct"] == 1.0 and s["max_loss_pct"] == 0.5
    assert s["mean_gain_pct"] == round(100 * (0.01 - 0.005 + 0) / 3, 3)
    assert (s["cp_s"], s["lpf_s"], s["rounds_of_80_jobs_or_more"], s["cp_s_80_or_more"], s["lpf_s_80_or_more"]) == (
        6.0,
        1.75,
        2,
        5.0,
        1.5,
    )
    assert s["jobs_range"] == [10, 120]


@pytest.mark.slow
def test_a_run_that_compares_no_round_still_sums_up(tmp_path):
    out = tmp_path / "rows.jsonl"
    assert lp_first_rounds.main(["--every", "1000", "--out", str(out), *SIM]) == 0
    (line,) = [json.loads(s) for s in out.read_text().splitlines()]
    assert line["rounds"] == 0 and line["equal"] == 0 and line["jobs_range"] == [0, 0]
