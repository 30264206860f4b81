"""The site's policy binds cellsched on a real Slurm with accounting (issue
"the site's policy binds the scheduler"): a dev cluster of its own with
DEVCLUSTER_ACCOUNTING=1 (MariaDB + slurmdbd, multifactor priority, accounts
acct-a with GrpTRES=gres/gpu=4 and acct-b, QOS gpu2) and a small shape, so
that managed jobs can hold every GPU.

* an account with GrpTRES=gres/gpu=4 never has more than 4 GPUs of managed
  jobs running while another account's jobs use the rest, and the job it
  holds back stays held by cellsched (not released for Slurm to refuse);
* a job is never placed in a partition its account may not use;
* a maintenance reservation starting in 10 minutes gets no job estimated to
  end after it;
* a pending plain sbatch GPU job of higher priority starts within 3 rounds
  while elastic managed jobs hold every GPU;
* `cellsched status --why` names the constraint in each case;
* a parent account's GrpTRES=gres/gpu=4 binds its two sub-accounts' managed
  jobs together, and an account's GrpJobs=1 never has two of them running
  (Slurm's tree and job counts, issue 57);
* `cellsched sbatch` at the user's MaxSubmitJobs exits with Slurm's words.
* with preemption = "priority", a job of a QOS of higher priority starts
  within 3 rounds while elastic managed jobs of the normal QOS hold every
  GPU: one of them checkpoints, is requeued held and placed again later.

Slurm is the oracle throughout: what runs where is read back from squeue.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from controller_support import cellsched, wait_until, write_config
from support import WORKER, DevCluster, cluster_of, wait_for

from slurm_ext.backends import get_backend
from slurm_ext.config import load
from slurm_ext.controller.round import Controller
from slurm_ext.records import ClusterSnapshot

pytestmark = pytest.mark.slurm

#: two a40 nodes and one a100 node: 8 GPUs that a few managed jobs can hold
SHAPE = "n1:a40:2,n2:a40:2,n3:a100:4"
GPUS = 8
ACCT_ENV = {
    "LAB": os.environ.get("CELLSCHED_TEST_ACCT_LAB", "/tmp/cellsched-test-acct") + (f"-gw{WORKER}" if WORKER else ""),
    "CTLD_PORT": str(int(os.environ.get("CELLSCHED_TEST_ACCT_CTLD_PORT", "12817")) + 200 * WORKER),
    "SLURMD_BASEPORT": str(int(os.environ.get("CELLSCHED_TEST_ACCT_SLURMD_BASEPORT", "12900")) + 200 * WORKER),
    "DEVCLUSTER_ACCOUNTING": "1",
    "DEVCLUSTER_SHAPE": SHAPE,
}
#: a managed job's step (one per task): reports a first step (so that the job
#: may be resized: controller.inputs.started_training) and checkpoints (exits
#: 75) on the checkpoint signal; it never ends by itself
STEP = """#!/bin/bash
d="$SLURM_SUBMIT_DIR/.cellsched/$SLURM_JOB_ID"
mkdir -p "$d"
trap 'exit 75' USR1 TERM
printf '{"iterations_done": 1, "first_step_at": %s}' "$(date +%s.%N)" >"$d/progress.json"
while :; do sleep 0.2; done
"""


@pytest.fixture(scope="module")
def acct_cluster() -> Iterator[DevCluster]:
    cluster = cluster_of(ACCT_ENV, SHAPE)
    with cluster.running("the accounting dev cluster"):
        yield cluster


def _slurm(*args: str) -> str:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, f"{args}: {proc.stderr}"
    return proc.stdout


def _cancel_all() -> None:
    jobs = _slurm("squeue", "-h", "-o", "%i").split()
    if jobs:
        subprocess.run(["scancel", "--full", *jobs], capture_output=True, timeout=20, check=False)
        wait_for(lambda: not _slurm("squeue", "-h", "-t", "PD,R,CG", "-o", "%i").split(), timeout=60, what="jobs gone")


@pytest.fixture
def site(acct_cluster: DevCluster) -> Iterator[DevCluster]:
    """The cluster; afterwards every job cancelled and the partitions and
    reservations as the dev cluster made them."""
    yield acct_cluster
    _cancel_all()
    for part in ("a40", "a100", "all"):
        _slurm("scontrol", "update", f"PartitionName={part}", "AllowAccounts=ALL")
    if "maint" in _slurm("scontrol", "-o", "show", "reservation"):
        _slurm("scontrol", "delete", "ReservationName=maint")


def _controller(tmp_path: Path) -> tuple[Controller, Path]:
    config = write_config(tmp_path / "c.toml", tmp_path / "state.sqlite", checkpoint_wait_s=20.0, checkpoint_poll_s=0.3)
    return Controller(load(config)), config


def _managed(tmp_path: Path, *opts: str, iterations: int = 100000, name: str = "job") -> str:
    """A managed job (its script in tmp_path, where its progress file goes): its id."""
    step, script = tmp_path / "step.sh", tmp_path / f"{name}.sh"
    step.write_text(STEP)
    script.write_text(f"#!/bin/bash\nsrun {step}\n")
    for f in (step, script):
        f.chmod(0o755)
    args = ["sbatch", "--parsable", "--model", "gpt-350m", "--global-batch", "64", "--iterations", str(iterations)]
    args += ["--runtime", "exact", "-o", str(tmp_path / f"{name}-%j.out"), *opts, "--", str(script)]
    # from tmp_path: the job's work dir, where the controller reads its progress file (.cellsched/<job id>)
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_ext", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    assert job_id.isdigit(), proc.stdout
    return job_id


def _gpus(snap: ClusterSnapshot, ids: set[str], account: str | None = None) -> int:
    """GPUs that Slurm says the jobs among `ids` (of `account`) hold now."""
    return sum(
        (j.gpus_per_node or 0) * len(j.nodes)
        for j in snap.jobs
        if j.job_id in ids and j.holds_resources and (account is None or j.account == account)
    )


def _why(config: Path, job_id: str) -> dict:
    return json.loads(cellsched("status", "--config", str(config), "--why", job_id, "--json").stdout)


def test_an_account_limit_binds_managed_jobs_while_the_other_account_uses_the_rest(site, tmp_path):
    backend = get_backend("cli")
    ctl, config = _controller(tmp_path)
    pinned = ("--min-gpus", "2", "--max-gpus", "2", "--no-elastic", "-t", "30")
    a = {_managed(tmp_path, "-A", "acct-a", *pinned, name=f"a{i}") for i in range(3)}
    b = {_managed(tmp_path, "-A", "acct-b", *pinned, name=f"b{i}") for i in range(2)}
    for _ in range(3):  # place, start, settle
        report = ctl.round()
        assert report.status == "ok", report.error
        released = {x["job"] for x in report.actions if x["kind"] == "place"}
        wait_until(
            lambda ids=released: all(backend.observe().job(j).state == "RUNNING" for j in ids), 60, "placed jobs to run"
        )
        snap = backend.observe()
        assert _gpus(snap, a | b, "acct-a") <= 4
    snap = backend.observe()
    assert _gpus(snap, a, "acct-a") == 4 and _gpus(snap, b, "acct-b") == GPUS - 4
    (waiting,) = [j for j in a if snap.job(j).pending]
    assert snap.job(waiting).held  # cellsched held it back: it never relied on Slurm's AssocGrpGRES
    why = _why(config, waiting)
    assert why["kind"] == "limit" and why["fields"]["name"] == "acct-a", why
    assert (why["fields"]["used"], why["fields"]["allowed"]) == ("4", "4"), why
    assert "account acct-a GrpTRES allows 4 GPUs, 4 in use" in why["text"]


def test_a_job_is_never_placed_in_a_partition_its_account_may_not_use(site, tmp_path):
    backend = get_backend("cli")
    ctl, config = _controller(tmp_path)
    only_a100 = _managed(tmp_path, "-A", "acct-a", "-p", "a100", "--max-gpus", "2", name="only")
    free = _managed(tmp_path, "-A", "acct-a", "--max-gpus", "2", name="free")
    for part in ("a100", "all"):  # acct-a may use only the a40 partition from now on
        _slurm("scontrol", "update", f"PartitionName={part}", "AllowAccounts=acct-b")
    report = ctl.round()
    assert report.status == "ok", report.error
    wait_until(lambda: backend.observe().job(free).state == "RUNNING", 60, "the job acct-a may run to start")
    snap = backend.observe()
    assert snap.job(free).partition == "a40" and set(snap.job(free).nodes) <= {"n1", "n2"}
    assert snap.job(only_a100).held and snap.job(only_a100).partition == "a100"
    why = _why(config, only_a100)
    assert why["kind"] == "partition" and why["fields"]["account"] == "acct-a", why
    assert why["fields"]["partitions"] == "a100"


def test_no_job_estimated_to_end_after_a_maintenance_reservation_starts_before_it(site, tmp_path):
    backend = get_backend("cli")
    ctl, config = _controller(tmp_path)
    _slurm(
        "scontrol", "create", "reservation", "ReservationName=maint", "StartTime=now+10minutes", "Duration=60",
        "Nodes=ALL", "Users=root", "Flags=MAINT,IGNORE_JOBS",
    )  # fmt: skip
    long = _managed(tmp_path, "-A", "acct-b", "--max-gpus", "2", iterations=10_000_000, name="long")
    short = _managed(tmp_path, "-A", "acct-b", "--max-gpus", "2", "-t", "5", iterations=20, name="short")
    report = ctl.round()
    assert report.status == "ok", report.error
    wait_until(lambda: backend.observe().job(short).state == "RUNNING", 60, "the short job to start")
    snap = backend.observe()
    assert snap.job(long).held
    why = _why(config, long)
    assert why["kind"] == "reservation" and why["fields"]["name"] == "maint", why
    assert why["fields"]["end"] > why["fields"]["start"]  # ISO 8601 UTC: the job would end after it starts


def test_a_plain_job_of_higher_priority_starts_within_3_rounds_while_elastic_jobs_hold_every_gpu(site, tmp_path):
    backend = get_backend("cli")
    ctl, config = _controller(tmp_path)
    elastic = ("-A", "acct-b", "--elastic", "--min-gpus", "2", "--max-gpus", "4")
    e1 = _managed(tmp_path, *elastic, "--gpu-types", "a40", name="e1")
    e2 = _managed(tmp_path, *elastic, "--gpu-types", "a100", name="e2")
    managed = {e1, e2}
    ctl.round()

    def hold_all() -> bool:
        snap = backend.observe()
        return _gpus(snap, managed) == GPUS and all(snap.job(j).state == "RUNNING" for j in managed)

    wait_until(hold_all, 60, "the elastic jobs to hold every GPU")
    wait_until(lambda: all((tmp_path / ".cellsched" / j / "progress.json").exists() for j in managed), 30, "steps")
    plain_sh = tmp_path / "plain.sh"
    plain_sh.write_text("#!/bin/bash\nsleep 300\n")
    plain = _slurm(
        "sbatch", "--parsable", "-A", "acct-a", "-p", "a40", "--gres=gpu:2", "-t", "10", "-o", os.devnull, str(plain_sh)
    ).strip()  # fmt: skip
    _slurm("scontrol", "update", f"JobId={plain}", "Priority=1000000")  # above every managed job's
    wait_until(lambda: backend.observe().job(plain).reason in ("Resources", "Priority"), 20, "the plain job to wait")
    # a managed job that wants the same GPUs, behind the plain job by Slurm's priority
    later = _managed(tmp_path, "-A", "acct-a", "--gpu-types", "a40", "--min-gpus", "2", "--max-gpus", "2", name="m3")
    rounds, whys = 0, []
    while backend.observe().job(plain).state != "RUNNING":
        assert rounds < 3, [(j.job_id, j.state, j.reason) for j in backend.observe().jobs]
        report = ctl.round()
        rounds += 1
        assert report.status == "ok", report.error
        whys.append(_why(config, later))
        # the round's requeue frees the GPUs; Slurm starts the plain job on its own (sched_interval=1)
        try:
            wait_for(lambda: backend.observe().job(plain).state == "RUNNING", timeout=15, what="the plain job")
        except AssertionError:
            continue
    snap = backend.observe()
    assert snap.job(plain).state == "RUNNING" and set(snap.job(plain).nodes) <= {"n1", "n2"}
    assert rounds <= 3
    # while the plain job waited, the managed job behind it was told why
    assert whys[0]["kind"] == "unmanaged", whys
    assert (whys[0]["fields"]["job"], whys[0]["fields"]["gpus"]) == (plain, "2"), whys
    assert f"plain sbatch job {plain} (Slurm priority 1e+06) claims 2 GPUs first" == whys[0]["text"]


# ---- the account tree, job counts and MaxSubmitJobs (issue 57) ----------------------------

#: accounts made for one test and deleted after it: (name, sacctmgr settings)
TREE = (
    ("lab", ("Fairshare=10", "GrpTRES=gres/gpu=4")),
    ("lab-x", ("parent=lab",)),
    ("lab-y", ("parent=lab",)),
    ("solo", ("Fairshare=10", "GrpJobs=1")),
    ("capped", ("Fairshare=10", "MaxSubmitJobs=2")),
)


@pytest.fixture
def tree(site: DevCluster) -> Iterator[DevCluster]:
    """The site with TREE's accounts (root a user of each), removed afterwards."""
    sa = ("sacctmgr", "-i")
    for name, settings in TREE:
        _slurm(*sa, "add", "account", name, "Cluster=cellsched", *settings)
    _slurm(*sa, "add", "user", "root", "Account=" + ",".join(n for n, _ in TREE))
    yield site
    _cancel_all()
    _slurm(*sa, "delete", "user", "root", "where", "account=" + ",".join(n for n, _ in TREE))
    for name, _ in reversed(TREE):
        _slurm(*sa, "delete", "account", name)


