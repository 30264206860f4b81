"""The site's policy read from Slurm (slurm_ext.site, slurm_ext.parse.accounting)
against outputs recorded on the dev cluster with accounting (Slurm 22.05.8,
DEVCLUSTER_ACCOUNTING=1, data/accounting/). The recorded site: account
acct-a GrpTRES=gres/gpu=4, user root in acct-b GrpTRES=gres/gpu=6 and
MaxTRES=gres/gpu=4, QOS gpu2 GrpTRES/MaxTRES/MaxTRESPU gres/gpu=2, QOS big
Priority=100, partition `all` with QoS=gpu2, a40 AllowAccounts=acct-b, v100
DenyAccounts=acct-a, a10 AllowQos=gpu2, a MAINT reservation `maint` on n1
and `b-res` for acct-b on n6; jobs 1 (acct-b, 2 GPUs on a40) and 2 (acct-a,
QOS gpu2, 1 GPU) running, 6 pending for Resources, 5 held, the others
pending on a limit or a begin time. The expected values below are read off
those files by hand."""

from __future__ import annotations

import subprocess

import pytest

from slurm_ext.backends import SlurmCommandError
from slurm_ext.backends.cli import CliBackend
from slurm_ext.parse import accounting as acc
from slurm_ext.parse import json_output, scontrol_text
from slurm_ext.records import ClusterSnapshot
from slurm_ext.site import SiteReader, round_policy
from solver.site import GpuLimit, LimitKind, LimitScope, PartitionAccess

#: when the outputs were recorded (epoch seconds; 2026-11-27T10:49:01Z)
RECORDED_AT = 1795776541.0
A = "accounting/"


def read(sample, now: float = RECORDED_AT):
    """The reading of the recorded outputs, and the argument lists it ran."""
    calls: list[list[str]] = []

    def run(args: list[str]) -> str:
        calls.append(args)
        if args[0] == "sacctmgr":
            return sample(A + ("sacctmgr_show_assoc.txt" if "assoc" in args else "sacctmgr_show_qos.txt"))
        if args[0] == "sshare":
            return sample(A + "sshare.txt")
        what = args[-1]  # scontrol [-o] show config|reservation|partition
        return sample(A + ("scontrol_show_config.txt" if what == "config" else f"scontrol_show_-o_{what}.txt"))

    return SiteReader(run).read(now), calls


def jobs(sample):
    return json_output.parse_jobs(sample(A + "squeue.json"))


def test_the_standing_policy_is_what_the_recorded_site_says(sample, utc):
    reading, calls = read(sample)
    p = reading.policy
    G, PJ, PU = LimitKind.GRP, LimitKind.PER_JOB, LimitKind.PER_USER
    assert set(p.limits) == {
        GpuLimit(LimitScope.ACCOUNT, "acct-a", G, 4),
        GpuLimit(LimitScope.USER, "acct-b/root", G, 6),
        GpuLimit(LimitScope.USER, "acct-b/root", PJ, 4),
        GpuLimit(LimitScope.QOS, "gpu2", G, 2),
        GpuLimit(LimitScope.QOS, "gpu2", PJ, 2),
        GpuLimit(LimitScope.QOS_PER_USER, "gpu2", PU, 2),
        GpuLimit(LimitScope.PARTITION, "all", G, 2),
        GpuLimit(LimitScope.PARTITION, "all", PJ, 2),
        GpuLimit(LimitScope.PARTITION, "all", PU, 2),
    }
    assert len(p.limits) == 9
    assert p.shares == pytest.approx({"acct-a": 0.594059, "acct-b": 0.396040}, abs=1e-6)
    assert p.usage == pytest.approx({"acct-a": 0.5, "acct-b": 0.5}, abs=1e-6)
    assert p.partition_access == {
        "v100": PartitionAccess(deny_accounts=("acct-a",)),
        "a40": PartitionAccess(accounts=("acct-b",)),
        "a10": PartitionAccess(qos=("gpu2",)),
    }
    maint, bres = sorted(p.reservations, key=lambda r: r.name, reverse=True)
    assert (maint.name, maint.nodes, maint.maintenance) == ("maint", ("n1",), True)
    assert (maint.start, maint.end) == (1795776958.0, 1795780558.0)  # 2026-11-27T10:55:58Z .. 11:55:58Z
    assert not maint.admits("acct-a", "root") and not maint.admits("acct-b", "root", "maint")
    assert (bres.name, bres.nodes, bres.accounts, bres.maintenance) == ("b-res", ("n6",), ("acct-b",), False)
    assert not p.unmanaged  # the round adds them
    assert reading.dropped == ()
    # the cluster's own rows only; every command an argument list
    assert ["sacctmgr", "-n", "-P", "show", "assoc", "where", "cluster=cellsched"] == calls[1][:7]
    assert all(isinstance(a, str) for c in calls for a in c)


def test_a_reservation_that_ended_is_left_out(sample, utc):
    reading, _ = read(sample, now=1795780558.0 + 1)  # maint's end
    assert [r.name for r in reading.policy.reservations] == ["b-res"]


