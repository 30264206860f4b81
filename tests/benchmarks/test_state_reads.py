"""benchmarks/state_reads.py: the state files it makes hold what its doc
says (the month's mix of history per job, counted here from that rule, not
from the generator), and it prints one line per file with the round's reads
timed, then its provenance; `--state` times an existing file as it is."""

from __future__ import annotations

import json
import sqlite3

import pytest
import state_reads  # benchmarks/ is on the path (conftest.py)

from slurm_ext.state import StateStore


def expected_rows(finished: int, open_jobs: int) -> dict[str, int]:
    """Job i makes i % 5 moves (signal, requeue, resume each), one plan
    released ("placed") more than its moves, a "trained" event on its first
    plan and every odd one, one or two speed rows; a finished job also a
    "finished" event."""
    events = plans = speeds = 0
    for i in range(finished + open_jobs):
        moves = i % 5
        plans += moves + 1
        events += (moves + 1) + 3 * moves + 1 + (moves + 1) // 2
        speeds += 1 + i % 2
    return {"cell_history": events + finished, "plans": plans, "speeds": speeds}


def test_the_files_hold_the_months_mix_and_each_prints_its_reads(tmp_path, capsys):
    assert state_reads.main(["--history", "20", "--history", "60", "--open", "7", "--repeat", "2"]) == 0
    lines = [json.loads(s) for s in capsys.readouterr().out.splitlines()]
    first, second, provenance = lines
    for line, n in ((first, 20), (second, 60)):
        assert (line["history_jobs"], line["open_jobs"]) == (n, 7)
        assert line["cell_history_rows"] == expected_rows(n, 7)["cell_history"]
        assert set(line["by_read_ms"]) == set(state_reads.round_reads(StateStore(":memory:"), []))  # every read
        assert line["reads_ms"] > 0
    assert first["ratio"] == 1.0
    assert second["ratio"] == pytest.approx(second["reads_ms"] / first["reads_ms"], rel=1e-2)  # of unrounded times
    assert provenance["command"].startswith("python benchmarks/state_reads.py") and provenance["commit"]

    path = tmp_path / "state.sqlite"
    state_reads.make_state(path, 30, 4).close()
    with sqlite3.connect(path) as db:
        counts = {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("cell_history", "plans", "speeds")}
        assert db.execute("SELECT COUNT(*) FROM jobs WHERE finished = 0").fetchone()[0] == 4
    assert counts == expected_rows(30, 4)
    assert state_reads.main(["--state", str(path), "--repeat", "1"]) == 0
    line = json.loads(capsys.readouterr().out.splitlines()[0])
    assert (line["history_jobs"], line["open_jobs"], line["state"]) == (30, 4, str(path))
    with StateStore(path, readonly=True) as st:  # read only: nothing written
        assert len(st.jobs()) == 34
