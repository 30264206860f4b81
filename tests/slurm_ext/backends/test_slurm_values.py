"""Decoders of Slurm values: NO_VAL numbers, states, GRES, exit codes, times."""

import pytest

from slurm_ext.parse.values import ParseError, exit_status, gpu_gres, job_state, minutes, node_state, number


@pytest.mark.parametrize(
    "value, expected",
    [
        (5, 5),
        ({"set": True, "infinite": False, "number": 7}, 7),
        ({"set": False, "infinite": False, "number": 0}, None),
        ({"set": True, "infinite": True, "number": 0}, None),
        (4294967294, None),
        (None, None),
        ("12", 12),
        ("UNLIMITED", None),
    ],
)
def test_number(value, expected):
    assert number(value) == expected


def test_number_rejects_text():
    with pytest.raises(ParseError, match="not a number"):
        number("lots")


@pytest.mark.parametrize(
    "value, expected",
    [
        (0, 0),
        (768, 3),  # raw wait status of exit(3), as squeue --json prints it in 22.05
        (15, 143),  # killed by SIGTERM
        ("3:0", 3),
        ("0:15", 143),
        (
            {
                "status": ["EXITED"],
                "return_code": {"set": True, "infinite": False, "number": 3},
                "signal": {"id": {"set": False, "infinite": False, "number": 0}, "name": ""},
            },
            3,
        ),
        (
            {
                "status": ["SIGNALED"],
                "return_code": {"set": True, "infinite": False, "number": 0},
                "signal": {"id": {"set": True, "infinite": False, "number": 9}, "name": "KILL"},
            },
            137,
        ),
    ],
)
def test_exit_status(value, expected):
    assert exit_status(value) == expected


@pytest.mark.parametrize(
    "value, flags, expected",
    [
        ("mixed", [], ("mixed", ())),
        ("idle", ["DRAIN"], ("idle", ("DRAIN",))),
        (["IDLE", "DRAIN"], None, ("idle", ("DRAIN",))),
        ("IDLE+DRAIN", None, ("idle", ("DRAIN",))),
        ("idle*", None, ("idle", ("NOT_RESPONDING",))),
        ("drained", None, ("idle", ("DRAIN",))),
        ("draining", None, ("allocated", ("DRAIN",))),
        ("MIX", None, ("mixed", ())),
        ("DOWN*+DRAIN", None, ("down", ("DRAIN",))),
    ],
)
def test_node_state(value, flags, expected):
    base, got_flags = node_state(value, flags)
    assert base == expected[0]
    assert set(got_flags) >= set(expected[1])


def test_job_state_array_and_text():
    assert job_state(["PENDING", "REQUEUED"]) == ("PENDING", ("REQUEUED",))
    assert job_state("RUNNING") == ("RUNNING", ())
    with pytest.raises(ParseError):
        job_state([])


@pytest.mark.parametrize(
    "value, expected",
    [
        ("gpu:a100:4", ("a100", 4)),
        ("gpu:a100:3(IDX:0-2)", ("a100", 3)),
        ("gpu:v100:0(IDX:N/A)", ("v100", 0)),
        ("gres:gpu:a100:3", ("a100", 3)),
        ("gres:gpu:2", (None, 2)),
        ("gres/gpu:a40:1", ("a40", 1)),
        ("gres/gpu=2", (None, 2)),
        ("gpu:a100:4(S:0-1),shard:8", ("a100", 4)),
        ("gpu:a100:2(IDX:0,2),gpu:a100:1(IDX:3)", ("a100", 3)),
        ("", (None, 0)),
        ("(null)", (None, 0)),
        ("N/A", (None, 0)),
    ],
)
def test_gpu_gres(value, expected):
    assert gpu_gres(value) == expected


@pytest.mark.parametrize(
    "value, expected",
    [
        ("UNLIMITED", None),
        (None, None),
        (-1, None),
        (60, 60),
        ("30", 30),
        ("1:00:00", 60),
        ("2-00:00:00", 2880),
        ("0:30", 1),
        ({"set": True, "infinite": True, "number": 0}, None),
        ({"set": True, "infinite": False, "number": 90}, 90),
    ],
)
def test_minutes(value, expected):
    assert minutes(value) == expected
