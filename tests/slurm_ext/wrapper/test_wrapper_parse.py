"""Option and #CELLSCHED parsing, validation and the request the wrapper builds
(no Slurm: a recording backend over the dev cluster's shape)."""

from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess

import pytest
from golden import ArgvRecorder
from wrapper_cases import BASE, TYPED_REQUEST

from slurm_ext.backends.cli import CliBackend
from slurm_ext.wrapper.argv import parse_argv
from slurm_ext.wrapper.command import main
from slurm_ext.wrapper.directives import parse_directives
from slurm_ext.wrapper.model import MAX_MODEL_FILE_BYTES
from slurm_ext.wrapper.options import OPTIONS
from slurm_ext.wrapper.submission import prepare
from solver.contract.jobspec import MAX_SPEC_BYTES, JobSpec


def script(tmp_path: pathlib.Path, *lines: str, name: str = "job.sh") -> str:
    path = tmp_path / name
    path.write_text("\n".join(["#!/bin/bash", *lines, "srun python train.py"]) + "\n")
    return str(path)


def run(argv: list[str], rec, environ: dict | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, backend_for=lambda name: rec, stdout=out, stderr=err, environ=environ or {})
    return code, out.getvalue(), err.getvalue()


def error_of(argv: list[str], rec, environ: dict | None = None) -> str:
    code, out, err = run(argv, rec, environ)
    assert code == 2, (out, err)
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("cellsched sbatch: error: "), err
    assert not rec.submitted
    return err.removeprefix("cellsched sbatch: error: ").rstrip("\n")


# ---- parsing -------------------------------------------------------------------------


def test_option_forms_and_script_args_pass_through():
    inv = parse_argv(
        ["--model=gpt-1.3b", "-J", "n1", "-pall", "-t=10", "--elastic", "job.sh", "--gres=gpu:9", "-N", "3"]
    )
    assert {k: s.value for k, s in inv.settings.items()} == {
        "model": "gpt-1.3b",
        "job-name": "n1",
        "partition": "all",
        "time": "10",
        "elastic": True,
    }
    assert inv.script == "job.sh" and inv.script_args == ("--gres=gpu:9", "-N", "3")
    inv = parse_argv(["--no-elastic", "--", "-odd-name.sh", "a"])
    assert inv.settings["elastic"].value is False and inv.script == "-odd-name.sh" and inv.script_args == ("a",)


def test_directives_and_precedence(tmp_path, make_recorder):
    path = script(
        tmp_path,
        "#CELLSCHED model=gpt-350m",
        "#CELLSCHED global-batch=32",
        "# a comment",
        "",
        "#CELLSCHED iterations = 7",
        "#CELLSCHED elastic=yes",
        "#SBATCH -J from-sbatch --time=5",
        "#CELLSCHED job-name=from-cellsched",
    )
    rec = make_recorder()
    sub = prepare(["--global-batch", "128", path], lambda n: rec, environ={})
    assert sub.spec.model == "gpt-350m" and sub.spec.global_batch == 128 and sub.spec.iterations == 7
    assert sub.spec.elastic is True
    assert sub.request.job_name == "from-cellsched" and sub.request.time_limit == "5"


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (["#CELLSCHED model"], "script line 2: malformed directive"),
        (["#CELLSCHEDmodel=x"], "script line 2: malformed directive"),
        (["#CELLSCHED =5"], "script line 2: malformed directive"),
        (["#CELLSCHED colour=blue"], "script line 2: unknown key 'colour'"),
        (["#CELLSCHED parsable=true"], "script line 2: unknown key 'parsable'"),
        (["#CELLSCHED model=a", "#CELLSCHED model=b"], "script line 3: 'model' is already set on script line 2"),
        (["#CELLSCHED elastic=maybe"], "script line 2: elastic must be true or false"),
        (["#SBATCH --gres=gpu:a100:4"], "--gres: not accepted by cellsched sbatch (script line 2)"),
        (["#SBATCH -N 2"], "-N: not accepted by cellsched sbatch (script line 2)"),
        (["#SBATCH --constraint=a100"], "--constraint: not accepted"),
        (["#SBATCH --mem=4G"], "--mem: unknown option (script line 2); supported: --model"),
        (["#SBATCH -J 'unterminated"], "script line 2: malformed #SBATCH line"),
        (["echo hi", "#CELLSCHED model=gpt-1.3b"], "script line 3: #CELLSCHED after the first command is not read"),
    ],
)
def test_bad_directive_lines_name_the_line(tmp_path, make_recorder, lines, expected):
    assert expected in error_of(BASE + [script(tmp_path, *lines)], make_recorder())


