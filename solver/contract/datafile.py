"""Reading a small JSON or TOML file (model specs, cluster specs) with
errors that name the file."""

from __future__ import annotations

import json
import os
import pathlib
import tomllib
from typing import Any


def read_json_or_toml(path: str | os.PathLike[str], error: type[Exception], label: str = "") -> Any:
    """The parsed content of `path`: TOML for ``.toml``, else JSON. Failures
    raise `error` with ``"<label><path>: cannot read (...)"`` or ``"...: not
    valid TOML|JSON: ..."``."""
    p = pathlib.Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise error(f"{label}{p}: cannot read ({exc.strerror})") from None
    toml = p.suffix.lower() == ".toml"
    try:
        return tomllib.loads(raw.decode("utf-8")) if toml else json.loads(raw)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{label}{p}: not valid {'TOML' if toml else 'JSON'}: {exc}") from None
