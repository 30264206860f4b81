"""The controller's metrics exposition, read back with prometheus_client's
own parser (an oracle that is not our code): exact values, exact names."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from slurm_ext.controller.metrics import Metrics, serve
from slurm_ext.controller.round_metrics import declare_metrics

# Everything the controller declares, as exported (the names the dashboard queries).
EXPORTED = {
    "cellsched_round_duration_seconds": "gauge",
    "cellsched_round_phase_seconds": "gauge",
    "cellsched_solve_seconds": "gauge",
    "cellsched_last_round_timestamp_seconds": "gauge",
    "cellsched_rounds_total": "counter",
    "cellsched_jobs": "gauge",
    "cellsched_gpus": "gauge",
    "cellsched_actions_total": "counter",
    "cellsched_errors_total": "counter",
    "cellsched_job_restarts": "gauge",
}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, as prometheus_client parses `text`."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def type_lines(text: str) -> dict[str, str]:
    return {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_a_timestamp_and_a_large_counter_keep_every_digit():
    """A Unix timestamp with a fraction and a counter past a million come back
    exactly (the hand-written exporter wrote them with 6 significant digits:
    1.7642e+09, 50 000 s off, and 1.23457e+06)."""
    m = Metrics()
    declare_metrics(m)
    m.set("last_round_timestamp_seconds", 1764201234.5)
    m.inc("rounds_total", 1234567, {"status": "ok"})
    m.inc("rounds_total", labels={"status": "ok"})
    m.set("gpus", 2**53, {"gpu_type": "a100", "use": "total"})
    got = samples(m.render())
    assert got[("cellsched_last_round_timestamp_seconds", ())] == 1764201234.5
    assert got[("cellsched_rounds_total", (("status", "ok"),))] == 1234568
    assert got[("cellsched_gpus", (("gpu_type", "a100"), ("use", "total")))] == 2**53


def test_the_exported_names_and_types_are_the_declared_ones():
    """Counters keep their declared `_total` name, and no other family (such as
    prometheus_client's `_created` series) appears."""
    m = Metrics()
    declare_metrics(m)
    m.inc("rounds_total", labels={"status": "ok"})
    m.inc("actions_total", labels={"kind": "place", "result": "ok"})
    m.inc("errors_total", labels={"kind": "round"})
    m.set("round_duration_seconds", 0.25)
    text = m.render()
    assert type_lines(text) == EXPORTED
    assert {name for name, _ in samples(text)} == {
        "cellsched_rounds_total",
        "cellsched_actions_total",
        "cellsched_errors_total",
        "cellsched_round_duration_seconds",
    }
    assert "_created" not in text


def test_labels_replace_and_undeclared_metrics():
    m = Metrics(prefix="x_")
    m.declare("jobs", "gauge", "Jobs")
    m.replace("jobs", {(("phase", "held"),): 2.0, (("phase", "running"),): 1.0})
    m.replace("jobs", {(("phase", "running"),): 3.0})  # held vanished
    m.set("other", -0.5, {"b": "2", "a": "1"})
    text = m.render()
    assert samples(text) == {("x_jobs", (("phase", "running"),)): 3.0, ("x_other", (("a", "1"), ("b", "2"))): -0.5}
    assert type_lines(text) == {"x_jobs": "gauge", "x_other": "gauge"}
    assert 'x_other{a="1",b="2"} -0.5\n' in text  # labels sorted by name
    assert m.get("jobs", {"phase": "running"}) == 3.0 and m.get("jobs", {"phase": "held"}) is None


def test_a_hostile_label_value_reaches_the_parser_printable():
    m = Metrics()
    m.set("gpus", 1, {"gpu_type": "a\u202eb\x1b[31m\nc"})
    [[(name, labels)]] = [list(samples(m.render()))]
    assert name == "cellsched_gpus" and labels == (("gpu_type", "a\\u202eb\\x1b[31m\\nc"),)


def test_a_counter_must_end_in_total_and_kinds_are_gauge_or_counter():
    m = Metrics()
    with pytest.raises(ValueError, match="_total"):
        m.declare("rounds", "counter", "Rounds")
    with pytest.raises(ValueError, match="kind"):
        m.declare("x", "histogram", "X")


def test_each_metrics_has_its_own_registry():
    a, b = Metrics(), Metrics()
    a.set("jobs", 1)
    assert "cellsched_jobs" in a.render() and "cellsched_jobs" not in b.render()
    assert "cellsched_jobs" not in {f.name for f in REGISTRY.collect()}


def test_serve_answers_the_exposition_and_a_busy_port_raises_oserror():
    m = Metrics()
    m.set("last_round_timestamp_seconds", 1764201234.5)
    server = serve(m, 0)
    try:
        port = server.server_address[1]
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/anything", timeout=5).read().decode()
        assert samples(body) == {("cellsched_last_round_timestamp_seconds", ()): 1764201234.5}
        with pytest.raises(OSError) as exc:
            serve(m, port)
        assert exc.value.strerror
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as s:  # the port is free again
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_an_openmetrics_scrape_gets_the_same_series():
    """Prometheus asks for OpenMetrics first; the series (what PromQL names)
    are the same as in the text format, values included."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

    m = Metrics()
    declare_metrics(m)
    m.set("last_round_timestamp_seconds", 1764201234.5)
    m.inc("rounds_total", 1234568, {"status": "ok"})
    server = serve(m, 0)
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.server_address[1]}/metrics",
            headers={"Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"},
        )
        with urllib.request.urlopen(request, timeout=5) as reply:
            assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
            body = reply.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in openmetrics_families(body) for s in f.samples}
    assert got == samples(m.render())
    assert got[("cellsched_last_round_timestamp_seconds", ())] == 1764201234.5
    assert got[("cellsched_rounds_total", (("status", "ok"),))] == 1234568
