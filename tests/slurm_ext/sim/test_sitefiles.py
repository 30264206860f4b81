"""A site's own files (`cellsched simulate --site-dump --partitions
--site-qos`) and the recorded run (`--policy recorded`), on files recorded
on the accounting dev cluster (data/site/README.md). The oracle is what
contrib/record-site-fixture.sh set with sacctmgr and scontrol, and the
sacct file's own Submit and Start columns, read here with the standard
library."""

from __future__ import annotations

import csv
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_ext.parse.sitefiles import SiteFileError, parse_dump, parse_partition_file
from slurm_ext.sim.recorded import recorded_run
from slurm_ext.sim.sitefiles import load_site_files
from slurm_ext.sim.traces import read_sacct
from slurm_ext.sim.types import AccountSpec, ClusterSpec, NodeGroup, QosSpec, TraceJob

DATA = Path(__file__).parent / "data" / "site"
DUMP, PARTS, QOS = DATA / "sacctmgr_dump.txt", DATA / "scontrol_show_partition.txt", DATA / "sacctmgr_show_qos.txt"
SACCT, CLUSTER = DATA / "sacct.txt", DATA / "cluster.toml"
TWO_TYPES = ClusterSpec((NodeGroup("a100", 2, 4), NodeGroup("a40", 2, 2)))


def test_the_recorded_dump_is_the_site_the_script_made():
    site = load_site_files(TWO_TYPES, str(DUMP), str(PARTS), str(QOS)).site
    assert site.accounts == (
        AccountSpec("acct-a", share=60, gpus=4),
        AccountSpec("acct-b", share=40, user_gpus=3),  # root's GrpTRES in acct-b
        AccountSpec("lab", share=30, gpus=6, jobs=3),
        AccountSpec("lab-x", share=2, parent="lab"),
        AccountSpec("lab-y", share=1, gpus=2, parent="lab", user_jobs=1),
    )
    assert site.qos == (
        QosSpec("normal"),
        QosSpec("gpu2", gpus=2),
        QosSpec("big", gpus=8, user_gpus=6, job_gpus=4, priority=100),
    )
    assert site.below("lab") == {"lab-x", "lab-y"}
    assert set(site.partitions) == {"a100", "a40"}  # `all` admits everybody
    assert site.partitions["a100"].deny_accounts == ("acct-b",)
    assert site.partitions["a40"].qos == ("normal", "gpu2")
    assert not site.partitions["a100"].allows("acct-b") and site.partitions["a100"].allows("acct-a")
    assert not site.partitions["a40"].allows("lab-x", "big") and site.partitions["a40"].allows("lab-x", "normal")
    assert site.priority_tiers == {}


def test_fields_not_used_are_listed_with_their_line():
    dump = parse_dump(DUMP.read_text(), DUMP)
    assert dump.ignored == {
        "DefaultAccount": 15,
        "AdminLevel": 15,
        "Description": 16,
        "Organization": 16,
        "MaxSubmitJobs": 18,
    }
    assert [u.parent for u in dump.users] == ["root", "acct-a", "acct-b", "lab-x", "lab-y"]
    parts = parse_partition_file(PARTS.read_text(), PARTS)
    assert parts.lines == {"a100": 1, "a40": 14, "all": 27}
    assert parts.ignored["Nodes"] == 6 and "MaxTime" not in parts.ignored
    notes = load_site_files(TWO_TYPES, str(DUMP), str(PARTS), str(QOS)).notes
    assert f"{PARTS}:14: partition a40 MaxTime: not applied (no job time limits)" in notes
    assert any(n.startswith(f"{DUMP}: accepted, not used: DefaultAccount (line 15)") for n in notes)


def test_limits_of_the_cluster_line_are_listed_not_applied(tmp_path):
    dump = tmp_path / "dump.txt"
    dump.write_text(_edited(DUMP.read_text(), 13, "Cluster - 'cellsched':Fairshare=1:GrpTRES=gres/gpu=10:QOS='normal'"))
    files = load_site_files(TWO_TYPES, str(dump))
    assert f"{dump}:13: the cluster's (root's) GrpTRES: not applied" in files.notes
    assert files.site.accounts == load_site_files(TWO_TYPES, str(DUMP)).site.accounts


