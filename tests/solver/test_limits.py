"""The one rule of the site's GPU limits (solver.limits): which limit binds
which job, in which bucket, and a bucket's load against its cap. The oracles
are worked out by hand from Slurm's rules (docs/site-policy.md#gpu-limits)."""

from __future__ import annotations

import pytest
from test_policies import job

from solver.limits import Bucket, Holder, Loads, bindings, binds, bucket_of, held_in
from solver.site import GpuLimit, LimitKind, LimitScope
from solver.types import Cell

GRP, PER_USER, PER_JOB = LimitKind.GRP, LimitKind.PER_USER, LimitKind.PER_JOB
ACCOUNT, USER, QOS, QOS_PER_USER, PARTITION = (
    LimitScope.ACCOUNT,
    LimitScope.USER,
    LimitScope.QOS,
    LimitScope.QOS_PER_USER,
    LimitScope.PARTITION,
)

#: four jobs: a JobRequest that names no partition (it may land in any), two Slurm
#: records running in one partition each, and a record of no account, QOS or partition
WHO = {
    "ann": job("ann", account="acctA", user="alice", qos="normal"),
    "bob": Holder("acctA", "bob", "normal", ("gpu",)),
    "cy": Holder("acctB", "alice", "high", ("other",)),
    "nobody": Holder("", "", "", ()),
}

#: limit -> {job: the user of the bucket that counts it (None: the limit's one bucket)}; jobs left out: not bound
CASES = [
    (GpuLimit(ACCOUNT, "acctA", GRP, 4), {"ann": None, "bob": None}),
    (GpuLimit(ACCOUNT, "", GRP, 4), {}),  # an empty account is nobody's
    (GpuLimit(USER, "acctA/alice", GRP, 4), {"ann": None}),  # not cy: alice of acctB
    (GpuLimit(QOS, "normal", GRP, 4), {"ann": None, "bob": None}),
    (GpuLimit(QOS, "", GRP, 4), {}),
    (GpuLimit(QOS_PER_USER, "normal", PER_USER, 4), {"ann": "alice", "bob": "bob"}),
    (GpuLimit(QOS_PER_USER, "normal/alice", PER_USER, 4), {"ann": None}),  # one user's, as slurm_ext.site adds
    (GpuLimit(QOS_PER_USER, "high/alice", PER_USER, 4), {"cy": None}),
    # a partition's limit binds the jobs that run there: ann may land anywhere, bob runs in gpu
    (GpuLimit(PARTITION, "gpu", GRP, 4), {"ann": None, "bob": None}),
    (GpuLimit(PARTITION, "other", GRP, 4), {"ann": None, "cy": None}),
    (GpuLimit(PARTITION, "gpu", PER_USER, 4), {"ann": "alice", "bob": "bob"}),
    (GpuLimit(PARTITION, "gpu/bob", PER_USER, 4), {"bob": None}),
    (GpuLimit(QOS, "normal", PER_JOB, 4), {"ann": None, "bob": None}),
    (GpuLimit(ACCOUNT, "acctB", PER_JOB, 4), {"cy": None}),
]


@pytest.mark.parametrize(("limit", "bound"), CASES, ids=[f"{lim.scope}-{lim.name}-{lim.kind}" for lim, _ in CASES])
def test_which_limit_binds_which_job_in_which_bucket(limit, bound):
    assert {w for w, who in WHO.items() if binds(limit, who)} == set(bound)
    buckets = {w: bucket_of(limit, who) for w, who in WHO.items()}
    assert {w: b.member for w, b in buckets.items() if b is not None} == bound
    assert all(b.per_job == (limit.kind == PER_JOB) for b in buckets.values() if b is not None)


def test_a_per_user_limit_keeps_each_users_gpus_apart_and_names_the_user_alone():
    lim = GpuLimit(QOS_PER_USER, "normal", PER_USER, 3)
    ann, bob = bucket_of(lim, WHO["ann"]), bucket_of(lim, WHO["bob"])
    assert ann is not None and bob is not None and ann.key != bob.key
    assert ann.key == "qos-per-user:normal:MaxTRESPerUser/alice"
    alone = ann.alone(2)  # what slurm_ext.site adds for alice's GPUs outside the round
    assert (alone.name, alone.used_outside, alone.gpus) == ("normal/alice", 2, 3)
    assert binds(alone, WHO["ann"]) and not binds(alone, WHO["bob"])


