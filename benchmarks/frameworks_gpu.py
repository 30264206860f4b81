"""The frameworks' own training loops on a GPU, under ``cellsched-launch``.

torchtitan's trainer (``python -m torchtitan.train``, its smallest llama3
config, ``llama3_debugmodel``) and Megatron-LM's ``pretrain_gpt.py`` (a small
GPT) each run as a managed job's task runs them: through the real launcher
(``python -m launch -- CMD``) with the SLURM_* variables of a one-task step
and an inline plan, so the adapter appends its options and relays the step
lines into ``progress.json``. For each framework, four runs:

1. ``reference``: plan A, all steps, never interrupted;
2. ``interrupted``: plan A; SIGUSR1 to the launcher once ``progress.json``
   shows step `SIGNAL_AFTER`: the framework checkpoints and the launcher
   exits 75 (EXIT_CHECKPOINTED);
3. ``resumed-same``: plan A again, from a copy of that checkpoint;
4. ``resumed-moved``: plan B (another split of the same global batch into
   micro-batches), from another copy of it.

Plan A: dp = tp = pp = 1, global batch 8 in 2 micro-batches of 4 (torchtitan
and Megatron accumulate gradients); plan B: one micro-batch of 8. A machine of
one GPU can run no plan of other degrees (NCCL takes one rank per GPU), so the
move here changes the micro-batches only.

Prints one JSON line per run (``framework``, ``run``, ``plan``, ``rc``,
``steps`` and ``losses`` as the framework printed them, the progress the
launcher wrote, ``wall_s``) and one per framework comparing the resumed
runs' losses with the reference's (``max_rel_diff_same``,
``max_rel_diff_moved``, ``resumed_from``).

    python benchmarks/frameworks_gpu.py --work DIR [--framework torchtitan|megatron] \\
        [--megatron-lm DIR]     # a Megatron-LM checkout (pretrain_gpt.py), core_v0.16.1

Needs a CUDA GPU, torchtitan 0.3.0 and megatron-core 0.16.1 (contrib/frameworks.txt).
torchtitan's debug config reads a tokenizer and a dataset from its own
repository's test assets, which its wheel does not ship: this script makes
its own (a byte-level BPE tokenizer of 2,000 tokens trained on generated text,
and that text as a json dataset) and points the config at them. Megatron runs
on its mock data with its null tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS = 10
SIGNAL_AFTER = 4
GLOBAL_BATCH = 8
PLANS = {
    "A": {"global_batch": GLOBAL_BATCH, "micro_batches": 2},
    "B": {"global_batch": GLOBAL_BATCH, "micro_batches": 1},
}
RUN_TIMEOUT_S = 120
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TITAN_LOSS = re.compile(r"(?<!validate )step:\s*(\d+)\s+loss:\s*([-+0-9.eE]+)")
MEGATRON_LOSS = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?lm loss: ([-+0-9.eE]+)")

WORDS = (
    "the a cluster job node gpu scheduler plan stage pipeline tensor data parallel batch step loss "
    "checkpoint resume model layer weight gradient optimizer memory link type queue wait run time "
    "of to in on with for and or but is was are be been has have will can may"
).split()


def make_text(path: Path, docs: int = 2000, seed: int = 0) -> list[str]:
    """Generated documents (random sentences over a small vocabulary), one json per line."""
    rng = random.Random(seed)
    texts = []
    for _ in range(docs):
        sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 15))) for _ in range(rng.randint(5, 30))]
        texts.append(". ".join(s.capitalize() for s in sentences) + ".")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return texts


def make_tokenizer(folder: Path, texts: list[str], vocab: int = 2000) -> None:
    """A byte-level BPE tokenizer with Llama 3's begin/end tokens, as torchtitan loads one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[bos, eos], show_progress=False)
    tok.train_from_iterator(texts, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": bos, "eos_token": eos}))


def task_env(plan: dict, port: int) -> dict[str, str]:
    """One task of a one-node step, as srun sets it, and the plan inline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CELLSCHED_"))}
    env.update(
        {
            "SLURM_JOB_ID": "54",
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NTASKS": "1",
            "SLURM_NNODES": "1",
            "SLURM_NODEID": "0",
            "SLURM_JOB_NODELIST": "n1",
            "SLURM_STEP_NODELIST": "n1",
            "SLURM_TASKS_PER_NODE": "1",
            "SLURM_STEP_TASKS_PER_NODE": "1",
            "CELLSCHED_PLAN": json.dumps(plan),
            "CELLSCHED_MASTER_ADDR": "127.0.0.1",
            "CELLSCHED_MASTER_PORT": str(port),
            "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def progress(folder: Path) -> dict:
    try:
        return json.loads((folder / "progress.json").read_text())
    except (OSError, ValueError):
        return {}


def run(cmd: list[str], plan: dict, log: Path, cwd: Path, port: int, signal_after: int | None) -> dict:
    """One run through the launcher; with SIGNAL_AFTER, SIGUSR1 once progress.json shows that step."""
    folder = Path(plan["checkpoint_dir"])
    start = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "launch", "--", *cmd],
            env=task_env(plan, port),
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        signalled_at = None
        try:
            while proc.poll() is None and time.monotonic() - start < RUN_TIMEOUT_S:
                if signal_after is not None and signalled_at is None:
                    step = progress(folder).get("step", 0)
                    if isinstance(step, int) and step >= signal_after:
                        proc.send_signal(signal.SIGUSR1)
                        signalled_at = step
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return {"rc": proc.returncode, "signalled_at": signalled_at, "wall_s": round(time.monotonic() - start, 1)}


def losses(log: Path, pattern: re.Pattern) -> dict[int, float]:
    found = {}
    for line in log.read_text(errors="replace").splitlines():
        m = pattern.search(ANSI.sub("", line))
        if m:
            found[int(m.group(1))] = float(m.group(2))
    return found


def titan_cmd(work: Path) -> list[str]:
    return [
        sys.executable, "-m", "torchtitan.train",
        "--module", "llama3", "--config", "llama3_debugmodel",
        "--hf_assets_path", str(work / "assets" / "tokenizer"),
        "--dataloader.dataset", "c4_test", "--dataloader.dataset_path", str(work / "assets" / "text"),
        "--training.steps", str(STEPS), "--training.seq_len", "512",
        "--debug.seed", "0", "--debug.deterministic", "--debug.deterministic_warn_only",
        "--metrics.log_freq", "1", "--metrics.disable_color_printing",
        "--dump_folder", str(work / "titan-dump"),
    ]  # fmt: skip


#: runs pretrain_gpt.py without the distributed optimizer the adapter asks for (--megatron-optimizer plain)
WITHOUT_DISTRIBUTED_OPTIMIZER = (
    "import os, runpy, sys; "
    "sys.argv = [a for a in sys.argv[1:] if a != '--use-distributed-optimizer']; "
    "sys.path.insert(0, os.path.dirname(sys.argv[0])); "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def megatron_cmd(mlm: Path, optimizer: str = "distributed") -> list[str]:
    head = [sys.executable] if optimizer == "distributed" else [sys.executable, "-c", WITHOUT_DISTRIBUTED_OPTIMIZER]
    return [
        *head, str(mlm / "pretrain_gpt.py"),
        "--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4",
        "--seq-length", "512", "--max-position-embeddings", "512",
        "--train-iters", str(STEPS), "--lr", "3e-4", "--min-lr", "3e-5", "--lr-decay-style", "cosine",
        "--lr-warmup-iters", "2", "--weight-decay", "0.01", "--clip-grad", "1.0",
        "--attention-dropout", "0", "--hidden-dropout", "0", "--seed", "1234",
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1024",
        "--transformer-impl", "local", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
        "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--no-rope-fusion", "--no-persist-layer-norm",
        "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000",
    ]  # fmt: skip


def framework(
    name: str, cmd: list[str], pattern: re.Pattern, work: Path, cwd: Path, port: int, variant: str = ""
) -> None:
    base = work / (f"{name}-{variant}" if variant else name)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)

    def plan(key: str, folder: Path) -> dict:
        where = {"checkpoint_dir": str(folder), "checkpoint_every": 100}
        return {"dp": 1, "tp": 1, "pp": 1, "runtime": name, **where, **PLANS[key]}

    seen: dict[str, dict[int, float]] = {}
    runs = [("reference", "A", "ref", None), ("interrupted", "A", "moved", SIGNAL_AFTER)]
    for i, (label, key, folder, sig) in enumerate(runs):
        out = run(cmd, plan(key, base / folder), base / f"{label}.log", cwd, port + i, sig)
        seen[label] = losses(base / f"{label}.log", pattern)
        report(name, variant, label, key, out, seen[label], base / folder)
    if out["rc"] != 75:  # no checkpoint to resume from: the runs' logs say why
        print(
            json.dumps(
                {"framework": name, "variant": variant, "compare": None, "error": f"interrupted run exited {out['rc']}"}
            )
        )
        return
    # the checkpoint the interrupted run left, copied so that both resumed runs start from it
    shutil.copytree(base / "moved", base / "same")
    for i, (label, key, folder) in enumerate([("resumed-same", "A", "same"), ("resumed-moved", "B", "moved")]):
        out = run(cmd, plan(key, base / folder), base / f"{label}.log", cwd, port + 2 + i, None)
        seen[label] = losses(base / f"{label}.log", pattern)
        report(name, variant, label, key, out, seen[label], base / folder)
    ref = seen["reference"]

    def rel(label: str) -> float | None:
        # Megatron's second loss line of a run is the mean of its first two iterations (training_log
        # averages since its last line, and the first line does not reset the sum): not one step's loss
        averaged = {sorted(run)[1] for run in (seen[label], ref) if len(run) > 1} if name == "megatron" else set()
        common = [s for s in seen[label] if s in ref and s not in averaged]
        if not common:
            return None
        return max(abs(seen[label][s] - ref[s]) / abs(ref[s]) for s in common)

    first = {label: min(seen[label], default=None) for label in ("resumed-same", "resumed-moved")}
    print(
        json.dumps(
            {
                "framework": name,
                "variant": variant,
                "compare": "resumed vs reference",
                "resumed_from": first,
                "max_rel_diff_same": rel("resumed-same"),
                "max_rel_diff_moved": rel("resumed-moved"),
            }
        ),
        flush=True,
    )


def report(name: str, variant: str, label: str, key: str, out: dict, seen: dict[int, float], folder: Path) -> None:
    prog = progress(folder)
    line = {"framework": name, "variant": variant, "run": label, "plan": key, **out, "steps": sorted(seen)}
    line["losses"] = [seen[s] for s in sorted(seen)]
    line["progress"] = {k: prog.get(k) for k in ("step", "iter_time_s") if k in prog}
    line["checkpoint_files"] = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    print(json.dumps(line), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="scratch folder (made; runs' logs and checkpoints)")
    ap.add_argument("--framework", choices=("torchtitan", "megatron"), action="append")
    ap.add_argument("--megatron-lm", type=Path, help="a Megatron-LM checkout holding pretrain_gpt.py")
    ap.add_argument(
        "--megatron-optimizer",
        choices=("distributed", "plain"),
        default="distributed",
        help="plain: drop the adapter's --use-distributed-optimizer (a diagnosis, not how the adapter runs Megatron)",
    )
    ap.add_argument("--port", type=int, default=29500)
    args = ap.parse_args()
    which = args.framework or ["torchtitan", "megatron"]
    args.work.mkdir(parents=True, exist_ok=True)
    if "torchtitan" in which:
        texts = make_text(args.work / "assets" / "text" / "train.jsonl")
        make_tokenizer(args.work / "assets" / "tokenizer", texts)
        framework("torchtitan", titan_cmd(args.work), TITAN_LOSS, args.work, args.work, args.port)
    if "megatron" in which:
        if args.megatron_lm is None:
            ap.error("--megatron-lm is needed for megatron")
        mlm = args.megatron_lm.resolve()
        variant = "" if args.megatron_optimizer == "distributed" else "plain-optimizer"
        cmd = megatron_cmd(mlm, args.megatron_optimizer)
        framework("megatron", cmd, MEGATRON_LOSS, args.work, mlm, args.port + 10, variant)
    return 0


if __name__ == "__main__":
    sys.exit(main())
