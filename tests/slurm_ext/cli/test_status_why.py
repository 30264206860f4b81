"""`cellsched status --why JOB` names the binding constraint with its numbers,
from the reason the round stored (the forms of solver.site's reason_*)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from slurm_ext.cli import main, status_cmd
from slurm_ext.state import HistoryEvent, JobStatus, StateStore
from solver.contract.jobspec import JobSpec
from solver.site import (
    GpuLimit,
    LimitKind,
    LimitScope,
    reason_fairshare,
    reason_governor,
    reason_limit,
    reason_no_cell,
    reason_outbid,
    reason_partition,
    reason_preempted,
    reason_preempting,
    reason_reservation,
    reason_stays,
    reason_unmanaged,
)

SPEC = JobSpec(model="gpt-350m", global_batch=64, iterations=100).to_json()
#: job -> (the reason a round stored, what `--why` must say of it)
CASES = {
    "21": (
        reason_limit(GpuLimit(LimitScope.ACCOUNT, "acct-a", LimitKind.GRP, 4), 4),
        "GPU limit: account acct-a GrpTRES allows 4 GPUs, 4 in use or planned",
    ),
    "22": (
        reason_limit(GpuLimit(LimitScope.QOS_PER_USER, "gpu2", LimitKind.PER_USER, 2, "a100"), 2, "alice"),
        "GPU limit: QOS gpu2/alice per user MaxTRESPerUser allows 2 a100 GPUs, 2 in use or planned",
    ),
    "23": (
        reason_fairshare("acct-b", 0.8, 0.4),
        "fair share: account acct-b has used 0.80 of the cluster against a share of 0.40",
    ),
    "24": (
        reason_reservation("maint", 1795777200.0, 1795780000.0),
        "reservation maint takes the nodes from 2026-11-27T11:00:00Z; the job would end about 2026-11-27T11:46:40Z",
    ),
    "25": (
        reason_partition("acct-a", "normal", ("a40",)),
        "partition access: account acct-a (QOS normal) may use none of a40",
    ),
    "26": (reason_unmanaged("77", 10000.0, 4, None), "plain sbatch job 77 (Slurm priority 10000) claims 4 GPUs first"),
    "27": (reason_no_cell("no free GPUs of its types"), "no cell fits: no free GPUs of its types"),
    "28": (
        reason_outbid((("31", 1.25), ("32", 0.8))),
        "the GPUs are worth more to other jobs: job 31 (value 1.25), job 32 (value 0.80)",
    ),
    "29": (
        reason_limit(GpuLimit(LimitScope.USER, "acct-b/bob", LimitKind.GRP, 6), 6) + "; progress file: too big",
        "GPU limit: user association acct-b/bob (account/user) GrpTRES allows 6 GPUs, 6 in use or planned",
    ),
    "30": ("waiting: not chosen", "waiting: not chosen"),
    "31": (
        reason_preempted("40", "qos urgent priority 100 > qos normal priority 0"),
        "preempted to zero GPUs for job 40, which outranks it: qos urgent priority 100 > qos normal priority 0",
    ),
    "32": (
        reason_preempting(("41", "42")) + "; released this round",
        "takes the GPUs of jobs of lower rank, preempted to zero: 41, 42",
    ),
    "33": (
        reason_governor(120.4, 600.0),
        "the restart governor keeps it where it runs: its run is 120 s old, min_run_s is 600 s",
    ),
    "34": (
        reason_stays("a40:1x2:pp1", "a40:1x4:pp1 worth 1.15x, 0.92x after its restart cost"),
        "runs on in a40:1x2:pp1: a40:1x4:pp1 worth 1.15x, 0.92x after its restart cost",
    ),
}


@pytest.mark.parametrize("job_id", sorted(CASES))
def test_why_says_the_constraint_with_its_numbers(job_id):
    reason, said = CASES[job_id]
    assert status_cmd.why(reason)["text"] == said


@pytest.fixture
def config(tmp_path):
    state = tmp_path / "s.sqlite"
    with StateStore(state) as st:
        for job_id in CASES:
            st.accept_spec(job_id, "root", SPEC, "comment", 1.0)
        st.save_statuses(
            [
                JobStatus(j, "root", "PENDING", "held", r, 900.0, None, None, None, None, None, False)
                for j, (r, _) in CASES.items()
            ],
            2.0,
        )
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[controller]\nstate_path = "{state}"\n')
    return cfg


def test_status_why_and_the_one_line_reason_of_each_pending_job(config):
    res = CliRunner().invoke(main, ["status", "--config", str(config), "--why", "21"])
    assert res.exit_code == 0, res.output
    assert res.output == "job 21 (held): GPU limit: account acct-a GrpTRES allows 4 GPUs, 4 in use or planned\n"
    res = CliRunner().invoke(main, ["status", "--config", str(config), "--why", "24", "--json"])
    out = json.loads(res.output)
    assert (out["kind"], out["fields"]["name"], out["reason"]) == ("reservation", "maint", CASES["24"][0])
    table = CliRunner().invoke(main, ["status", "--config", str(config)]).output.splitlines()
    for job_id, (reason, _) in CASES.items():  # one line per job, the reason at its end
        (line,) = [ln for ln in table if ln.startswith(job_id + " ")]
        assert line.endswith(reason)
    res = CliRunner().invoke(main, ["status", "--config", str(config), "--why", "99"])
    assert res.exit_code != 0 and "no managed job 99" in res.output


def test_why_names_the_preemptor_and_the_victims_from_the_history(config, tmp_path):
    """Job 31 was preempted for job 32 twice, job 33 for 32 once: --why 31 names
    the job it gave its GPUs to, --why 32 the jobs that gave it theirs, long
    after the round's reason has moved on."""
    with StateStore(tmp_path / "s.sqlite") as st:
        for victim, t in (("31", 1000.0), ("33", 1001.0), ("31", 5000.0)):
            st.add_history(victim, HistoryEvent.YIELDED, t, 1, "32")
    res = CliRunner().invoke(main, ["status", "--config", str(config), "--why", "31"])
    lines = res.output.splitlines()
    assert lines[1].startswith("  preempted for: job 32 at ") and lines[1].count("job 32 at") == 2
    res = CliRunner().invoke(main, ["status", "--config", str(config), "--why", "32"])
    assert res.output.splitlines()[1].startswith("  preempted for it: job 31 at ")
    assert [v for v in ("31", "33") if f"job {v} at" in res.output.splitlines()[1]] == ["31", "33"]
    out = json.loads(CliRunner().invoke(main, ["status", "--config", str(config), "--why", "32", "--json"]).output)
    assert [(p["job"], p["time"]) for p in out["preempted_for_it"]] == [("31", 1000.0), ("33", 1001.0), ("31", 5000.0)]
    out = json.loads(CliRunner().invoke(main, ["status", "--config", str(config), "--why", "31", "--json"]).output)
    assert [(p["job"], p["time"]) for p in out["preempted_by"]] == [("32", 1000.0), ("32", 5000.0)]
    assert out["kind"] == "preempted" and out["fields"]["job"] == "40"


def test_status_says_the_restarts_per_job(config, tmp_path):
    """Requeues by the controller per job: 14 jobs, one requeued 3 times, one once."""
    with StateStore(tmp_path / "s.sqlite") as st:
        for job_id, n in (("21", 3), ("22", 1)):
            for k in range(n):
                st.add_history(job_id, HistoryEvent.REQUEUED, 10.0 + k)
        st.add_history("23", HistoryEvent.SIGNALLED, 10.0)  # a signal alone is no restart
    out = CliRunner().invoke(main, ["status", "--config", str(config)]).output
    n = len(CASES)
    assert f"restarts per job: mean {4 / n:.2f}, p99 3, max 3 over {n} jobs" in out
    got = json.loads(CliRunner().invoke(main, ["status", "--config", str(config), "--json"]).output)
    assert got["restarts_per_job"] == {"mean": 4 / n, "p99": 3.0, "max": 3.0}
