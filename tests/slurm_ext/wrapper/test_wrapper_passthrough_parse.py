"""`cellsched sbatch` passes -A, -q and -e through to sbatch: the argument list
the cli backend would run (no Slurm: observe() is the dev cluster's shape and
the sbatch call is recorded)."""

from __future__ import annotations

import io

import pytest

from slurm_ext.wrapper.command import main

ERR = "/data/logs/err-%j.txt"


@pytest.mark.parametrize("how", ["short", "long", "directives"])
def test_account_qos_and_stderr_reach_sbatch(tmp_path, cli_recorder, how):
    """-A/-q/-e (or --account/--qos/--error, or #SBATCH lines) become sbatch's --account/--qos/--error."""
    lines = ["#!/bin/bash", "#CELLSCHED model=gpt-tiny", "#CELLSCHED global-batch=8", "#CELLSCHED iterations=10"]
    opts = {
        "short": ["-A", "someacct", "-q", "someqos", "-e", ERR],
        "long": ["--account=someacct", "--qos=someqos", f"--error={ERR}"],
        "directives": [],
    }[how]
    if how == "directives":
        lines += ["#SBATCH -A someacct", "#SBATCH --qos=someqos", f"#SBATCH -e {ERR}"]
    script = tmp_path / "job.sh"
    script.write_text("\n".join([*lines, "srun true"]) + "\n")
    out, err = io.StringIO(), io.StringIO()
    code = main(
        ["--parsable", *opts, str(script), "-q", "arg"],
        backend_for=lambda name: cli_recorder,
        stdout=out,
        stderr=err,
        environ={},
    )
    assert (code, out.getvalue(), err.getvalue()) == (0, "4242\n", "")
    (argv,) = cli_recorder.runner.calls
    assert argv[:2] == ["sbatch", "--parsable"]
    options, script_part = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    assert {"--account=someacct", "--qos=someqos", f"--error={ERR}", "--hold"} <= set(options)
    assert script_part == [str(script), "-q", "arg"]  # after the script: its own arguments, untouched