def _running(snap: ClusterSnapshot, accounts: set[str]) -> list[str]:
    """The jobs of `accounts` that Slurm says run (squeue's records)."""
    return [j.job_id for j in snap.jobs if j.account in accounts and j.state == "RUNNING"]


def test_a_parent_accounts_gpu_limit_binds_both_sub_accounts_managed_jobs_together(tree, tmp_path):
    backend = get_backend("cli")
    ctl, config = _controller(tmp_path)
    pinned = ("--min-gpus", "2", "--max-gpus", "2", "--no-elastic", "-t", "30")
    # 8 GPUs of the 4 jobs fit the cluster: only lab's GrpTRES=gres/gpu=4 stops two of them
    jobs = {_managed(tmp_path, "-A", acct, *pinned, name=f"{acct}-{i}") for acct in ("lab-x", "lab-y") for i in (0, 1)}
    for _ in range(3):
        report = ctl.round()
        assert report.status == "ok", report.error
        released = {x["job"] for x in report.actions if x["kind"] == "place"}
        wait_until(lambda ids=released: all(backend.observe().job(j).state == "RUNNING" for j in ids), 60, "start")
        assert _gpus(backend.observe(), jobs, "lab-x") + _gpus(backend.observe(), jobs, "lab-y") <= 4
    snap = backend.observe()
    assert _gpus(snap, jobs, "lab-x") + _gpus(snap, jobs, "lab-y") == 4 and len(_running(snap, {"lab-x", "lab-y"})) == 2
    waiting = [j for j in jobs if snap.job(j).pending]
    assert len(waiting) == 2 and all(snap.job(j).held for j in waiting)  # held by cellsched, not left to Slurm
    for j in waiting:
        why = _why(config, j)
        assert why["kind"] == "limit" and why["fields"]["name"] == "lab", why
        assert (why["fields"]["used"], why["fields"]["allowed"]) == ("4", "4"), why


