"""The active/standby lease (slurm_ext.controller.lease) without Slurm: take,
renew, expire, take-over after expiry, never two holders (contenders racing
on real threads), fencing; a controller round under the lease on the
simulated Slurm (standby changes nothing; one that loses the lease mid-round
applies nothing); the config keys and the fail-safe reading the lease."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from controller_support import DiesAt

from slurm_ext.backends.base import SubmitRequest
from slurm_ext.config import ConfigError, from_dict
from slurm_ext.controller.lease import FencedBackend, FileLease, LeaseLost, LeaseRecord, boottime
from slurm_ext.controller.round import Controller
from slurm_ext.failsafe.check import last_completed
from slurm_ext.sim.backend import SimBackend
from slurm_ext.sim.types import ClusterSpec, NodeGroup
from slurm_ext.sim.world import SimWorld
from slurm_ext.state import RoundStatus, StateStore
from solver.contract.jobspec import JobSpec

LEASE_S, SETTLE_S = 10.0, 1.0


class Clock:
    """A shared fake clock (wall and elapsed alike); `sleep` advances it."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def lease(path: Path, clock: Clock, holder: str) -> FileLease:
    return FileLease(str(path), LEASE_S, SETTLE_S, holder=holder, clock=clock, elapsed=clock, sleep=clock.sleep)


def record(path: Path) -> dict:
    return json.loads(path.read_text())


def test_take_renew_expire_and_take_over(tmp_path):
    path, clock = tmp_path / "lease", Clock()
    a, b = lease(path, clock, "a"), lease(path, clock, "b")
    assert a.acquire() and a.held() and a.epoch == 1
    rec = record(path)
    assert rec["holder"] == "a" and rec["epoch"] == 1 and rec["expires_at"] == 1000.0 + LEASE_S
    # valid on its own clock from before its write, less the settle time
    assert a.remaining() == pytest.approx(LEASE_S - SETTLE_S - SETTLE_S)

    assert not b.acquire() and not b.held()  # held and unexpired: the standby writes nothing
    assert record(path) == rec

    clock.t += 5
    assert a.acquire() and a.epoch == 1  # a renewal: same epoch, later expiry
    renewed = record(path)
    assert renewed["serial"] == rec["serial"] + 1 and renewed["expires_at"] == clock.t + LEASE_S
    assert not b.acquire()

    clock.t += LEASE_S  # the holder stopped renewing (SIGKILL): its lease lapses on its clock ...
    assert not a.held()
    assert b.acquire() and b.epoch == 2  # ... and, past the record's expiry, the standby takes it
    assert record(path)["holder"] == "b"
    assert not a.acquire() and not a.held()  # the old holder is standby now
    with pytest.raises(LeaseLost):
        a.fence()


def test_a_holder_not_renewing_in_time_does_not_renew_after_expiry(tmp_path):
    """Past its own validity a holder does not renew (another may hold it):
    it takes the lease like anyone else, once the record has expired."""
    path, clock = tmp_path / "lease", Clock()
    a = lease(path, clock, "a")
    assert a.acquire()  # written at 1000 (expires at 1010), read back at 1001, valid until 1009
    clock.t = 1009.5  # own validity over, the record's not yet
    assert not a.held() and not a.acquire()
    clock.t = 1010.1
    assert a.acquire() and a.epoch == 2


def test_a_clean_release_lets_the_standby_take_over_at_once(tmp_path):
    path, clock = tmp_path / "lease", Clock()
    a, b = lease(path, clock, "a"), lease(path, clock, "b")
    assert a.acquire()
    a.release()
    assert not a.held() and b.acquire() and record(path)["holder"] == "b"
    a.release()  # not held: changes nothing
    assert record(path)["holder"] == "b"


def test_a_slow_contender_gives_up(tmp_path):
    """A contender whose write lands more than settle_s / 2 after its read
    cannot know that nobody read the lease free meanwhile: it does not take it."""
    path, clock = tmp_path / "lease", Clock()
    a, b = lease(path, clock, "a"), lease(path, clock, "b")
    real_read = a.read

    def read_then_b_takes_it() -> LeaseRecord | None:
        rec = real_read()
        if rec is None:  # a saw it free; before a writes, b takes it whole (and time passes)
            assert b.acquire()
        return rec

    a.read = read_then_b_takes_it  # type: ignore[method-assign]
    assert not a.acquire() and not a.held()
    assert b.held()  # b still believes it holds ... and a's stray write makes b lose it at its next renewal:
    assert not b.acquire() and not b.held()
    assert record(path)["holder"] == "a"  # held by nobody until it expires; never by two


