"""Jobs that would share a network card, on the real dev cluster.

Unmanaged jobs hold one GPU of each a100 node (n1, n2), so job X (4 a100
GPUs) can only run as a100:2x2 across both. Job Y (2 GPUs, communication
heavy: gpt-1.3b, batch 64) could then run as a100:2x1 on the same two nodes,
sharing X's network cards, or on one a40 node (n4 or n5: no network, but
the slower GPU). The site's [network] says the cards are 10 Gb/s.

- With room elsewhere (Y may use a40), the contention-aware controller keeps
  Y off X's cards; the same controller with `contention_aware = false`
  (every job priced as if alone on its links) puts Y on them, since a100:2x1
  alone is the faster cell.
- With no room elsewhere (Y may use a100 only), sharing the cards beats
  leaving Y waiting, and the controller shares.

Each placement is then carried out by Slurm: the jobs run on the nodes of
their plan.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from controller_support import submit_managed, wait_until, write_config

from slurm_ext.backends import get_backend
from slurm_ext.config import load
from slurm_ext.controller.round import Controller

pytestmark = pytest.mark.slurm

SHARED = ("n1", "n2")


def _blocker(node: str) -> str:
    """An unmanaged job holding one a100 GPU of `node`; its id once it runs."""
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            "a100",
            "-w",
            node,
            "-N1",
            "--gres=gpu:1",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 600",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.strip().split(";")[0]


def _running_on(backend, job_id: str) -> tuple[str, ...] | None:
    job = next((j for j in backend.observe().jobs if j.job_id == job_id), None)
    return tuple(sorted(job.nodes)) if job is not None and job.state == "RUNNING" else None


def _round(tmp_path: Path, y_types: str, contention_aware: bool) -> tuple[dict, dict[str, str]]:
    config = write_config(tmp_path / "cellsched.toml", tmp_path / "state.sqlite")
    with config.open("a") as f:  # the [solver] section is the file's last
        f.write(f"max_pp = 1\nmixed_cells = false\ncontention_aware = {str(contention_aware).lower()}\n")
        f.write("[network]\nnic_gbps = 10.0\n")
    backend = get_backend("cli")
    blockers = [_blocker(n) for n in SHARED]
    wait_until(lambda: all(_running_on(backend, b) for b in blockers), 60, "the blockers to run")
    done = tmp_path / "done"

    def submit(types: str, gpus: int) -> str:
        extra = ("--gpu-types", types, "--min-gpus", str(gpus), "--max-gpus", str(gpus))
        return submit_managed("gpt-1.3b", tmp_path, done_file=done, sleep=60, extra=extra)

    ids = {"x": submit("a100", 4), "y": submit(y_types, 2)}
    report = Controller(load(config)).round()
    placed = {k: report.placements.get(v) for k, v in ids.items()}
    assert all(placed.values()), report
    for k, v in ids.items():  # Slurm carries the plan out
        want = _nodes(placed[k])
        wait_until(lambda v=v, want=want: _running_on(backend, v) == want, 60, f"job {k} to run on {want}")
    return placed, ids


def _nodes(p: dict) -> tuple[str, ...]:
    return tuple(sorted(n.split(":")[0] for n in p["nodes"]))


def test_a_communicating_job_is_kept_off_anothers_cards_when_there_is_room(slurm_cluster, tmp_path):
    placed, _ = _round(tmp_path, "a100,a40", contention_aware=True)
    assert placed["x"]["cell"] == "a100:2x2:pp1" and _nodes(placed["x"]) == SHARED
    assert placed["y"]["cell"] == "a40:1x2:pp1", placed
    assert not set(_nodes(placed["y"])) & set(SHARED)


def test_priced_as_if_alone_the_same_job_shares_the_cards(slurm_cluster, tmp_path):
    placed, _ = _round(tmp_path, "a100,a40", contention_aware=False)
    assert placed["x"]["cell"] == "a100:2x2:pp1"
    assert placed["y"]["cell"] == "a100:2x1:pp1" and _nodes(placed["y"]) == SHARED, placed


def test_with_no_room_elsewhere_sharing_the_cards_beats_waiting(slurm_cluster, tmp_path):
    placed, _ = _round(tmp_path, "a100", contention_aware=True)
    assert placed["x"]["cell"] == "a100:2x2:pp1"
    assert placed["y"]["cell"] == "a100:2x1:pp1" and _nodes(placed["y"]) == SHARED, placed
