"""The site's policy in the simulator: the cluster file's [site], the
account rule for traces without accounts, Slurm's decayed usage, the
entitlement by share, and a run whose account limit binds."""

from __future__ import annotations

import hashlib
import math
from types import SimpleNamespace

import pytest

from slurm_ext.backends.base import SubmitRequest
from slurm_ext.sim.backend import SimBackend
from slurm_ext.sim.clusterspec import ClusterSpecError, load_cluster_spec
from slurm_ext.sim.engine import SimOptions, Simulator
from slurm_ext.sim.site import SiteUsage, assign_accounts, normalized_shares, water_fill
from slurm_ext.sim.types import AccountSpec, ClusterSpec, NodeGroup, QosSpec, SiteSpec, TraceJob
from slurm_ext.sim.world import SimWorld
from solver.contract.jobspec import JobSpec
from solver.estimator import EstimatorBase
from solver.types import Estimate, ParallelPlan

NODES = '[[nodes]]\ngpu_type = "a100"\ncount = 1\ngpus_per_node = 8\n'


def spec(tmp_path, site: str) -> ClusterSpec:
    path = tmp_path / "c.toml"
    path.write_text(NODES + site)
    return load_cluster_spec(path)


def test_the_site_table_is_read(tmp_path):
    got = spec(
        tmp_path,
        "[site]\ndecay_half_life_s = 3600\ndefault_qos = 'normal'\n"
        "[site.accounts.phys]\nshare = 60\ngpus = 4\nuser_gpus = 2\nusers = 3\ntrace_weight = 2\n"
        "[site.accounts.bio]\n"
        "[site.qos.normal]\ngpus = 8\nuser_gpus = 4\njob_gpus = 2\n",
    ).site
    assert got == SiteSpec(
        (AccountSpec("phys", 60.0, 4, 2, 3, 2.0), AccountSpec("bio", 1.0, None, None, 1, 1.0)),
        (QosSpec("normal", 8, 4, 2),),
        "normal",
        3600.0,
    )
    assert load_cluster_spec(tmp_path / "c.toml").total_gpus == 8


@pytest.mark.parametrize(
    ("site", "message"),
    [
        ("[site]\n", "site: field 'accounts' must name at least one account"),
        ("[site]\nfoo = 1\n[site.accounts.a]\n", "site: unknown field 'foo'"),
        ("[site.accounts.a]\nshare = -1\n", "site.accounts.a: field 'share' must be a number >= 0, got -1"),
        ("[site.accounts.a]\nshare = 0\n", "every share is 0"),
        ("[site.accounts.a]\ngpus = 2.5\n", "site.accounts.a: field 'gpus' must be a number of GPUs"),
        ("[site.accounts.a]\nusers = 0\n", "site.accounts.a: field 'users' must be a positive integer"),
        ("[site.accounts.a]\nshares = 1\n", "site.accounts.a: unknown field 'shares'"),
        ("[site]\ndefault_qos = 'high'\n[site.accounts.a]\n", "field 'default_qos' must name a QOS"),
        ("[site]\ndecay_half_life_s = 0\n[site.accounts.a]\n", "field 'decay_half_life_s' must be a positive"),
        ("[site.accounts.a]\n[site.qos.q]\njob_gpus = -1\n", "site.qos.q: field 'job_gpus' must be a number of GPUs"),
        ('[site.accounts."a b"]\n', "is not a Slurm name"),
    ],
)
def test_a_bad_site_table_is_an_error_naming_the_field(tmp_path, site, message):
    with pytest.raises(ClusterSpecError, match=f"c.toml: .*{message.replace('(', '.').replace(')', '.')}"):
        spec(tmp_path, site)


# ---- the account rule --------------------------------------------------------------------

SITE = SiteSpec((AccountSpec("a", 1.0, users=2), AccountSpec("b", 1.0, trace_weight=3.0, users=5)), (), "std")


