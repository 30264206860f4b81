"""A Slurm client killed by a signal (scontrol dies of SIGPIPE when a loaded
slurmctld closes its connection) is an outage of that call, SlurmUnavailable,
never a bad request nor an empty answer."""

import subprocess
import sys

import pytest

from slurm_ext.backends import SlurmUnavailable
from slurm_ext.backends.cli import CliBackend


def dies_of(signal_name: str):
    """A runner whose every command is a real process that kills itself with SIGNAL_NAME."""

    def run(args, **kwargs):
        # Python ignores SIGPIPE unless told otherwise; scontrol does not
        default = f"s.signal(s.{signal_name}, s.SIG_DFL); " if signal_name != "SIGKILL" else ""
        suicide = f"import os, signal as s; {default}os.kill(os.getpid(), s.{signal_name})"
        return subprocess.run([sys.executable, "-c", suicide], **kwargs)

    return run


@pytest.mark.parametrize("signal_name", ["SIGPIPE", "SIGKILL"])
def test_a_client_killed_by_a_signal_is_slurm_unavailable(signal_name):
    backend = CliBackend(run=dies_of(signal_name), workers=1)
    with pytest.raises(SlurmUnavailable, match=f"killed by {signal_name}"):
        backend.observe()
    with pytest.raises(SlurmUnavailable, match=f"scontrol was killed by {signal_name}"):
        backend.release_many(["7"])
