"""The launcher as srun runs it: a real process per task, real exec."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from srun_local import REPO, task_envs, wait_for_pid

PLAN = {"pp": 2, "dp": 2, "tp": 1, "micro_batches": 4}
SHOW_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


def launch(args, task, plan=PLAN, extra=None, path_prefix=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CELLSCHED_", "CUDA_"))}
    env.update(task)
    if plan is not None:
        env["CELLSCHED_PLAN"] = plan if isinstance(plan, str) else json.dumps(plan)
    if path_prefix:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    env.update(extra or {})
    return subprocess.run(
        [sys.executable, "-m", "launch", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )


def child_env(result):
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_sets_torch_distributed_variables_and_execs():
    tasks = task_envs(4, nnodes=2)
    seen = [
        child_env(launch(["--", sys.executable, "-c", SHOW_ENV], t, extra={"CELLSCHED_MASTER_ADDR": "10.1.2.3"}))
        for t in tasks
    ]
    assert [e["RANK"] for e in seen] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in seen] == ["0", "1", "0", "1"]
    assert {e["WORLD_SIZE"] for e in seen} == {"4"} and {e["LOCAL_WORLD_SIZE"] for e in seen} == {"2"}
    assert {e["MASTER_ADDR"] for e in seen} == {"10.1.2.3"}
    assert len({e["MASTER_PORT"] for e in seen}) == 1 and 20000 <= int(seen[0]["MASTER_PORT"]) < 32768
    assert (seen[0]["CELLSCHED_PP"], seen[0]["CELLSCHED_DP"], seen[0]["CELLSCHED_TP"]) == ("2", "2", "1")
    assert json.loads(seen[0]["CELLSCHED_PLAN"])["micro_batches"] == 4


def test_port_depends_on_job_and_step_and_can_be_overridden():
    def port(**kw):
        return child_env(launch(["--", sys.executable, "-c", SHOW_ENV], task_envs(4, **kw)[0]))["MASTER_PORT"]

    assert port(job_id="7", step_id="0") == port(job_id="7", step_id="0")
    assert len({port(job_id="7", step_id="0"), port(job_id="7", step_id="1"), port(job_id="8", step_id="0")}) == 3
    # two clusters on one machine repeat job ids: the cluster (name:host:port of its slurmctld) tells them apart
    other = task_envs(4, job_id="7", step_id="0")[0] | {"SLURM_WORKING_CLUSTER": "cellsched:localhost:19817:9728:109"}
    assert child_env(launch(["--", sys.executable, "-c", SHOW_ENV], other))["MASTER_PORT"] != port(
        job_id="7", step_id="0"
    )
    forced = launch(["--", sys.executable, "-c", SHOW_ENV], task_envs(4)[0], extra={"CELLSCHED_MASTER_PORT": "31234"})
    assert child_env(forced)["MASTER_PORT"] == "31234"


def test_single_node_step_uses_loopback():
    assert child_env(launch(["--", sys.executable, "-c", SHOW_ENV], task_envs(4)[2]))["MASTER_ADDR"] == "127.0.0.1"


def test_print_env_without_command():
    r = launch(["--print-env"], task_envs(4)[3], extra={"CELLSCHED_MASTER_PORT": "30000"})
    assert r.returncode == 0, r.stderr
    lines = dict(line.split("=", 1) for line in r.stdout.splitlines())
    assert lines["RANK"] == "3" and lines["MASTER_PORT"] == "30000" and lines["MASTER_ADDR"] == "127.0.0.1"


def test_command_arguments_pass_through_untouched():
    r = launch([sys.executable, "-c", "import sys; print(sys.argv[1:])", "--print-env", "a b", "--"], task_envs(4)[0])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['--print-env', 'a b', '--']"


def test_plan_from_file(tmp_path):
    f = tmp_path / "plan.json"
    f.write_text(json.dumps({"dp": 2}))
    e = child_env(launch(["--", sys.executable, "-c", SHOW_ENV], task_envs(2)[1], plan=str(f)))
    assert e["CELLSCHED_DP"] == "2" and e["RANK"] == "1"


@pytest.mark.parametrize(
    "args, ntasks, plan, message",
    [
        (["--", "true"], 3, PLAN, "the step has 3 tasks but the plan needs pp*dp*tp = 2*2*1 = 4"),
        (["--", "true"], 4, '{"pp": 2, "dp": 2', "bad plan: plan is not valid JSON"),
        (["--", "true"], 4, {"pp": 0, "dp": 4}, "bad plan: plan field 'pp' must be an integer >= 1"),
        (["--", "true"], 4, "/nonexistent/plan.json", "CELLSCHED_PLAN names file '/nonexistent/plan.json'"),
        (["--", "true"], 4, {**PLAN, "job_id": "99"}, "the plan is for job 99, this is job 4242"),
        (["--"], 4, PLAN, "no command to run"),
        ([], 4, PLAN, "no command to run"),
        (["--bogus", "true"], 4, PLAN, "unknown option '--bogus'"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, ntasks, plan, message):
    r = launch(args, task_envs(ntasks)[0], plan=plan)
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, r.stderr


def test_outside_slurm_is_named():
    env = {k: v for k, v in task_envs(4)[0].items() if k != "SLURM_JOB_ID"}
    r = launch(["--", "true"], env)
    assert r.returncode == 2 and "SLURM_JOB_ID is not set" in r.stderr


def test_missing_command_binary():
    r = launch(["--", "no-such-binary-xyz"], task_envs(4)[0])
    assert r.returncode == 127 and "cannot run 'no-such-binary-xyz'" in r.stderr


# A stand-in for the Slurm client (no cluster here): it prints what
# Slurm 22.05's `scontrol show -o job|node` prints, and records its argv.
FAKE_SCONTROL = r"""#!{python}
import json, sys
COMMENT = {comment!r}
open({log!r}, "a").write(json.dumps(sys.argv[1:]) + "\n")
kind, name = sys.argv[3], sys.argv[4]
if kind == "job":
    print("JobId=" + name + " JobName=train UserId=u(1000) Comment=see AdminComment=" + COMMENT +
          " Priority=1 JobState=RUNNING NodeList=gpu[3-4] NumNodes=2 Features=a100")
