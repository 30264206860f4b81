"""Text users control (job names, reasons, user names, specs, errors quoting
them) reaches an admin's terminal, the logs and the metrics escaped: no
control, C1 or bidi character gets through, and the escaped form shows what
the user wrote."""

from __future__ import annotations

import io
import json
import logging
import re
import sys

import pytest

from slurm_ext.cli import status_cmd
from slurm_ext.controller.logs import JsonFormatter, TextFormatter
from slurm_ext.controller.metrics import Metrics
from slurm_ext.controller.report import RoundReport
from slurm_ext.state import JobStatus, StateStore
from slurm_ext.textsafe import printable

# OSC title + clear screen, colour, CR/LF (log-line forgery), NUL, RLO, C1 CSI, DEL, isolate, line separator.
HOSTILE = "evil\x1b]0;pwned\x07\x1b[2J\x1b[31m\r\n2024-01-01 info forged\x00\u202eexe.txt\x9b6n\x7f\u2066\u2028end"
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def assert_clean(text: str, *, lines: int | None = None) -> None:
    """No unsafe character but the newlines between `lines` lines; the escapes are visible."""
    assert not UNSAFE.findall(text.replace("\n", "")), UNSAFE.findall(text.replace("\n", ""))
    if lines is not None:
        assert text.count("\n") == lines - 1
    for esc in ("\\x1b]0;pwned\\x07", "\\r\\n", "\\x00", "\\u202e", "\\x9b", "\\x7f", "\\u2066", "\\u2028"):
        assert esc in text, esc


# --- the escaping function ----------------------------------------------------


@pytest.mark.parametrize(
    "raw, shown",
    [
        ("plain ascii: a-z 0-9 !#$%&'()*+,-./:;<=>?@[]^_`{|}~", "plain ascii: a-z 0-9 !#$%&'()*+,-./:;<=>?@[]^_`{|}~"),
        ("café 日本 Ωμέγα 😀", "café 日本 Ωμέγα 😀"),
        ("a\\b", "a\\\\b"),
        ("\\x1b", "\\\\x1b"),  # a user's literal backslash-x cannot pass for an escape
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
        ("a\r\nb\tc", "a\\r\\nb\\tc"),
        ("\x00\x01\x1f\x7f", "\\x00\\x01\\x1f\\x7f"),
        ("\x80\x85\x9b\x9f\xa0", "\\x80\\x85\\x9b\\x9f\xa0"),  # C1 escaped, NBSP (a letter-ish char) kept
        ("\u202a\u202b\u202c\u202d\u202e", "\\u202a\\u202b\\u202c\\u202d\\u202e"),
        ("\u2066\u2067\u2068\u2069", "\\u2066\\u2067\\u2068\\u2069"),
        ("\u2028\u2029\u200e\u200f\u061c", "\\u2028\\u2029\\u200e\\u200f\\u061c"),
        ("\udc9b", "\\udc9b"),  # a lone surrogate (undecodable byte) would crash a strict stdout
    ],
)
def test_printable_escapes_exactly_the_unsafe_characters(raw, shown):
    assert printable(raw) == shown


def test_printable_takes_any_object_and_truncates_with_a_marker():
    assert printable(None) == "None" and printable(42) == "42"
    assert printable("abcdef", limit=3) == "abc...(+3 chars)"
    assert printable("abc", limit=3) == "abc"
    assert printable("\x1b\x1b\x1b", limit=1) == "\\x1b...(+2 chars)"


# --- status and plan, plain text --------------------------------------------


def _state(tmp_path) -> StateStore:
    st = StateStore(tmp_path / "s.sqlite")
    st.accept_spec("2", HOSTILE, json.dumps({"model": HOSTILE, "global_batch": 64, "iterations": 100}), "comment", 1.0)
    st.mark_bad("3", "bob", "bad spec: " + HOSTILE, 1.0)
    st.save_statuses(
        [
            JobStatus("2", HOSTILE, "PENDING", "held", HOSTILE, 900.0, None, None, None, None, None, False),
            JobStatus("3", "bob", "PENDING", "bad", "", 900.0, None, None, None, None, None, False),
        ],
        2.0,
    )
    rid = st.begin_round(3.0)
    st.finish_round(rid, status="error", duration_s=0.5, error="ValueError: job name " + HOSTILE)
    st.add_history("2", "placed", 4.0, rid, "a100:1x2:pp1", "n1" + HOSTILE)
    return st


def test_status_table_escapes_user_names_and_reasons(tmp_path):
    with _state(tmp_path) as st:
        rows = status_cmd.job_rows(st, now=1000.0)
        table = status_cmd._table(rows)
        round_line = status_cmd._round_text(st.rounds(limit=1)[0])
        history = status_cmd._history_text("2", st.history("2"))
    assert_clean(table, lines=3)  # header + 2 jobs
    assert table.count(printable(HOSTILE)) == 3  # user and reason of job 2, reason of job 3
    assert table.endswith("  bad spec: " + printable(HOSTILE))
    assert_clean(round_line, lines=1)
    assert round_line.endswith(f"(ValueError: job name {printable(HOSTILE)})")
    assert_clean(history, lines=2)