def tj(job_id: str, **kw) -> TraceJob:
    return TraceJob(job_id, 0.0, "bert__760M", 64, 10, 1, "a100", **kw)


def test_the_account_rule_as_documented():
    """u = sha256("account:" + id)[:16 hex] / 2^64 in [0, 1/4): a, else b
    (weights 1 and 3); user k = sha256("user:" + id) mod the account's users."""
    ids = [f"job-{i}" for i in range(200)]
    got = assign_accounts([tj(i) for i in ids], SITE)
    for i, g in zip(ids, got, strict=True):
        u = int(hashlib.sha256(f"account:{i}".encode()).hexdigest()[:16], 16) / 2**64
        account, users = ("a", 2) if u < 0.25 else ("b", 5)
        k = int(hashlib.sha256(f"user:{i}".encode()).hexdigest(), 16) % users
        assert (g.account, g.user, g.qos) == (account, f"{account}-u{k}", "std")
    share_a = sum(g.account == "a" for g in got) / len(got)
    assert abs(share_a - 0.25) < 3 * math.sqrt(0.25 * 0.75 / len(got))


def test_a_trace_account_is_kept_and_weight_zero_takes_no_job():
    site = SiteSpec((AccountSpec("a", 1.0, trace_weight=0.0), AccountSpec("b", 1.0)))
    got = assign_accounts([tj("1", account="x", user="ann", qos="high"), tj("2"), tj("3")], site)
    assert (got[0].account, got[0].user, got[0].qos) == ("x", "ann", "high")
    assert [g.account for g in got[1:]] == ["b", "b"]


# ---- usage and entitlement ---------------------------------------------------------------


def test_water_fill_lends_what_an_account_cannot_use_by_share():
    # a (share .5) asks 2: it gets 2; the 8 left go to b and c by their equal shares
    assert water_fill(10, {"a": 2, "b": 10, "c": 10}, {"a": 0.5, "b": 0.25, "c": 0.25}) == {"a": 2, "b": 4, "c": 4}
    assert water_fill(10, {"a": 20, "b": 20}, {"a": 0.75, "b": 0.25}) == pytest.approx({"a": 7.5, "b": 2.5})
    # an account without a share gets what the others leave
    assert water_fill(10, {"a": 4, "z": 20}, {"a": 1.0}) == {"a": 4, "z": 6}


def test_usage_decays_with_the_half_life():
    site = SiteSpec((AccountSpec("a"), AccountSpec("b")), decay_half_life_s=100.0)
    clock = SimpleNamespace(t=0.0)
    usage = SiteUsage(site, 8, lambda: clock.t, 0.0)
    usage.register("1", tj("j1", account="a", user="u"))
    j = SimpleNamespace(job_id="1", gpus=4)
    usage.started(j, "a100:1x4")
    clock.t = 100.0
    usage.stopped(j, 100.0)
    usage.ended(j)
    clock.t = 200.0
    # 4 GPUs over [0, 100), each second decayed by 2^(-age/100), seen at 200:
    # 4 * integral_0^100 2^-((200 - s)/100) ds = 4 * 100/ln 2 * (2^-1 - 2^-2)
    assert usage.normalized_usage() == {"a": 1.0}
    assert usage.usage["a"] == pytest.approx(4 * 100 / math.log(2) * 0.25)
    assert usage.site_policy().shares == {"a": 0.5, "b": 0.5}


# ---- a run -------------------------------------------------------------------------------


class Table(EstimatorBase):
    """1 s per iteration on any cell: truth and estimate."""

    def speed(self, spec, gpu_type, num_nodes, gpus_per_node, plan):
        return 1.0

    def estimate(self, job, cell):
        return Estimate(cell, ParallelPlan(1, cell.num_gpus, 1), 1.0, 1.0, "measured")


