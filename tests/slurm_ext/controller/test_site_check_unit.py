"""The live controller checks every plan against the site's hard rules
before it acts (reconcile.checked -> validate_plan with the round's site):
a policy that plans over a GrpTRES limit gets the job that breaks it refused,
with the limit as its reason and a log line, and the job stays held for a
later round (never lost). On the simulated backend, seen through an
accounting that puts every job in account acct-a with GrpTRES=gres/gpu=4.

Oracle, by hand: three held jobs ask for 2 A100s each on 8 A100s; 2 + 2 = 4
is the limit, so the plan's third job (the highest id: placements are
admitted in id order) is refused, "used 6/4"."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from slurm_ext.backends.base import SubmitRequest
from slurm_ext.config import from_dict
from slurm_ext.controller.inputs import Phase
from slurm_ext.controller.progress import EachCall
from slurm_ext.controller.round import Controller
from slurm_ext.records import ClusterSnapshot
from slurm_ext.sim.backend import SimBackend
from slurm_ext.sim.types import ClusterSpec, NodeGroup
from slurm_ext.sim.world import SimWorld
from slurm_ext.site import SiteReading
from slurm_ext.state import StateStore
from solver.contract.jobspec import JobSpec
from solver.estimator import EstimatorLike
from solver.policies import get_policy
from solver.site import GpuLimit, LimitKind, LimitScope, SitePolicy, parse_reason
from solver.types import ScheduleReply, ScheduleRequest

CLUSTER = ClusterSpec((NodeGroup("a100", 2, 4),))
SPEC = JobSpec(model="gpt-350m", global_batch=64, iterations=400, requested_gpus=2, requested_gpu_type="a100")
LIMIT = GpuLimit(LimitScope.ACCOUNT, "acct-a", LimitKind.GRP, 4)


class Accounting:
    """The simulated Slurm with accounting: every job of account acct-a, and acct-a's GPU limit."""

    def __init__(self, sim: SimBackend) -> None:
        self.sim, self.name = sim, sim.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sim, name)

    def observe(self) -> ClusterSnapshot:
        snap = self.sim.observe()
        return dataclasses.replace(snap, jobs=tuple(dataclasses.replace(j, account="acct-a") for j in snap.jobs))

    def read_site(self) -> SiteReading:
        return SiteReading(SitePolicy(limits=(LIMIT,)))


class Blind:
    """FCFS that does not see the site: it plans every job, over the limit."""

    name = "blind"

    def schedule(self, request: ScheduleRequest, estimator: EstimatorLike) -> ScheduleReply:
        assert request.site.limits  # the round did read the limit ...
        return get_policy("fcfs").schedule(dataclasses.replace(request, site=SitePolicy()), estimator)  # ... and not


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def controller_log() -> Iterator[list[logging.LogRecord]]:
    """What the controller logs meanwhile (a handler of its own: the daemon's tests stop propagation)."""
    logger, seen = logging.getLogger("cellsched.controller"), Records()
    was = (logger.level, logger.disabled)
    logger.setLevel(logging.INFO)
    logger.disabled = False
    logger.addHandler(seen)
    try:
        yield seen.records
    finally:
        logger.removeHandler(seen)
        logger.setLevel(was[0])
        logger.disabled = was[1]


def test_a_plan_over_a_grptres_limit_is_refused_and_the_job_waits(tmp_path: Path) -> None:
    world = SimWorld(CLUSTER, speed=lambda spec, gpu_type, nodes, gpus_per_node, plan: 1.0)
    sim = SimBackend(world)
    submit = SubmitRequest(script="job.sh", gres_per_node=1, hold=True, comment=SPEC.to_comment())
    jobs = [sim.submit(submit) for _ in range(3)]
    state = tmp_path / "s.sqlite"
    config = from_dict({"controller": {"state_path": str(state), "kick_file": ""}})
    ctl = Controller(
        config,
        backend=Accounting(sim),
        policy=Blind(),
        state=StateStore(state),
        clock=lambda: world.now,
        progress=EachCall(lambda m: None),
    )
    with controller_log() as logged:
        report = ctl.round()
    first, second, third = jobs
    assert report.status == "ok" and set(report.placements) == {first, second}
    phase = {s.job_id: s.phase for s in report.jobs}
    assert (phase[first], phase[second], phase[third]) == (Phase.RELEASED, Phase.RELEASED, Phase.HELD)
    why = {s.job_id: s.reason for s in report.jobs}[third]
    assert why == "plan rejected: limit account:acct-a GrpTRES gres/gpu used 6/4 planned (4 allowed to managed jobs)"
    kind, fields = parse_reason(
        why.removeprefix("plan rejected: ").removesuffix(" planned (4 allowed to managed jobs)")
    )
    assert kind == "limit" and fields["name"] == "acct-a"
    (line,) = [r for r in logged if r.getMessage() == "placement rejected"]
    assert line.levelno == logging.ERROR and "acct-a" in line.fields["error"]  # type: ignore[attr-defined]
    # never lost: held in Slurm, known to the state, placed once the limit allows
    assert sim.observe().job(third).held and third in ctl.state.jobs()
    world.advance(world.now + 1.0)
    assert {j: sim.observe().job(j).state for j in jobs} == {first: "RUNNING", second: "RUNNING", third: "PENDING"}
    sim.cancel(first)
    world.advance(world.now + 1.0)
    later = ctl.round()
    assert third in later.placements and {s.job_id: s.phase for s in later.jobs}[third] == Phase.RELEASED
    ctl.state.close()