def _edited(text: str, line: int, new: str) -> str:
    lines = text.splitlines()
    lines[line - 1] = new
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("file", "line", "new", "message"),
    [
        (DUMP, 16, "Qos - 'big':Priority=100", "unknown kind 'Qos'"),
        (DUMP, 16, "Account - 'acct-a':Fairshare=60:Bogus=1", "unknown field 'Bogus'"),
        (DUMP, 16, "Account - 'acct-a':Fairshare=60:GrpJobs=many", "GrpJobs='many': not a number of jobs"),
        (DUMP, 16, "Account - 'acct-a':GrpTRES=gres/gpu:a100=4", "a limit of one GPU type is not modelled"),
        (DUMP, 16, "Account - 'acct-a' Fairshare=60", "expected ':Key=Value'"),
        (DUMP, 16, "Account - 'acct-a':Fairshare=60:Fairshare=2", "field 'Fairshare' given twice"),
        (DUMP, 16, "Account - 'acct-a':Fairshare=parent", "Fairshare='parent' is not modelled"),
        (DUMP, 16, "Account - 'a b;c':Fairshare=1", "not a plain name"),
        (DUMP, 16, "Account - 'acct-a':Description='oops:Fairshare=60", "unclosed quote"),
        (DUMP, 16, "acct-a Fairshare=60", "expected \"Kind - 'name'\""),
        (DUMP, 19, "Parent - 'nobody'", "Parent 'nobody' is no account listed above"),
        (DUMP, 17, "Account - 'acct-a':Fairshare=1", "account 'acct-a' listed twice"),
        (DUMP, 13, "Parent - 'root'", "Parent line before the Cluster line"),
        # a second user of acct-b (line 23) with another GrpTRES than root's on line 22
        (DUMP, 22, "User - 'root':GrpTRES=gres/gpu=3\nUser - 'alice':GrpTRES=gres/gpu=2", "differs from line 22's"),
        (PARTS, 4, "   DefaultTime=NONE Bogus=NO", "unknown field 'Bogus'"),
        (PARTS, 6, "   n[1-2]", "expected Key=Value fields"),
        (PARTS, 1, "Partition=a100", "expected a line starting with PartitionName="),
        (PARTS, 14, "PartitionName=a100", "partition 'a100' listed twice (first on line 1)"),
        (PARTS, 3, "   AllocNodes=ALL Default=NO QoS=N/A Default=YES", "field 'Default' given twice"),
        (PARTS, 18, "   MaxNodes=UNLIMITED MaxTime=soon MinNodes=0", "MaxTime 'soon' is not a time"),
        (PARTS, 27, "PartitionName=h100", "partition 'h100' is not one of the simulated cluster's (a100, a40, all)"),
    ],
)
def test_a_bad_line_is_an_error_naming_it(tmp_path, file, line, new, message):
    bad = tmp_path / file.name
    bad.write_text(_edited(file.read_text(), line, new))
    paths = {DUMP: str(DUMP), PARTS: str(PARTS)} | {file: str(bad)}
    if "alice" in new:
        line += 1
    with pytest.raises(SiteFileError) as err:
        load_site_files(TWO_TYPES, paths[DUMP], paths[PARTS])
    assert str(err.value).startswith(f"{bad}:{line}: ")
    assert message in str(err.value)


def _recorded_waits() -> dict[str, float]:
    """Start - Submit of each job of the sacct file, by the standard library."""
    with SACCT.open(newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="|"))
    return {
        r["JobID"]: (dt.datetime.fromisoformat(r["Start"]) - dt.datetime.fromisoformat(r["Submit"])).total_seconds()
        for r in rows
    }


def test_the_recorded_run_is_the_record():
    trace = read_sacct(SACCT)
    run = recorded_run(trace, TWO_TYPES)
    waits = _recorded_waits()
    assert len(waits) == 36 and len(run.jobs) == 36
    assert {j.job_id: j.queueing for j in run.jobs} == waits
    # job 3: lab-x, 4 a100 GPUs from 12:18:56 to 12:19:21
    three = next(j for j in run.jobs if j.job_id == "3")
    assert (three.end_time - three.first_start, three.gpu_seconds, three.cells) == (25.0, 100.0, ("a100:4",))
    assert max(s.gpus_used.get("a100", 0) for s in run.samples) <= 8
    assert max(s.gpus_used.get("a40", 0) for s in run.samples) <= 4
    assert run.samples[-1].running == 0 and run.samples[-1].queued == 0
    fracs = {a: v["used_frac"] for a, v in run.meta["site"].items()}
    assert sum(fracs.values()) == pytest.approx(1.0, abs=1e-12)
    assert run.meta["site"]["lab-y"]["peak_gpus"] <= 2  # its GrpTRES


def test_a_job_without_a_recorded_start_is_refused():
    from slurm_ext.sim.recorded import RecordedError

    with pytest.raises(RecordedError, match="line 7: job x has no recorded Start"):
        recorded_run([TraceJob("x", 0.0, "gpt-1.3b", 128, None, 1, duration_s=5.0, line=7)], TWO_TYPES)


def simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurm_ext", "simulate", *args], capture_output=True, text=True, timeout=600, check=False
    )