def test_an_account_with_grpjobs_1_never_has_two_managed_jobs_running(tree, tmp_path):
    backend = get_backend("cli")
    ctl, config = _controller(tmp_path)
    jobs = {_managed(tmp_path, "-A", "solo", "--max-gpus", "2", name=f"solo-{i}") for i in range(3)}
    for _ in range(3):
        report = ctl.round()
        assert report.status == "ok", report.error
        released = {x["job"] for x in report.actions if x["kind"] == "place"}
        wait_until(lambda ids=released: all(backend.observe().job(j).state == "RUNNING" for j in ids), 60, "start")
        assert len(_running(backend.observe(), {"solo"})) <= 1
    snap = backend.observe()
    (one,) = _running(snap, {"solo"})
    assert all(snap.job(j).held for j in jobs - {one})

    # Slurm's accounting agrees: one solo job ever started (slurmdbd records a start a moment after it)
    def started() -> list[str]:
        rows = [r.split("|") for r in _slurm("sacct", "-X", "-n", "-P", "-A", "solo", "-o", "JobID,Start").splitlines()]
        return [r[0] for r in rows if len(r) == 2 and r[1] not in ("Unknown", "None", "")]

    assert wait_until(started, 60, "sacct to record the start") == [one]
    why = _why(config, sorted(jobs - {one})[0])
    assert why["kind"] == "limit" and why["fields"]["unit"] == "jobs", why
    assert why["text"] == "job limit: account solo GrpJobs allows 1 running jobs, 1 running or planned"


