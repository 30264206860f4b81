"""benchmarks/frameworks_gpu.py, the parts that run without a GPU: the tokenizer and
dataset it makes for torchtitan's debug config are read by torchtitan's own classes,
and its loss readers take the step lines the frameworks print (tests/launch/framework_logs.py,
one of them printed by Megatron-LM on a GPU) and nothing else."""

from __future__ import annotations

import sys
from pathlib import Path

import frameworks_gpu  # benchmarks/ is on the path (conftest.py)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch"))
from framework_logs import MEGATRON_LINES, MEGATRON_OTHER, TITAN_LINES  # noqa: E402


def test_torchtitan_reads_the_tokenizer_and_the_dataset_the_script_makes(tmp_path):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset
    from torchtitan.models.llama3 import model_registry

    texts = frameworks_gpu.make_text(tmp_path / "text" / "train.jsonl", docs=200)
    frameworks_gpu.make_tokenizer(tmp_path / "tokenizer", texts)
    tok = HuggingFaceTokenizer(HuggingFaceTokenizer.Config(), tokenizer_path=str(tmp_path / "tokenizer"))
    assert (tok.bos_id, tok.eos_id) == (0, 1)
    assert tok.decode(tok.encode(texts[0][:200], add_bos=False, add_eos=False)) == texts[0][:200]
    data = HuggingFaceTextDataset(
        dataset_name="c4_test",
        dataset_path=str(tmp_path / "text"),
        tokenizer=tok,
        seq_len=512,
        dp_rank=0,
        dp_world_size=1,
        infinite=True,
    )
    sample, labels = next(iter(data))
    assert sample["input"].shape == labels.shape == (512,)
    # every token fits the debug model's embedding
    vocab = model_registry("debugmodel").model.vocab_size
    assert int(labels.max()) < tok.get_vocab_size() <= vocab


def test_the_loss_readers_take_training_steps_only(tmp_path):
    log = tmp_path / "titan.log"
    log.write_text("\n".join(line for line, _ in TITAN_LINES) + "\n")
    assert frameworks_gpu.losses(log, frameworks_gpu.TITAN_LOSS) == {7: 8.12345, 120: 3.25}
    log.write_text("\n".join([*(line for line, _ in MEGATRON_LINES), *MEGATRON_OTHER]) + "\n")
    read = frameworks_gpu.losses(log, frameworks_gpu.MEGATRON_LOSS)
    assert read == {step.done: loss for (_, step), loss in zip(MEGATRON_LINES, MEGATRON_LOSSES, strict=True)}


#: the lm loss each of MEGATRON_LINES prints, in order
MEGATRON_LOSSES = [10.83, 9.1234, 7.812345, 2.5, 6.917109]
