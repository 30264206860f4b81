"""`cellsched sbatch` as a command: help, dry run or submit, and one-line errors."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TextIO

from slurm_ext.backends.base import Backend, SlurmCommandError, SlurmError
from slurm_ext.textsafe import printable
from slurm_ext.wrapper.argv import parse_argv
from slurm_ext.wrapper.options import PROG, WrapperError, usage_text
from slurm_ext.wrapper.submission import prepare

EXIT_USAGE = 2


def main(
    argv: Iterable[str],
    *,
    backend_for: Callable[[str], Backend] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run `cellsched sbatch`; returns the exit status (0, 1 Slurm error, 2 bad input)."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    args = list(argv)
    if backend_for is None:
        from slurm_ext.backends import get_backend

        backend_for = get_backend
    made: dict[str, Backend] = {}

    def backend(name: str) -> Backend:
        if name not in made:
            made[name] = backend_for(name)
        return made[name]

    try:
        if parse_argv(args).help:
            print(usage_text(), file=out)
            return 0
        sub = prepare(args, backend, environ=environ)
        if sub.dry_run:
            print(sub.describe(), file=out)
            return 0
        job_id = backend(sub.backend).submit(sub.request)
    except WrapperError as exc:
        print(f"{PROG}: error: {_one_line(str(exc))}", file=err)
        return EXIT_USAGE
    except SlurmCommandError as exc:  # Slurm refused: its own words (a submit limit, an account, a partition)
        for line in slurm_said(exc):
            print(f"{PROG}: error: {line}", file=err)
        return 1
    except SlurmError as exc:
        print(f"{PROG}: error: slurm: {_one_line(str(exc))}", file=err)
        return 1
    print(job_id if sub.parsable else f"Submitted batch job {job_id}", file=out)
    return 0


def slurm_said(exc: SlurmCommandError) -> list[str]:
    """What Slurm said when it refused, in its own words: each line of the
    command's error output less its ``sbatch: error: `` prefix (sbatch at
    MaxSubmitJobs: ``AssocMaxSubmitJobLimit``, then ``Batch job submission
    failed: Job violates accounting/QOS policy (job submit limit, user's
    size and/or time limits)``), made printable; the whole error when it said nothing."""
    lines = [printable(line.strip().removeprefix("sbatch: error: "), 500) for line in exc.stderr.splitlines()]
    return [line for line in lines if line][:20] or [f"slurm: {printable(_one_line(str(exc)), 2000)}"]


def _one_line(text: str) -> str:
    return " | ".join(part.strip() for part in text.splitlines() if part.strip())
