"""Slurm records -> the solver's ClusterView."""

import dataclasses

from slurm_ext.parse import json_output as J
from slurm_ext.parse import scontrol_text as T
from slurm_ext.records import ClusterSnapshot
from slurm_ext.view import to_cluster_view


def snapshot(sample, nodes_file="sinfo.json"):
    return ClusterSnapshot(
        nodes=J.parse_nodes(sample(nodes_file)),
        partitions=T.parse_partitions(sample("scontrol_show_-o_partition.txt")),
        jobs=J.parse_jobs(sample("squeue.json")),
        taken_at=0.0,
    )


def free(view):
    return {n.name: n.gpus_free for n in view.nodes}


def test_unmanaged_running_jobs_hold_their_gpus(sample):
    # job 6 runs 3 a100 GPUs on n1 and n2, job 7 runs 2 v100 GPUs on n3
    view = to_cluster_view(snapshot(sample), managed_job_ids=set())
    assert free(view) == {"n1": 1, "n2": 1, "n3": 2, "n4": 4}
    assert view.gpu_types() == ("a100", "v100")
    assert view.partitions["a100"] == ("n1", "n2") and view.partitions["all"] == ("n1", "n2", "n3", "n4")
    assert view.node("n3").partitions == ("v100", "all") and view.node("n3").gpus_total == 4


def test_managed_jobs_gpus_count_as_free(sample):
    view = to_cluster_view(snapshot(sample), managed_job_ids={"6"})
    assert free(view) == {"n1": 4, "n2": 4, "n3": 2, "n4": 4}
    view = to_cluster_view(snapshot(sample), managed_job_ids={"6", "7", "9"})
    assert free(view) == {"n1": 4, "n2": 4, "n3": 4, "n4": 4}


def test_unavailable_nodes_have_nothing_free(sample):
    snap = snapshot(sample)
    drained = dataclasses.replace(snap.node("n4"), flags=("DRAIN",))
    down = dataclasses.replace(snap.node("n2"), state="down")
    snap = dataclasses.replace(snap, nodes=tuple({"n4": drained, "n2": down}.get(n.name, n) for n in snap.nodes))
    assert free(to_cluster_view(snap, managed_job_ids={"6"})) == {"n1": 4, "n2": 0, "n3": 2, "n4": 0}


def test_allocation_reported_by_slurm_wins_when_larger(sample):
    """GPUs allocated on a node by a job that asked for them per job (no
    per-node request visible) still count as taken."""
    snap = snapshot(sample)
    busy = dataclasses.replace(snap.node("n4"), gpus_alloc=3)
    snap = dataclasses.replace(snap, nodes=tuple(busy if n.name == "n4" else n for n in snap.nodes))
    assert free(to_cluster_view(snap, managed_job_ids=set()))["n4"] == 1


def test_24_11_cluster(sample):
    """Recorded on 24.11 (data/24.11): job "run" holds 4 GPUs on each of n1, n2; n3 is drained."""
    ids = dict(line.split("=") for line in sample("24.11/ids.txt").split())
    snap = ClusterSnapshot(
        nodes=J.parse_nodes(sample("24.11/scontrol_show_node_v0.0.42.json")),
        partitions=T.parse_partitions(sample("24.11/scontrol_-o_show_partition.txt")),
        jobs=J.parse_jobs(sample("24.11/squeue_v0.0.42.json")),
        taken_at=0.0,
    )
    others = {"n3": 0, "n4": 2, "n5": 2, "n6": 2}
    assert free(to_cluster_view(snap, managed_job_ids=set())) == {"n1": 0, "n2": 0, **others}
    assert free(to_cluster_view(snap, managed_job_ids={ids["run"]})) == {"n1": 4, "n2": 4, **others}


def test_gpus_still_counted_for_a_job_that_ended_are_its_own_when_it_is_placed_again(sample):
    """Job 3 ended on n3 (1 GPU per node), where job 7 runs 2 GPUs. A node
    read before the job's end (or not freed yet) still counts job 3's GPU:
    taken for anyone, unless job 3 is placed again (`ending_job_ids`: it
    checkpointed), for which it is its own. Only what the running jobs do
    not explain is: a GPU Slurm freed already is not taken from another."""
    snap = snapshot(sample)
    assert snap.job("3").finished and snap.job("3").nodes == ("n3",) and snap.job("3").gpus_per_node == 1
    lagging = dataclasses.replace(snap.node("n3"), gpus_alloc=3)
    stale = dataclasses.replace(snap, nodes=tuple(lagging if n.name == "n3" else n for n in snap.nodes))
    assert free(to_cluster_view(stale, managed_job_ids=set()))["n3"] == 1
    assert free(to_cluster_view(stale, managed_job_ids=set(), ending_job_ids={"3"}))["n3"] == 2
    assert free(to_cluster_view(stale, managed_job_ids={"7"}, ending_job_ids={"3"}))["n3"] == 4
    # Slurm freed it already: job 7's GPUs stay taken
    assert free(to_cluster_view(snap, managed_job_ids=set(), ending_job_ids={"3"}))["n3"] == 2
    # only a job that ended: one still running holds its GPUs
    assert free(to_cluster_view(stale, managed_job_ids=set(), ending_job_ids={"7"}))["n3"] == 1
