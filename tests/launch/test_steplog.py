"""The frameworks' step-line parsers (launch.steplog) on their recorded lines
(framework_logs.py says where each comes from) and on lines they must not believe."""

from datetime import datetime

import pytest
from framework_logs import MEGATRON_LINES, MEGATRON_OTHER, TITAN_LINES, megatron_line, titan_line

from launch import adapters, steplog
from launch.steplog import MEGATRON, TORCHTITAN, Step, parse_megatron, parse_torchtitan

TITAN_PREFIX = "[titan] 2026-11-29 07:30:18,751 - root - INFO - "
MEGA_SAMPLE = MEGATRON_LINES[1][0]


@pytest.mark.parametrize(("line", "want"), TITAN_LINES)
def test_torchtitans_recorded_lines(line, want):
    assert parse_torchtitan(line) == want
    assert parse_megatron(line) is None


@pytest.mark.parametrize(("line", "want"), MEGATRON_LINES)
def test_megatrons_recorded_lines(line, want):
    got = parse_megatron(line)
    assert got is not None and got.done == want.done
    assert got.iter_time_s == pytest.approx(want.iter_time_s, rel=1e-12)
    assert parse_torchtitan(line) is None


@pytest.mark.parametrize("line", MEGATRON_OTHER)
def test_megatrons_other_lines_naming_an_iteration_are_no_step(line):
    assert parse_megatron(line) is None


def test_the_stand_in_prints_the_recorded_formats():
    """The stand-in framework of the Slurm tests prints what the frameworks print."""
    assert TITAN_PREFIX + titan_line(7, 8.12345) == TITAN_LINES[0][0]
    when = datetime(2026, 1, 5, 10, 11, 12, 345678)
    assert megatron_line(1, 500, 4521.3, 10.83, 1.5e-6, when) == MEGATRON_LINES[0][0]


def test_each_framework_adapter_declares_its_step_log():
    assert adapters.get_adapter("torchtitan").progress is TORCHTITAN
    assert adapters.get_adapter("megatron").progress is MEGATRON
    # who prints: torchtitan every rank (rank 0's is read), Megatron its last rank (print_rank_last)
    assert [r for r in range(4) if TORCHTITAN.printed_by(r, 4)] == [0]
    assert [r for r in range(4) if MEGATRON.printed_by(r, 4)] == [3]
    assert MEGATRON.printed_by(0, 1) and TORCHTITAN.printed_by(0, 1)


@pytest.mark.parametrize(
    "line",
    [
        TITAN_PREFIX + "step: 0  loss:  8.12345  grad_norm:  2.3456",  # torchtitan counts from 1
        TITAN_PREFIX + "step: -3  loss:  8.12345",
        TITAN_PREFIX + "step: 1e5  loss:  8.12345",
        TITAN_PREFIX + "step: 12abc  loss:  8.12345",
        TITAN_PREFIX + "step: 10000000000001  loss:  8.12345",  # above MAX_STEP
        TITAN_PREFIX + "step: 99999999999999999999999  loss:  8.12345",
        TITAN_PREFIX + "step: 7  loss: nan",
        TITAN_PREFIX + "step: 7  loss:",
        TITAN_PREFIX + "step: 7",
        TITAN_PREFIX + "substep: 7  loss:  8.12345",
        TITAN_PREFIX + "validate step: 7  loss:  8.12345",
        TITAN_PREFIX + "\x1b[33mvalidate \x1b[31mstep: 7  loss:  8.12345",
        "",
        "step:",
    ],
)
def test_torchtitan_lines_with_wrong_numbers_are_no_step(line):
    assert parse_torchtitan(line) is None


@pytest.mark.parametrize(
    "line",
    [
        MEGA_SAMPLE.replace("iteration       10/     500", "iteration      501/     500"),  # past its total
        MEGA_SAMPLE.replace("iteration       10/", "iteration        0/"),
        MEGA_SAMPLE.replace("iteration       10/", "iteration      -10/"),
        MEGA_SAMPLE.replace("iteration       10/", "iteration     1e10/"),
        MEGA_SAMPLE.replace("(ms): 731.9", "(ms): nan"),
        MEGA_SAMPLE.replace("(ms): 731.9", "(ms): inf"),
        MEGA_SAMPLE.replace("(ms): 731.9", "(ms): -731.9"),
        MEGA_SAMPLE.replace("(ms): 731.9", "(ms): 0.0"),
        MEGA_SAMPLE.replace("(ms): 731.9", "(ms): 1e5"),
        MEGA_SAMPLE.replace("(ms): 731.9", "(ms): 86400000.1"),  # a day and more
        MEGA_SAMPLE.replace("(ms): 731.9", "(ms): 9" * 40),
        MEGA_SAMPLE.replace(" elapsed time per iteration (ms): 731.9 |", ""),
        MEGA_SAMPLE.replace(" [2026-01-05 10:11:12.345678]", ""),
        # the time before the iteration: not Megatron's order
        " [2026-01-05] elapsed time per iteration (ms): 731.9 | iteration       10/     500 |",
        "iteration 10/500",
    ],
)
def test_megatron_lines_with_wrong_numbers_are_no_step(line):
    assert parse_megatron(line) is None


def test_a_megatron_line_with_no_total_still_counts():
    """train_iters 0 (training by samples, before Megatron sets it): no total to check against."""
    assert parse_megatron(MEGA_SAMPLE.replace("/     500 |", "/       0 |")) == Step(10, 0.7319)
    # the largest time believed: a day
    assert parse_megatron(MEGA_SAMPLE.replace("(ms): 731.9", "(ms): 86400000.0")) == Step(10, 86400.0)


@pytest.mark.parametrize("parse", [parse_torchtitan, parse_megatron])
def test_hostile_text_is_no_step_and_cheap(parse):
    huge = "step: 5  loss: 1.0 " * 200_000 + "iteration"  # 4 MB of near-matches
    binary = bytes(range(256)).decode("utf-8", "replace") * 100
    for line in (huge, binary, "\x00" * 10_000, "\ufffd" * 1000 + TITAN_LINES[0][0][:30]):
        parse(line)  # never raises; the relay never hands it more than MAX_LINE bytes
    assert parse(binary) is None
    assert steplog.MAX_LINE >= 2 * len(MEGA_SAMPLE)  # Megatron's lines fit, with room for its optional fields
