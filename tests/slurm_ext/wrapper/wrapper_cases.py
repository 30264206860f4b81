"""Command lines of `cellsched sbatch` that several wrapper tests submit."""

#: the least a valid submission names
BASE = ["--model", "gpt-1.3b", "--global-batch", "64", "--iterations", "100"]
#: a typed, elastic request over two partitions (on top of BASE), run by the
#: reference trainer (runtime exact: the one whose virtual workers keep an
#: elastic job's training the same at any dp)
# fmt: off
TYPED_REQUEST = [
    "--gpu-types", "a100,v100", "--min-gpus", "2", "--max-gpus", "8", "--gpus", "4", "--gpu-type", "a100",
    "--elastic", "--virtual-workers", "8", "-p", "a100,v100", "-J", "train", "-t", "1:00:00",
    "--runtime", "exact",
]
# fmt: on
