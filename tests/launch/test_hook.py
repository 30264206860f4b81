"""launch.on_checkpoint: the hook file, and save-and-exit-75 on the signal, in real processes."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from srun_local import REPO, start, task_envs, wait, wait_for_pid
from support import free_port

from launch.hook import on_checkpoint, write_hook_file
from solver import contract


def test_hook_file_is_written_by_rank_0_with_the_job_id(tmp_path, monkeypatch):
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # not this test process's handlers
    monkeypatch.setattr(signal, "pthread_sigmask", lambda *a: set())
    monkeypatch.setenv("SLURM_JOB_ID", "321")
    monkeypatch.setenv("RANK", "1")
    on_checkpoint(lambda: None, checkpoint_dir=str(tmp_path / "r1"))
    assert not (tmp_path / "r1").exists()
    monkeypatch.setenv("RANK", "0")
    before = time.time()
    on_checkpoint(lambda: None, checkpoint_dir=str(tmp_path / "r0"))
    doc = json.loads((tmp_path / "r0" / contract.HOOK_FILE).read_text())
    assert doc["job_id"] == "321" and before <= doc["time"] <= time.time()
    assert [p.name for p in (tmp_path / "r0").iterdir()] == [contract.HOOK_FILE]  # no temporary left


def test_checkpoint_dir_defaults_to_the_launchers_then_the_plans(tmp_path, monkeypatch):
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(signal, "pthread_sigmask", lambda *a: set())
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv(contract.ENV_PLAN, json.dumps({"dp": 1, "checkpoint_dir": str(tmp_path / "plan")}))
    assert on_checkpoint(lambda: None).checkpoint_dir == str(tmp_path / "plan")
    monkeypatch.setenv(contract.ENV_CHECKPOINT_DIR, str(tmp_path / "env"))
    assert on_checkpoint(lambda: None).checkpoint_dir == str(tmp_path / "env")
    assert (tmp_path / "plan" / contract.HOOK_FILE).exists() and (tmp_path / "env" / contract.HOOK_FILE).exists()


def test_without_a_checkpoint_dir_the_script_is_told_it_stays_put(monkeypatch, capsys):
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(signal, "pthread_sigmask", lambda *a: set())
    for k in (contract.ENV_PLAN, contract.ENV_CHECKPOINT_DIR):
        monkeypatch.delenv(k, raising=False)
    on_checkpoint(lambda: None)
    assert "no checkpoint_dir, so the controller cannot learn that it is movable" in capsys.readouterr().err


def test_save_fn_must_be_callable():
    with pytest.raises(TypeError, match="on_checkpoint needs a function to call, got str"):
        on_checkpoint("save.pt")  # type: ignore[arg-type]


def test_hook_file_replaces_an_older_one(tmp_path):
    write_hook_file(tmp_path, "1", now=1.0)
    write_hook_file(tmp_path, "2", now=2.0)
    assert json.loads((tmp_path / contract.HOOK_FILE).read_text()) == {"job_id": "2", "time": 2.0}


# A script that only registers the hook (no poll): save_fn runs from the handler.
ONE_CALL = """
import os, sys, time
from pathlib import Path
import launch
state = {"step": 0}
launch.on_checkpoint(lambda: Path(sys.argv[1]).write_text(str(state["step"])))
while True:
    state["step"] += 1
    if state["step"] == 1:  # ready once a step has run: the signal cannot come before it
        Path(sys.argv[2]).write_text(str(os.getpid()))
    time.sleep(0.001)
"""

# A DDP-style loop that polls the hook at each step boundary (gloo, all ranks agree).
POLLING = """
import os, sys, time
from pathlib import Path
import torch, torch.distributed as dist
import launch
dist.init_process_group("gloo")
rank = dist.get_rank()
step = 0
hook = launch.on_checkpoint(lambda: Path(sys.argv[1], f"rank{rank}").write_text(str(step)), poll=True)
Path(sys.argv[2], f"ready{rank}").write_text(str(os.getpid()))
while step < 100000:
    step += 1
    t = torch.ones(1)
    dist.all_reduce(t)
    hook.step()
    time.sleep(0.002)
"""


def test_one_call_hook_saves_from_the_handler_and_exits_75(tmp_path):
    ck = tmp_path / "ck"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CELLSCHED_"))}
    env.update(task_envs(1, job_id="99")[0])
    env.update({"CELLSCHED_PLAN": json.dumps({"dp": 1, "checkpoint_dir": str(ck)}), "PYTHONPATH": str(REPO)})
    saved, ready = tmp_path / "saved", tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch", "--", sys.executable, "-c", ONE_CALL, str(saved), str(ready)],
        env=env,
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    pid = wait_for_pid(ready, [proc])
    assert json.loads((ck / contract.HOOK_FILE).read_text())["job_id"] == "99"
    os.kill(pid, signal.SIGUSR1)
    assert proc.wait(timeout=60) == contract.EXIT_CHECKPOINTED, proc.stderr.read()
    assert int(saved.read_text()) >= 1


def test_polling_hook_saves_the_same_step_on_every_rank_and_exits_75(tmp_path):
    """Only rank 1 is signalled: the all-reduce of the flag stops rank 0 at the same step."""
    out = tmp_path / "out"
    out.mkdir()
    procs = start(
        [sys.executable, "-c", POLLING, str(out), str(out)],
        2,
        env={"CELLSCHED_PLAN": json.dumps({"dp": 2}), "CELLSCHED_MASTER_PORT": str(free_port())},
    )
    pids = [wait_for_pid(out / f"ready{r}", procs) for r in range(2)]
    os.kill(pids[1], signal.SIGUSR1)
    tasks = wait(procs, timeout=60)
    assert [t.returncode for t in tasks] == [75, 75], tasks[0].stderr[-2000:] + tasks[1].stderr[-2000:]
    steps = [int((out / f"rank{r}").read_text()) for r in range(2)]
    assert steps[0] == steps[1] >= 1


def test_with_poll_a_signal_before_the_first_poll_waits_for_it(tmp_path):
    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "import launch\n"
        f"hook = launch.on_checkpoint(lambda: Path({str(tmp_path / 'saved')!r}).write_text('x'), poll=True)\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        f"print(Path({str(tmp_path / 'saved')!r}).exists(), flush=True)\n"
        "hook.step()\n"
        "print('not reached')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CELLSCHED_"))}
    r = subprocess.run(
        [sys.executable, "-c", code], env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == contract.EXIT_CHECKPOINTED, r.stderr
    assert r.stdout.split() == ["False"] and (tmp_path / "saved").read_text() == "x"
