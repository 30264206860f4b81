"""The model priced is the model trained: a megatron or torchtitan job's own
command states its model (slurm_ext.wrapper.frameworks); `cellsched sbatch`
derives the spec from it without --model and refuses a --model that
contradicts it (no Slurm: a recording backend over the dev cluster's shape).

The oracles are the numbers written in each script and the presets' shapes
as the GPT-3 paper gives them, not the wrapper's readers."""

from __future__ import annotations

import io
import pathlib

import pytest

from slurm_ext.wrapper.command import main
from slurm_ext.wrapper.frameworks import TORCHTITAN_MODELS
from slurm_ext.wrapper.launched import launched_commands
from slurm_ext.wrapper.submission import prepare

RUN = ["--global-batch", "64", "--iterations", "100"]
#: gpt-1.3b's shape (GPT-3 paper: 24 layers, d_model 2048; the preset's 16 heads), written as Megatron's options
MEGATRON_13B = (
    "--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048"
    " --vocab-size 50257"
)


def job(tmp_path: pathlib.Path, *command_lines: str) -> str:
    """A batch script whose last lines are COMMAND_LINES (the launch line among them)."""
    path = tmp_path / "train.sh"
    path.write_text("\n".join(["#!/bin/bash", "#SBATCH --open-mode=append", *command_lines]) + "\n")
    return str(path)


def megatron_job(tmp_path: pathlib.Path, options: str = MEGATRON_13B, *, before: str = "") -> str:
    return job(
        tmp_path,
        before,
        "exec srun --kill-on-bad-exit=1 cellsched-launch -- \\",
        f"    python pretrain_gpt.py {options} \\",
        "    --train-iters 100 --lr 1e-4 --fp16",
    )


def titan_job(tmp_path: pathlib.Path, *options: str) -> str:
    return job(tmp_path, "exec srun cellsched-launch -- python -m torchtitan.train " + " ".join(options))


def error_of(argv: list[str], rec) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, backend_for=lambda name: rec, stdout=out, stderr=err, environ={})
    assert code == 2, (out.getvalue(), err.getvalue())
    assert err.getvalue().count("\n") == 1 and err.getvalue().startswith("cellsched sbatch: error: ")
    assert not rec.submitted
    return err.getvalue().removeprefix("cellsched sbatch: error: ").rstrip("\n")


def submitted(argv: list[str], rec):
    return prepare(argv, lambda name: rec, environ={}, fits=lambda spec, snapshot: None).spec  # any size


# ---- megatron -------------------------------------------------------------------------


def test_megatron_without_model_submits_the_model_its_arguments_state(tmp_path, make_recorder):
    spec = submitted(["--runtime", "megatron", *RUN, megatron_job(tmp_path)], make_recorder())
    assert spec.model == "megatron-gpt" and spec.model_def is not None
    d = spec.model_def
    assert (d["num_layers"], d["hidden"], d["heads"], d["seq_len"], d["vocab"]) == (24, 2048, 16, 2048, 50257)
    assert d["dtype"] == "fp16" and d["family"] == "gpt"
    # counted as the presets are: 24 blocks of 12 h^2 + 13 h, and the embedding
    assert d["params"] == 24 * (12 * 2048**2 + 13 * 2048) + 50257 * 2048
    assert spec.model_spec().signature.endswith("L24|H2048|A16|S2048|V50257|E1|fp16")


def test_megatron_with_a_model_that_agrees_keeps_the_preset(tmp_path, make_recorder):
    spec = submitted(["--runtime", "megatron", "--model", "gpt-1.3b", *RUN, megatron_job(tmp_path)], make_recorder())
    assert spec.model == "gpt-1.3b" and spec.model_def is None


def test_megatron_with_a_model_that_contradicts_its_arguments_is_refused_naming_both(tmp_path, make_recorder):
    script = megatron_job(tmp_path, MEGATRON_13B.replace("--num-layers 24", "--num-layers 32"))
    assert error_of(["--runtime", "megatron", "--model", "gpt-1.3b", *RUN, script], make_recorder()) == (
        "model: layers 24 in gpt-1.3b, 32 in the job's command (--num-layers on script line 5)"
    )
    # gpt-2.7b: 32 layers, hidden 2560, 32 heads; the command: 24, 2048, 16; every field named on one line
    wide = ["--runtime", "megatron", "--model", "gpt-2.7b", *RUN, megatron_job(tmp_path)]
    assert error_of(wide, make_recorder()) == (
        "model: layers 32 in gpt-2.7b, 24 in the job's command (--num-layers on script line 5); "
        "hidden size 2560 in gpt-2.7b, 2048 in the job's command (--hidden-size on script line 5); "
        "attention heads 32 in gpt-2.7b, 16 in the job's command (--num-attention-heads on script line 5)"
    )


