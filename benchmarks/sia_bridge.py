"""The artifact's half of the cellsched adapter (issue 56): a policy the Sia
artifact's simulator accepts, run in the artifact's environment (numpy
1.23; nothing of cellsched is imported here).

`make_policy` builds a subclass of the artifact's ``SiaPolicy`` (its
cluster admits only that class or Gavel's; ``SiaPolicy.__init__`` and
``populate_valid_configs`` run as for Sia, so the cluster sets the jobs up
as it does for Sia: batch sizes adapted by the simulator). Each round its
``optimize(job_infos, node_infos, prev_allocs)`` describes the jobs and
nodes as one JSON line (benchmarks/sia_policy.py's module doc has the
format) to cellsched's policy, a child process of this project's
interpreter, and returns the allocations it answers.

What a job is told (read from the job_info the cluster makes for Sia, and
from the simulator's job where the job_info has nothing):

* rates: per GPU type, nodes and GPUs (every uniform layout of up to the
  job's max_replicas, the largest over the types as Sia's
  share_max_replicas, GPUs on that type's nodes), the goodput of the
  type's fitted goodput function (the job_info's speedup function, times
  the job's calibration factor as the simulator applies it); for a type
  without a fit, the goodput on a type with one times the ratio of the two
  types' one-GPU throughputs (Sia's project_throughputs); without any fit,
  the type's one-GPU throughput (the simulator's cluster_throughputs,
  samples/s) times the calibration factor, for one GPU;
* restart cost: the artifact's checkpoint-restore delay (its
  application's rescale_time) on the type it runs on, else the largest;
* size (aware only): the job's total work, the progress at which its
  completion epoch ends (its target batch size), times exp(sigma x N(0, 1))
  drawn per job from (seed, name): a user's declaration with a
  multiplicative log-normal error (TODO: unify with the project simulator's
  --declared-error once it lands); progress so far, the job's own.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def layouts(per_node: int, nodes: int, max_gpus: int) -> list[tuple[int, int]]:
    """(nodes, GPUs) of every uniform layout of at most max_gpus GPUs."""
    return [(n, n * g) for n in range(1, nodes + 1) for g in range(1, per_node + 1) if n * g <= max_gpus]


def declared(job: Any, sigma: float, seed: int) -> float:
    app = job.reference_app
    true = app.get_progress(app.get_completion_epoch(job.target_batch_size) + 1)
    return float(true) * math.exp(sigma * random.Random(f"{seed}:{job.name}").gauss(0.0, 1.0))


def make_policy(
    cellsched_python: str,
    aware: bool,
    sigma: float,
    seed: int,
    sets: list[str] | None = None,
    scheduler: str = "cellsched",
) -> Any:
    import numpy as np
    from sia import SiaPolicy  # the artifact's

    class CellschedBridge(SiaPolicy):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.aware, self.sigma, self.seed = aware, sigma, seed
            self.cluster: Any = None
            self.since: dict[str, float] = {}
            self.last: dict[str, Any] = {}
            self.stats = {"policy_s": 0.0, "bridge_s": 0.0}
            self.proc = subprocess.Popen(
                [
                    cellsched_python,
                    str(HERE / "sia_policy.py"),
                    "--serve",
                    f"--scheduler={scheduler}",
                    *(f"--set={s}" for s in sets or []),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )

        def attach(self, cluster: Any) -> None:
            self.cluster = cluster
            self.jobs = {j.name: j for j in cluster.jobs}

        def close(self) -> None:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=60)

        def rates(self, name: str, info: Any) -> list[list[Any]]:
            job = self.jobs[name]
            types = self.cluster.clusters
            cap = max(int(v) for v in info.max_replicas.values())
            fitted = {t: f for t, f in info.speedup_fn.items() if f is not None}
            thr = info.cluster_throughputs
            out: list[list[Any]] = []
            for t in types:
                lay = layouts(self.cluster.ngpus_per_node[t], self.cluster.num_nodes[t], cap)
                src = t if t in fitted else next(iter(sorted(fitted)), None)
                if src is None:
                    out.append([t, 1, 1, float(thr[t]) * job.calibration_factor])
                    continue
                nn = np.array([n for n, _ in lay])
                gg = np.array([g for _, g in lay])
                good = np.atleast_1d(fitted[src].get_goodput(nn, gg)) * job.calibration_factor
                scale = 1.0 if src == t else float(thr[t]) / float(thr[src])
                out += [[t, int(n), int(g), float(x) * scale] for n, g, x in zip(nn, gg, good, strict=True)]
            return out

        def describe(
            self, job_infos: dict[str, Any], node_infos: dict[str, Any], prev: dict[str, Any]
        ) -> dict[str, Any]:
            now = self.cluster.current_time
            nodes = [
                {"name": f"{t}-{i}", "type": t, "index": int(i), "gpus": int(ni.resources["nvidia.com/gpu"])}
                for t, per in node_infos.items()
                for i, ni in per.items()
            ]
            jobs = []
            for name, info in job_infos.items():
                job = self.jobs[name]
                cur = prev.get(name)
                current = None
                if cur and len(cur[1]) > 0:
                    counts: dict[str, int] = {}
                    for i in cur[1]:
                        counts[f"{cur[0]}-{i}"] = counts.get(f"{cur[0]}-{i}", 0) + 1
                    current = {"type": cur[0], "nodes": counts}
                delays = {t: a.rescale_time or 30 for t, a in job.applications.items() if t in node_infos}
                jobs.append(
                    {
                        "id": name,
                        "submit": float(job.submission_time),
                        "restarts": int(job.num_restarts or 0),
                        "restart_cost_s": float(delays.get(job.current_cluster, max(delays.values()))),
                        "rates": self.rates(name, info),
                        "min_gpus": 1,
                        "max_gpus": max(int(v) for v in info.max_replicas.values()),
                        "work": declared(job, self.sigma, self.seed) if self.aware else None,
                        "done": float(job.progress),
                        "current": current,
                        "running_since": self.since.get(name),
                    }
                )
            return {"now": float(now), "aware": self.aware, "nodes": nodes, "jobs": jobs}

        def optimize(
            self, job_infos: dict[str, Any], node_infos: dict[str, Any], prev_allocs: dict[str, Any]
        ) -> dict[str, Any]:
            t0 = time.perf_counter()
            desc = self.describe(job_infos, node_infos, prev_allocs)
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(desc) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("cellsched's policy process ended (see its stderr)")
            answer = json.loads(line)
            self.stats["policy_s"] += float(answer["solve_s"])
            allocs = {j: (t, tuple(ids)) for j, (t, ids) in answer["allocations"].items()}
            now = float(self.cluster.current_time)
            for j in job_infos:
                if allocs.get(j) != self.last.get(j):
                    self.since[j] = now
            self.last = allocs
            self.stats["bridge_s"] += time.perf_counter() - t0
            return allocs

    return CellschedBridge()
