"""What trace jobs run and declare (slurm_ext.sim.workload): the mix parser,
the seeded per-job assignment against its shares, the declared-work
distribution, and the simulator running it: a ddp job without the hook is
never moved, one with it is, a job runs its true work whatever it declared,
and Arena's conventions keep Arena's adaptive jobs."""

from __future__ import annotations

import math

import pytest

from slurm_ext.cli.simulate_cmd import simulate
from slurm_ext.sim.engine import SimError, SimOptions, Simulator
from slurm_ext.sim.types import ClusterSpec, NodeGroup, TraceJob
from slurm_ext.sim.workload import DEFAULT_MIX, Workload, WorkloadError, parse_runtime_mix
from tests.slurm_ext.sim.test_engine import ONE_NODE, Table, job

#: jobs drawn for the share tests, and how many binomial standard deviations a share may stray:
#: 4.5 sigma misses a correct share with probability below 1e-5 per share
N_JOBS = 20_000
SIGMAS = 4.5


def tolerance(p: float, n: int) -> float:
    """SIGMAS binomial standard deviations of a share p estimated from n draws."""
    return SIGMAS * math.sqrt(p * (1 - p) / n)


def trace_jobs(n: int) -> list[TraceJob]:
    return [TraceJob(f"job-{i}", 0.0, "bert__760M", 64, 100, 4, "a100") for i in range(n)]


# ---- the parser -----------------------------------------------------------------------


def test_a_mix_is_parsed_in_its_order():
    assert parse_runtime_mix("ddp=0.6, megatron=0.3,exact=0.1") == (("ddp", 0.6), ("megatron", 0.3), ("exact", 0.1))
    assert parse_runtime_mix("sharded=1") == (("sharded", 1.0),)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("ddp", "'ddp' is not NAME=SHARE"),
        ("=1", "is not NAME=SHARE"),
        ("pytorch=1", "unknown runtime 'pytorch' (known: ddp, sharded, exact, torchtitan, megatron)"),
        ("adaptive=1", "adaptive is Arena's assumption: --arena-compat"),
        ("ddp=0.5,ddp=0.5", "runtime 'ddp' given twice"),
        ("ddp=half,megatron=0.5", "share of ddp must be a number in [0, 1], got 'half'"),
        ("ddp=1.5,megatron=-0.5", "share of ddp must be a number in [0, 1]"),
        ("ddp=nan", "share of ddp must be a number in [0, 1]"),
        ("ddp=0.5,megatron=0.4", "shares must sum to 1, got 0.9"),
    ],
)
def test_a_bad_mix_is_an_error_naming_what_is_wrong(text, says):
    with pytest.raises(WorkloadError, match="^--runtime-mix: ") as err:
        parse_runtime_mix(text)
    assert says in str(err.value)


