"""Jobs on the real dev cluster through the CLI backend: the held-untyped
submit -> update -> release pattern, requeue, cancel, signal, and updates
that Slurm does not apply."""

from pathlib import Path

import pytest

from slurm_ext.backends.base import JobUpdate, SubmitRequest, UpdateNotApplied
from slurm_ext.backends.cli import CliBackend
from slurm_ext.records import expand_hostlist

pytestmark = pytest.mark.slurm


@pytest.fixture
def backend(contract_backend):
    return contract_backend


@pytest.fixture
def jobs(backend):
    """Submitted job ids; cancelled after the test whatever happens."""
    ids: list[str] = []
    yield ids
    for job_id in ids:
        backend.cancel(job_id)


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return str(path)


def test_held_untyped_job_runs_where_the_update_puts_it(tmp_path, backend, jobs, wait_job_state, wait_until):
    out = tmp_path / "where"
    body = (
        f'echo "$SLURM_JOB_NODELIST $CUDA_VISIBLE_DEVICES $SLURM_JOB_GPUS" > {out}.batch\n'
        f"srun --ntasks-per-node=1 bash -c 'echo \"$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES\" > {out}.$SLURMD_NODENAME'\n"
        f"srun bash -c 'echo $SLURMD_NODENAME > {out}.task$SLURM_PROCID'\n"
        "sleep 60\n"
    )
    req = SubmitRequest(
        script=script(tmp_path, body),
        job_name="cs-place",
        gres_per_node=1,
        nodes=1,
        hold=True,
        output=str(tmp_path / "out.txt"),
        workdir=str(tmp_path),
        comment="cellsched-test",
    )
    job_id = backend.submit(req)
    jobs.append(job_id)
    held = backend.observe().job(job_id)
    assert (held.state, held.held, held.gpus_per_node, held.gpu_type, held.partition) == (
        "PENDING",
        True,
        1,
        None,
        "all",
    )
    assert held.comment == "cellsched-test"

    plan = f'{{"cell":"a40:2x2:pp1","job":"{job_id}"}}'
    change = JobUpdate(
        partition="a40",
        features="a40",
        num_nodes=2,
        req_nodes=("n4", "n5"),
        gres_per_node=2,
        num_tasks=4,
        tasks_per_node=2,
        admin_comment=plan,
    )
    updated = backend.update(job_id, change)
    assert (updated.partition, updated.features, updated.num_nodes, updated.required_nodes) == (
        "a40",
        "a40",
        2,
        ("n4", "n5"),
    )
    assert (updated.num_tasks, updated.tasks_per_node, updated.work_dir) == (4, 2, str(tmp_path))
    assert (updated.gpus_per_node, updated.admin_comment, updated.held) == (2, plan, True)

    backend.release(job_id)
    running = wait_job_state(backend, job_id, "RUNNING", timeout=20)
    assert running.nodes == ("n4", "n5") and running.num_nodes == 2 and running.batch_host == "n4"
    snap = backend.observe()
    assert (snap.node("n4").gpus_alloc, snap.node("n5").gpus_alloc) == (2, 2)

    def written():
        files = [Path(f"{out}.{n}") for n in ("batch", "n4", "n5")]
        return all(f.exists() and f.read_text().strip() for f in files) and [f.read_text().split() for f in files]

    batch, n4, n5 = wait_until(written, timeout=20, what="the job's files")
    assert expand_hostlist(batch[0]) == ("n4", "n5") and batch[1] == "0,1" and batch[2] == "0,1"
    assert n4 == ["n4", "0,1"] and n5 == ["n5", "0,1"]

    # a plain `srun` starts one task per GPU: NumTasks/TasksPerNode stuck
    def task_hosts():
        # a file can exist before its task has written it: wait for all four written
        hosts = sorted(p.read_text().strip() for p in tmp_path.glob("where.task*"))
        return len(hosts) == 4 and all(hosts) and hosts

    tasks = wait_until(task_hosts, timeout=20, what="one task per GPU")
    assert tasks == ["n4", "n4", "n5", "n5"]