def test_bindings_keep_the_limits_order_and_each_bucket_once():
    acct, qos, per_job = (
        GpuLimit(ACCOUNT, "acctA", GRP, 4),
        GpuLimit(QOS, "normal", GRP, 6),
        GpuLimit(QOS, "normal", PER_JOB, 2),
    )
    got = bindings((qos, GpuLimit(ACCOUNT, "acctB", GRP, 1), acct, per_job, acct), WHO["ann"])
    assert [b.limit for b in got] == [qos, acct, per_job]


def test_a_bucket_counts_its_gpu_type_or_every_type():
    mixed = Cell("a100+a10", 3, 2, parts=(("a100", 1), ("a10", 2)))  # 2 A100s and 4 A10s
    assert held_in(mixed) == (("a100", 2), ("a10", 4))
    assert Bucket(GpuLimit(ACCOUNT, "acctA", GRP, 4)).gpus(mixed) == 6
    assert Bucket(GpuLimit(ACCOUNT, "acctA", GRP, 4, gpu_type="a10")).gpus(mixed) == 4
    assert Bucket(GpuLimit(ACCOUNT, "acctA", GRP, 4, gpu_type="v100")).gpus(mixed) == 0
    assert Bucket(GpuLimit(ACCOUNT, "acctA", GRP, 4, gpu_type="a10")).count((("a10", 2), (None, 5))) == 2


def test_a_bucket_load_against_its_headroom():
    lim = GpuLimit(ACCOUNT, "acctA", GRP, 4, used_outside=1)  # 3 GPUs left to the round's jobs
    (b,) = bindings((lim,), WHO["ann"])
    two = (("a100", 2),)
    loads = Loads()
    assert loads.blocking([b], two) is None
    loads.add([b], two)
    assert loads.blocking([b], (("a100", 1),)) is None
    assert loads.blocking([b], two) == (b, 3)  # 2 held + 1 outside: the reason says "used 3/4"
    assert b.reason(3) == "limit account:acctA GrpTRES gres/gpu used 3/4"
    assert loads.blocking([b], ()) is None  # a job holding none of its GPUs never waits for it
    loads.add([b], two)
    assert (loads.excess(b.key), loads.over(), loads.overs()) == (1, 1, [(b, 4)])
    loads.add([b], two, -1)
    assert (loads.load, loads.over()) == ({b.key: 2}, 0)
    # another cap: what the plan's fixed jobs leave, say 1
    assert Loads(lambda _: 1).blocking([b], two) == (b, 1)


def test_a_per_job_limit_caps_each_job_alone_and_holds_no_load():
    (b,) = bindings((GpuLimit(QOS, "normal", PER_JOB, 2),), WHO["ann"])
    loads = Loads()
    for _ in range(3):
        assert loads.blocking([b], (("a100", 2),)) is None
        loads.add([b], (("a100", 2),))
    assert loads.load == {}
    assert loads.blocking([b], (("a100", 4),)) == (b, 4)  # the job's own 4: "used 4/2"


# ---- the account tree, per-account limits and job counts ----------------------------------

#: Slurm's tree: root > lab > (lab-x, lab-y > lab-y-z); jobs of a user association under each
TREE_WHO = {
    "x-ann": Holder("lab-x", "ann", "normal"),
    "yz-ann": Holder("lab-y-z", "ann", "normal"),
    "yz-bob": Holder("lab-y-z", "bob", "high"),
    "y-bob": Holder("lab-y", "bob", "normal"),
    "lab-cy": Holder("lab", "cy", "normal"),
    "other": Holder("acct-b", "ann", "normal"),
}
GRP_JOBS, MAX_JOBS = LimitKind.GRP_JOBS, LimitKind.MAX_JOBS
PER_ACCOUNT, JOBS_PER_ACCOUNT = LimitKind.PER_ACCOUNT, LimitKind.JOBS_PER_ACCOUNT
QOS_PER_ACCOUNT = LimitScope.QOS_PER_ACCOUNT

TREE_CASES = [
    # a grandparent's Grp limit binds the grandchild's jobs (lab-y-z under lab-y under lab)
    (
        GpuLimit(ACCOUNT, "lab", GRP, 4, below=frozenset({"lab-x", "lab-y", "lab-y-z"})),
        {"x-ann", "yz-ann", "yz-bob", "y-bob", "lab-cy"},
    ),
    (GpuLimit(ACCOUNT, "lab-y", GRP_JOBS, 1, below=frozenset({"lab-y-z"})), {"yz-ann", "yz-bob", "y-bob"}),
    # a limit with no tree binds the account's own jobs only
    (GpuLimit(ACCOUNT, "lab", GRP, 4), {"lab-cy"}),
    # a user association under a sub-account: that user's jobs in that account only
    (GpuLimit(USER, "lab-y-z/ann", MAX_JOBS, 1), {"yz-ann"}),
    (GpuLimit(USER, "lab-y/bob", GRP_JOBS, 1), {"y-bob"}),
]


