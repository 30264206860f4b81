"""Model presets and spec files."""

from __future__ import annotations

import csv
import json

import pytest

from solver.contract.models import ModelSpec, ModelSpecError, get_model, list_presets, parse_size
from solver.contract.profiles.arena import shipped_path


def _nominal(name: str) -> float:
    size = name.split("__")[-1].split("-")[-1]
    return parse_size(size)


def test_every_arena_model_has_a_preset():
    with open(shipped_path("traces/simulate_trace_philly.csv"), newline="") as fh:
        trace_models = {row["model_name"] for row in csv.DictReader(fh)}
    profiled = {r["trace_model_name"] for r in json.loads(shipped_path("profiles_optimal.json").read_text())["records"]}
    assert trace_models | profiled <= set(list_presets())
    for family, sizes in {
        "wide_resnet": "500M 1B 2B 4B 6.8B 13B",
        "bert": "760M 1.3B 2.6B 6.7B 15B 39B",
        "moe": "690M 1.3B 2.4B 10B 27B 70B",
    }.items():
        for size in sizes.split():
            assert get_model(f"{family}__{size}").family == family


@pytest.mark.parametrize("name", [n for n in list_presets() if n != "gpt-tiny"])
def test_preset_params_close_to_name(name):
    spec = get_model(name)
    assert spec.params == pytest.approx(_nominal(name), rel=0.15)
    assert spec.hidden % spec.heads == 0 and spec.num_layers >= 1
    assert spec.params_per_layer > 0
    assert spec.train_flops_per_sample_per_layer() > 0
    assert spec.act_bytes_per_sample_per_layer() > 0 and spec.boundary_bytes_per_sample() > 0


def test_aliases_and_case():
    assert get_model("bert-2.6b") is get_model("BERT__2.6B") is get_model("bert__2.6B")
    assert get_model("moe-2.4b").name == "moe__2.4B"
    assert get_model("wide-resnet-1b").name == "wide_resnet__1B"
    assert get_model("GPT-1.3B").name == "gpt-1.3b"


def test_gpt_tiny_is_tiny():
    tiny = get_model("gpt-tiny")
    assert (tiny.num_layers, tiny.hidden, tiny.heads, tiny.seq_len, tiny.vocab) == (4, 64, 4, 32, 256)
    assert tiny.params < 1e6 and tiny.dtype == "fp32"


def test_flops_follow_6nd_and_moe_counts_active_experts():
    gpt = get_model("gpt-6.7b")
    dense_6nd = 6 * gpt.params_per_layer * gpt.seq_len
    assert dense_6nd < gpt.train_flops_per_sample_per_layer() < 1.3 * dense_6nd
    moe = get_model("moe__10B")
    all_experts = 6 * moe.params_per_layer * moe.seq_len
    assert moe.train_flops_per_sample_per_layer() < 0.2 * all_experts
    wrn = get_model("wide_resnet__1B")
    assert wrn.train_flops_per_sample_per_layer() * wrn.num_layers == pytest.approx(990 * 1e9)


def test_unknown_preset_suggests_close_matches():
    with pytest.raises(ModelSpecError, match=r"unknown preset 'bert-2.7b'.*bert__2\.6B"):
        get_model("bert-2.7b")


def test_spec_files_json_and_toml(tmp_path):
    js = tmp_path / "mine.json"
    js.write_text(
        json.dumps(
            {"family": "gpt", "layers": 8, "hidden": 512, "heads": 8, "seq_len": 1024, "vocab": 32000, "params": "42M"}
        )
    )
    spec = get_model(str(js))
    assert (spec.name, spec.num_layers, spec.params, spec.dtype) == ("mine", 8, 42e6, "fp16")
    toml = tmp_path / "moe.toml"
    toml.write_text(
        'name = "my-moe"\nfamily = "moe"\nnum_layers = 4\nhidden = 256\nheads = 4\n'
        'seq_len = 128\nvocab = 1000\nnum_experts = 8\ndtype = "bf16"\n'
    )
    moe = get_model(toml)
    assert (moe.name, moe.num_experts, moe.dtype) == ("my-moe", 8, "bf16")
    assert moe.params > 8 * 4 * 8 * 256 * 256  # computed from the shape