def run(limit: int | None):
    site = SiteSpec((AccountSpec("x", 1.0, gpus=limit), AccountSpec("y", 1.0)))
    cluster = ClusterSpec((NodeGroup("a100", 1, 8),), site=site)
    trace = [tj(n, account=a, user="u") for n, a in (("x1", "x"), ("x2", "x"), ("y1", "y"))]
    trace = [TraceJob(j.job_id, 0.0, j.model, 64, 100, 4, "a100", account=j.account, user="u") for j in trace]
    opts = SimOptions(restart_per_gpu_s=0.0, restart_max_s=0.0, elastic=False)
    result = Simulator(trace, cluster, "slurm-multifactor", speed=Table().speed, estimator=Table(), options=opts).run()
    return {j.job_id: j.jct for j in result.jobs}, result.meta["site"]


def test_an_account_limit_binds_in_a_run_and_the_share_is_measured():
    # x1, x2, y1 (4 GPUs, 100 s each) at t=0 on 8 GPUs, equal priority: submit order.
    # x at most 4 GPUs: x1 and y1 run first, x2 after them
    jct, site = run(limit=4)
    assert jct == {"x1": 100.0, "x2": 200.0, "y1": 100.0}
    assert (site["x"]["peak_gpus"], site["y"]["peak_gpus"]) == (4, 4)
    assert (site["x"]["gpu_s"], site["y"]["gpu_s"]) == (800.0, 400.0)
    # entitled: [0, 100) x asks 8, y 4: 4 each; [100, 200) x alone, asks 4
    assert (site["x"]["entitled_gpu_s"], site["y"]["entitled_gpu_s"]) == (800.0, 400.0)
    # without the limit x1 and x2 come first, y1 after them
    jct, site = run(limit=None)
    assert jct == {"x1": 100.0, "x2": 100.0, "y1": 200.0}
    assert site["x"]["peak_gpus"] == 8


def test_a_checkpointed_job_keeps_its_demand_once_requeued():
    site = SiteSpec((AccountSpec("a"),))
    usage = SiteUsage(site, 8, lambda: 0.0, 0.0)
    usage.register("1", tj("j1", account="a", user="u"))
    j = SimpleNamespace(job_id="1", gpus=1)
    assert usage.demand == {"a": 1}
    usage.ended(j)  # a checkpoint: the job ends (exit 75) ...
    assert usage.demand == {"a": 0}
    usage.requeued(j)  # ... and the controller requeues it
    usage.requeued(j)
    assert usage.demand == {"a": 1}


def test_slurms_limits_hold_back_a_start_over_them():
    site = SiteSpec(
        (AccountSpec("a", gpus=4, user_gpus=3), AccountSpec("b")), (QosSpec("q", gpus=6, user_gpus=5, job_gpus=4),), "q"
    )
    usage = SiteUsage(site, 16, lambda: 0.0, 0.0)
    for sid, acct, user in (
        ("1", "a", "ann"),
        ("2", "a", "bob"),
        ("3", "a", "ann"),
        ("4", "b", "cy"),
        ("5", "b", "cy"),
    ):
        usage.register(sid, assign_accounts([tj(sid, account=acct, user=user)], site)[0])

    def sim_job(sid, gpus, nodes=1):
        return SimpleNamespace(job_id=sid, gres=gpus, num_nodes=nodes, gpus=gpus * nodes, starts=0)

    assert usage.gate(sim_job("1", 3)) == ""
    usage.started(sim_job("1", 3), "a100:1x3")
    assert usage.gate(sim_job("2", 2)) == "AssocGrpGRES"  # a: 3 + 2 > 4
    assert usage.gate(sim_job("3", 1)) == "AssocGrpGRES"  # a/ann: 3 + 1 > 3
    assert usage.gate(sim_job("2", 1)) == ""
    assert usage.gate(sim_job("4", 2, nodes=2)) == "QOSGrpGRES"  # q: 3 + 4 > 6
    assert usage.gate(sim_job("4", 3)) == ""
    usage.started(sim_job("4", 3), "a100:1x3")
    assert usage.gate(sim_job("5", 5)) == "QOSGrpGRES"
    usage.stopped(sim_job("1", 3), 10.0)
    assert usage.gate(sim_job("5", 3)) == "QOSMaxGRESPerUser"  # q/cy: 3 + 3 > 5
    assert usage.gate(sim_job("2", 5)) == "AssocGrpGRES"  # a: 0 + 5 > 4
    assert usage.gate(sim_job("5", 2)) == ""
    assert usage.summary()["a"]["held_back_starts"] == 2  # jobs 2 and 3 (each start once)


