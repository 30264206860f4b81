"""SBATCH_* input variables: sbatch reads them itself, so only those that set
pass-through options may be set when `cellsched sbatch` runs."""

from __future__ import annotations

from collections.abc import Mapping

from slurm_ext.wrapper.options import PROG, WrapperError

_ALLOWED_ENV = frozenset(
    {
        "SBATCH_ACCOUNT",
        "SBATCH_QOS",
        "SBATCH_JOB_NAME",
        "SBATCH_TIMELIMIT",
        "SBATCH_EXPORT",
        "SBATCH_MAIL_TYPE",
        "SBATCH_MAIL_USER",
        "SBATCH_OUTPUT",
        "SBATCH_ERROR",
        "SBATCH_DEBUG",
        "SBATCH_EXPORT_ENV",
        "SBATCH_GET_USER_ENV",
        "SBATCH_IGNORE_PBS",
        "SBATCH_NO_REQUEUE",
    }
)


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuse SBATCH_* variables that would set what the scheduler decides."""
    for key in sorted(environ):
        if key.startswith("SBATCH_") and key not in _ALLOWED_ENV:
            raise WrapperError(
                "environment",
                f"{key} is set; sbatch would apply it behind {PROG}'s back. "
                "Unset it (GPUs, nodes and holds are the scheduler's business)",
            )
