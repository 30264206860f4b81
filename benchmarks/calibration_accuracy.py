"""How far online calibration moves the estimates toward the truth in the
simulator's realistic mode, without a whole simulation.

Truth and belief are `cellsched simulate --realistic`'s: Arena's measured
table (gaps filled by our estimator) with the seeded per-job noise (sigma
0.1, half that per GPU type), against Arena's profiler estimates. Each of
the first --jobs jobs of Arena's Philly trace is seen in one cell: its
requested count of its requested GPU type, packed on as few nodes as the
--cluster's node size allows (default: Arena's cluster). Its observed / estimated iteration time there,
seen --samples rounds, is the observation the controller records. Every
other cell of the job that both truth and estimate hold (1 to 16 GPUs of
each type of the cluster) is then predicted by:

  none        the estimate alone (calibrate=false);
  calibrated  solver.calibration over every job's observation;
and the job's own first cell, before it ran, by
  none-first  the estimate alone;
  unseen      calibration over the other jobs' observations only (a job
              just submitted learns from the jobs before it).

A trace without users is, as the simulator submits it, one user's
(`--per-job-users`: each job its own). Prints one JSON line per predictor:
the mean, median and 90th percentile of |log(predicted / true)| (about the
relative error) and the share of cells within 10%.

    python benchmarks/calibration_accuracy.py [--jobs 300] [--samples 10] [--seed 0] [--cluster SPEC]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

from slurm_ext.sim.clusterspec import ClusterSpecError, arena_cluster, load_cluster_spec
from slurm_ext.sim.conditions import Conditions
from slurm_ext.sim.traces import read_arena_trace
from solver.arena.estimates import ArenaEstimates
from solver.calibration import Calibration, Observation
from solver.contract.profiles.arena import TRACE_FILE, shipped_path
from solver.types import Cell

COUNTS = (1, 2, 4, 8, 16)


def packed(node_gpus: dict[str, int], gpu_type: str, gpus: int) -> Cell:
    """`gpus` GPUs of `gpu_type` on as few nodes of `node_gpus[gpu_type]` GPUs as hold them."""
    per_node = min(node_gpus[gpu_type], gpus)
    return Cell(gpu_type, gpus // per_node, per_node, 1)


def summary(name: str, errors: list[float]) -> dict[str, object]:
    errors = sorted(errors)
    return {
        "predictor": name,
        "cells": len(errors),
        "mean_abs_log_err": round(statistics.mean(errors), 4),
        "median": round(statistics.median(errors), 4),
        "p90": round(errors[int(0.9 * (len(errors) - 1))], 4),
        "within_10pct": round(sum(e <= math.log(1.1) for e in errors) / len(errors), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=300, help="first N jobs of the trace (default 300)")
    ap.add_argument("--samples", type=int, default=10, help="rounds each observation was seen (default 10)")
    ap.add_argument("--seed", type=int, default=0, help="the noise's seed, as simulate --seed (default 0)")
    ap.add_argument("--per-job-users", action="store_true", help="each job its own user (default: one user)")
    ap.add_argument("--cluster", help="cluster spec whose node sizes pack the cells (default: Arena's cluster)")
    args = ap.parse_args()
    try:
        spec = load_cluster_spec(args.cluster) if args.cluster else arena_cluster()
    except ClusterSpecError as exc:
        ap.error(f"--cluster: {exc}")
    node_gpus: dict[str, int] = {}
    for g in spec.groups:
        node_gpus[g.gpu_type] = max(node_gpus.get(g.gpu_type, 0), g.gpus_per_node)

    cond = Conditions.realistic(seed=args.seed)
    estimates, truth = ArenaEstimates(), ArenaEstimates.filled_truth()

    def ratio(job, cell: Cell) -> float | None:
        """The job's true / estimated iteration time in `cell` (None: either lacks it)."""
        args_ = (job.model, job.global_batch, cell.gpu_type, cell.num_nodes, cell.gpus_per_node)
        est, true = estimates.iter_time(*args_), truth.iter_time(*args_)
        if not est or not true:
            return None
        return true * cond.speed_factor(job.job_id, cell.gpu_type) / est

    observations, targets, first_cell = [], [], {}
    for job in read_arena_trace(shipped_path(TRACE_FILE))[: args.jobs]:
        if job.requested_gpu_type not in node_gpus:
            continue
        first = packed(node_gpus, job.requested_gpu_type, job.requested_gpus)
        r0 = ratio(job, first)
        if r0 is None:
            continue
        user = f"u-{job.job_id}" if args.per_job_users else "sim"
        observations.append(Observation(job.job_id, user, job.model, first.gpu_type, r0, args.samples))
        first_cell[job.job_id] = first
        for gpu_type in node_gpus:
            for gpus in COUNTS:
                cell = packed(node_gpus, gpu_type, gpus)
                r = ratio(job, cell) if cell != first else None
                if r is not None:
                    targets.append((job.job_id, job.model, cell, r))

    calibration = Calibration(observations)
    rows = [
        summary("none", [abs(math.log(r)) for *_, r in targets]),
        summary("calibrated", [abs(math.log(r / calibration.factor(j, m, cell))) for j, m, cell, r in targets]),
        summary("none-first", [abs(math.log(o.ratio)) for o in observations]),
    ]
    unseen = []
    for i, o in enumerate(observations):
        others = Calibration(observations[:i] + observations[i + 1 :])
        cell = first_cell[o.job_id]
        unseen.append(abs(math.log(o.ratio / others.factor(o.job_id, o.model, cell))))
    rows.append(summary("unseen", unseen))
    for row in rows:
        print(json.dumps({"observations": len(observations), **row}))


if __name__ == "__main__":
    main()
