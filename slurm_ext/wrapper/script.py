"""The batch script: read only when it is a small UTF-8 text file sbatch would take."""

from __future__ import annotations

import os
import pathlib
import stat

from slurm_ext.wrapper.options import WrapperError

MAX_SCRIPT_BYTES = 4 << 20


def read_script(path_text: str, cwd: pathlib.Path) -> tuple[pathlib.Path, str]:
    """The script's absolute path and text; WrapperError("script", ...) when
    it is missing, unreadable, not a regular file or not a batch script."""
    if not path_text:
        raise WrapperError("script", "is empty")
    path = pathlib.Path(path_text).expanduser()
    path = (path if path.is_absolute() else cwd / path).absolute()
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise WrapperError("script", f"{path_text!r} is not a regular file")
        if st.st_size > MAX_SCRIPT_BYTES:
            raise WrapperError("script", f"{path_text!r} is {st.st_size} bytes, more than {MAX_SCRIPT_BYTES}")
        with open(path, "rb") as f:
            data = f.read(MAX_SCRIPT_BYTES + 1)
    except OSError as exc:
        raise WrapperError("script", f"cannot read {path_text!r} ({exc.strerror})") from None
    if not data.startswith(b"#!"):
        raise WrapperError(
            "script", f"{path_text!r} does not start with '#!' (an interpreter line, as sbatch requires)"
        )
    if b"\x00" in data:
        raise WrapperError("script", f"{path_text!r} contains NUL bytes (not a text script)")
    if b"\r\n" in data:
        raise WrapperError("script", f"{path_text!r} has DOS line breaks (\\r\\n), which sbatch refuses")
    try:
        return path, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WrapperError("script", f"{path_text!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
