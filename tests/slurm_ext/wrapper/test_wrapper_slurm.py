"""`cellsched sbatch` on a real Slurm dev cluster, without and with
slurm_ext/admin/job_submit.lua, as root and as two ordinary users."""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile
import time

import pytest

from slurm_ext.backends.base import JobUpdate
from solver.contract.jobspec import ADMIN_MARKER, JobSpec, spec_of_job

pytestmark = pytest.mark.slurm

HELLO_SPEC = JobSpec(model="gpt-tiny", global_batch=8, iterations=10)
EVIL = ["; rm -rf / #", "$(touch /tmp/cellsched-pwned)", "`touch /tmp/cellsched-pwned`", "a\nb", "' \" \\ ${HOME} %j"]


def hello() -> str:
    return str(pathlib.Path(__file__).resolve().parents[3] / "contrib" / "examples" / "hello_job.sh")


def submitted_id(proc) -> str:
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    first, _, job_id = proc.stdout.strip().rpartition(" ")
    assert first == "Submitted batch job" and job_id.isdigit(), proc.stdout
    return job_id


def wait_state(cluster, job_id: str, states: set[str], timeout: float = 60) -> object:
    deadline = time.monotonic() + timeout
    while True:
        job = cluster.backend.job(job_id)
        if job.state in states:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} is {job.state} ({job.reason}), not {states}")
        time.sleep(0.3)


#: Slurm 22.05's refusals: scontrol on another user's job, and a permission check that failed
NOT_OWNER = "Invalid user id for job"
DENIED = "Access/permission denied"


def denied(proc, why: str | tuple[str, ...] = DENIED) -> None:
    """Refused by Slurm for `why` (one of them, given several; not by any other failure)."""
    whys = (why,) if isinstance(why, str) else why
    assert proc.returncode != 0 and any(w in proc.stderr for w in whys), (proc.args, proc.stdout, proc.stderr)


def evil_model_file(tmp: pathlib.Path) -> pathlib.Path:
    """A valid model spec whose name is full of shell metacharacters."""
    path = tmp / "evil.json"
    path.write_text(
        json.dumps(
            {
                "name": "x; rm -rf / $(reboot) `id` | cat > /etc/passwd\nline2",
                "family": "gpt",
                "layers": 2,
                "hidden": 64,
                "heads": 4,
                "seq_len": 32,
                "vocab": 256,
            }
        )
    )
    path.chmod(0o644)
    tmp.chmod(0o755)
    return path


# ---- without the plugin ----------------------------------------------------------------


def test_valid_submission_is_held_tagged_and_untyped(plain_cluster):
    job_id = submitted_id(plain_cluster.run(["cellsched", "sbatch", hello()]))
    job = plain_cluster.backend.job(job_id)
    assert job.state == "PENDING" and job.held and job.reason == "JobHeldUser"
    assert job.comment == HELLO_SPEC.to_comment()
    assert job.gpus_per_node == 1 and job.gpu_type is None
    assert job.name == "hello"


def test_parsable_prints_the_job_id(plain_cluster):
    proc = plain_cluster.run(["cellsched", "sbatch", "--parsable", "--gpu-types", "v100", "--min-gpus", "8", hello()])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    job_id = proc.stdout.strip()
    assert job_id.isdigit() and proc.stdout == job_id + "\n"
    job = plain_cluster.backend.job(job_id)
    assert job.held and job.gpus_per_node == 8 and job.gpu_type is None and job.features == "v100"


MALFORMED = [
    ["--global-batch", "-1"],
    ["--model", "gpt-1.3"],
    ["--min-gpus", "9", "--max-gpus", "2"],
    ["--gpu-types", "h100"],
    ["--min-gpus", "64"],
    ["--model", "gpt-13b", "--gpu-types", "a10"],
    ["--gres=gpu:a100:2"],
    ["-N", "2"],
    ["--job-name", "$(reboot)"],
    ["--comment", "cellsched/v1 {}"],
    ["--virtual-workers", "3"],
    ["--iterations", "\u0662"],
]