# ---- the account tree and job-count limits ------------------------------------------------

TREE = (
    "[site]\n"
    "[site.accounts.lab]\nshare = 3\ngpus = 4\njobs = 3\n"
    "[site.accounts.lab-x]\nparent = 'lab'\nshare = 2\n"
    "[site.accounts.lab-y]\nparent = 'lab'\nshare = 1\nuser_jobs = 1\n"
    "[site.accounts.lab-y-z]\nparent = 'lab-y'\n"
    "[site.accounts.other]\nshare = 1\n"
)


def test_sub_accounts_and_job_counts_are_read(tmp_path):
    site = spec(tmp_path, TREE).site
    assert site.account("lab") == AccountSpec("lab", 3.0, 4, jobs=3)
    assert site.account("lab-y") == AccountSpec("lab-y", 1.0, parent="lab", user_jobs=1)
    assert site.above("lab-y-z") == ("lab-y", "lab") and site.below("lab") == {"lab-x", "lab-y", "lab-y-z"}
    assert (site.user_jobs("lab-y-z"), site.user_jobs("lab-x"), site.user_jobs("other")) == (1, None, None)
    # shares along the tree: lab 3/4 of root's; lab-x 2/3 of lab's; lab-y-z all of lab-y's (1/3 of lab's)
    assert normalized_shares(site) == pytest.approx(
        {"lab": 0.75, "lab-x": 0.5, "lab-y": 0.25, "lab-y-z": 0.25, "other": 0.25}
    )


@pytest.mark.parametrize(
    ("site", "message"),
    [
        ("[site.accounts.a]\nparent = 'b'\n", r"site.accounts.a: field 'parent' must name another account .*got 'b'"),
        ("[site.accounts.a]\nparent = 'a'\n", "field 'parent' must name another account"),
        ("[site.accounts.a]\nparent = 'b'\n[site.accounts.b]\nparent = 'a'\n", "makes a cycle"),
        ("[site.accounts.a]\njobs = -1\n", "site.accounts.a: field 'jobs' must be a number of jobs"),
        ("[site.accounts.a]\nuser_jobs = 1.5\n", "site.accounts.a: field 'user_jobs' must be a number of jobs"),
    ],
)
def test_a_bad_tree_or_job_count_is_an_error_naming_the_field(tmp_path, site, message):
    with pytest.raises(ClusterSpecError, match=message):
        spec(tmp_path, site)


def test_usage_and_the_classic_factor_follow_the_tree():
    """lab-x's and lab-y-z's jobs used 3 and 1 GPU-units, other's none:
    normalised usage lab-x 0.75, lab-y-z and lab-y 0.25, lab 1 (its
    sub-accounts'); factors 2^(-u/s) with the shares along the tree."""
    site = SiteSpec(
        (
            AccountSpec("lab", 3.0),
            AccountSpec("lab-x", 2.0, parent="lab"),
            AccountSpec("lab-y", 1.0, parent="lab"),
            AccountSpec("lab-y-z", 1.0, parent="lab-y"),
            AccountSpec("other", 1.0),
        )
    )
    usage = SiteUsage(site, 8, lambda: 0.0, 0.0)
    usage.usage = {"lab-x": 3.0, "lab-y-z": 1.0}
    got = usage.site_policy()
    assert got.usage == {"lab-x": 0.75, "lab-y-z": 0.25, "lab": 1.0, "lab-y": 0.25}
    assert got.fairshare == pytest.approx(
        {"lab": 2 ** (-1 / 0.75), "lab-x": 2 ** (-0.75 / 0.5), "lab-y": 2**-1, "lab-y-z": 2**-1, "other": 1.0}
    )


