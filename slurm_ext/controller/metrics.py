"""Prometheus metrics in the text exposition format, served by http.server.

A small registry of gauges and counters with labels; `serve(port)` runs
the HTTP endpoint (any path) in a daemon thread.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from slurm_ext.textsafe import printable

Labels = tuple[tuple[str, str], ...]


def _labels(labels: Mapping[str, str] | None) -> Labels:
    return tuple(sorted((labels or {}).items()))


def _escape(v: str) -> str:
    """A label value for the text format: `printable` (no control, C1 or bidi
    character, which Prometheus would pass on to dashboards; newlines become
    a visible escape), then the format's own escapes for backslash and quote."""
    return printable(v).replace("\\", "\\\\").replace('"', '\\"')


def _help(text: str) -> str:
    """A HELP text: the format escapes backslash and newline."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


class Metrics:
    """name -> (type, help, {labels: value}); thread-safe."""

    def __init__(self, prefix: str = "cellsched_") -> None:
        self.prefix = prefix
        self._lock = threading.Lock()
        self._meta: dict[str, tuple[str, str]] = {}
        self._values: dict[str, dict[Labels, float]] = {}

    def declare(self, name: str, kind: str, help_text: str) -> None:
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

    def render(self) -> str:
        out = []
        with self._lock:
            for name in sorted(self._values):
                full = self.prefix + name
                kind, help_text = self._meta.get(name, ("gauge", ""))
                out.append(f"# HELP {full} {_help(help_text)}")
                out.append(f"# TYPE {full} {kind}")
                for labels, value in sorted(self._values[name].items()):
                    lab = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                    out.append(f"{full}{{{lab}}} {value:g}" if lab else f"{full} {value:g}")
        return "\n".join(out) + "\n"


def serve(metrics: Metrics, port: int, address: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serve `metrics` on address:port in a daemon thread; returns the server
    (its ``server_address`` has the real port when `port` is 0)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = metrics.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