GOOD = {"family": "gpt", "layers": 8, "hidden": 512, "heads": 8, "seq_len": 1024, "vocab": 32000}


@pytest.mark.parametrize(
    "change, field",
    [
        ({"family": None}, "family"),
        ({"hidden": None}, "hidden"),
        ({"hidden": "512"}, "hidden"),
        ({"layers": 0}, "layers"),
        ({"heads": -2}, "heads"),
        ({"heads": 7}, "hidden"),
        ({"dtype": "fp8"}, "dtype"),
        ({"family": "rnn"}, "family"),
        ({"params": "lots"}, "params"),
        ({"params": 1e16}, "params"),
        ({"params": 10}, "params"),
        ({"vocab": 10**9}, "vocab"),
        ({"num_experts": 1.5}, "num_experts"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_spec_files_name_the_field(tmp_path, change, field):
    data = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ModelSpecError, match=rf"'{field}'") as err:
        get_model(str(path))
    assert "bad.json" in str(err.value)


def test_unreadable_spec_files(tmp_path):
    with pytest.raises(ModelSpecError, match="cannot read"):
        get_model(str(tmp_path / "missing.json"))
    broken = tmp_path / "broken.toml"
    broken.write_text("family = \n")
    with pytest.raises(ModelSpecError, match="not valid TOML"):
        get_model(str(broken))


def test_direct_construction_is_checked():
    with pytest.raises(ModelSpecError, match="'dtype'"):
        ModelSpec("x", "gpt", 2, 64, 4, 32, 256, 1e6, dtype="int4")
    with pytest.raises(ModelSpecError, match="'hidden'"):
        ModelSpec("x", "gpt", 2, 65, 4, 32, 256, 1e6)


def test_wide_resnet_spec_file_derives_costs(tmp_path):
    path = tmp_path / "wrn.toml"
    path.write_text('family = "wide_resnet"\nlayers = 16\nparams = "1B"\n')
    spec = get_model(str(path))
    preset = get_model("wide_resnet__1B")
    assert spec.name == "wrn" and spec.dtype == "fp32"
    assert spec.flops_per_sample_override == preset.flops_per_sample_override
    assert spec.act_bytes_per_sample_override == preset.act_bytes_per_sample_override
    path.write_text('family = "wide_resnet"\nlayers = 16\n')
    with pytest.raises(ModelSpecError, match="missing field 'params'"):
        get_model(str(path))


def test_a_model_shape_applied_to_a_spec_is_the_model_trained():
    from solver.contract.models import ModelShape, transformer_params

    gpt = get_model("gpt-350m")
    assert ModelShape(24, 1024, 16, 2048, 50257).applied_to(gpt) is gpt  # nothing differs
    trained = ModelShape(8, 32, 4, 16, 64).applied_to(gpt)
    assert (trained.num_layers, trained.hidden, trained.heads, trained.seq_len, trained.vocab) == (8, 32, 4, 16, 64)
    assert trained.params == transformer_params(8, 32, 64) and trained.family == "gpt" and trained.dtype == gpt.dtype
    assert trained.name == "gpt-350m (trained L8 H32 A4 S16 V64)" and trained.signature != gpt.signature
    layers_only = ModelShape(8).applied_to(gpt)  # the rest of the spec's shape kept
    assert (layers_only.num_layers, layers_only.hidden, layers_only.params) == (
        8,
        1024,
        transformer_params(8, 1024, 50257),
    )
    resnet = get_model("wide_resnet__1B")
    assert ModelShape(8).applied_to(resnet).params == resnet.params  # not a transformer: its parameters kept
    with pytest.raises(ModelSpecError, match="must be divisible by 'heads'"):
        ModelShape(8, hidden=30, heads=4).applied_to(gpt)
    assert ModelShape.from_dict(ModelShape(8, 32).to_dict()) == ModelShape(8, 32)