def test_a_sub_accounts_jobs_wait_on_the_parents_limits_with_slurms_reasons():
    """The simulated slurmctld on 8 A100s: lab (GrpTRES=gres/gpu=4,
    GrpJobs=3) over lab-x and lab-y (MaxJobs=1 for each of its users), and
    other. Released in this order, each on one node (hand-worked):

    1 lab-x/ann 2 GPUs   starts                  (lab: 2 GPUs, 1 job)
    2 lab-y/bob 1 GPU    starts                  (lab: 3 GPUs, 2 jobs)
    3 lab-y/cy  2 GPUs   waits: lab 3 + 2 > 4 GPUs (its parent's GrpTRES)
    4 lab-x/ann 1 GPU    starts                  (lab: 4 GPUs, 3 jobs)
    5 lab-y/dan 1 GPU    AssocGrpJobsLimit       (lab: 3 + 1 > 3 jobs; counted before the GPUs)
    6 lab-y/bob 1 GPU    AssocMaxJobsLimit       (lab-y/bob: 1 + 1 > 1, its own association first)
    7 other/eve 1 GPU    starts                  (not under lab)

    and 3, over both of lab's limits once 4 runs, shows AssocGrpJobsLimit
    (as Slurm 22.05 showed on the dev cluster for the same four jobs).
    Then job 2 ends: 3 waits on lab's GPUs (3 + 2 > 4: AssocGrpGRES), 5
    starts (lab: 4 GPUs, 3 jobs), 6 waits on lab's job count now (bob runs
    none in lab-y)."""
    site = SiteSpec(
        (
            AccountSpec("lab", 1.0, gpus=4, jobs=3),
            AccountSpec("lab-x", 1.0, parent="lab"),
            AccountSpec("lab-y", 1.0, parent="lab", user_jobs=1),
            AccountSpec("other", 1.0),
        )
    )
    cluster = ClusterSpec((NodeGroup("a100", 2, 4),), site=site)
    box: list[SimWorld] = []
    usage = SiteUsage(site, 8, lambda: box[0].now, 0.0)
    world = SimWorld(cluster, speed=lambda *a: 1.0, observers=(usage,), gate=usage.gate)
    box.append(world)
    backend = SimBackend(world)
    jobs = [
        ("lab-x", "ann", 2),
        ("lab-y", "bob", 1),
        ("lab-y", "cy", 2),
        ("lab-x", "ann", 1),
        ("lab-y", "dan", 1),
        ("lab-y", "bob", 1),
        ("other", "eve", 1),
    ]
    ids = []
    long = JobSpec(model="bert__760M", global_batch=64, iterations=10**6).to_comment()
    for account, user, gpus in jobs:
        jid = backend.submit(SubmitRequest(script="job.sh", gres_per_node=gpus, nodes=1, hold=True, comment=long))
        usage.register(jid, TraceJob(jid, 0.0, "bert__760M", 64, 10**6, gpus, "a100", account=account, user=user))
        ids.append(jid)
    for jid in ids:
        backend.release(jid)
    world.advance(1.0)

    def states() -> list[str]:
        snap = backend.observe()
        return [snap.job(j).state if snap.job(j).state != "PENDING" else snap.job(j).reason for j in ids]

    assert states() == [
        "RUNNING",
        "RUNNING",
        "AssocGrpJobsLimit",
        "RUNNING",
        "AssocGrpJobsLimit",
        "AssocMaxJobsLimit",
        "RUNNING",
    ]
    world.cancel(world.jobs[ids[1]])
    world.advance(2.0)
    assert states() == ["RUNNING", "CANCELLED", "AssocGrpGRES", "RUNNING", "RUNNING", "AssocGrpJobsLimit", "RUNNING"]