def test_requeue_then_cancel(tmp_path, backend, jobs, wait_job_state, wait_until):
    req = SubmitRequest(
        script=script(tmp_path, "sleep 120\n"),
        job_name="cs-requeue",
        gres_per_node=1,
        partition="a100",
        output="/dev/null",
    )
    job_id = backend.submit(req)
    jobs.append(job_id)
    wait_job_state(backend, job_id, "RUNNING")
    backend.requeue(job_id)
    pending = wait_job_state(backend, job_id, "PENDING", timeout=15)
    if pending.nodes:  # 24.11 shows the last node of a requeued job for a moment after it is pending again
        pending = wait_until(
            lambda: (j := backend.job(job_id)).pending and not j.nodes and j, timeout=15, what="its node cleared"
        )
    assert pending.nodes == () and not pending.held
    backend.cancel(job_id)
    done = wait_job_state(backend, job_id, "CANCELLED", timeout=10)
    assert done.finished and not done.holds_resources
    backend.cancel(job_id)  # cancelling a finished job is not an error


def test_requeue_held_and_hold_release(tmp_path, backend, jobs, wait_job_state):
    req = SubmitRequest(
        script=script(tmp_path, "sleep 120\n"),
        job_name="cs-rqhold",
        gres_per_node=1,
        partition="a100",
        output="/dev/null",
    )
    job_id = backend.submit(req)
    jobs.append(job_id)
    wait_job_state(backend, job_id, "RUNNING")
    backend.requeue(job_id, hold=True)
    pending = wait_job_state(backend, job_id, "PENDING", timeout=15)
    assert pending.held
    backend.release(job_id)
    assert not backend.observe().job(job_id).held
    backend.hold(job_id)
    again = backend.observe().job(job_id)
    assert again.held and again.reason == "JobHeldAdmin"


def test_signal_reaches_the_batch_shell(tmp_path, backend, jobs, wait_job_state, wait_until):
    flag, ready = tmp_path / "got-usr1", tmp_path / "trap-set"
    body = f"trap 'echo usr1 > {flag}' USR1\ntouch {ready}\nfor i in $(seq 600); do sleep 0.1; done\n"
    job_id = backend.submit(SubmitRequest(script=script(tmp_path, body), gres_per_node=1, output="/dev/null"))
    jobs.append(job_id)
    wait_job_state(backend, job_id, "RUNNING")
    wait_until(ready.exists, timeout=30, what="the batch shell to install its trap")
    backend.signal(job_id, "USR1")
    assert wait_until(lambda: flag.exists() and flag.read_text().strip() == "usr1", timeout=10, what="the USR1 trap")


def test_typed_gres_job_rejects_the_update(tmp_path, backend, jobs):
    """Slurm 22.05: a job submitted with a typed GPU request cannot take an
    untyped Gres: Slurm refuses the whole update; nothing may pass as applied.
    Slurm 24.11 takes it (the request becomes untyped)."""
    req = SubmitRequest(
        script=script(tmp_path, "sleep 60\n"), hold=True, output="/dev/null", extra_args=("--gres=gpu:a100:1",)
    )
    job_id = backend.submit(req)
    jobs.append(job_id)
    if (CliBackend().version() or (0, 0)) >= (24, 11):
        job = backend.update(job_id, JobUpdate(partition="a40", gres_per_node=2, admin_comment="plan"))
        assert (job.partition, job.gpus_per_node, job.gpu_type, job.admin_comment) == ("a40", 2, None, "plan")
        return
    with pytest.raises(UpdateNotApplied) as info:
        backend.update(job_id, JobUpdate(partition="a40", gres_per_node=2, admin_comment="plan"))
    err = info.value
    assert err.mismatches["gres_per_node"] == (2, 1)
    assert set(err.mismatches) == {"gres_per_node", "partition", "admin_comment"}
    assert "Invalid GRES" in err.detail
    assert err.job.gpu_type == "a100" and err.job.partition == "all"


def test_req_nodes_outside_the_partition_is_detected(tmp_path, backend, jobs):
    """Slurm accepts ReqNodeList=n1 for partition a40 (rc 0) and the job would
    pend forever once released (BadConstraints)."""
    req = SubmitRequest(script=script(tmp_path, "sleep 60\n"), gres_per_node=1, hold=True, output="/dev/null")
    job_id = backend.submit(req)
    jobs.append(job_id)
    with pytest.raises(UpdateNotApplied) as info:
        backend.update(job_id, JobUpdate(partition="a40", req_nodes=("n1",)))
    assert info.value.mismatches == {"req_nodes": ("nodes of partition a40", "n1 outside it")}
    assert info.value.detail == ""