def test_malformed_input_never_reaches_slurm(plain_cluster, tmp_path):
    before = plain_cluster.job_ids()
    for extra in MALFORMED:
        proc = plain_cluster.run(["cellsched", "sbatch", *extra, hello()])
        assert proc.returncode == 2 and proc.stdout == "", (extra, proc.stdout, proc.stderr)
        assert proc.stderr.startswith("cellsched sbatch: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    for bad_script in ["/nonexistent.sh", "/tmp", "/dev/null"]:
        proc = plain_cluster.run(["cellsched", "sbatch", bad_script])
        assert proc.returncode == 2 and proc.stderr.startswith("cellsched sbatch: error: script: "), proc.stderr
    assert plain_cluster.job_ids() == before


def test_metacharacters_are_stored_literally_and_run_harmlessly(plain_cluster, tmp_path):
    marker = pathlib.Path("/tmp/cellsched-pwned")
    marker.unlink(missing_ok=True)
    model = evil_model_file(tmp_path)
    out = tmp_path / "out-%j.txt"
    proc = plain_cluster.run(["cellsched", "sbatch", "--model", str(model), "-o", str(out), hello(), *EVIL])
    job_id = submitted_id(proc)
    job = plain_cluster.backend.job(job_id)
    spec = JobSpec.from_comment(job.comment)
    assert job.comment == spec.to_comment()  # read back exactly
    assert spec.model_def["name"] == "x; rm -rf / $(reboot) `id` | cat > /etc/passwd\nline2"
    # release it as the controller would, and let it run: the arguments arrive literally
    assert plain_cluster.run(["scontrol", "release", job_id]).returncode == 0
    done = wait_state(plain_cluster, job_id, {"COMPLETED", "FAILED", "CANCELLED"})
    assert done.state == "COMPLETED"
    text = pathlib.Path(str(out).replace("%j", job_id)).read_text()
    printed = text.split(": 5 arguments\n", 1)[1]
    assert printed == "".join(f"  {a}\n" for a in EVIL)
    assert not marker.exists()


def test_users_cannot_touch_each_others_jobs_without_the_plugin(plain_cluster, users):
    proc = plain_cluster.run(["cellsched", "sbatch", "--parsable", hello()], user="cs_alice", users=users)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    for attempt, why in (
        (["scontrol", "release", job_id], NOT_OWNER),
        (["scontrol", "update", f"JobId={job_id}", "Comment=x"], NOT_OWNER),
        (["scancel", job_id], f"Kill job error on job id {job_id}: {DENIED}"),
    ):
        denied(plain_cluster.run(attempt, user="cs_bob"), why)
    job = plain_cluster.backend.job(job_id)
    assert job.user == "cs_alice" and job.held and job.state == "PENDING" and job.comment == HELLO_SPEC.to_comment()
    # without the plugin the hold is the user's own: alice can release her job (documented limitation)
    assert (
        plain_cluster.run(["scontrol", "update", f"JobId={job_id}", "Comment=changed"], user="cs_alice").returncode == 0
    )
    assert plain_cluster.run(["scontrol", "release", job_id], user="cs_alice").returncode == 0
    assert not plain_cluster.backend.job(job_id).held
    plain_cluster.run(["scancel", job_id])


# ---- with slurm_ext/admin/job_submit.lua ----------------------------------------------------------


def test_plugin_moves_the_spec_to_admin_comment_and_holds(lua_cluster, users):
    proc = lua_cluster.run(["cellsched", "sbatch", hello()], user="cs_alice", users=users)
    job_id = submitted_id(proc)
    job = lua_cluster.backend.job(job_id)
    assert job.user == "cs_alice" and job.state == "PENDING" and job.held
    assert job.comment == ADMIN_MARKER
    assert job.admin_comment == '{"spec":' + HELLO_SPEC.to_json() + "}"
    assert spec_of_job(job.comment, job.admin_comment) == HELLO_SPEC
    assert job.gpus_per_node == 1 and job.gpu_type is None


def test_plugin_stores_metacharacters_literally(lua_cluster, tmp_path):
    model = evil_model_file(tmp_path)
    job_id = submitted_id(lua_cluster.run(["cellsched", "sbatch", "--model", str(model), hello(), *EVIL]))
    job = lua_cluster.backend.job(job_id)
    spec = spec_of_job(job.comment, job.admin_comment)
    assert job.admin_comment == '{"spec":' + spec.to_json() + "}"
    assert spec.model_def["name"].endswith("| cat > /etc/passwd\nline2")


def test_with_the_plugin_only_admins_release_or_change_a_managed_job(lua_cluster, users):
    job_id = lua_cluster.run(
        ["cellsched", "sbatch", "--parsable", hello()], user="cs_alice", users=users
    ).stdout.strip()
    assert job_id.isdigit()
    before = lua_cluster.backend.job(job_id)
    alice_tries = [
        ["scontrol", "release", job_id],
        ["scontrol", "update", f"JobId={job_id}", "Comment=cellsched/v1 {}"],
        ["scontrol", "update", f"JobId={job_id}", "Features=a100"],
        ["scontrol", "update", f"JobId={job_id}", "NumNodes=2-2"],
        ["scontrol", "update", f"JobId={job_id}", "Gres=gpu:2"],
        ["scontrol", "hold", job_id],
    ]
    log = lua_cluster.ctld_log()
    for attempt in alice_tries:
        denied(lua_cluster.run(attempt, user="cs_alice"))
    # each refusal is the plugin's (slurmctld logs its reason; 22.05 shows the user only the error code)
    refusals = lua_cluster.ctld_log()[len(log) :].count(f"cellsched: job {job_id} is scheduled by cellsched: ")
    assert refusals == len(alice_tries), lua_cluster.ctld_log()[len(log) :]
    bob_tries = [
        ["scontrol", "release", job_id],
        ["scontrol", "update", f"JobId={job_id}", "Comment=x"],
        ["scancel", job_id],
    ]
    for attempt in bob_tries:  # the plugin refuses (22.05), or Slurm's owner check comes first (24.11)
        denied(lua_cluster.run(attempt, user="cs_bob"), (DENIED, NOT_OWNER))
    # bob's own cellsched cannot reach alice's job either: the wrapper only ever submits new jobs
    proc = lua_cluster.run(["cellsched", "sbatch", "--comment", job_id, hello()], user="cs_bob", users=users)
    assert proc.returncode == 2
    after = lua_cluster.backend.job(job_id)
    assert (after.state, after.held, after.comment, after.admin_comment, after.features, after.num_nodes) == (
        before.state,
        True,
        ADMIN_MARKER,
        before.admin_comment,
        before.features,
        before.num_nodes,
    )
    # a change that is not the scheduler's is still the owner's to make
    assert lua_cluster.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=30"], user="cs_alice").returncode == 0
    # the controller (root) may do everything, through its backend (which tries again what
    # Slurm 24.11 refuses only for now: docs/slurm-support.md)
    plan = json.dumps(
        {"spec": json.loads(HELLO_SPEC.to_json()), "plan": {"cell": "a100:1x1:pp1"}}, separators=(",", ":")
    )
    lua_cluster.backend.update(job_id, JobUpdate(admin_comment=plan, features="a100", partition="a100"))
    assert lua_cluster.run(["scontrol", "release", job_id]).returncode == 0
    job = lua_cluster.backend.job(job_id)
    assert job.admin_comment == plan and not job.held
    assert lua_cluster.run(["scancel", job_id], user="cs_alice").returncode == 0  # the owner may still cancel


def test_plugin_refuses_a_malformed_tag_and_holds_a_bare_tagged_job(lua_cluster, users):
    before = lua_cluster.job_ids()
    bad = lua_cluster.run(["sbatch", "--comment=cellsched/v1 garbage", hello()], user="cs_alice", users=users)
    assert bad.returncode != 0 and "malformed cellsched spec" in bad.stderr
    assert lua_cluster.job_ids() == before
    raw = lua_cluster.run(["sbatch", "--parsable", f"--comment={HELLO_SPEC.to_comment()}", hello()], user="cs_alice")
    job = lua_cluster.backend.job(raw.stdout.strip())
    assert job.held and job.comment == ADMIN_MARKER and spec_of_job(job.comment, job.admin_comment) == HELLO_SPEC
    # and an unmanaged job cannot be made managed by its owner
    plain = lua_cluster.run(["sbatch", "--parsable", "-H", hello()], user="cs_alice").stdout.strip()
    denied(
        lua_cluster.run(["scontrol", "update", f"JobId={plain}", f"Comment={HELLO_SPEC.to_comment()}"], user="cs_alice")
    )
    assert lua_cluster.run(["scontrol", "update", f"JobId={plain}", "Comment=fine"], user="cs_alice").returncode == 0


@pytest.fixture
def shared_tmp():
    """A temporary directory other users can read (pytest's own is 0700)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="cellsched-users-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_users_read_only_their_own_jobs_through_cellsched(plain_cluster, users, shared_tmp):
    """`cellsched status` run by cs_alice shows her job and not cs_bob's (nor his
    plan); `cellsched plan`, which shows everyone's placements, is refused."""
    from slurm_ext.state import JobStatus, StateStore

    spec = HELLO_SPEC.to_json()
    tmp_path = shared_tmp
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    db = state_dir / "state.sqlite"
    with StateStore(db) as st:
        for job_id, user in (("41", "cs_alice"), ("42", "cs_bob")):
            st.accept_spec(job_id, user, spec, "comment", 1.0)
        st.save_statuses(
            [
                JobStatus("41", "cs_alice", "PENDING", "held", "waiting", 900.0, None, None, None, None, None, False),
                JobStatus(
                    "42", "cs_bob", "PENDING", "held", "secret-of-bob", 900.0, None, None, None, None, None, False
                ),
            ],
            2.0,
        )
    for p in (state_dir, *state_dir.iterdir()):
        p.chmod(0o755 if p.is_dir() else 0o644)
    config = tmp_path / "c.toml"
    config.write_text(f'[controller]\nstate_path = "{db}"\n')
    config.chmod(0o644)

    mine = plain_cluster.run(["cellsched", "status", "--json", "--config", str(config)], user="cs_alice", users=users)
    assert mine.returncode == 0, mine.stderr
    assert [r["job_id"] for r in json.loads(mine.stdout)["jobs"]] == ["41"] and "secret-of-bob" not in mine.stdout
    everyone = plain_cluster.run(["cellsched", "status", "--json", "--config", str(config)])  # root sees all
    assert sorted(r["job_id"] for r in json.loads(everyone.stdout)["jobs"]) == ["41", "42"]
    refused = plain_cluster.run(["cellsched", "plan", "--config", str(config)], user="cs_alice", users=users)
    assert refused.returncode == 2 and "for root and the SlurmUser" in refused.stderr
