"""``cellsched-launch [--print-env] [--] CMD [ARGS...]``: the srun wrapper.

Run once per task (``srun cellsched-launch -- python train.py``). It reads
the Slurm step environment and the job's plan, sets the variables
torch.distributed expects plus the plan, and replaces itself with CMD.

Plan source, first found: ``CELLSCHED_PLAN`` (inline JSON or a file path),
else the job's AdminComment (``scontrol show -o job $SLURM_JOB_ID``).
Overrides: ``CELLSCHED_MASTER_ADDR``, ``CELLSCHED_MASTER_PORT``.
When the step runs on the plan's nodes in another order than ``plan.nodes``,
the plan's per-stage and per-dp-rank fields are re-listed for the step's
order before CMD sees them (``plan_in_step_order``).
Exit status 2 with a one-line message when the step and plan disagree
(task count, job id, a node order the plan's fields cannot follow), the
plan is missing or malformed, or CMD is missing.

Environment: what torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_NAME,
ROLE_WORLD_SIZE, MASTER_ADDR/PORT, TORCHELASTIC_RUN_ID,
TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
TORCHELASTIC_USE_AGENT_STORE, TORCH_NCCL_ASYNC_ERROR_HANDLING; and for a
framework runtime OMP_NUM_THREADS=1 as torchrun sets it), so torchrun-style
scripts and Lightning (which then takes its ranks from them and starts no
processes itself) run as under torchrun; and the plan: CELLSCHED_PLAN, its
degrees, runtime, batch facts and checkpoint folder (docs/runtime-ddp.md).

Framework runtimes (plan.runtime torchtitan or megatron): the framework's own
options for the plan are appended to CMD (``launch.adapters``), and the task
that prints the framework's step lines (torchtitan: rank 0; Megatron: the
last rank) runs CMD as its child with CMD's standard output through a pipe:
passed on unchanged, and read for the steps into the plan's
``checkpoint_dir/progress.json`` (``launch.relay``); signals are passed on.

The checkpoint signals (``solver.contract.CHECKPOINT_SIGNALS``: SIGUSR1,
the controller's request, and SIGTERM, what Slurm sends a job it preempts
at the start of its GraceTime, docs/preemption.md) are blocked from the
launcher's first line on and stay blocked across the exec, so a request
that arrives while CMD starts up (imports torch, say) waits, pending,
instead of killing the task; ``launch.checkpoint.StopRequest`` or
``launch.on_checkpoint`` unblocks them once its handler is in place. A CMD
that does neither never sees them: a job that cannot checkpoint runs on
through Slurm's grace time, and Slurm's own SIGKILL (after the grace time
or KillWait) ends it, so that Slurm requeues or ends it as its PreemptMode
says. Under megatron the launcher stays CMD's parent and turns SIGUSR1 into
the SIGTERM Megatron saves on, and Megatron's exit 0 after that save into 75.

Keep this path light: stdlib and ``solver.contract`` only (no torch).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from launch import adapters, scontrol
from launch.errors import LauncherError
from launch.layout import Layout, LayoutError, in_step_order, plan_ranks
from launch.relay import Reporter, StepRelay
from launch.slurm_env import SlurmEnv, SlurmEnvError
from launch.steplog import StepLog
from solver import contract
from solver.contract.plan import JobPlan, PlanError

T = TypeVar("T")

EXIT_USAGE = 2
#: the rendezvous port's range, below Linux's default ephemeral ports (32768-60999): a
#: port in that range may be taken by any outgoing connection on the node (EADDRINUSE)
PORT_BASE, PORT_SPAN = 20000, 12768
USAGE = "usage: cellsched-launch [--print-env] [--] CMD [ARGS...]"
#: blocked from the first line on (see the module doc)
CHECKPOINT_SIGNALS = frozenset(signal.Signals[f"SIG{name}"] for name in contract.CHECKPOINT_SIGNALS)


class LaunchError(LauncherError):
    """The task cannot be launched; the message names the problem."""


def load_plan(env: Mapping[str, str], slurm: SlurmEnv) -> JobPlan:
    """The job's plan from CELLSCHED_PLAN or the job's AdminComment."""
    try:
        plan = contract.plan_from_env(env)
        if plan is None:
            try:
                comment = scontrol.job_admin_comment(slurm.job_id)
            except scontrol.ScontrolError as e:
                raise LaunchError(f"no {contract.ENV_PLAN} and the AdminComment cannot be read: {e}") from None
            if comment is None:
                raise LaunchError(f"no plan: {contract.ENV_PLAN} is unset and job {slurm.job_id} has no AdminComment")
            plan = contract.admin_comment_plan(comment)
            if plan is None:
                raise LaunchError(
                    f"no plan: {contract.ENV_PLAN} is unset and job {slurm.job_id}'s AdminComment holds none"
                )
    except PlanError as e:
        raise LaunchError(f"bad plan: {e}") from None
    if plan.job_id is not None and str(plan.job_id) != slurm.job_id:
        raise LaunchError(f"the plan is for job {plan.job_id}, this is job {slurm.job_id}")
    if plan.world_size != slurm.ntasks:
        raise LaunchError(
            f"the step has {slurm.ntasks} tasks but the plan needs pp*dp*tp = "
            f"{plan.pp}*{plan.dp}*{plan.tp} = {plan.world_size}"
        )
    return plan_in_step_order(plan, slurm)


def plan_in_step_order(plan: JobPlan, slurm: SlurmEnv) -> JobPlan:
    """PLAN re-listed for the order Slurm gave the step its nodes.

    The plan's per-stage (``stage_layers``) and per-dp-rank (``batch_shares``,
    ``state_shares``) fields follow ``plan.nodes``, the task order the
    controller expected; when the step runs on the same nodes in another
    order, each stage and dp rank takes the values of the role its tasks had
    (``launch.layout.plan_ranks``/``in_step_order``) and ``nodes`` becomes the
    step's order. Other nodes than planned: the fields stay as written (they
    change speed and memory use, never the update). LaunchError when the
    plan's roles cannot be kept in the step's order.
    """
    if not plan.nodes or tuple(plan.nodes) == slurm.nodelist:
        return plan
    try:
        ranks = plan_ranks(plan.nodes, slurm.nodelist, slurm.tasks_per_node)
        if ranks is None:
            return plan
        layout = Layout(plan.pp, plan.dp, plan.tp)
        stage_layers = _reordered(plan.stage_layers, layout, ranks, "pp", "stage_layers")
        batch_shares = _reordered(plan.batch_shares, layout, ranks, "dp", "batch_shares")
        state_shares = _reordered(plan.state_shares, layout, ranks, "dp", "state_shares")
    except LayoutError as e:
        raise LaunchError(
            f"{e} (plan nodes {','.join(plan.nodes)}, step nodes {','.join(slurm.nodelist)}, "
            f"tasks per node {','.join(map(str, slurm.tasks_per_node))})"
        ) from None
    return replace(
        plan, nodes=slurm.nodelist, stage_layers=stage_layers, batch_shares=batch_shares, state_shares=state_shares
    )


def _reordered(
    values: tuple[T, ...] | None, layout: Layout, ranks: Sequence[int], dim: str, field: str
) -> tuple[T, ...] | None:
    """`in_step_order` of a plan field that may be unset (None stays None)."""
    return None if values is None else in_step_order(values, layout, ranks, dim, field)


def master_addr(env: Mapping[str, str], slurm: SlurmEnv) -> str:
    """Address of rank 0's node.

    A single-node step rendezvous over loopback; otherwise the head node's
    NodeAddr from scontrol, since node names need not resolve.
    """
    if env.get(contract.ENV_MASTER_ADDR, "").strip():
        return env[contract.ENV_MASTER_ADDR].strip()
    if slurm.nnodes == 1:
        return "127.0.0.1"
    try:
        return scontrol.node_addr(slurm.head_node)
    except scontrol.ScontrolError as e:
        raise LaunchError(
            f"cannot find the address of node {slurm.head_node} (set {contract.ENV_MASTER_ADDR}): {e}"
        ) from None


def master_port(env: Mapping[str, str], slurm: SlurmEnv) -> int:
    """A port fixed by (cluster, job, step), so every task computes the same
    one. The cluster (``SLURM_WORKING_CLUSTER``: name, controller host and
    port) keeps two clusters on one machine, whose job ids repeat, apart."""
    text = env.get(contract.ENV_MASTER_PORT, "").strip()
    if text:
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise LaunchError(f"{contract.ENV_MASTER_PORT}={text!r} is not a port number")
        return int(text)
    key = f"{slurm.job_id}.{slurm.step_id}"
    cluster = env.get("SLURM_WORKING_CLUSTER", "")
    if cluster:
        key += f"@{cluster}"
    return PORT_BASE + zlib.crc32(key.encode()) % PORT_SPAN


def gpu_count(dev: str = "/dev") -> int:
    """NVIDIA GPUs on this node, counted from device files (no CUDA init)."""
    try:
        return sum(1 for n in os.listdir(dev) if n.startswith("nvidia") and n[6:].isdigit())
    except OSError:
        return 0


#: runtimes whose code is a torchrun-style script or framework (not cellsched's own)
TORCHRUN_STYLE = ("ddp", "torchtitan", "megatron")


def task_env(env: Mapping[str, str], slurm: SlurmEnv, plan: JobPlan) -> dict[str, str]:
    """The variables this task's command gets on top of its environment."""
    out = {
        "RANK": str(slurm.procid),
        "LOCAL_RANK": str(slurm.localid),
        "WORLD_SIZE": str(slurm.ntasks),
        "LOCAL_WORLD_SIZE": str(slurm.local_ntasks),
        "GROUP_RANK": str(slurm.nodeid),
        "MASTER_ADDR": master_addr(env, slurm),
        "MASTER_PORT": str(master_port(env, slurm)),
        contract.ENV_PLAN: plan.to_json(),
        contract.ENV_PP: str(plan.pp),
        contract.ENV_DP: str(plan.dp),
        contract.ENV_TP: str(plan.tp),
    }
    out.update(torchrun_env(env, slurm))
    out.update(plan_env(plan))
    if plan.runtime in TORCHRUN_STYLE and "OMP_NUM_THREADS" not in env and slurm.local_ntasks > 1:
        out["OMP_NUM_THREADS"] = "1"  # torchrun's default with several workers on a node
    if "CUDA_VISIBLE_DEVICES" not in env:
        gpus = gpu_count()
        if gpus:
            out["CUDA_VISIBLE_DEVICES"] = str(slurm.localid % gpus)
    return out


