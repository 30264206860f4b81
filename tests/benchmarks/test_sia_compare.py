"""benchmarks/sia_compare.py: two runs of the Sia artifact's simulator, model by
model and GPU type by GPU type, against sums worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sia_compare import compare, load, main, model_of

GPUS = {"x": 4, "y": 2}


def write_run(tmp: Path, name: str, jobs: list[tuple[str, str, int, float]], rounds: list[object]) -> Path:
    """A run's files as benchmarks/sia_artifact.py writes them; its log's path."""
    log = tmp / f"{name}.log"
    rows = ["job,submit_s,completion_s,jct_s,restarts,gpu_s"]
    rows += [f"{j},0,{jct},{jct},{r},{g}" for j, jct, r, g in jobs]
    log.with_suffix(".jobs.csv").write_text("\n".join(rows) + "\n")
    lines = [json.dumps({"gpus": GPUS})] + [json.dumps(r) for r in rounds]
    log.with_suffix(".rounds.jsonl").write_text("\n".join(lines) + "\n")
    return log


JOBS_A = [("m-1", "3600", 1, 7200.0), ("m-2", "7200", 3, 3600.0), ("n-1", "1800", 0, 900.0)]
# m-1 on 4 x GPUs, m-2 waiting for 100 s; then m-1 on 2 x, m-2 on 2 y for 200 s; n-1 on 1 y
# throughout; the last round (t=300) holds nothing
ROUNDS_A = [
    {"t": 0, "jobs": [["m-1", "x", 4], ["m-2", None, 0], ["n-1", "y", 1]]},
    {"t": 100, "jobs": [["m-1", "x", 2], ["m-2", "y", 2], ["n-1", "y", 1]]},
    {"t": 300, "jobs": []},
]
JOBS_B = [("m-1", "1800", 0, 3600.0), ("m-2", "3600", 1, 3600.0), ("n-1", "3600", 2, 1800.0)]
ROUNDS_B = [{"t": 0, "jobs": [["m-1", "y", 2], ["m-2", "x", 4], ["n-1", None, 0]]}, {"t": 600, "jobs": []}]


def test_model_is_the_name_without_its_number() -> None:
    assert model_of("cifar10-3") == "cifar10"
    assert model_of("gpt-pmp-12") == "gpt-pmp"
    assert model_of("solo") == "solo"
    assert model_of("bert-x") == "bert-x"


def test_models_and_types_against_hand_sums(tmp_path: Path) -> None:
    a = load(write_run(tmp_path, "a", JOBS_A, ROUNDS_A))
    b = load(write_run(tmp_path, "b", JOBS_B, ROUNDS_B))
    lines = compare(a, b)
    m, n, x, y, total = lines
    assert m["model"] == "m" and m["jobs"] == 2
    # a: JCT (3600 + 7200) / 2 s; restarts (1 + 3) / 2; GPU s (7200 + 3600) / 2
    assert m["a"]["avg_jct_h"] == 1.5 and m["a"]["restarts_per_job"] == 2.0 and m["a"]["gpu_hours_per_job"] == 1.5
    # a: GPU s 4*100 + (2+2)*200 = 1200 over 2*100 + 2*200 = 600 s unfinished; x 300 s, y 200 s, waiting 100 s
    assert m["a"]["mean_gpus"] == 2.0
    assert m["a"]["types"] == {"none": round(100 / 600, 3), "x": 0.5, "y": round(200 / 600, 3)}
    # b: 2*600 + 4*600 over 1200 s
    assert m["b"]["mean_gpus"] == 3.0 and m["b"]["types"] == {"x": 0.5, "y": 0.5}
    assert m["jct_ratio"] == round(5400 / 10800, 4) and m["jct_diff_h"] == -1.5
    assert n["model"] == "n" and n["a"]["mean_gpus"] == 1.0 and n["b"]["types"] == {"none": 1.0}
    assert n["jct_ratio"] == 2.0 and n["jct_diff_h"] == 0.5
    # x in a: 4*100 + 2*200 = 800 GPU s over 300 s, all 4 held for 100 s; in b: 4 for all 600 s
    assert x == {
        "gpu_type": "x",
        "gpus": 4,
        "a": {"mean_busy": round(800 / 300, 2), "full_share": round(100 / 300, 3)},
        "b": {"mean_busy": 4.0, "full_share": 1.0},
    }
    # y in a: 1*100 + 3*200 = 700 over 300 s, both held for 200 s; in b: 2 for 600 s
    assert y["a"] == {"mean_busy": round(700 / 300, 2), "full_share": round(200 / 300, 3)}
    assert y["b"] == {"mean_busy": 2.0, "full_share": 1.0}
    assert total == {
        "jobs": 3,
        "avg_jct_h": {"a": round(12600 / 3 / 3600, 4), "b": round(9000 / 3 / 3600, 4)},
        "jct_ratio": round(9000 / 12600, 4),
    }


def test_cli_prints_json_lines_and_refuses_bad_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(tmp_path, "a", JOBS_A, ROUNDS_A)
    b = write_run(tmp_path, "b", JOBS_B, ROUNDS_B)
    assert main([str(a), str(b)]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line.get("model", line.get("gpu_type")) for line in out[:-1]] == ["m", "n", "x", "y"]
    unfinished = write_run(tmp_path, "c", [*JOBS_A[:2], ("n-1", "", 0, 0.0)], ROUNDS_A)
    assert main([str(a), str(unfinished)]) == 2
    err = capsys.readouterr().err
    assert "c.jobs.csv" in err and "'n-1' did not finish" in err
    other = write_run(tmp_path, "d", JOBS_A[:2], ROUNDS_A)
    with pytest.raises(ValueError, match="jobs differ"):
        compare(load(a), load(other))
    assert main([str(a), str(tmp_path / "missing.log")]) == 2
