"""Log lines on stderr: one JSON object per line (or plain text).

Structured fields travel in ``extra={"fields": {...}}``. Either way a record
is one line with no control, C1 or bidi character: fields carry users' text
(job names, reasons, errors quoting them).
"""

from __future__ import annotations

import json
import logging
import sys
import time

from slurm_ext.textsafe import printable


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        d = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        d.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            d["exception"] = self.formatException(record.exc_info)
        return json.dumps(d, default=str, separators=(",", ":"), ensure_ascii=True)  # controls, non-ASCII: \uXXXX


def _value(v: object) -> str:
    """A logfmt value: escaped, quoted when it holds a space, '=' or '"'."""
    s = printable(v)
    if s and not any(c in s for c in ' ="'):
        return s
    return '"' + s.replace('"', '\\"') + '"'


class TextFormatter(logging.Formatter):
    """`time level msg k=v ...`; the traceback, if any, as an escaped exception= field."""

    def format(self, record: logging.LogRecord) -> str:
        fields = dict(getattr(record, "fields", None) or {})
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        line = f"{self.formatTime(record)} {record.levelname.lower()} {printable(record.getMessage())}"
        return " ".join([line, *(f"{printable(k)}={_value(v)}" for k, v in fields.items())])


def setup(fmt: str = "json", level: str = "info", stream=None) -> logging.Logger:
    """Route the `cellsched` loggers to stderr in `fmt` ("json" or "text")."""
    logger = logging.getLogger("cellsched")
    for h in list(logger.handlers):
        logger.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    return logger