def test_sbatch_lines_after_the_first_command_are_not_read():
    cs, sb = parse_directives("#!/bin/sh\n#SBATCH -J a\necho\n#SBATCH --gres=gpu:8\n")
    assert cs == {} and sb["job-name"].value == "a"


# ---- validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model", "gpt-1.3"], "model: unknown model 'gpt-1.3'; did you mean gpt-1.3b"),
        (["--model", "no/such/file.json"], "model: no such spec file"),
        (["--global-batch", "abc"], "global-batch: must be a whole number, got 'abc'"),
        (["--global-batch", "-4"], "global-batch: must be a whole number, got '-4'"),
        (["--global-batch", "0"], "global-batch: must be between 1 and 1000000000, got 0"),
        (["--global-batch", "1e3"], "global-batch: must be a whole number"),
        (["--global-batch", "\u0661\u0662"], "global-batch: must be a whole number"),
        (["--iterations", "99999999999999"], "iterations: must be a whole number"),
        (["--min-gpus", "8", "--max-gpus", "4"], "min-gpus: 8 is more than max-gpus (4)"),
        (["--gpus", "16", "--max-gpus", "8"], "gpus: 16 is more than max-gpus (8)"),
        (["--virtual-workers", "7"], "virtual-workers: 7 does not divide global-batch (64)"),
        (["--virtual-workers", "8"], "virtual-workers: runtime ddp has no virtual workers (only exact has)"),
        (
            ["--runtime", "deepspeed"],
            "runtime: 'deepspeed' is not a runtime; known: ddp, sharded, exact, torchtitan, megatron",
        ),
        (["--runtime", "adaptive"], "runtime: 'adaptive' is the simulator's runtime for trace jobs; known: ddp,"),
        (["--runtime", "DDP"], "runtime: 'DDP' is not a runtime"),
        (["--gpu-types", "a100,h100"], "gpu-types: no 'h100' GPUs in this cluster; it has: a10, a100, a40, v100"),
        (["--gpu-types", "A100"], "gpu-types: 'A100' is not a GPU type name"),
        (["--gpu-types", "a100", "--gpu-type", "v100"], "gpu-type: 'v100' is not among gpu-types (a100)"),
        (["--min-gpus", "64"], "min-gpus: 64 GPUs of one type can never be had: the allowed GPU types have at most 8"),
        (["--gpu-types", "a40", "--min-gpus", "5"], "min-gpus: 5 GPUs of one type can never be had"),
        (["--partition", "a10", "--min-gpus", "4"], "in the chosen partitions have at most 2"),
        (["--partition", "nope"], "partition: no partition 'nope'; partitions: a10, a100, a40, all, v100"),
        (
            ["--gpu-types", "a10", "--model", "gpt-13b"],
            "model: gpt-13b with global batch 64 fits no cell of this cluster",
        ),
        (["--job-name", "a b"], "job-name: 'a b' is not a job name"),
        (["--job-name", "$(reboot)"], "job-name: '$(reboot)' is not a job name"),
        (["--time", "soon"], "time: 'soon' is not a time limit"),
        (["--output", "a\nb"], "output: must not contain control characters"),
        (["--mail-type", "END,LUNCH"], "mail-type: 'LUNCH' is not one of"),
        (["--open-mode", "rewrite"], "open-mode: 'rewrite' is not append or truncate"),
        (["--mail-user", "x;y"], "mail-user: 'x;y' is not a mail address"),
        (["--elastic=yes"], "--elastic: takes no value"),
        (
            ["--gres=gpu:4"],
            "--gres: not accepted by cellsched sbatch (command line): "
            "GPU counts and types are the scheduler's business",
        ),
        (["-N", "2"], "-N: not accepted"),
        (["-C", "a100"], "-C: not accepted"),
        (["--hold"], "--hold: not accepted by cellsched sbatch (command line): the scheduler holds"),
        (["--comment", "x"], "--comment: not accepted"),
        (["--frobnicate"], "--frobnicate: unknown option (command line); supported: --model, --global-batch"),
        (["--iterations"], None),  # consumes the script as its value
    ],
)
def test_bad_options_are_refused_naming_the_field(tmp_path, make_recorder, args, expected):
    msg = error_of(BASE + args + [script(tmp_path)], make_recorder())
    if expected is not None:
        assert expected in msg