def test_a_directive_model_that_contradicts_names_its_line(tmp_path, make_recorder):
    script = megatron_job(tmp_path, before="#CELLSCHED model=gpt-1.3b")
    pathlib.Path(script).write_text(pathlib.Path(script).read_text().replace("--seq-length 2048", "--seq-length 4096"))
    assert error_of(["--runtime", "megatron", *RUN, script], make_recorder()) == (
        "model (script line 3): sequence length 2048 in gpt-1.3b, 4096 in the job's command "
        "(--seq-length on script line 5)"
    )


def test_the_padded_vocabulary_is_what_the_model_has(tmp_path, make_recorder):
    script = megatron_job(tmp_path, MEGATRON_13B + " --padded-vocab-size 50304")
    spec = submitted(["--runtime", "megatron", *RUN, script], make_recorder())
    assert spec.model_def is not None and spec.model_def["vocab"] == 50304
    assert "vocabulary 50257 in gpt-1.3b, 50304 in the job's command (--padded-vocab-size on script line 5)" in (
        error_of(["--runtime", "megatron", "--model", "gpt-1.3b", *RUN, script], make_recorder())
    )


def test_arguments_passed_to_the_script_state_the_model_too(tmp_path, make_recorder):
    script = megatron_job(tmp_path, '--num-layers 24 --hidden-size 2048 --vocab-size 50257 "$@"')
    args = ["--num-attention-heads", "16", "--seq-length", "1024"]
    spec = submitted(["--runtime", "megatron", *RUN, script, *args], make_recorder())
    assert spec.model_def is not None and (spec.model_def["heads"], spec.model_def["seq_len"]) == (16, 1024)
    assert error_of(["--runtime", "megatron", "--model", "gpt-1.3b", *RUN, script, *args], make_recorder()) == (
        "model: sequence length 2048 in gpt-1.3b, 1024 in the job's command (--seq-length on script argument 4)"
    )


def test_what_the_wrapper_cannot_read_it_neither_derives_nor_checks(tmp_path, make_recorder):
    script = megatron_job(tmp_path, MEGATRON_13B.replace("--num-layers 24", "--num-layers $LAYERS"))
    assert error_of(["--runtime", "megatron", *RUN, script], make_recorder()) == (
        "model: is required (--model or '#CELLSCHED model=...'): the job's megatron command does not state its "
        "layers (--num-layers on script line 5 is '$LAYERS', which cellsched sbatch does not expand)"
    )
    spec = submitted(["--runtime", "megatron", "--model", "gpt-1.3b", *RUN, script], make_recorder())
    assert spec.model == "gpt-1.3b"


def test_a_megatron_command_without_its_shape_needs_a_model(tmp_path, make_recorder):
    script = megatron_job(tmp_path, "--num-layers 24 --hidden-size 2048")
    message = error_of(["--runtime", "megatron", *RUN, script], make_recorder())
    assert message.startswith(
        "model: is required (--model or '#CELLSCHED model=...'): the job's megatron command does not state its "
        "attention heads, sequence length, vocabulary (write --num-layers, --hidden-size, --num-attention-heads,"
    )


def test_a_value_that_is_no_number_is_refused(tmp_path, make_recorder):
    script = megatron_job(tmp_path, MEGATRON_13B.replace("--hidden-size 2048", "--hidden-size=2k"))
    assert error_of(["--runtime", "megatron", *RUN, script], make_recorder()) == (
        "script: --hidden-size on script line 5: '2k' is not a whole number"
    )


def test_two_launched_commands_must_train_one_model(tmp_path, make_recorder):
    narrow = MEGATRON_13B.replace("--hidden-size 2048", "--hidden-size 1024")
    script = job(
        tmp_path,
        f"srun cellsched-launch -- python pretrain_gpt.py {MEGATRON_13B}",
        f"srun cellsched-launch -- python pretrain_gpt.py {narrow}",
    )
    assert error_of(["--runtime", "megatron", *RUN, script], make_recorder()) == (
        "script: its commands train different models: hidden size 2048 (--hidden-size on script line 3) "
        "and 1024 (--hidden-size on script line 4)"
    )


def test_other_runtimes_do_not_read_the_command(tmp_path, make_recorder):
    spec = submitted(["--model", "gpt-2.7b", *RUN, megatron_job(tmp_path)], make_recorder())
    assert spec.runtime == "ddp" and spec.model == "gpt-2.7b"
    assert error_of([*RUN, megatron_job(tmp_path)], make_recorder()) == (
        "model: is required (--model or '#CELLSCHED model=...')"
    )