@pytest.mark.parametrize(("limit", "bound"), TREE_CASES, ids=[f"{lim.name}-{lim.kind}" for lim, _ in TREE_CASES])
def test_a_grp_limit_of_an_account_binds_the_jobs_of_every_account_below_it(limit, bound):
    assert {w for w, who in TREE_WHO.items() if binds(limit, who)} == bound
    assert {bucket_of(limit, TREE_WHO[w]).key for w in bound} == {limit.key}  # one bucket for all of them


def test_a_per_account_limit_keeps_each_accounts_jobs_apart():
    # QOS normal MaxTRESPerAccount=gres/gpu=3: lab-y-z's ann and bob hold 2 + 1 (full), lab-x's ann may still take 3
    lim = GpuLimit(QOS_PER_ACCOUNT, "normal", PER_ACCOUNT, 3)
    yz = bucket_of(lim, TREE_WHO["yz-ann"])
    assert yz is not None and yz.member == "lab-y-z" and yz.key == "qos-per-account:normal:MaxTRESPerAccount/lab-y-z"
    assert bucket_of(lim, TREE_WHO["yz-bob"]) is None  # QOS high
    loads = Loads()
    loads.add([yz], (("a100", 2),))
    loads.add(bindings((lim,), Holder("lab-y-z", "bob", "normal")), (("a100", 1),))
    assert loads.load == {yz.key: 3}
    assert loads.blocking([yz], (("a100", 1),)) == (yz, 3)
    assert yz.reason(3) == "limit qos-per-account:normal/lab-y-z MaxTRESPerAccount gres/gpu used 3/3"
    assert loads.fits(bindings((lim,), TREE_WHO["x-ann"]), (("a100", 3),))
    alone = yz.alone(2)  # one account's, as slurm_ext.site adds for what it holds outside the round
    assert alone.name == "normal/lab-y-z" and binds(alone, TREE_WHO["yz-ann"]) and not binds(alone, TREE_WHO["x-ann"])
    per_acct_jobs = GpuLimit(QOS_PER_ACCOUNT, "normal", JOBS_PER_ACCOUNT, 1)
    assert bucket_of(per_acct_jobs, TREE_WHO["x-ann"]).member == "lab-x"


def test_a_job_count_limit_counts_each_running_job_once_whatever_it_holds():
    # lab GrpJobs=2: a 4-GPU job and a job with no GPU are two jobs; a third waits, "used 2/2"
    lim = GpuLimit(ACCOUNT, "lab", GRP_JOBS, 2, below=frozenset({"lab-x", "lab-y", "lab-y-z"}))
    (b,) = bindings((lim,), TREE_WHO["x-ann"])
    mixed = Cell("a100+a10", 3, 2, parts=(("a100", 1), ("a10", 2)))
    assert b.gpus(mixed) == 1 and b.count((("a100", 4),)) == 1 and b.count(((None, 0),)) == 1
    loads = Loads()
    loads.add(bindings((lim,), TREE_WHO["x-ann"]), (("a100", 4),))
    assert loads.fits(bindings((lim,), TREE_WHO["yz-bob"]), (("a100", 1),))
    loads.add(bindings((lim,), TREE_WHO["yz-bob"]), ((None, 0),))
    assert loads.load == {b.key: 2}
    assert loads.blocking(bindings((lim,), TREE_WHO["lab-cy"]), (("a10", 1),)) == (b, 2)
    assert b.reason(2) == "limit account:lab GrpJobs jobs used 2/2"
    assert loads.fits(bindings((lim,), TREE_WHO["other"]), (("a10", 1),))  # acct-b is not below lab
    # used_outside counts jobs too: 1 job outside leaves room for one
    outside = GpuLimit(ACCOUNT, "lab", GRP_JOBS, 2, used_outside=1, below=lim.below)
    (o,) = bindings((outside,), TREE_WHO["x-ann"])
    assert Loads().fits([o], (("a100", 4),))
    one = Loads()
    one.add([o], (("a100", 1),))
    assert one.blocking([o], (("a100", 1),)) == (o, 2)