def test_the_round_counts_outside_gpus_and_pending_plain_jobs(sample, utc):
    reading, _ = read(sample)
    snap = ClusterSnapshot(nodes=(), partitions=(), jobs=jobs(sample), taken_at=RECORDED_AT)
    p = round_policy(reading, snap, carried=(), managed={"5"})
    used = {(lim.key): lim.used_outside for lim in p.limits if lim.used_outside}
    # job 1: acct-b/root, QOS normal, 2 GPUs in a40; job 2: acct-a/root, QOS gpu2, 1 GPU in a100
    assert used == {
        "account:acct-a:GrpTRES": 1,
        "user:acct-b/root:GrpTRES": 2,
        "qos:gpu2:GrpTRES": 1,
        "qos-per-user:gpu2/root:MaxTRESPerUser": 1,
    }
    # 6 waits for Resources; 4, 8, 9 wait on their own limits, 7 on its begin time, 5 is held (and managed)
    (u,) = p.unmanaged
    assert (u.job_id, u.gpus, u.nodes, u.partitions, u.account, u.priority) == ("6", 4, 2, ("a40",), "acct-b", 3335)
    # a managed job on a placement of ours is carried: not counted outside
    carried = round_policy(reading, snap, carried={"2"}, managed={"2", "5"})
    assert {lim.key: lim.used_outside for lim in carried.limits}["account:acct-a:GrpTRES"] == 0


def test_a_held_jobs_priority_is_estimated_as_slurm_gives_an_unheld_twin(sample, utc):
    """Jobs 4 (pending, Slurm's priority 6668) and 5 (held: 0) share account,
    user, QOS and submit time: the estimate for 5 is Slurm's for 4, to the
    age Slurm last recalculated it at (PriorityCalcPeriod 1 min: 1000 x 60 s
    / 1 day = 0.7)."""
    reading, _ = read(sample)
    by_id = {j.job_id: j for j in jobs(sample)}
    assert by_id["5"].priority == 0 and by_id["5"].held
    assert reading.priority.priority(by_id["5"], RECORDED_AT) == pytest.approx(6668, abs=1.0)
    assert reading.priority.priority(by_id["4"], RECORDED_AT) == 6668


def test_jobs_carry_account_qos_priority_and_reservation_in_json_and_text(sample, utc):
    for parsed in (jobs(sample), scontrol_text.parse_jobs(sample(A + "scontrol_show_-o_job.txt"))):
        by_id = {j.job_id: j for j in parsed}
        assert (by_id["1"].account, by_id["1"].qos, by_id["1"].time_limit) == ("acct-b", "normal", 30)
        assert (by_id["8"].qos, by_id["8"].reservation) == ("gpu2", "b-res")
        assert by_id["5"].priority == 0 and by_id["1"].reservation == ""


def test_tres_and_names_are_read_strictly():
    assert acc.gpu_tres("cpu=4,gres/gpu=4,gres/gpu:a100=2,mem=1G") == {None: 4, "a100": 2}
    assert acc.gpu_tres("") == {} and acc.gpu_tres("gres/gpux=3") == {}
    with pytest.raises(acc.ParseError, match="sacctmgr show assoc line 1"):
        acc.parse_assocs("cellsched|acct-a\n")
    with pytest.raises(acc.ParseError, match="not a number"):
        acc.parse_sshare(" acct-a||60|zero|0|0.5|\n")
    assert not acc.plain_name("a b") and not acc.plain_name("x\x1b[31m") and acc.plain_name("acct-a")


def test_untrusted_names_are_dropped_and_said(sample, utc):
    bad = "cellsched|ev\x1bil|||1|gres/gpu=1||normal|root||\n"

    def run(args: list[str]) -> str:
        if args[:2] == ["scontrol", "show"]:
            return sample(A + "scontrol_show_config.txt")
        if "assoc" in args:
            return sample(A + "sacctmgr_show_assoc.txt") + bad
        return ""

    reading = SiteReader(run).read(RECORDED_AT)
    assert all("ev" not in lim.name for lim in reading.policy.limits)
    assert reading.dropped and "not a plain name" in reading.dropped[0]


def test_an_oversized_output_is_refused(sample):
    def run(args: list[str]) -> str:
        return sample(A + "scontrol_show_config.txt") if args[0] == "scontrol" else "x|" * (3 << 20)

    with pytest.raises(acc.ParseError, match="more than"):
        SiteReader(run).read(RECORDED_AT)


def test_no_slurmdbd_is_a_slurm_error_from_the_cli_backend(sample):
    """What sacctmgr says on a cluster without accounting (recorded on the
    plain dev cluster) comes out as a SlurmCommandError, which the
    controller turns into an empty policy and one warning."""

    def runner(args, **kw):
        if args[0] == "sacctmgr":
            err = "You are not running a supported accounting_storage plugin\n"
            err += "Only 'accounting_storage/slurmdbd' is supported.\n"
            return subprocess.CompletedProcess(args, 1, "", err)
        return subprocess.CompletedProcess(args, 0, sample(A + "scontrol_show_config.txt"), "")

    with pytest.raises(SlurmCommandError, match="supported accounting_storage plugin"):
        CliBackend(run=runner).read_site()
