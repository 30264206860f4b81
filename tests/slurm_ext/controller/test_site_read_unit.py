"""The controller reads the site's policy each round (Backend.read_site):
jobs carry their account, QOS, priority, time limit and reservation; a plain
pending GPU job and the GPUs of running ones reach the request; a policy that
cannot be read costs no round: an empty policy, one warning, a retry after
SITE_RETRY_S; the partition a job is updated to is one its account may use."""

from __future__ import annotations

import logging

from test_controller_unit import managed_job, snapshot

from slurm_ext.backends import SlurmCommandError
from slurm_ext.config import from_dict
from slurm_ext.controller.round import SITE_RETRY_S, Controller
from slurm_ext.records import SlurmJob
from slurm_ext.site import SiteReading
from solver.contract.jobspec import JobSpec
from solver.policies import get_policy
from solver.site import GpuLimit, LimitKind, LimitScope, PartitionAccess, SitePolicy

LIMIT = GpuLimit(LimitScope.ACCOUNT, "acct-a", LimitKind.GRP, 4)
#: a running plain job of acct-a with 2 GPUs on n4, a pending one of acct-b asking for 4
RUNNING = SlurmJob(
    "50", user="bob", state="RUNNING", account="acct-a", qos="normal", nodes=("n4",), num_nodes=1, gpus_per_node=2
)
PENDING = SlurmJob(
    "51", user="bob", state="PENDING", reason="Priority", account="acct-b", partition="a100", gpus_per_node=4,
    num_nodes=1, priority=9000, submit_time=950.0,
)  # fmt: skip


class Site:
    """A backend observing one snapshot whose read_site fails while `fail` is set."""

    name = "site"

    def __init__(self, policy: SitePolicy, **job: object) -> None:
        self.policy, self.fail, self.reads, self.job = policy, True, 0, job

    def observe(self):
        job = managed_job("2", account="acct-a", qos="normal", priority=0, time_limit=30, reservation="r1", **self.job)
        return snapshot(job, RUNNING, PENDING)

    def read_site(self) -> SiteReading:
        self.reads += 1
        if self.fail:
            raise SlurmCommandError(["sacctmgr"], 1, "You are not running a supported accounting_storage plugin")
        return SiteReading(self.policy)


class Spy:
    """The cellsched policy, keeping each request it was given."""

    name = "spy"

    def __init__(self) -> None:
        self.inner, self.requests = get_policy("cellsched"), []

    def schedule(self, request, estimator):
        self.requests.append(request)
        return self.inner.schedule(request, estimator)


class Messages(logging.Handler):
    """The messages the controller logs (a handler of its own: another test may
    have configured the logger not to propagate, as the daemon does)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_site_that_cannot_be_read_costs_no_round_and_is_tried_again(tmp_path):
    clock = [1000.0]
    backend, spy = Site(SitePolicy(limits=(LIMIT,))), Spy()
    config = from_dict({"controller": {"state_path": str(tmp_path / "s.sqlite")}})
    ctl = Controller(config, backend=backend, policy=spy, clock=lambda: clock[0])
    logger, seen = logging.getLogger("cellsched.controller"), Messages()
    level, disabled = logger.level, logger.disabled
    logger.setLevel(logging.INFO)
    logger.disabled = False
    logger.addHandler(seen)
    try:
        for _ in range(3):  # fails, then rounds within SITE_RETRY_S do not ask again
            assert ctl.round(dry_run=True).status == "ok"
            clock[0] += 1.0
        assert backend.reads == 1 and all(r.site == SitePolicy() for r in spy.requests)
        assert (
            seen.messages.count(
                "site policy not read: scheduling without accounts, limits, fair share and reservations"
            )
            == 1
        )
        clock[0] += SITE_RETRY_S
        backend.fail = False
        assert ctl.round(dry_run=True).status == "ok"
        assert backend.reads == 2 and "site policy read again" in seen.messages
    finally:
        logger.removeHandler(seen)
        logger.setLevel(level)
        logger.disabled = disabled
    site = spy.requests[-1].site
    # the running plain job's 2 GPUs count under acct-a's limit; the pending one claims its 4 by its priority
    assert site.limits == (GpuLimit(LimitScope.ACCOUNT, "acct-a", LimitKind.GRP, 4, used_outside=2),)
    (u,) = site.unmanaged
    assert (u.job_id, u.gpus, u.partitions, u.priority, u.account) == ("51", 4, ("a100",), 9000.0, "acct-b")
    (job,) = spy.requests[-1].jobs
    assert (job.account, job.qos, job.time_limit_s, job.reservation) == ("acct-a", "normal", 1800.0, "r1")
    ctl.state.close()


def test_a_job_is_updated_only_to_a_partition_its_account_may_use(tmp_path):
    """The a100 nodes are in partitions a100 and all; acct-a may not use a100:
    a placement on them goes through `all`."""
    a100 = JobSpec(model="gpt-350m", global_batch=64, iterations=100, gpu_types=("a100",))
    backend = Site(
        SitePolicy(partition_access={"a100": PartitionAccess(accounts=("acct-b",))}), comment=a100.to_comment()
    )
    backend.fail = False
    config = from_dict({"controller": {"state_path": str(tmp_path / "s.sqlite")}})
    ctl = Controller(config, backend=backend, policy=get_policy("cellsched"))
    report = ctl.round(dry_run=True)
    (place,) = [a for a in report.actions if a["job"] == "2"]
    assert {n.split(":")[0] for n in place["nodes"]} <= {"n1", "n2"} and place["partition"] == "all", place
    ctl.state.close()
