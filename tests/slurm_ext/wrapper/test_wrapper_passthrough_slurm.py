"""`cellsched sbatch -A -q -e` on the real dev cluster (no job_submit.lua,
accounting_storage/none): what Slurm keeps of them."""

from __future__ import annotations

import re

import pytest
from support import console_script, wait_for

pytestmark = pytest.mark.slurm


def test_account_qos_and_stderr_on_slurm(plain_cluster, tmp_path):
    """Slurm keeps Account and the StdErr pattern; without accounting storage it drops any QOS (QOS=(null))."""
    tmp_path.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n#CELLSCHED model=gpt-tiny\n#CELLSCHED global-batch=8\n#CELLSCHED iterations=10\n"
        "echo to-stderr >&2\n"
    )
    proc = plain_cluster.run(
        [
            console_script(),
            "sbatch",
            "--parsable",
            "-A",
            "someacct",
            "-q",
            "someqos",
            "-e",
            str(tmp_path / "err-%j.txt"),
            "-o",
            str(tmp_path / "out-%j.txt"),
            str(script),
        ]
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    job = proc.stdout.strip()
    assert job.isdigit(), proc.stdout
    try:
        shown = plain_cluster.run(["scontrol", "-o", "show", "job", job]).stdout
        fields = dict(re.findall(r"(\w+)=(\S*)", shown))
        assert fields["Account"] == "someacct"
        assert fields["QOS"] == "(null)"  # accepted, then ignored: no QOS exists without accounting storage
        assert fields["StdErr"] == str(tmp_path / f"err-{job}.txt")
        assert fields["JobState"] == "PENDING" and fields["Reason"] == "JobHeldUser"
        released = plain_cluster.run(["scontrol", "release", job])
        assert released.returncode == 0, released.stderr
        err = tmp_path / f"err-{job}.txt"
        wait_for(lambda: err.exists() and "to-stderr" in err.read_text(), timeout=60, what=f"job {job} to write {err}")
        assert "to-stderr" not in (tmp_path / f"out-{job}.txt").read_text()
    finally:
        plain_cluster.run(["scancel", job])
