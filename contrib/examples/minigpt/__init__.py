"""A small GPT with pipeline, data and tensor parallelism: the library behind ``train_gpt.py``.

- ``minigpt.model``: ``GPTConfig``, the blocks and pipeline stages, building the
  whole model from a seed and cutting a stage's tensor-parallel shard from it;
- ``minigpt.tensor_parallel``: column- and row-parallel linear layers;
- ``minigpt.data``: the seeded synthetic dataset, drawn by virtual workers (exact)
  or by global sample position (sharded);
- ``minigpt.trainer``: ``TrainConfig``, ``workload`` (minigpt plugged into
  ``launch.Trainer``, which trains it in the plan's runtime), and
  ``reference_losses`` / ``keyed_reference_losses`` (the same training on one
  process without torch.distributed, with exact's and sharded's data).
"""