elif kind == "node" and name == "gpu3":
    print("NodeName=gpu3 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.13 NodeHostName=gpu3 State=ALLOCATED")
else:
    print("Node " + name + " not found", file=sys.stderr); sys.exit(1)
"""


def fake_scontrol(tmp_path, comment):
    d = tmp_path / "bin"
    d.mkdir()
    log = tmp_path / "calls.jsonl"
    (d / "scontrol").write_text(FAKE_SCONTROL.format(python=sys.executable, log=str(log), comment=comment))
    (d / "scontrol").chmod(0o755)
    return d, log


def test_plan_from_admin_comment_and_master_from_node_addr(tmp_path):
    plan = {"pp": 1, "dp": 4, "tp": 1, "cell": "a100 x 4"}  # a space inside the JSON
    comment = json.dumps({"spec": {"model": "gpt-s"}, "plan": plan})
    d, log = fake_scontrol(tmp_path, comment)
    task = {**task_envs(4, nnodes=2)[3], "SLURM_STEP_NODELIST": "gpu[3-4]", "SLURM_JOB_NODELIST": "gpu[3-4]"}
    e = child_env(launch(["--", sys.executable, "-c", SHOW_ENV], task, plan=None, path_prefix=d))
    assert e["MASTER_ADDR"] == "127.0.0.13" and e["CELLSCHED_DP"] == "4"
    assert json.loads(e["CELLSCHED_PLAN"])["cell"] == "a100 x 4"
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    assert calls == [["show", "-o", "job", "4242"], ["show", "-o", "node", "gpu3"]]


def test_empty_admin_comment_is_named(tmp_path):
    d, _ = fake_scontrol(tmp_path, "(null)")
    r = launch(["--", "true"], task_envs(4)[0], plan=None, path_prefix=d)
    assert r.returncode == 2 and "job 4242 has no AdminComment" in r.stderr


def test_admin_comment_without_a_plan_is_named(tmp_path):
    d, _ = fake_scontrol(tmp_path, json.dumps(PLAN))  # a bare plan is not the contract's {"plan": ...}
    r = launch(["--", "true"], task_envs(4)[0], plan=None, path_prefix=d)
    assert r.returncode == 2 and "job 4242's AdminComment holds none" in r.stderr


def test_unknown_head_node_is_named(tmp_path):
    d, _ = fake_scontrol(tmp_path, json.dumps({"plan": PLAN}))
    r = launch(["--", "true"], task_envs(4, nnodes=2)[0], plan=None, path_prefix=d)
    assert r.returncode == 2 and "cannot find the address of node n1" in r.stderr and "not found" in r.stderr


def test_launcher_is_fast_and_does_not_import_torch():
    task = task_envs(4)[0]
    r = launch([], task, extra={"PYTHONPROFILEIMPORTTIME": "1"})  # the launcher's own imports
    assert "solver.contract.plan" in r.stderr and "launch.cli" in r.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    heavy = {
        m for m in imported if m.split(".")[0] in ("torch", "numpy", "ortools", "torchtitan", "megatron", "lightning")
    }
    assert not heavy, f"launcher imported a heavy module: {sorted(heavy)}"
    assert "launch.adapters.torchtitan" in imported  # the adapters load (stdlib only), not the frameworks
    best = min(_timed(lambda: launch(["--", "true"], task)) for _ in range(3))
    baseline = min(_timed(lambda: subprocess.run([sys.executable, "-c", "pass"], timeout=60)) for _ in range(3))
    print(f"launcher wall time {best * 1000:.0f} ms (bare python {baseline * 1000:.0f} ms)")
    assert best - baseline < 1.0


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def test_gpu_count_reads_device_files(tmp_path):
    from launch.cli import gpu_count

    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "null"):
        (tmp_path / name).touch()
    assert gpu_count(str(tmp_path)) == 2
    assert gpu_count(str(tmp_path / "missing")) == 0


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_a_checkpoint_request_during_start_up_waits_for_the_handler(tmp_path, sig):
    """The checkpoint signals (the controller's SIGUSR1, Slurm's SIGTERM when it
    preempts the job) are blocked from the launcher's first line on and across
    the exec: sent to CMD before it installed its StopRequest, one stays
    pending (the process lives) and is seen once the handler is in place."""
    ready, go = tmp_path / "ready", tmp_path / "go"
    child = (
        "import os, signal, sys, time\n"
        "from pathlib import Path\n"
        f"blocked = {int(sig)} in signal.pthread_sigmask(signal.SIG_BLOCK, [])\n"
        f"Path({str(ready)!r}).write_text(str(os.getpid()))\n"
        f"while not Path({str(go)!r}).exists(): time.sleep(0.01)\n"  # the request arrives now, during 'start-up'
        f"pending = {int(sig)} in signal.sigpending()\n"
        "from launch.checkpoint import StopRequest\n"
        "stop = StopRequest()\n"
        "print(blocked, pending, stop._seen)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CELLSCHED_", "CUDA_"))}
    env.update(task_envs(1)[0])
    env["CELLSCHED_PLAN"] = json.dumps({"dp": 1})
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch", "--", sys.executable, "-c", child],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.kill(wait_for_pid(ready, [proc]), sig)
    go.write_text("")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.split() == ["True", "True", "True"]


def test_sets_what_torchrun_gives_its_workers():
    """The names and values torch's LocalElasticAgent gives each worker, one role
    and one group per node; the launcher never restarts (Slurm's requeues count)."""
    tasks = task_envs(3, nnodes=2, job_id="77")
    addr = {"CELLSCHED_MASTER_ADDR": "10.0.0.1"}
    seen = [child_env(launch(["--", sys.executable, "-c", SHOW_ENV], t, plan={"dp": 3}, extra=addr)) for t in tasks]
    assert [e["GROUP_RANK"] for e in seen] == ["0", "0", "1"]
    assert [e["LOCAL_WORLD_SIZE"] for e in seen] == ["2", "2", "1"]
    assert [e["ROLE_RANK"] for e in seen] == ["0", "1", "2"]
    for e in seen:
        assert (e["GROUP_WORLD_SIZE"], e["ROLE_WORLD_SIZE"], e["ROLE_NAME"]) == ("2", "3", "default")
        assert (e["TORCHELASTIC_RUN_ID"], e["TORCHELASTIC_RESTART_COUNT"], e["TORCHELASTIC_MAX_RESTARTS"]) == (
            "77",
            "0",
            "0",
        )
        assert e["TORCHELASTIC_USE_AGENT_STORE"] == "False" and e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    requeued = launch(
        ["--", sys.executable, "-c", SHOW_ENV], tasks[0], plan={"dp": 3}, extra={**addr, "SLURM_RESTART_COUNT": "2"}
    )
    assert child_env(requeued)["TORCHELASTIC_RESTART_COUNT"] == "2"


def test_omp_threads_one_per_worker_for_framework_runtimes_as_torchrun_does(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def omp(plan, task, extra=None):
        env = child_env(launch(["--", sys.executable, "-c", SHOW_ENV], task, plan=plan, extra=extra))
        return env.get("OMP_NUM_THREADS")

    two_per_node = task_envs(2)[0]
    assert omp({"dp": 2, "runtime": "ddp"}, two_per_node) == "1"
    assert omp({"dp": 2, "runtime": "ddp"}, two_per_node, {"OMP_NUM_THREADS": "4"}) == "4"
    assert omp({"dp": 2, "runtime": "exact"}, two_per_node) is None
    assert omp({"dp": 1, "runtime": "ddp"}, task_envs(1)[0]) is None


def test_plan_batch_facts_and_checkpoint_dir_are_exported():
    plan = {
        "dp": 2,
        "micro_batches": 4,
        "global_batch": 64,
        "runtime": "ddp",
        "checkpoint_dir": "/ck",
        "checkpoint_every": 9,
    }
    e = child_env(launch(["--", sys.executable, "-c", SHOW_ENV], task_envs(2)[1], plan=plan))
    # 64 samples over 2 ranks: 32 each, in 4 micro-batches of 8
    assert e["CELLSCHED_GLOBAL_BATCH"] == "64" and e["CELLSCHED_LOCAL_BATCH"] == "32"
    assert e["CELLSCHED_MICRO_BATCHES"] == "4" and e["CELLSCHED_MICRO_BATCH_SIZE"] == "8"
    assert (e["CELLSCHED_RUNTIME"], e["CELLSCHED_CHECKPOINT_DIR"], e["CELLSCHED_CHECKPOINT_EVERY"]) == (
        "ddp",
        "/ck",
        "9",
    )
    bare = child_env(launch(["--", sys.executable, "-c", SHOW_ENV], task_envs(2)[1], plan={"dp": 2}))
    assert not {
        "CELLSCHED_GLOBAL_BATCH",
        "CELLSCHED_LOCAL_BATCH",
        "CELLSCHED_RUNTIME",
        "CELLSCHED_CHECKPOINT_DIR",
    } & set(bare)
    shares = {"dp": 2, "global_batch": 60, "batch_shares": [1, 2]}  # uneven: no one local batch to name
    e = child_env(launch(["--", sys.executable, "-c", SHOW_ENV], task_envs(2)[1], plan=shares))
    assert e["CELLSCHED_GLOBAL_BATCH"] == "60" and "CELLSCHED_LOCAL_BATCH" not in e


def test_framework_runtime_gets_its_options_appended():
    plan = {"pp": 1, "dp": 1, "tp": 2, "global_batch": 8, "runtime": "megatron"}
    r = launch(
        ["--", sys.executable, "-c", "import sys; print(sys.argv[1:])", "--num-layers", "2"], task_envs(2)[0], plan
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(
        ["--num-layers", "2", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1"]
        + ["--micro-batch-size", "8", "--global-batch-size", "8", "--use-distributed-optimizer"]
    )
    clash = launch(["--", "python", "x.py", "--tensor-model-parallel-size", "1"], task_envs(2)[0], plan)
    assert clash.returncode == 2
    assert clash.stderr.startswith("cellsched-launch: error: the command sets --tensor-model-parallel-size itself")


# Megatron's side of the bridge as its training code has it (megatron/training: with
# --exit-signal-handler, SIGTERM -> save at the iteration's end, rewrite the tracker
# file, exit 0); it is not on PyPI, so this stand-in keeps just that contract.
MEGATRON_LIKE = """
import os, signal, sys, time
from pathlib import Path
args = sys.argv[1:]
save = args[args.index("--save") + 1] if "--save" in args else None
got = []
signal.signal(signal.SIGTERM, lambda *a: got.append(a[0]))
Path(os.environ["READY"]).write_text(str(os.getpid()))
deadline = time.monotonic() + 60
while not got and time.monotonic() < deadline and not os.environ.get("FINISH"):
    time.sleep(0.01)
blocked = signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, [])
if got and save:
    Path(save).mkdir(parents=True, exist_ok=True)
    Path(save, "latest_checkpointed_iteration.txt").write_text("7")
print(blocked, got)
sys.exit(0)
"""


def _megatron_like(tmp_path, extra=None, save=True):
    plan = {"dp": 1, "runtime": "megatron", **({"checkpoint_dir": str(tmp_path / "ck")} if save else {})}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CELLSCHED_", "CUDA_"))}
    env.update(task_envs(1)[0])
    env.update({"CELLSCHED_PLAN": json.dumps(plan), "PYTHONPATH": str(REPO), "READY": str(tmp_path / "ready")})
    env.update(extra or {})
    return subprocess.Popen(
        [sys.executable, "-m", "launch", "--", sys.executable, "-c", MEGATRON_LIKE],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_ready(tmp_path, proc):
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (tmp_path / "ready").exists(), proc.communicate()[1]


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_megatron_bridge_turns_the_checkpoint_signal_into_sigterm_and_its_exit_into_75(tmp_path, sig):
    proc = _megatron_like(tmp_path)
    _wait_ready(tmp_path, proc)
    proc.send_signal(sig)  # to the launcher, the child's parent, as srun's signal reaches the task
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert out.split() == ["True", f"[{int(signal.SIGTERM)}]"]  # SIGUSR1 stayed blocked in Megatron


def test_megatron_bridge_passes_other_exits_through(tmp_path):
    done = _megatron_like(tmp_path, {"FINISH": "1"})
    assert done.wait(timeout=60) == 0
    (tmp_path / "ready").unlink()
    unsaved = _megatron_like(tmp_path, save=False)  # no checkpoint_dir: Megatron has nothing to save into
    _wait_ready(tmp_path, unsaved)
    unsaved.send_signal(signal.SIGUSR1)
    assert unsaved.wait(timeout=60) == 0
