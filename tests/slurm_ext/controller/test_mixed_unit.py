"""The controller's side of a mixed-GPU-type cell, without Slurm."""

import json

from slurm_ext.config import Config
from slurm_ext.controller import inputs as inp
from slurm_ext.controller.reconcile import PLACE, decide
from slurm_ext.jobspec import JobSpec
from slurm_ext.records import ClusterSnapshot, SlurmJob, SlurmNode, SlurmPartition
from solver.mixed import mixed_cell
from solver.plan import JobPlan
from solver.types import ParallelPlan, Placement

SPEC = JobSpec(model="gpt-tiny", global_batch=24, iterations=10, gpu_types=("a40", "a10"), min_gpus=6)
NODES = (("n4", "a40"), ("n5", "a40"), ("n6", "a10"))


def snapshot(*jobs: SlurmJob) -> ClusterSnapshot:
    nodes = tuple(
        SlurmNode(name=n, gpu_type=t, gpus_total=2, gpus_alloc=0, state="idle", partitions=(t, "all")) for n, t in NODES
    )
    parts = (
        SlurmPartition(name="a40", nodes=("n4", "n5")),
        SlurmPartition(name="a10", nodes=("n6",)),
        SlurmPartition(name="all", nodes=("n4", "n5", "n6")),
    )
    return ClusterSnapshot(nodes=nodes, partitions=parts, jobs=jobs, taken_at=1000.0)


def test_a_mixed_placement_is_released_as_one_ordinary_job():
    job = SlurmJob(
        job_id="7",
        user="alice",
        state="PENDING",
        held=True,
        reason="JobHeldUser",
        partition="a40",
        comment=SPEC.to_comment(),
        submit_time=900.0,
        gpus_per_node=2,
    )
    snap = snapshot(job)
    jobs = inp.classify(snap, {}, {})
    view = inp.build_request(snap, jobs, {}, Config().solver).view
    cell = mixed_cell((("a10", 1), ("a40", 2)), 2)
    p = Placement("7", cell, (("n6", 2), ("n5", 2), ("n4", 2)), ParallelPlan(1, 6, 1, 1, (6, 3)), 0.5)
    (a,) = decide(jobs, {"7": p}, view, "/ck")
    u = a.update
    assert a.kind == PLACE and (u.partition, u.features, u.num_nodes, u.gres_per_node) == ("all", "", 3, 2)
    assert (u.req_nodes, u.num_tasks, u.tasks_per_node) == (("n4", "n5", "n6"), 6, 2)
    plan = JobPlan.from_dict(json.loads(u.admin_comment)["plan"])
    assert plan.nodes == ("n4", "n5", "n6") and plan.gpu_types == ("a10", "a40") and plan.cell == cell.key()
    assert plan.batch_shares == (3, 3, 3, 3, 6, 6)  # per dp rank in task order: a40 ranks 3, a10 ranks 6
    again = inp.placement_of("7", plan)  # read back from the AdminComment once it runs
    assert again is not None and again.cell == cell and again.same_resources(p)