def test_unknown_backend_is_refused(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    code = main(BASE + ["--backend", "nope", script(tmp_path)], stdout=out, stderr=err, environ={})
    assert code == 2 and err.getvalue().startswith("cellsched sbatch: error: backend: unknown backend 'nope'")


@pytest.mark.parametrize("what", ["missing", "directory", "fifo", "no-shebang", "nul", "dos", "latin1", "none"])
def test_bad_scripts_are_refused(tmp_path, make_recorder, what):
    path = tmp_path / "s.sh"
    if what == "directory":
        path.mkdir()
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "no-shebang":
        path.write_text("echo hi\n")
    elif what == "nul":
        path.write_bytes(b"#!/bin/sh\necho \x00\n")
    elif what == "dos":
        path.write_bytes(b"#!/bin/sh\r\necho\r\n")
    elif what == "latin1":
        path.write_bytes(b"#!/bin/sh\necho caf\xe9\n")
    argv = BASE + ([] if what == "none" else [str(path)])
    assert error_of(argv, make_recorder()).startswith("script: ")


def test_nul_bytes_in_arguments_are_refused(tmp_path, make_recorder):
    assert error_of(BASE + [script(tmp_path), "a\x00b"], make_recorder()).startswith("arguments: contains a NUL byte")
    assert error_of(["--job-name", "x\x00"] + BASE + [script(tmp_path)], make_recorder()).startswith("arguments: ")


def test_sbatch_environment_variables_that_bypass_the_wrapper_are_refused(tmp_path, make_recorder):
    msg = error_of(BASE + [script(tmp_path)], make_recorder(), environ={"SBATCH_GRES": "gpu:8", "SBATCH_ACCOUNT": "a"})
    assert msg.startswith("environment: SBATCH_GRES is set")
    code, _, _ = run(BASE + ["--dry-run", script(tmp_path)], make_recorder(), environ={"SBATCH_ACCOUNT": "a"})
    assert code == 0


def test_required_settings(tmp_path, make_recorder):
    assert error_of(["--model", "gpt-1.3b", script(tmp_path)], make_recorder()).startswith("global-batch: is required")


def test_oversized_spec_is_refused(tmp_path, make_recorder):
    spec_file = tmp_path / "big.json"
    spec_file.write_text(
        json.dumps(
            {
                "name": "m" * (MAX_SPEC_BYTES + 10),
                "family": "gpt",
                "layers": 2,
                "hidden": 64,
                "heads": 4,
                "seq_len": 32,
                "vocab": 256,
            }
        )
    )
    msg = error_of(
        ["--model", str(spec_file), "--global-batch", "8", "--iterations", "1", script(tmp_path)], make_recorder()
    )
    assert msg.startswith("spec: is ") and f"more than {MAX_SPEC_BYTES}" in msg


def test_model_spec_file_is_refused_unless_a_small_regular_file(tmp_path, make_recorder):
    big = tmp_path / "big.json"
    big.write_text(" " * (MAX_MODEL_FILE_BYTES + 1))
    for model, expected in [
        ("/dev/zero", "is not a regular file"),
        (str(big), "bytes, more than"),
        (str(tmp_path), "is not a regular file"),
    ]:
        args = ["--model", model, "--global-batch", "8", "--iterations", "1", script(tmp_path)]
        assert expected in error_of(args, make_recorder())


def test_bad_spec_file_content_names_the_model_field(tmp_path, make_recorder):
    spec_file = tmp_path / "m.json"
    spec_file.write_text(
        json.dumps({"family": "gpt", "layers": -1, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 256})
    )
    msg = error_of(
        ["--model", str(spec_file), "--global-batch", "8", "--iterations", "1", script(tmp_path)], make_recorder()
    )
    assert msg.startswith("model: model spec file") and "'layers' must be positive" in msg


# ---- what is submitted -------------------------------------------------------------------


def test_valid_submission_builds_a_held_untyped_request(tmp_path, make_recorder):
    rec = make_recorder(forbid_submit=False)
    path = script(tmp_path)
    code, out, err = run(
        BASE + TYPED_REQUEST + ["--mail-type", "end,fail", "--open-mode", "append", path, "x", "y z"], rec
    )
    assert (code, out, err) == (0, "Submitted batch job 4242\n", "")
    (req,) = rec.submitted
    spec = JobSpec.from_comment(req.comment)
    assert spec == JobSpec(
        model="gpt-1.3b",
        global_batch=64,
        iterations=100,
        gpu_types=("a100", "v100"),
        min_gpus=2,
        max_gpus=8,
        elastic=True,
        requested_gpus=4,
        requested_gpu_type="a100",
        virtual_workers=8,
        partitions=("a100", "v100"),
        runtime="exact",
    )
    assert req.comment == spec.to_comment()
    assert req.hold is True and req.gres_per_node == 2 and req.nodes == 1
    assert req.constraint == "a100|v100" and req.partition is None
    assert req.extra_args == ("--open-mode=append", "--mail-type=END,FAIL", "--partition=a100,v100")
    assert req.script == path and req.script_args == ("x", "y z")
    assert req.job_name == "train" and req.time_limit == "1:00:00"


def test_parsable_prints_the_job_id_only(tmp_path, make_recorder):
    rec = make_recorder(forbid_submit=False)
    assert run(BASE + ["--parsable", script(tmp_path)], rec)[:2] == (0, "4242\n")


def test_provisional_gres_is_capped_by_the_largest_allowed_node(tmp_path, make_recorder):
    rec = make_recorder()
    sub = prepare(BASE + ["--gpu-types", "a100", "--min-gpus", "6", script(tmp_path)], lambda n: rec, environ={})
    assert sub.request.gres_per_node == 4 and sub.request.partition is None


def test_dry_run_submits_nothing_and_prints_the_request(tmp_path, make_recorder):
    rec = make_recorder()
    code, out, _ = run(BASE + ["--dry-run", "-p", "a100", script(tmp_path)], rec)
    shown = json.loads(out)
    assert code == 0 and not rec.submitted
    assert shown["sbatch"]["hold"] is True and shown["sbatch"]["partition"] == "a100"
    assert shown["spec"]["partitions"] == ["a100"] and shown["sbatch"]["comment"].startswith("cellsched/v1 {")


def test_model_spec_file_travels_inline(tmp_path, make_recorder):
    spec_file = tmp_path / "my model.toml"
    spec_file.write_text('family = "gpt"\nlayers = 4\nhidden = 64\nheads = 4\nseq_len = 32\nvocab = 256\n')
    rec = make_recorder()
    sub = prepare(
        ["--model", str(spec_file), "--global-batch", "8", "--iterations", "3", script(tmp_path)],
        lambda n: rec,
        environ={},
    )
    from solver.contract.models import load_spec_file

    assert sub.spec.model == "my model.toml" and sub.spec.model_def is not None
    assert JobSpec.from_comment(sub.request.comment).model_spec() == load_spec_file(spec_file)


def test_help_lists_every_option(make_recorder):
    code, out, _ = run(["--help"], make_recorder())
    assert code == 0
    for opt in OPTIONS:
        assert f"--{opt.name}" in out


# ---- runtimes (docs/runtimes.md) ---------------------------------------------------------


def test_runtime_defaults_to_ddp_and_travels_in_the_spec(tmp_path, make_recorder):
    rec = make_recorder()
    sub = prepare(BASE + [script(tmp_path)], lambda n: rec, environ={})
    assert sub.spec.runtime == "ddp"
    assert json.loads(sub.request.comment.removeprefix("cellsched/v1 "))["runtime"] == "ddp"


@pytest.mark.parametrize("name", ["ddp", "sharded", "exact", "torchtitan", "megatron"])
def test_runtime_from_the_command_line_or_a_directive(tmp_path, make_recorder, name):
    rec = make_recorder()
    sub = prepare(BASE + ["--runtime", name, script(tmp_path)], lambda n: rec, environ={})
    assert json.loads(sub.request.comment.removeprefix("cellsched/v1 "))["runtime"] == name
    sub = prepare(BASE + [script(tmp_path, f"#CELLSCHED runtime={name}")], lambda n: rec, environ={})
    assert JobSpec.from_comment(sub.request.comment).runtime == name


def test_runtime_on_the_command_line_wins_over_the_directive(tmp_path, make_recorder):
    rec = make_recorder()
    sub = prepare(
        BASE + ["--runtime", "exact", script(tmp_path, "#CELLSCHED runtime=megatron")], lambda n: rec, environ={}
    )
    assert sub.spec.runtime == "exact"


def test_a_bad_runtime_directive_names_its_line(tmp_path, make_recorder):
    err = error_of(BASE + [script(tmp_path, "#CELLSCHED runtime=horovod")], make_recorder())
    assert (
        err == "runtime (script line 2): 'horovod' is not a runtime; known: ddp, sharded, exact, torchtitan, megatron"
    )


def test_help_explains_each_runtime_in_a_line(make_recorder):
    code, out, _ = run(["--help"], make_recorder())
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Runtimes"))
    named = {line.split()[0]: line for line in lines[start + 1 :] if line.strip()}
    assert list(named) == ["ddp", "sharded", "exact", "torchtitan", "megatron"]
    assert "(default)" in named["ddp"] and sum("(default)" in line for line in named.values()) == 1
    assert "DDP" in named["ddp"] and "Megatron" in named["megatron"] and "torchtitan" in named["torchtitan"]


# ---- what Slurm refuses at submission ----------------------------------------------------

#: sbatch's error output when the user's association is at its MaxSubmitJobs (recorded on the dev cluster
#: with accounting, Slurm 22.05.8: MaxSubmitJobs=5 and five held jobs, the sixth refused; held jobs count)
MAX_SUBMIT = (
    "sbatch: error: AssocMaxSubmitJobLimit\n"
    "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy "
    "(job submit limit, user's size and/or time limits)\n"
)


def test_a_submission_slurm_refuses_at_max_submit_jobs_exits_with_slurms_words(tmp_path, snapshot):
    class Refusing(CliBackend):
        """The real cli backend over the dev cluster's shape; sbatch answers as Slurm did at MaxSubmitJobs."""

        def __init__(self) -> None:
            self.runner = ArgvRecorder()

            def run(args, **kw):
                self.runner(args, **kw)
                return subprocess.CompletedProcess(args, 1, "", MAX_SUBMIT)

            super().__init__(run=run)

        def observe(self):
            return snapshot

    backend = Refusing()
    code, out, err = run(BASE + ["-A", "sub1", script(tmp_path)], backend)
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "cellsched sbatch: error: AssocMaxSubmitJobLimit",
        "cellsched sbatch: error: Batch job submission failed: Job violates accounting/QOS policy "
        "(job submit limit, user's size and/or time limits)",
    ]
    (call,) = backend.runner.calls
    assert call[0] == "sbatch" and "--hold" in call and "--account=sub1" in call
