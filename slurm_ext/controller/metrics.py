"""The controller's Prometheus metrics, exposed with prometheus_client.

`Metrics` holds gauges and counters with labels (thread-safe). It is a
prometheus_client collector, registered on a registry of its own (never the
library's process-wide default one), so the library writes the exposition
(`Metrics.render`, the text format 0.0.4) and serves it (`serve`): every
number keeps all its digits (a timestamp such as 1764201234.5, a counter
past a million), and label values and help texts get the format's escapes.

Why a collector rather than prometheus_client's `Gauge` and `Counter`:

- the exported names stay what the dashboard (slurm_ext/admin/grafana/cellsched.json)
  queries: a library `Counter` adds a ``<name>_created`` series, i.e. a new
  metric family, to every counter (turning that off is a process-wide switch);
- `Metrics.replace` swaps a whole family at once (the labels that vanished
  disappear), and a scrape sees either the old family or the new one;
- the label names of a metric are not declared up front: a series gets its
  labels where it is written.

A counter's name ends in ``_total`` (``rounds_total``): the library's counter
family takes the name without it and writes the samples, HELP and TYPE lines
with it, so the exported name is exactly the declared one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from slurm_ext.textsafe import printable

Labels = tuple[tuple[str, str], ...]
KINDS = ("gauge", "counter")


def _labels(labels: Mapping[str, str] | None) -> Labels:
    return tuple(sorted((labels or {}).items()))


class Metrics:
    """name -> (kind, help, {labels: value}); thread-safe. Names are exported
    with `prefix`; a name never declared is exported as a gauge."""

    def __init__(self, prefix: str = "cellsched_") -> None:
        self.prefix = prefix
        self._lock = threading.Lock()
        self._meta: dict[str, tuple[str, str]] = {}
        self._values: dict[str, dict[Labels, float]] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def declare(self, name: str, kind: str, help_text: str) -> None:
        """`kind`: "gauge" or "counter" (whose name must end in ``_total``)."""
        if kind not in KINDS:
            raise ValueError(f"metric {name}: kind {kind!r} is not one of {KINDS}")
        if kind == "counter" and not name.endswith("_total"):
            raise ValueError(f"counter {name}: a counter's name ends in _total")
        with self._lock:
            self._meta[name] = (kind, help_text)
            self._values.setdefault(name, {})

    def set(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        with self._lock:
            self._values.setdefault(name, {})[_labels(labels)] = float(value)

    def inc(self, name: str, by: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        with self._lock:
            series = self._values.setdefault(name, {})
            key = _labels(labels)
            series[key] = series.get(key, 0.0) + by

    def replace(self, name: str, values: Mapping[Labels, float]) -> None:
        """Set a whole gauge family at once (labels that vanished disappear)."""
        with self._lock:
            self._values[name] = dict(values)

    def get(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        with self._lock:
            return self._values.get(name, {}).get(_labels(labels))

    def collect(self) -> Iterator[Metric]:
        """The metric families, for prometheus_client's registry: by name, each
        series by its labels; every label value made `printable` (no control,
        C1 or bidi character, which Prometheus would pass on to dashboards;
        a newline becomes a visible escape)."""
        with self._lock:
            families = [(name, self._meta.get(name, ("gauge", "")), dict(self._values[name])) for name in self._values]
        for name, (kind, help_text), series in sorted(families, key=lambda f: f[0]):
            family: Metric
            if kind == "counter":  # the family's name drops the _total that its samples carry
                family = CounterMetricFamily(self.prefix + name, help_text)
                sample = family.name + "_total"
            else:
                family = GaugeMetricFamily(self.prefix + name, help_text)
                sample = family.name
            for labels, value in sorted(series.items()):
                family.add_sample(sample, {k: printable(v) for k, v in labels}, value)
            yield family

    def render(self) -> str:
        """The exposition in Prometheus' text format (what `serve` answers)."""
        return generate_latest(self.registry).decode()


def serve(metrics: Metrics, port: int, address: str = "127.0.0.1") -> WSGIServer:
    """Serve `metrics` (any path) on address:port with prometheus_client's
    HTTP server, in a daemon thread; returns the server (its
    ``server_address`` has the real port when `port` is 0; ``shutdown()``
    stops it). A port that cannot be bound raises OSError."""
    server, _thread = start_http_server(port, address, registry=metrics.registry)
    return server