def test_recorded_multifactor_and_cellsched_side_by_side(tmp_path):
    out = tmp_path / "out"
    proc = simulate(
        *("--trace-format", "sacct", "--trace", str(SACCT), "--cluster", str(CLUSTER)),
        *("--site-dump", str(DUMP), "--partitions", str(PARTS), "--site-qos", str(QOS)),
        *("--policy", "recorded", "--policy", "slurm-multifactor", "--policy", "cellsched"),
        *("--truth", "arena-filled", "--interval", "1", "--no-plots", "--json", "--out", str(out)),
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "results.json").read_text())
    assert list(doc["summary"]) == ["recorded", "slurm-multifactor", "cellsched"]
    rec = {j["job_id"]: j["queueing"] for j in doc["runs"]["recorded"]["jobs"]}
    assert rec == _recorded_waits()  # exactly
    side = doc["recorded"]
    assert side["recorded"]["mean_wait_s"] == pytest.approx(sum(rec.values()) / 36, rel=1e-12)
    for policy in ("slurm-multifactor", "cellsched"):
        sim = {j["job_id"]: j["queueing"] for j in doc["runs"][policy]["jobs"] if j["queueing"] is not None}
        errs = side[policy]["wait_err_s"]
        assert errs == pytest.approx({j: sim[j] - rec[j] for j in sim}, abs=1e-9)
        assert side[policy]["jobs_compared"] == len(sim) >= 30
        assert set(side[policy]["account_gpu_frac"]) == {"acct-a", "acct-b", "lab", "lab-x", "lab-y"} - {"lab"}
    assert doc["meta"]["site_dump"] == str(DUMP)
    assert "Against the recorded run" in (out / "results.md").read_text()


def test_bad_site_files_on_the_command_line(tmp_path):
    bad = tmp_path / "dump.txt"
    bad.write_text(_edited(DUMP.read_text(), 17, "Account - 'acct-b':Fairshare=40:Bogus=1"))
    base = ("--trace-format", "sacct", "--trace", str(SACCT), "--cluster", str(CLUSTER), "--out", str(tmp_path / "o"))
    for args, message in (
        (("--site-dump", str(bad)), f"--site-dump: {bad}:17: unknown field 'Bogus'"),
        (("--partitions", str(PARTS)), "--partitions: needs --site-dump"),
        (
            (
                "--site-dump",
                str(DUMP),
                "--cluster",
                str(DATA.parent / "small_cluster.toml"),
                "--partitions",
                str(PARTS),
            ),
            "partition 'a100' is not one of the simulated cluster's",
        ),
    ):
        proc = simulate(*base, *args, "--policy", "recorded")
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr
    proc = simulate("--out", str(tmp_path / "o"), "--limit-jobs", "3", "--policy", "recorded")
    assert proc.returncode == 2 and "--policy recorded: needs a recorded run, --trace-format sacct" in proc.stderr
    proc = simulate(*base, "--arrival-rate", "2", "--policy", "recorded")
    assert proc.returncode == 2 and "the record is of the trace's own arrivals" in proc.stderr


def test_the_policies_get_the_partitions_who_may_use_them():
    from slurm_ext.sim.site import SiteUsage

    site = load_site_files(TWO_TYPES, str(DUMP), str(PARTS), str(QOS)).site
    policy = SiteUsage(site, 12, lambda: 0.0, 0.0).site_policy()
    assert policy.partition_access == site.partitions
    assert not policy.admits("a100", "acct-b", "normal", "root", None)
    assert policy.admits("all", "acct-b", "normal", "root", None)


def test_the_wait_error_by_hand():
    from slurm_ext.sim.report import against_recorded
    from slurm_ext.sim.types import JobOutcome, SimRun

    def run(policy, waits, **meta):
        jobs = tuple(
            JobOutcome(j, 100.0, None if w is None else 100.0 + w, None if w is None else 200.0 + w, w is not None)
            for j, w in waits.items()
        )
        return SimRun(policy, jobs, (), (), {"a100": 8}, meta=meta)

    rec = run("recorded", {"1": 10.0, "2": 20.0, "3": 30.0}, recorded=True)
    sim = run("sim", {"1": 15.0, "2": 35.0, "3": None})  # job 3 never started
    got = against_recorded([rec, sim])
    assert got["recorded"]["mean_wait_s"] == 20.0 and "wait_err_s" not in got["recorded"]
    assert got["sim"]["wait_err_s"] == {"1": 5.0, "2": 15.0}
    assert got["sim"]["jobs_compared"] == 2
    assert got["sim"]["mean_abs_wait_err_s"] == 10.0 and got["sim"]["median_abs_wait_err_s"] == 10.0
    assert got["sim"]["mean_wait_err_pct"] == pytest.approx(100 * (25 - 15) / 15)  # over jobs 1 and 2
    assert against_recorded([sim]) is None
