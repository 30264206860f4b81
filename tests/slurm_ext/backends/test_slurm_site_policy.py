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
from dataclasses import replace

import pytest

from slurm_ext.backends import SlurmCommandError
from slurm_ext.backends.cli import CliBackend
from slurm_ext.parse import accounting as acc
from slurm_ext.parse import json_output, scontrol_text
from slurm_ext.records import ClusterSnapshot
from slurm_ext.site import SiteReader, UnixGroups, round_policy
from solver.contract.models import ModelSpec
from solver.limits import bindings
from solver.site import GpuLimit, LimitKind, LimitScope, PartitionAccess
from solver.types import JobRequest

#: when the outputs were recorded (epoch seconds; 2026-11-27T10:49:01Z)
RECORDED_AT = 1795776541.0
A = "accounting/"
MODEL = ModelSpec("tiny", "gpt", 4, 256, 4, 128, 1000, 1e7)


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
    # each association's FairShare as sshare gives it (Slurm's default Fair Tree here), not one of cellsched's own
    assert p.fairshare == {"root/root": 1.0, "acct-a/root": 0.666667, "acct-b/root": 0.333333}
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


def read_tree(sample):
    """The reading of the site recorded with an account tree (data/accounting/tree/)."""

    def run(args: list[str]) -> str:
        if args[:2] == ["scontrol", "show"]:
            return sample(A + "scontrol_show_config.txt")
        if args[0] == "sacctmgr":
            return sample(A + "tree/" + ("sacctmgr_show_assoc.txt" if "assoc" in args else "sacctmgr_show_qos.txt"))
        if args[0] == "sshare":
            return sample(A + "tree/sshare.txt")
        return (
            "No reservations in the system"
            if args[-1] == "reservation"
            else sample(A + "tree/" + "scontrol_show_-o_partition.txt")
        )

    return SiteReader(run).read(RECORDED_AT)


def test_the_account_tree_and_job_counts_are_what_the_recorded_site_says(sample, utc):
    """Recorded on the dev cluster with accounting: the site above, plus
    account lab (Fairshare=30 GrpTRES=gres/gpu=4 GrpJobs=3 MaxJobs=2) under
    root, lab-x (Fairshare=2) and lab-y (Fairshare=1 MaxJobs=1
    GrpTRES=gres/gpu=2) under lab, lab-y-z under lab-y; root in lab-x,
    lab-y and lab-y-z, alice in lab-x with GrpJobs=1; QOS shared
    (GrpJobs=4 MaxJobsPerUser=2 MaxJobsPerAccount=3
    MaxTRESPerAccount=gres/gpu=3) as partition all's QOS; partition a40
    MaxTime=1-00:00:00 PriorityTier=2 DenyQos=gpu2, a100
    AllowGroups=nogroup,daemon MaxTime=02:30:00; jobs of root ran in lab-x
    and lab-y-z before sshare was read. The expected values are read off
    those files by hand."""
    p = read_tree(sample).policy
    G, PJ, PU, PA = LimitKind.GRP, LimitKind.PER_JOB, LimitKind.PER_USER, LimitKind.PER_ACCOUNT
    GJ, MJ, JPU, JPA = LimitKind.GRP_JOBS, LimitKind.MAX_JOBS, LimitKind.JOBS_PER_USER, LimitKind.JOBS_PER_ACCOUNT
    ACCOUNT, USER, QOS, PARTITION = LimitScope.ACCOUNT, LimitScope.USER, LimitScope.QOS, LimitScope.PARTITION
    QPU, QPA = LimitScope.QOS_PER_USER, LimitScope.QOS_PER_ACCOUNT
    lab_below = frozenset({"lab-x", "lab-y", "lab-y-z"})
    assert set(p.limits) == {
        GpuLimit(ACCOUNT, "acct-a", G, 4),
        GpuLimit(USER, "acct-b/root", G, 6),
        GpuLimit(USER, "acct-b/root", PJ, 4),
        # a parent's Grp limits bind every account below it; MaxJobs binds through the user rows
        GpuLimit(ACCOUNT, "lab", G, 4, below=lab_below),
        GpuLimit(ACCOUNT, "lab", GJ, 3, below=lab_below),
        GpuLimit(USER, "lab-x/alice", GJ, 1),
        GpuLimit(USER, "lab-x/alice", MJ, 2),  # lab's MaxJobs, copied down by slurmdbd
        GpuLimit(USER, "lab-x/root", MJ, 2),
        GpuLimit(ACCOUNT, "lab-y", G, 2, below=frozenset({"lab-y-z"})),
        GpuLimit(USER, "lab-y/root", MJ, 1),
        GpuLimit(USER, "lab-y-z/root", MJ, 1),  # lab-y's, copied down
        GpuLimit(QOS, "gpu2", G, 2),
        GpuLimit(QOS, "gpu2", PJ, 2),
        GpuLimit(QPU, "gpu2", PU, 2),
        GpuLimit(QPA, "shared", PA, 3),
        GpuLimit(QOS, "shared", GJ, 4),
        GpuLimit(QPU, "shared", JPU, 2),
        GpuLimit(QPA, "shared", JPA, 3),
        GpuLimit(PARTITION, "all", PA, 3),
        GpuLimit(PARTITION, "all", GJ, 4),
        GpuLimit(PARTITION, "all", JPU, 2),
        GpuLimit(PARTITION, "all", JPA, 3),
    }
    assert len(p.limits) == 22
    assert p.fairshare == {
        "root/root": 1.0,
        "acct-a/root": 0.714286,
        "acct-b/root": 1.0,
        "lab-x/alice": 0.571429,
        "lab-x/root": 0.428571,
        "lab-y/root": 0.285714,
        "lab-y-z/root": 0.142857,
    }
    assert p.shares == pytest.approx(
        {
            "acct-a": 0.458015,
            "acct-b": 0.305344,
            "lab": 0.229008,
            "lab-x": 0.229008 * 0.666667,
            "lab-y": 0.229008 * 0.333333,
            "lab-y-z": 0.229008 * 0.333333 * 0.5,
        },
        abs=1e-6,
    )
    assert p.partition_access == {
        "a40": PartitionAccess(deny_qos=("gpu2",), max_time_s=86400.0),
        "a100": PartitionAccess(groups=("nogroup", "daemon"), max_time_s=9000.0),
    }
    assert p.priority_tiers == {"a40": 2} and p.tier("a40") == 2 and p.tier("all") == 1