def _race(path: Path, contenders: int) -> tuple[list[FileLease], dict[int, bool]]:
    """Contenders on real threads and clocks that all read the lease at
    `path` free before any of them writes; (their leases, who says it took it).
    Each one's wait for the others' reads is the test's doing, so its own
    elapsed clock leaves it out: the protocol's write window (settle_s / 2)
    runs from the moment all have read."""
    waited = [0.0] * contenders  # seconds each contender spent waiting for the others' reads
    all_read = threading.Barrier(contenders)

    def contender(i: int) -> FileLease:
        le = FileLease(str(path), 2.0, 0.25, holder=f"c{i}", elapsed=lambda: boottime() - waited[i])
        first = le.read

        def read_once() -> LeaseRecord | None:
            rec = first()
            if rec is None:
                t = boottime()
                all_read.wait(timeout=10)
                waited[i] += boottime() - t
            return rec

        le.read = read_once  # type: ignore[method-assign]
        return le

    leases = [contender(i) for i in range(contenders)]
    results: dict[int, bool] = {}

    def acquire(i: int) -> None:
        results[i] = leases[i].acquire()

    threads = [threading.Thread(target=acquire, args=(i,)) for i in range(contenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    return leases, results


@pytest.mark.parametrize("contenders", [2, 3])
def test_contenders_that_all_see_the_lease_free_never_both_take_it(tmp_path, contenders):
    """Every contender reads the lease free before any writes; exactly one
    holds it after the read-back: the last writer (the others read its
    record back). A write landing later than settle_s / 2 after the last read
    would still give up; on a machine that slow none might win."""
    for attempt in range(10):
        path = tmp_path / f"lease-{attempt}"
        leases, results = _race(path, contenders)
        winners = [i for i, ok in results.items() if ok]
        assert len(results) == contenders and len(winners) == 1, results
        assert [i for i, le in enumerate(leases) if le.held()] == winners
        assert record(path)["holder"] == f"c{winners[0]}"


def test_fencing_detects_a_lease_taken_over_by_another_writer(tmp_path):
    """The holder's own clock says valid, but the file is another's (a host
    with a skewed clock, an operator): check() reads it and raises."""
    path, clock = tmp_path / "lease", Clock()
    a = lease(path, clock, "a")
    assert a.acquire()
    a.fence()  # well within the lease: no I/O needed
    path.write_text(LeaseRecord("intruder", 7, 99, clock.t, clock.t + LEASE_S).to_json())
    with pytest.raises(LeaseLost):
        a.check()
    assert not a.held()


def test_the_fenced_backend_fences_writes_only(tmp_path):
    calls: list[str] = []

    class Inner:
        name = "inner"

        def observe(self) -> str:
            return "snap"

        def release_many(self, ids: list[str]) -> dict:
            calls.append("release")
            return {}

    def fence() -> None:
        calls.append("fence")

    fenced = FencedBackend(Inner(), fence)
    assert fenced.observe() == "snap" and calls == []
    assert fenced.release_many(["1"]) == {} and calls == ["fence", "release"]

    def lost() -> None:
        raise LeaseLost("gone")

    with pytest.raises(LeaseLost):
        FencedBackend(Inner(), lost).release_many(["1"])
    assert calls == ["fence", "release"]  # nothing released without the lease


def test_an_unreadable_lease_file_is_not_held(tmp_path):
    (tmp_path / "dir").mkdir()
    clock = Clock()
    a = lease(tmp_path / "dir", clock, "a")  # a directory: every read fails
    assert not a.acquire() and not a.held()


def test_a_garbled_lease_file_is_free(tmp_path):
    path, clock = tmp_path / "lease", Clock()
    path.write_text("{not json")
    assert lease(path, clock, "a").acquire()


# --- config ---------------------------------------------------------------------


def test_config_keys_and_their_checks():
    cc = from_dict({}).controller
    assert cc.lease_path == "" and cc.lease_s == 30.0 and cc.lease_settle_s == 1.0
    cc = from_dict({"controller": {"lease_path": "/shared/lease", "lease_s": 5, "lease_settle_s": 0.5}}).controller
    assert (cc.lease_path, cc.lease_s, cc.lease_settle_s) == ("/shared/lease", 5.0, 0.5)
    with pytest.raises(ConfigError, match="controller.lease_settle_s"):
        from_dict({"controller": {"lease_s": 2, "lease_settle_s": 1}})
    with pytest.raises(ConfigError, match="controller.lease_s must be > 0"):
        from_dict({"controller": {"lease_s": 0}})


# --- a round under the lease (simulated Slurm) -----------------------------------

CLUSTER = ClusterSpec((NodeGroup("a100", 2, 4),))


def sim_with_job() -> tuple[SimWorld, SimBackend, str]:
    world = SimWorld(CLUSTER, speed=lambda spec, gpu_type, nodes, gpus_per_node, plan: 1.0)
    sim = SimBackend(world)
    spec = JobSpec(model="gpt-350m", global_batch=32, iterations=10_000)
    return world, sim, sim.submit(SubmitRequest(script="job.sh", gres_per_node=1, hold=True, comment=spec.to_comment()))


def controller(tmp_path: Path, name: str, backend, world: SimWorld, lease_path: Path) -> Controller:
    state = tmp_path / f"{name}.sqlite"
    config = from_dict(
        {"controller": {"state_path": str(state), "kick_file": "", "lease_path": str(lease_path), "lease_s": 10.0}}
    )
    return Controller(config, backend=backend, state=StateStore(state), clock=lambda: world.now)


def test_without_a_lease_the_controller_has_none(tmp_path):
    world, sim, _ = sim_with_job()
    config = from_dict({"controller": {"state_path": str(tmp_path / "s.sqlite"), "kick_file": ""}})
    ctl = Controller(config, backend=sim, state=StateStore(tmp_path / "s.sqlite"), clock=lambda: world.now)
    assert ctl.lease is None and ctl.round().status == RoundStatus.OK


def test_only_the_holder_acts_and_the_standby_records_standby_rounds(tmp_path):
    world, sim, job = sim_with_job()
    path = tmp_path / "lease"
    probe_a, probe_b = DiesAt(sim, None), DiesAt(sim, None)
    a, b = controller(tmp_path, "a", probe_a, world, path), controller(tmp_path, "b", probe_b, world, path)
    ra = a.round()
    rb = b.round()
    assert ra.status == RoundStatus.OK and [x["job"] for x in ra.actions] == [job]
    assert rb.status == RoundStatus.STANDBY and rb.actions == () and "held by " in rb.error
    assert probe_a.writes == 3 and probe_b.writes == 0  # update + release + tidy by a; nothing by b
    assert b.state.rounds()[0]["status"] == "standby" and b.state.last_completed_round() is None
    rec = a.lease.read()  # renewed when the round completed, with when that was
    assert rec is not None and rec.holder == a.lease.holder and rec.last_round_at == a.state.last_completed_round()
    # the fail-safe on b's host counts a's rounds, read from the lease
    assert last_completed(str(tmp_path / "b.sqlite"), str(path)) == a.state.last_completed_round()
    assert last_completed(str(tmp_path / "b.sqlite")) is None
    for c in (a, b):
        c.state.close()


def test_a_controller_that_loses_the_lease_mid_round_applies_nothing(tmp_path):
    world, sim, job = sim_with_job()
    path = tmp_path / "lease"
    probe = DiesAt(sim, None)
    a = controller(tmp_path, "a", probe, world, path)
    schedule = a.policy.schedule

    def solve_then_lose(request, estimator):
        reply = schedule(request, estimator)
        path.write_text(LeaseRecord("other", 9, 99, 0.0, 1e12).to_json())  # taken over while a solved
        return reply

    a.policy.schedule = solve_then_lose  # type: ignore[method-assign]
    report = a.round()
    assert report.status == RoundStatus.STANDBY and report.actions == () and probe.writes == 0
    assert "does not hold the lease" in report.error
    assert sim.observe().job(job).held and a.state.last_completed_round() is None
    a.state.close()