def torchrun_env(env: Mapping[str, str], slurm: SlurmEnv) -> dict[str, str]:
    """The rest of what torchrun's agent gives each worker
    (torch.distributed.elastic's LocalElasticAgent): one role, one group per
    node. The run id is the job's, restarts count Slurm's requeues (the
    launcher itself never restarts a worker), and workers create their own
    rendezvous store (no agent store). TORCHELASTIC_RUN_ID is also what
    Lightning looks for to take its ranks from these variables and start no
    processes of its own."""
    out = {
        "GROUP_WORLD_SIZE": str(slurm.nnodes),
        "ROLE_RANK": str(slurm.procid),
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": str(slurm.ntasks),
        "TORCHELASTIC_RUN_ID": slurm.job_id,
        "TORCHELASTIC_RESTART_COUNT": env.get("SLURM_RESTART_COUNT", "").strip() or "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
    }
    if "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env:
        out["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    return out


def plan_env(plan: JobPlan) -> dict[str, str]:
    """The plan's runtime, batch facts and checkpoint folder, each set only
    when the plan has it (the local and micro-batch sizes only for an even
    split: no batch shares, no virtual workers other than dp)."""
    out: dict[str, str] = {contract.ENV_MICRO_BATCHES: str(plan.micro_batches)}
    if plan.runtime:
        out[contract.ENV_RUNTIME] = plan.runtime
    if plan.global_batch is not None:
        out[contract.ENV_GLOBAL_BATCH] = str(plan.global_batch)
        even = plan.batch_shares is None or len(set(plan.batch_shares)) == 1
        if even and plan.virtual_workers in (None, plan.dp) and plan.global_batch % (plan.dp * plan.micro_batches) == 0:
            local = plan.global_batch // plan.dp
            out[contract.ENV_LOCAL_BATCH] = str(local)
            out[contract.ENV_MICRO_BATCH_SIZE] = str(local // plan.micro_batches)
    if plan.checkpoint_dir:
        out[contract.ENV_CHECKPOINT_DIR] = plan.checkpoint_dir
    if plan.checkpoint_every:
        out[contract.ENV_CHECKPOINT_EVERY] = str(plan.checkpoint_every)
    return out


def parse_args(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """-> (print_env, CMD)."""
    print_env, i = False, 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if a == "--print-env":
            print_env = True
        elif a in ("-h", "--help"):
            print(USAGE + "\n" + (__doc__ or "").split("\n\n", 1)[1].split("Keep this")[0].rstrip())
            raise SystemExit(0)
        elif a.startswith("-"):
            raise LaunchError(f"unknown option {a!r} ({USAGE})")
        else:
            break
        i += 1
    cmd = list(argv[i:])
    if not cmd and not print_env:
        raise LaunchError(f"no command to run ({USAGE})")
    return print_env, cmd


def main(argv: Sequence[str] | None = None) -> int:
    signal.pthread_sigmask(signal.SIG_BLOCK, CHECKPOINT_SIGNALS)  # first: see the module doc
    argv = sys.argv[1:] if argv is None else argv
    try:
        print_env, cmd = parse_args(argv)
        slurm = SlurmEnv.from_environ(os.environ)
        plan = load_plan(os.environ, slurm)
        extra = task_env(os.environ, slurm, plan)
        if cmd:
            cmd = adapters.command_for(plan, cmd)
    except (LaunchError, SlurmEnvError, adapters.AdapterError) as e:
        print(f"cellsched-launch: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if print_env:
        for k in sorted(extra):
            print(f"{k}={extra[k]}")
        if not cmd:
            return 0
        sys.stdout.flush()
    os.environ.update(extra)
    adapter = adapters.get_adapter(plan.runtime)
    steps = step_log(adapter, plan, slurm)
    try:
        if adapter is not None and (adapter.supervise or steps is not None):
            return supervise(cmd, plan.checkpoint_dir, bridge=adapter.supervise, steps=steps)
        os.execvp(cmd[0], cmd)
    except OSError as e:
        print(f"cellsched-launch: error: cannot run {cmd[0]!r}: {e.strerror}", file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 126
    return 0  # not reached


def step_log(adapter: adapters.Adapter | None, plan: JobPlan, slurm: SlurmEnv) -> StepLog | None:
    """The framework's step log when this task's output is the one to read
    for progress: its adapter declares one, this task prints the steps, and
    the plan has a checkpoint folder for progress.json."""
    log = adapter.progress if adapter is not None else None
    if log is None or not plan.checkpoint_dir or not log.printed_by(slurm.procid, slurm.ntasks):
        return None
    return log


#: what the launcher sends its child when it receives each signal: the bridge
#: (Megatron) turns the checkpoint signal into the SIGTERM Megatron saves on
BRIDGED = {signal.SIGUSR1: signal.SIGTERM, signal.SIGTERM: signal.SIGTERM, signal.SIGINT: signal.SIGINT}
PASSED = {signal.SIGUSR1: signal.SIGUSR1, signal.SIGTERM: signal.SIGTERM, signal.SIGINT: signal.SIGINT}


def supervise(cmd: list[str], checkpoint_dir: str | None, *, bridge: bool = True, steps: StepLog | None = None) -> int:
    """Run CMD as a child, SIGUSR1 still blocked in it, and pass on the
    signals the launcher receives (SIGUSR1, SIGTERM, SIGINT).

    BRIDGE (Megatron): SIGUSR1 becomes SIGTERM to CMD; CMD's exit status is
    the launcher's, except that an exit 0 after a checkpoint signal, with
    Megatron's tracker file rewritten since, is EXIT_CHECKPOINTED (Megatron
    exits 0 after its signal-triggered save). Otherwise each signal is
    passed on as it is and CMD's exit status is the launcher's.

    STEPS: CMD's standard output goes through the launcher unchanged, read
    for the framework's steps into ``<checkpoint_dir>/progress.json``
    (``launch.relay``)."""
    from launch.adapters.megatron import TRACKER_FILE

    relayed = steps if checkpoint_dir else None
    signalled: list[float] = []
    children: list[subprocess.Popen[bytes]] = []
    sends = BRIDGED if bridge else PASSED

    def forward(signum: int, frame: object) -> None:
        if not signalled and signum != signal.SIGINT:
            signalled.append(time.time())
        for child in children:
            try:
                child.send_signal(sends[signal.Signals(signum)])
            except ProcessLookupError:  # pragma: no cover - it exited meanwhile
                pass

    for s in sends:
        signal.signal(s, forward)
    if bridge:  # Megatron saves on SIGTERM, with a handler of its own: its child sees it from the start
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    sys.stdout.flush()
    # SIGUSR1 (and, but for the bridge, SIGTERM) stays blocked in it until its handler is in place
    children.append(subprocess.Popen(cmd, stdout=subprocess.PIPE if relayed else None))
    child = children[0]
    if signalled:  # a signal came while it started: pass it on now
        forward(signal.SIGTERM, None)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(CHECKPOINT_SIGNALS))
    relay = None
    if relayed is not None and checkpoint_dir and child.stdout is not None:
        pipe = os.dup(child.stdout.fileno())  # the relay's own: it closes it when the pipe ends
        child.stdout.close()
        relay = StepRelay(pipe, 1, relayed, Reporter(checkpoint_dir)).start()
    code = child.wait()
    if relay is not None:
        relay.finish()
    if code < 0:
        return 128 - code
    if bridge and code == 0 and signalled and checkpoint_dir:
        try:
            saved_at = os.stat(os.path.join(checkpoint_dir, TRACKER_FILE)).st_mtime
        except OSError:
            saved_at = 0.0
        if saved_at >= signalled[0] - 1.0:  # coarse file system clocks
            return contract.EXIT_CHECKPOINTED
    return code
