"""Golden records of what `cellsched sbatch` runs: for representative
submissions (command line, #CELLSCHED and #SBATCH lines), the commands the cli
backend would run must equal golden/sbatch_argv.json, argument for argument
and in order. No Slurm: observe() is the dev cluster's shape and the commands
are recorded at the backend's `run` seam (`cli_recorder`); the script's
directory reads as $TMP.

After a meant change, rewrite the golden file and review its diff:

    CELLSCHED_UPDATE_GOLDEN=1 python -m pytest -q tests/slurm_ext/wrapper/test_wrapper_argv_golden.py
"""

from __future__ import annotations

import io
from pathlib import Path

from golden import check_golden
from wrapper_cases import BASE, TYPED_REQUEST

from slurm_ext.wrapper.command import main

GOLDEN = Path(__file__).parent / "golden" / "sbatch_argv.json"
TINY_MODEL = 'family = "gpt"\nlayers = 4\nhidden = 64\nheads = 4\nseq_len = 32\nvocab = 256\n'
#: case -> (options before the script, the script's directive lines, the script's own arguments)
CASES: dict[str, tuple[list[str], list[str], list[str]]] = {
    "defaults": (BASE, [], []),
    "typed request over two partitions": ([*BASE, *TYPED_REQUEST], [], ["x", "y z"]),
    "directives and pass-through options": (
        ["--parsable", "-J", "from-command-line", "--time=30"],
        [
            "#CELLSCHED model=gpt-350m",
            "#CELLSCHED global-batch=32",
            "#CELLSCHED iterations=7",
            "#CELLSCHED elastic=yes",
            "#CELLSCHED job-name=from-cellsched",
            "#SBATCH -J from-sbatch -o out-%j.txt -e err-%j.txt",
            "#SBATCH -A acct -q normal --export=NONE",
            "#SBATCH --mail-type=end,fail --mail-user=me@example.org --open-mode=append",
        ],
        ["--lr", "3e-4"],
    ),
    "model spec file, one partition": (
        ["--model", "$TMP/tiny.toml", "--global-batch", "8", "--iterations", "3", "-p", "a40", "--min-gpus", "2"],
        [],
        [],
    ),
}


def test_sbatch_argument_lists(tmp_path, cli_recorder):
    (tmp_path / "tiny.toml").write_text(TINY_MODEL)
    script = tmp_path / "job.sh"
    recorded = {}
    for name, (options, directives, args) in CASES.items():
        script.write_text("\n".join(["#!/bin/bash", *directives, "srun python train.py"]) + "\n")
        argv = [a.replace("$TMP", str(tmp_path)) for a in options] + [str(script), *args]
        out, err = io.StringIO(), io.StringIO()
        code = main(argv, backend_for=lambda _: cli_recorder, stdout=out, stderr=err, environ={})
        assert (code, err.getvalue()) == (0, ""), name
        assert out.getvalue() in ("4242\n", "Submitted batch job 4242\n"), name
        recorded[name] = [[a.replace(str(tmp_path), "$TMP") for a in call] for call in cli_recorder.runner.calls]
        cli_recorder.runner.calls.clear()
    check_golden(GOLDEN, recorded)
