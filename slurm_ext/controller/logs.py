"""Log lines on stderr: one JSON object per line (or plain text).

Structured fields travel in ``extra={"fields": {...}}``.
"""

from __future__ import annotations

import json
import logging
import sys
import time


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
        return json.dumps(d, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None) or {}
        extra = " ".join(f"{k}={v}" for k, v in fields.items())
        line = f"{self.formatTime(record)} {record.levelname.lower()} {record.getMessage()}" + (f" {extra}" if extra else "")
        return line + ("\n" + self.formatException(record.exc_info) if record.exc_info else "")


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
