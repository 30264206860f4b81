"""The site's GPU limits bind every path that makes cellsched's plans (the
CP-SAT model, exact and aggregated, the LP-first path, the greedy plan),
and the guard (site_problems, validate_plan, enforce_site) catches any
other policy's plan that breaks one. Oracles worked out by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_policies import job, running, table_for

from solver.placement import PlacementError, joint, validate_plan
from solver.placement.siterules import enforce_site, site_problems
from solver.policies import POLICIES, get_policy
from solver.site import GpuLimit, LimitKind, LimitScope, PartitionAccess, SitePolicy, parse_reason
from solver.types import Cell, ClusterView, NodeView, ScheduleRequest

#: 8 GPUs: two nodes of 4 A100s
EIGHT = ClusterView(tuple(NodeView(f"n{i}", "a100", 4, 4) for i in range(2)))


def acct_limit(gpus: int, name: str = "acctA", **kw) -> GpuLimit:
    return GpuLimit(LimitScope.ACCOUNT, name, LimitKind.GRP, gpus, **kw)


def gpus_of(placements, jobs, account: str) -> int:
    accounts = {j.job_id: j.account for j in jobs}
    return sum(p.cell.num_gpus for jid, p in placements.items() if accounts.get(jid) == account)


def two_accounts():
    """Three elastic acctA jobs and one acctB job, each worth up to 8 GPUs."""
    jobs = [job(f"a{i}", account="acctA", elastic=True, max_gpus=8) for i in range(3)]
    jobs.append(job("b0", account="acctB", elastic=True, max_gpus=8))
    return jobs, table_for(jobs, EIGHT, {(j.job_id, "a100"): 1.0 for j in jobs})


#: the solver paths: exact node model; aggregated (node classes); LP first, then CP-SAT
PATHS = {
    "exact": {},
    "aggregated": {"exact_node_model_max_nodes": 0},
    "lp-first": {"exact_node_model_max_nodes": 0, "lp_first_min_jobs": 0},
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_an_account_limit_of_4_of_8_gpus_leaves_the_rest_to_the_other_account(path, exact_config):
    jobs, est = two_accounts()
    site = SitePolicy(limits=(acct_limit(4),))
    rep = get_policy("cellsched").schedule(
        ScheduleRequest(EIGHT, tuple(jobs), config=exact_config(**PATHS[path]), site=site), est
    )
    assert gpus_of(rep.placements, jobs, "acctA") <= 4
    assert gpus_of(rep.placements, jobs, "acctB") == 8 - gpus_of(rep.placements, jobs, "acctA")
    assert gpus_of(rep.placements, jobs, "acctA") == 4  # the limit is the only thing that stops acctA
    validate_plan(EIGHT, rep.placements, {j.job_id: j for j in jobs}, site)
    # without the limit acctA takes more than 4 (so the test has a subject)
    free = get_policy("cellsched").schedule(
        ScheduleRequest(EIGHT, tuple(jobs), config=exact_config(**PATHS[path])), est
    )
    assert gpus_of(free.placements, jobs, "acctA") > 4


def test_the_greedy_fallback_keeps_the_limit(monkeypatch, exact_config):
    def broken(*a, **kw):
        raise RuntimeError("no CP-SAT today")

    monkeypatch.setattr(joint, "solve_cpsat", broken)
    jobs, est = two_accounts()
    site = SitePolicy(limits=(acct_limit(4),))
    rep = get_policy("cellsched").schedule(ScheduleRequest(EIGHT, tuple(jobs), config=exact_config(), site=site), est)
    assert rep.status == "GREEDY"
    assert 0 < gpus_of(rep.placements, jobs, "acctA") <= 4
    assert sum(p.cell.num_gpus for p in rep.placements.values()) == 8


def test_gpus_used_outside_the_round_count_against_the_limit(exact_config):
    jobs, est = two_accounts()
    site = SitePolicy(limits=(acct_limit(4, used_outside=3),))  # a plain sbatch job of acctA holds 3
    rep = get_policy("cellsched").schedule(ScheduleRequest(EIGHT, tuple(jobs), config=exact_config(), site=site), est)
    assert gpus_of(rep.placements, jobs, "acctA") == 1


def test_a_typed_limit_counts_only_its_gpu_type(exact_config):
    cluster = ClusterView((NodeView("a", "a100", 4, 4), NodeView("b", "a10", 4, 4)))
    jobs = [job(f"a{i}", account="acctA", elastic=True, max_gpus=4) for i in range(2)]
    est = table_for(jobs, cluster, {(j.job_id, t): 1.0 for j in jobs for t in ("a100", "a10")})
    site = SitePolicy(limits=(acct_limit(2, gpu_type="a100"),))
    rep = get_policy("cellsched").schedule(ScheduleRequest(cluster, tuple(jobs), config=exact_config(), site=site), est)
    on = {t: sum(p.cell.num_gpus for p in rep.placements.values() if p.cell.gpu_type == t) for t in ("a100", "a10")}
    assert on == {"a100": 2, "a10": 4}


def test_per_user_qos_limit_and_per_job_limit(exact_config):
    jobs = [
        job("u1a", account="acct", user="alice", qos="normal", elastic=True, max_gpus=8),
        job("u1b", account="acct", user="alice", qos="normal", elastic=True, max_gpus=8),
        job("u2", account="acct", user="bob", qos="normal", elastic=True, max_gpus=8),
    ]
    est = table_for(jobs, EIGHT, {(j.job_id, "a100"): 1.0 for j in jobs})
    site = SitePolicy(
        limits=(
            GpuLimit(LimitScope.QOS_PER_USER, "normal", LimitKind.PER_USER, 3),
            GpuLimit(LimitScope.QOS, "normal", LimitKind.PER_JOB, 2),
        )
    )
    rep = get_policy("cellsched").schedule(ScheduleRequest(EIGHT, tuple(jobs), config=exact_config(), site=site), est)
    alice = sum(rep.placements[j].cell.num_gpus for j in ("u1a", "u1b") if j in rep.placements)
    assert alice <= 3
    assert all(p.cell.num_gpus <= 2 for p in rep.placements.values())
    assert rep.placements["u2"].cell.num_gpus == 2  # bob: his own 3 per user, but 2 per job


def test_a_lowered_limit_shrinks_running_elastic_jobs_and_grows_none(exact_config):
    cell = Cell("a100", 1, 4)
    jobs = [
        running(job("a0", account="acctA", elastic=True, max_gpus=8), cell, [("n0", 4)], 0.5),
        running(job("a1", account="acctA", elastic=True, max_gpus=8), cell, [("n1", 4)], 0.5),
        job("a2", account="acctA", elastic=True, max_gpus=8),
    ]
    est = table_for(jobs, EIGHT, {(j.job_id, "a100"): 1.0 for j in jobs})
    site = SitePolicy(limits=(acct_limit(4),))  # they hold 8
    rep = get_policy("cellsched").schedule(ScheduleRequest(EIGHT, tuple(jobs), config=exact_config(), site=site), est)
    assert {"a0", "a1"} <= set(rep.placements)  # never preempted
    assert sum(p.cell.num_gpus for p in rep.placements.values()) == 4  # shrunk back to the limit
    assert all(rep.placements[j].cell.num_gpus < 4 for j in ("a0", "a1"))


def test_a_limit_lowered_under_jobs_that_cannot_shrink_keeps_them_and_starts_nothing(exact_config):
    cell = Cell("a100", 1, 4)
    jobs = [
        running(job("a0", account="acctA", elastic=True, min_gpus=4, max_gpus=4), cell, [("n0", 4)], 0.5),
        job("a1", account="acctA", elastic=True, max_gpus=4),
        job("b0", account="acctB", elastic=True, max_gpus=4),
    ]
    est = table_for(jobs, EIGHT, {(j.job_id, "a100"): 1.0 for j in jobs})
    site = SitePolicy(limits=(acct_limit(2),))
    rep = get_policy("cellsched").schedule(ScheduleRequest(EIGHT, tuple(jobs), config=exact_config(), site=site), est)
    assert rep.placements["a0"].cell.num_gpus == 4 and "a1" not in rep.placements
    assert rep.placements["b0"].cell.num_gpus == 4
    kind, fields = parse_reason(rep.reasons["a1"])
    assert kind == "limit" and fields["name"] == "acctA" and (fields["used"], fields["allowed"]) == ("4", "2")


def test_partition_access_keeps_an_account_out_of_a_partition(exact_config):
    cluster = ClusterView(
        (NodeView("p0", "a100", 4, 4, partitions=("prio",)), NodeView("g0", "a100", 4, 4, partitions=("gpu",)))
    )
    jobs = [job("a0", account="acctA", elastic=True, max_gpus=8), job("a1", account="acctA", max_gpus=8)]
    est = table_for(jobs, cluster, {(j.job_id, "a100"): 1.0 for j in jobs})
    site = SitePolicy(partition_access={"prio": PartitionAccess(accounts=("acctB",))})
    rep = get_policy("cellsched").schedule(ScheduleRequest(cluster, tuple(jobs), config=exact_config(), site=site), est)
    assert rep.placements and all(p.node_names == ("g0",) for p in rep.placements.values())
    assert all(p.partition in (None, "gpu") for p in rep.placements.values())
    # only "prio" open to it: it waits, and says why
    only = replace(jobs[0], partitions=("prio",))
    rep = get_policy("cellsched").schedule(ScheduleRequest(cluster, (only,), config=exact_config(), site=site), est)
    assert not rep.placements
    assert rep.reasons["a0"] == "partition acctA/ may use none of prio"


def test_the_guard_catches_a_baseline_over_a_limit_and_enforce_site_fixes_it(exact_config):
    jobs = [job(f"a{i}", account="acctA", requested_gpus=4, requested_gpu_type="a100") for i in range(2)]
    est = table_for(jobs, EIGHT, {(j.job_id, "a100"): 1.0 for j in jobs})
    site = SitePolicy(limits=(acct_limit(4),))
    req = ScheduleRequest(EIGHT, tuple(jobs), config=exact_config(), site=site)
    rep = get_policy("fcfs").schedule(replace(req, site=SitePolicy()), est)  # FCFS's own plan
    assert len(rep.placements) == 2
    problems = site_problems(site, EIGHT, jobs, rep.placements)
    assert problems == ["limit account:acctA GrpTRES gres/gpu used 8/4 planned (4 allowed to managed jobs)"]
    with pytest.raises(PlacementError, match="acctA"):
        validate_plan(EIGHT, rep.placements, {j.job_id: j for j in jobs}, site)
    fixed = enforce_site(req, rep)
    assert list(fixed.placements) == ["a0"]  # the later one waits
    assert fixed.reasons["a1"] == "limit account:acctA GrpTRES gres/gpu used 8/4"
    assert enforce_site(replace(req, site=SitePolicy()), rep) is rep
    assert get_policy("fcfs").schedule(req, est).placements == fixed.placements  # every policy's reply is guarded


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_no_policy_plans_over_a_limit(name, exact_config):
    jobs = [job(f"a{i}", account="acctA", requested_gpus=4, requested_gpu_type="a100", elastic=True) for i in range(3)]
    jobs.append(job("b0", account="acctB", requested_gpus=4, requested_gpu_type="a100", elastic=True))
    est = table_for(jobs, EIGHT, {(j.job_id, "a100"): 1.0 for j in jobs})
    site = SitePolicy(limits=(acct_limit(4),))
    rep = get_policy(name).schedule(ScheduleRequest(EIGHT, tuple(jobs), config=exact_config(), site=site), est)
    assert site_problems(site, EIGHT, jobs, rep.placements) == []
    assert 0 < gpus_of(rep.placements, jobs, "acctA") <= 4
    assert all(j.job_id in rep.placements or rep.reasons.get(j.job_id) for j in jobs)


def test_placements_admitted_one_at_a_time_are_those_of_the_definition():
    """reconcile.checked, where the plan as a whole breaks a rule, admits
    placements one at a time, each checked once against what was admitted
    before it (validate_plan's `admitted`). Oracle: the definition, each
    placement validated together with every one admitted before it, on 200
    random plans over EIGHT with an account limit, the jobs in `first` first."""
    import random

    from slurm_ext.controller.reconcile import checked
    from solver.types import ParallelPlan, Placement

    site = SitePolicy(limits=(acct_limit(6),))
    for seed in range(200):
        rng = random.Random(seed)
        placements, jobs = {}, {}
        for i in range(rng.randint(2, 6)):
            jid = f"j{i}"
            g = rng.choice([1, 2, 4])
            nodes = tuple((f"n{k}", g) for k in rng.sample(range(2), rng.choice([1, 2]) if g < 4 else 1))
            cell = Cell("a100", len(nodes), g)
            placements[jid] = Placement(jid, cell, nodes, ParallelPlan(1, cell.num_gpus, 1), 1.0)
            jobs[jid] = job(jid, account=rng.choice(["acctA", "acctB"]))
        first = {j for j in placements if rng.random() < 0.3}
        ok: dict = {}
        rejected = {}
        try:
            validate_plan(EIGHT, placements, jobs, site)
            ok = dict(placements)
        except PlacementError:
            for jid, p in sorted(placements.items(), key=lambda kv: (kv[0] not in first, kv[0])):
                try:
                    validate_plan(EIGHT, {**ok, jid: p}, jobs, site)
                    ok[jid] = p
                except PlacementError as exc:
                    rejected[jid] = f"plan rejected: {exc}"
        assert checked(EIGHT, placements, first, jobs, site) == (ok, rejected), seed