def test_the_cli_refuses_a_bad_mix_and_the_options_under_arena_compat(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        simulate(["--runtime-mix", "ddp=0.7", "--out", str(tmp_path)])
    assert e.value.code == 2 and "shares must sum to 1, got 0.7" in capsys.readouterr().err
    for opt in (["--runtime-mix", "ddp=1"], ["--declared-error", "1"]):
        with pytest.raises(SystemExit) as e:
            simulate([*opt, "--arena-compat", "--out", str(tmp_path)])
        assert e.value.code == 2 and "--arena-compat runs Arena's assumption" in capsys.readouterr().err


# ---- the assignment ---------------------------------------------------------------------


def test_runtimes_follow_the_mix_within_the_sampling_tolerance():
    w = Workload(mix=DEFAULT_MIX, seed=3)
    drawn = [w.runtime_of(j) for j in trace_jobs(N_JOBS)]
    for name, share in DEFAULT_MIX:
        assert abs(drawn.count(name) / N_JOBS - share) <= tolerance(share, N_JOBS), name
    assert set(drawn) == {n for n, _ in DEFAULT_MIX}


def test_the_assignment_is_a_function_of_the_job_id_and_the_seed():
    jobs = trace_jobs(500)
    a, b, c = (Workload(mix=DEFAULT_MIX, hook_fraction=0.5, badness=2.0, seed=s) for s in (7, 7, 8))

    def drawn(w):
        return [(w.runtime_of(j), w.hooked(j, "ddp"), w.declared(j, 1000)) for j in jobs]

    assert drawn(a) == drawn(b)  # every policy of a run meets the same jobs
    assert drawn(a) != drawn(c)
    # a job's draw does not depend on the others
    assert drawn(a)[250:] == [(a.runtime_of(j), a.hooked(j, "ddp"), a.declared(j, 1000)) for j in jobs[250:]]


def test_the_hook_fraction_of_ddp_jobs_and_only_ddp_jobs():
    w = Workload(mix=DEFAULT_MIX, hook_fraction=0.3, seed=1)
    jobs = trace_jobs(N_JOBS)
    hooked = sum(w.hooked(j, "ddp") for j in jobs)
    assert abs(hooked / N_JOBS - 0.3) <= tolerance(0.3, N_JOBS)
    assert not any(w.hooked(j, rt) for j in jobs[:200] for rt in ("megatron", "sharded", "exact", "torchtitan"))
    assert not any(Workload(hook_fraction=0.0).hooked(j, "ddp") for j in jobs[:200])


def test_a_trace_runtime_is_kept_and_a_runtime_that_cannot_run_the_job_gives_way():
    w = Workload(mix=(("ddp", 0.5), ("megatron", 0.3), ("exact", 0.2)), seed=0)
    named = TraceJob("j", 0.0, "bert__760M", 64, 100, 4, "a100", runtime="torchtitan")
    assert w.runtime_of(named) == "torchtitan"
    assert Workload(trace_runtimes=False).runtime_of(named) == "adaptive"
    jobs = trace_jobs(2000)
    free = [w.runtime_of(j) for j in jobs]
    no_ddp = [w.runtime_of(j, lambda rt: rt != "ddp") for j in jobs]
    # a job that drew ddp takes the next of the mix (megatron); the others keep theirs
    assert no_ddp == ["megatron" if rt == "ddp" else rt for rt in free]
    assert [w.runtime_of(j, lambda rt: False) for j in jobs] == free  # none can: the drawn one


def test_bad_workloads_are_refused():
    with pytest.raises(WorkloadError, match="hook-fraction"):
        Workload(hook_fraction=1.5)
    with pytest.raises(WorkloadError, match="declared-error"):
        Workload(badness=-1.0)
    with pytest.raises(SimError, match="arena-compat"):
        SimOptions(arena_compat=True, runtime_mix=(("ddp", 1.0),))
    with pytest.raises(SimError, match="shares must sum to 1"):
        SimOptions(runtime_mix=(("ddp", 0.5),))


# ---- declared work ----------------------------------------------------------------------


def test_declared_work_follows_the_badness_model():
    """declared / true = 1 + f u with u uniform in [0, 1): checked against the
    uniform law by Kolmogorov-Smirnov (1.63 / sqrt(n): 1% level), and its mean
    against 1 + f / 2 within SIGMAS standard errors (sd of f u: f / sqrt(12))."""
    f, truth, n = 3.0, 10_000, N_JOBS
    w = Workload(badness=f, seed=5)
    ratios = sorted(w.declared(j, truth) / truth for j in trace_jobs(n))
    assert ratios[0] >= 1.0 and ratios[-1] <= 1.0 + f + 1 / truth
    u = [(r - 1.0) / f for r in ratios]
    ks = max(max(abs((i + 1) / n - x), abs(i / n - x)) for i, x in enumerate(u))
    assert ks < 1.63 / math.sqrt(n)
    assert abs(sum(ratios) / n - (1 + f / 2)) <= SIGMAS * f / math.sqrt(12 * n)
    assert all(w.declared(j, 7) >= 7 for j in trace_jobs(100))
    assert [Workload(badness=0.0).declared(j, 123) for j in trace_jobs(50)] == [123] * 50


def test_a_job_runs_its_true_work_whatever_it_declared():
    trace = [job("a", 0.0, 100, 4), job("b", 0.0, 300, 4)]
    opts = SimOptions(restart_per_gpu_s=0.0, restart_max_s=0.0, declared_error=3.0, seed=2)
    sim = Simulator(trace, ONE_NODE, "fcfs", speed=TABLE.speed, estimator=TABLE, options=opts)
    result = sim.run()
    ends = {j.job_id: j.end_time for j in result.jobs}
    assert ends == {"a": 100.0, "b": 300.0}  # 1 s per iteration on 4 GPUs: the truth's iterations
    declared = {sim.trace_ids[sid]: j.spec.iterations for sid, j in sim.world.all_jobs.items()}
    assert declared == {"a": sim.workload.declared(trace[0], 100), "b": sim.workload.declared(trace[1], 300)}
    assert declared["a"] > 100 and declared["b"] > 300


# ---- runtimes in the simulator ----------------------------------------------------------

#: 8 GPUs twice as fast as 4: cellsched grows a lone job once the other is gone
TABLE = Table({("a100", 1): 4.0, ("a100", 2): 2.0, ("a100", 4): 1.0, ("a100", 8): 0.5})


def growing(hook_fraction: float):
    """A long ddp job beside a short one on 8 GPUs, under cellsched."""
    trace = [job("long", 0.0, 20_000, 4), job("short", 0.0, 200, 4)]
    opts = SimOptions(
        restart_per_gpu_s=0.0, restart_max_s=0.0, runtime_mix=(("ddp", 1.0),), hook_fraction=hook_fraction
    )
    sim = Simulator(trace, ONE_NODE, "cellsched", speed=TABLE.speed, estimator=TABLE, options=opts)
    result = sim.run()
    assert {j.spec.runtime for j in sim.world.all_jobs.values()} == {"ddp"}
    return {j.job_id: j for j in result.jobs}


def test_a_ddp_job_without_the_hook_is_never_moved_while_it_runs():
    jobs = growing(0.0)
    long = jobs["long"]
    assert (long.finished, long.restarts, long.cells, long.end_time) == (True, 0, ("a100:1x4",), 20_000.0)


def test_a_ddp_job_that_registered_the_hook_is_moved():
    long = growing(1.0)["long"]
    assert long.restarts == 1 and long.cells == ("a100:1x4", "a100:1x8")
    # moved when the short job ends at 200: its 200 iterations kept, a 5 s checkpoint, the rest on 8 GPUs
    assert long.end_time == pytest.approx(200 + SimOptions().checkpoint_s + (20_000 - 200) * 0.5)


def test_arena_compat_runs_arenas_adaptive_jobs():
    named = [TraceJob(f"j{i}", 0.0, "bert__760M", 64, 50, 4, "a100", runtime="ddp") for i in range(3)]
    cluster = ClusterSpec((NodeGroup("a100", 2, 8),))
    sim = Simulator(named, cluster, "fcfs", speed=TABLE.speed, estimator=TABLE, options=SimOptions(arena_compat=True))
    sim.run()
    assert set(sim.runtimes.values()) == {"adaptive"} and not sim.hooked
    assert {j.spec.runtime for j in sim.world.all_jobs.values()} == {"adaptive"}
    assert sim.workload.badness == 0.0


def test_a_sacct_jobs_spec_names_the_runtime_it_keeps(tmp_path):
    from slurm_ext.sim.traces import load_sacct

    named = '{"global_batch":128,"iterations":10,"model":"bert__760M","runtime":"megatron","version":1}'
    plain = '{"global_batch":128,"iterations":10,"model":"bert__760M","version":1}'
    path = tmp_path / "s.txt"
    path.write_text(
        "JobID|Submit|Start|End|AllocTRES|Comment\n"
        f"1|2024-05-01T10:00:00|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=2|cellsched/v1 {named}\n"
        f"2|2024-05-01T10:00:01|2024-05-01T10:00:01|2024-05-01T11:00:00|gres/gpu=2|cellsched/v1 {plain}\n"
        "3|2024-05-01T10:00:02|2024-05-01T10:00:02|2024-05-01T11:00:00|gres/gpu=2|\n"
    )
    jobs = load_sacct(path).jobs
    # a spec without a runtime is what `cellsched sbatch` records: ddp; a job without a spec says none
    assert [(j.job_id, j.runtime) for j in jobs] == [("1", "megatron"), ("2", "ddp"), ("3", "")]
    w = Workload(mix=(("sharded", 1.0),))
    assert [w.runtime_of(j) for j in jobs] == ["megatron", "ddp", "sharded"]