# ---- torchtitan -------------------------------------------------------------------------


def test_torchtitan_without_model_submits_its_configs_model(tmp_path, make_recorder):
    script = titan_job(tmp_path, "--module", "llama3", "--config", "llama3_8b")
    spec = submitted(["--runtime", "torchtitan", *RUN, script], make_recorder())
    d = spec.model_def
    assert spec.model == "llama3_8b" and d is not None
    # Llama 3 8B: 32 layers, d_model 4096, 32 heads, vocabulary 128256, 8.03B parameters; torchtitan trains at 8192
    assert (d["num_layers"], d["hidden"], d["heads"], d["seq_len"], d["vocab"]) == (32, 4096, 32, 8192, 128256)
    assert d["params"] == 8_030_261_248 and d["dtype"] == "bf16"
    shorter = titan_job(tmp_path, "--module=llama3", "--config=llama3_8b", "--training.seq_len", "2048")
    assert submitted(["--runtime", "torchtitan", *RUN, shorter], make_recorder()).model_def["seq_len"] == 2048


def test_torchtitan_with_a_model_that_contradicts_its_config_is_refused(tmp_path, make_recorder):
    script = titan_job(tmp_path, "--module", "llama3", "--config", "llama3_8b")
    message = error_of(["--runtime", "torchtitan", "--model", "gpt-6.7b", *RUN, script], make_recorder())
    # gpt-6.7b: 32 layers, hidden 4096, 32 heads (the same), seq 2048 and vocabulary 50257 (not)
    assert message == (
        "model: sequence length 2048 in gpt-6.7b, 8192 in the job's command (--config llama3_8b on script line 3); "
        "vocabulary 50257 in gpt-6.7b, 128256 in the job's command (--config llama3_8b on script line 3)"
    )


def test_an_unknown_torchtitan_config_needs_a_model(tmp_path, make_recorder):
    script = titan_job(tmp_path, "--module", "llama3", "--config", "my_llama")
    assert error_of(["--runtime", "torchtitan", *RUN, script], make_recorder()).startswith(
        "model: is required (--model or '#CELLSCHED model=...'): the job's torchtitan command does not state its "
        "layers, hidden size, attention heads, sequence length, vocabulary (torchtitan config llama3/my_llama is "
        "not one whose model it knows)"
    )
    assert submitted(["--runtime", "torchtitan", "--model", "gpt-1.3b", *RUN, script], make_recorder()).model == (
        "gpt-1.3b"
    )


# ---- reading the script ------------------------------------------------------------------


def test_launched_commands_are_read_as_written():
    text = "\n".join(
        [
            "#!/bin/bash",
            "# cellsched-launch -- python not_this.py",
            "srun cellsched-launch --print-env -- python a.py --x 1 \\",
            '  --y "two words" && echo done',
            "srun /usr/local/bin/cellsched-launch python b.py \"$@\" $HOME; echo 'cellsched-launch -- c.py'",
            "cellsched-launch -- python c.py --url a#b # a comment",
            "echo 'unclosed cellsched-launch",
        ]
    )
    got = [[(w.text, w.where, w.readable) for w in cmd] for cmd in launched_commands(text, ["--z", "3"])]
    line3, line4, line5, line6 = (f"script line {n}" for n in (3, 4, 5, 6))
    assert got == [
        [("python", line3, True), ("a.py", line3, True), ("--x", line3, True), ("1", line3, True)]
        + [("--y", line4, True), ("two words", line4, True)],
        [("python", line5, True), ("b.py", line5, True), ("--z", "script argument 1", True)]
        + [("3", "script argument 2", True), ("$HOME", line5, False)],
        [("python", line6, True), ("c.py", line6, True), ("--url", line6, True), ("a#b", line6, True)],
    ]


# ---- the table of torchtitan's models, against the installed torchtitan --------------------


@pytest.mark.slow
@pytest.mark.parametrize(("module", "config"), sorted(TORCHTITAN_MODELS))
def test_torchtitan_models_are_the_installed_torchtitans(module, config):
    pytest.importorskip(f"torchtitan.models.{module}.config_registry")
    import importlib
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    cfg = getattr(importlib.import_module(f"torchtitan.models.{module}.config_registry"), config)()
    model = cfg.model_spec.model
    with torch.device("meta"):
        params = sum(p.numel() for p in model.build().parameters())
    got = (len(model.layers), model.dim, model.layers[0].attention.n_heads, cfg.training.seq_len, model.vocab_size)
    want = TORCHTITAN_MODELS[(module, config)]
    assert got + (params,) == (want.num_layers, want.hidden, want.heads, want.seq_len, want.vocab, want.params)