def test_a_grandparents_limit_binds_a_grandchilds_jobs_as_read(sample, utc):
    """Which of the recorded limits bind a job of root in lab-y-z (QOS
    normal, partition all) and one of alice in lab-x (QOS shared)."""
    limits = read_tree(sample).policy.limits
    yz = JobRequest("1", MODEL, 32, iterations=1, runtime="adaptive", account="lab-y-z", user="root", qos="normal")
    assert [b.key for b in bindings(limits, replace(yz, partitions=("all",)))] == [
        "account:lab:GrpTRES",
        "account:lab:GrpJobs",
        "account:lab-y:GrpTRES",
        "user:lab-y-z/root:MaxJobs",
        "partition:all:MaxTRESPerAccount/lab-y-z",
        "partition:all:GrpJobs",
        "partition:all:MaxJobsPerUser/root",
        "partition:all:MaxJobsPerAccount/lab-y-z",
    ]
    alice = replace(yz, account="lab-x", user="alice", qos="shared", partitions=("a40",))
    assert [b.key for b in bindings(limits, alice)] == [
        "account:lab:GrpTRES",
        "account:lab:GrpJobs",
        "user:lab-x/alice:GrpJobs",
        "user:lab-x/alice:MaxJobs",
        "qos-per-account:shared:MaxTRESPerAccount/lab-x",
        "qos:shared:GrpJobs",
        "qos-per-user:shared:MaxJobsPerUser/alice",
        "qos-per-account:shared:MaxJobsPerAccount/lab-x",
    ]


def test_partition_access_reads_deny_qos_groups_and_max_time(sample, utc):
    """a40 denies QOS gpu2 and allows a day; a100 allows groups nogroup and
    daemon (the users' groups as the controller host gives them; root is
    not bound) and 2.5 hours; all admits everybody."""
    reading = read_tree(sample)
    reading = replace(reading, groups=lambda u: None if u == "root" else {"alice": ("daemon",)}.get(u, ("users",)))
    snap = ClusterSnapshot(nodes=(), partitions=(), jobs=jobs(sample), taken_at=RECORDED_AT)
    managed = {j.job_id for j in snap.jobs}
    policy = round_policy(reading, snap, carried=(), managed=managed)
    assert policy.user_groups == {"root": None}  # the recorded jobs are root's
    policy = replace(policy, user_groups={**policy.user_groups, "alice": ("daemon",), "bob": ("users",)})

    def admitted(user: str, qos: str, limit: float | None) -> list[str]:
        return [p for p in ("a40", "a100", "all") if policy.admits(p, "lab-x", qos, user, limit)]

    assert admitted("alice", "normal", 3600.0) == ["a40", "a100", "all"]
    assert admitted("bob", "normal", 3600.0) == ["a40", "all"]  # in neither group
    assert admitted("root", "normal", 3600.0) == ["a40", "a100", "all"]  # AllowGroups does not bind root
    assert admitted("alice", "gpu2", 3600.0) == ["a100", "all"]  # DenyQos
    assert admitted("alice", "normal", 2 * 86400.0) == ["all"]  # over both MaxTimes
    assert admitted("alice", "normal", 86400.0) == ["a40", "all"]  # at a40's MaxTime, over a100's
    # no limit: Slurm would run it with MaxTime as its limit (measured), cellsched does not cut it
    assert admitted("alice", "normal", None) == ["all"]


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


def test_a_users_groups_are_read_from_the_host_without_running_a_command():
    """UnixGroups against `id -Gn` (the oracle: another reader of the same
    host's user database): nobody's groups; root and SlurmUser are not bound
    by AllowGroups (None); an unknown or unplain name is in none."""
    groups = UnixGroups(("slurm",))
    want = subprocess.run(["id", "-Gn", "nobody"], capture_output=True, text=True, check=True).stdout.split()
    assert sorted(groups("nobody") or ()) == sorted(want) and want
    assert groups("root") is None and groups("slurm") is None
    assert groups("no-such-user-here") == () and groups("ev\x1bil") == () and groups("a/b") == ()