def test_cellsched_sbatch_at_max_submit_jobs_exits_with_slurms_words(tree, tmp_path):
    """capped has MaxSubmitJobs=2 (its user association inherits it): Slurm
    counts the two held jobs and refuses the third; cellsched sbatch says so."""
    for i in range(2):
        _managed(tmp_path, "-A", "capped", name=f"capped-{i}")
    script = tmp_path / "capped-2.sh"
    script.write_text("#!/bin/bash\nsrun true\n")
    args = ["sbatch", "--model", "gpt-350m", "--global-batch", "64", "--iterations", "10", "-A", "capped"]
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_ext", *args, "--", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
    assert proc.stderr.splitlines() == [
        "cellsched sbatch: error: AssocMaxSubmitJobLimit",
        "cellsched sbatch: error: Batch job submission failed: Job violates accounting/QOS policy "
        "(job submit limit, user's size and/or time limits)",
    ]
    assert len([j for j in _slurm("squeue", "-h", "-A", "capped", "-o", "%i").split() if j]) == 2


def test_a_job_of_an_urgent_qos_preempts_an_elastic_job_within_3_rounds(site, tmp_path):
    """QOS gpu2 gets Priority=100 (normal has 0); two elastic jobs of the
    normal QOS that never go below 4 GPUs hold all 8; a job of QOS gpu2 asks
    for 2 a40 GPUs. The round preempts the a40 job (its step exits 75 on the
    signal, the controller requeues it held), Slurm starts the urgent job on
    its GPUs; once the urgent job is gone the victim is placed again and runs."""
    backend = get_backend("cli")
    config = write_config(tmp_path / "c.toml", tmp_path / "state.sqlite", checkpoint_wait_s=20.0, checkpoint_poll_s=0.3)
    with config.open("a") as f:
        f.write('preemption = "priority"\n')  # the [solver] section is the file's last
    ctl = Controller(load(config))
    _slurm("sacctmgr", "-i", "modify", "qos", "gpu2", "set", "Priority=100")
    try:
        held = ("-A", "acct-b", "--elastic", "--min-gpus", "4", "--max-gpus", "4")
        e1 = _managed(tmp_path, *held, "--gpu-types", "a40", name="e1")
        e2 = _managed(tmp_path, *held, "--gpu-types", "a100", name="e2")
        ctl.round()
        wait_until(
            lambda: (
                _gpus(backend.observe(), {e1, e2}) == GPUS
                and all(backend.observe().job(j).state == "RUNNING" for j in (e1, e2))
            ),
            60,
            "the elastic jobs to hold every GPU",
        )
        wait_until(lambda: all((tmp_path / ".cellsched" / j / "progress.json").exists() for j in (e1, e2)), 30, "steps")
        urgent = _managed(
            tmp_path,
            "-A",
            "acct-a",
            "--qos",
            "gpu2",
            "--gpu-types",
            "a40",
            "--min-gpus",
            "2",
            "--max-gpus",
            "2",
            "--elastic",
            name="u",
        )
        rounds = 0
        while backend.observe().job(urgent).state != "RUNNING":
            assert rounds < 3, [(j.job_id, j.state, j.reason) for j in backend.observe().jobs]
            report = ctl.round()
            rounds += 1
            assert report.status == "ok", report.error
            try:
                wait_for(lambda: backend.observe().job(urgent).state == "RUNNING", timeout=15, what="the urgent job")
            except AssertionError:
                continue
        snap = backend.observe()
        assert set(snap.job(urgent).nodes) <= {"n1", "n2"} and snap.job(urgent).qos == "gpu2"
        assert snap.job(e1).pending and snap.job(e1).held  # checkpointed, requeued held by cellsched
        assert snap.job(e2).state == "RUNNING"
        why = _why(config, urgent)
        assert why["preempted_for_it"] and [p["job"] for p in why["preempted_for_it"]] == [e1], why
        assert [p["job"] for p in _why(config, e1)["preempted_by"]] == [urgent]
        _slurm("scancel", urgent)
        wait_for(lambda: not backend.observe().job(urgent).holds_resources, timeout=30, what="the urgent job gone")
        for _ in range(3):  # the victim is placed again on its GPUs
            ctl.round()
            try:
                wait_for(lambda: backend.observe().job(e1).state == "RUNNING", timeout=15, what="the victim to run")
                break
            except AssertionError:
                continue
        assert backend.observe().job(e1).state == "RUNNING"
    finally:
        _slurm("sacctmgr", "-i", "modify", "qos", "gpu2", "set", "Priority=0")