def test_status_and_plan_json_is_ascii(tmp_path, capsys):
    with _state(tmp_path) as st:
        rows = status_cmd.job_rows(st, now=1000.0)
        last = st.rounds(limit=1)[0]
    status_cmd._json_out({"jobs": rows, "last_round": last})
    out = capsys.readouterr().out
    assert out.endswith("\n") and out.isascii() and not UNSAFE.search(out[:-1])
    assert "\\u001b]0;pwned\\u0007" in out and "\\u202e" in out and "\\u009b" in out and "\\u007f" in out
    back = json.loads(out)  # lossless: the JSON still carries what the user wrote
    assert back["jobs"][0]["user"] == HOSTILE and back["jobs"][0]["model"] == HOSTILE


def _report() -> RoundReport:
    actions = (
        {
            "kind": "place",
            "job": "2",
            "cell": "a100:1x2:pp1",
            "nodes": ["n1:2"],
            "partition": "a100",
            "why": "requested by " + HOSTILE,
        },
    )
    jobs = (
        JobStatus(
            "2", HOSTILE, "PENDING", "held", "waiting for " + HOSTILE, 900.0, None, None, None, None, None, False
        ),
    )
    return RoundReport(None, "error", 1000.0, actions=actions, jobs=jobs, error="SlurmError: " + HOSTILE, dry_run=True)


def test_plan_text_escapes_reasons_and_errors():
    text = status_cmd.plan_text(_report())
    assert_clean(text, lines=3)
    assert text.splitlines() == [
        f"round error: SlurmError: {printable(HOSTILE)}",
        f"place job 2 -> a100:1x2:pp1 on n1:2 (a100) [requested by {printable(HOSTILE)}]",
        f"job 2 waits: waiting for {printable(HOSTILE)}",
    ]


def test_plan_json_is_ascii(capsys):
    status_cmd._json_out(_report().to_dict())
    out = capsys.readouterr().out
    assert out.endswith("\n") and out.isascii() and not UNSAFE.search(out[:-1])
    assert json.loads(out)["jobs"][0]["reason"] == "waiting for " + HOSTILE


# --- logs ---------------------------------------------------------------------


def _record(with_exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if with_exc:
        try:
            raise ValueError("bad comment " + HOSTILE)
        except ValueError:
            exc_info = sys.exc_info()
    return logging.getLogger("cellsched.test").makeRecord(
        "cellsched.test",
        logging.WARNING,
        __file__,
        1,
        "job refused: %s",
        (HOSTILE,),
        exc_info,
        extra={"fields": {"job": "2", "user": HOSTILE, "reason": "x error=forged " + HOSTILE}},
    )


@pytest.mark.parametrize("with_exc", [False, True])
def test_text_log_record_is_one_escaped_line(with_exc):
    line = TextFormatter().format(_record(with_exc))
    assert_clean(line, lines=1)
    assert f' warning job refused: {printable(HOSTILE)} job=2 user="{printable(HOSTILE)}" ' in line
    assert f' reason="x error=forged {printable(HOSTILE)}"' in line  # quoted: no forged error= field
    if with_exc:
        assert ' exception="Traceback (most recent call last):\\n' in line
        assert "ValueError: bad comment evil\\x1b]0;pwned" in line


def test_text_log_values_are_logfmt_quoted():
    rec = logging.makeLogRecord({"msg": "m", "levelname": "INFO", "fields": {"a": 'say "hi"', "b": "", "c": "ok"}})
    assert TextFormatter().format(rec).endswith(' m a="say \\"hi\\"" b="" c=ok')


@pytest.mark.parametrize("with_exc", [False, True])
def test_json_log_record_is_one_ascii_line(with_exc):
    line = JsonFormatter().format(_record(with_exc))
    assert "\n" not in line and line.isascii() and not UNSAFE.search(line)
    assert "\\u001b]0;pwned\\u0007" in line and "\\u202e" in line and "\\u009b" in line
    d = json.loads(line)
    assert d["user"] == HOSTILE and d["msg"] == "job refused: " + HOSTILE
    assert ("exception" in d) == with_exc


def test_log_setup_writes_one_line_per_record():
    from slurm_ext.controller.logs import setup

    for fmt in ("json", "text"):
        buf = io.StringIO()
        log = setup(fmt, stream=buf)
        log.warning("job refused", extra={"fields": {"user": HOSTILE}})
        assert buf.getvalue().count("\n") == 1 and not UNSAFE.search(buf.getvalue()[:-1])


# --- metrics ------------------------------------------------------------------


def test_metrics_label_values_are_escaped_and_parseable():
    # The controller's labels are its own words (phase, kind, status) and the
    # admin's GPU types; a hostile value must still not break the exposition.
    m = Metrics()
    m.declare("gpus", "gauge", "GPUs\nby type \\ use")
    m.set("gpus", 4, {"gpu_type": HOSTILE, "use": "total"})
    m.set("gpus", 1, {"gpu_type": 'a"b\\c\nd\x1be', "use": "used"})
    body = m.render()
    assert not UNSAFE.search(body.replace("\n", "")) and body.count("\n") == 4  # HELP, TYPE, two series
    assert "# HELP cellsched_gpus GPUs\\nby type \\\\ use\n" in body
    assert 'cellsched_gpus{gpu_type="a\\"b\\\\\\\\c\\\\nd\\\\x1be",use="used"} 1.0\n' in body
    for value in re.findall(r'gpu_type="((?:\\.|[^"\\])*)"', body):
        assert re.fullmatch(r'(?:\\[\\"n]|[^\\])*', value), value  # only the escapes Prometheus accepts
        decoded = re.sub(r"\\(.)", lambda e: "\n" if e[1] == "n" else e[1], value)
        assert decoded in (printable(HOSTILE), printable('a"b\\c\nd\x1be'))
