"""Golden records of the cli backend's Slurm argument lists: every command a
representative call runs, in order, must equal golden/cli_backend.json, so
that any change of an argument (or of their order) fails here.

The commands run through an ArgvRecorder at CliBackend's `run` seam. Reads
are answered with the recorded outputs under data/ (22.05: the dev cluster;
24.11: the dev cluster in data/24.11), writes with nothing, as Slurm does.

After a meant change, rewrite the golden file and review its diff:

    CELLSCHED_UPDATE_GOLDEN=1 python -m pytest -q tests/slurm_ext/backends/test_slurm_argv_golden.py
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from golden import ArgvRecorder, check_golden

from slurm_ext.backends.base import ALL, STEPS, JobUpdate, SubmitRequest, UpdateNotApplied
from slurm_ext.backends.cli import CliBackend
from slurm_ext.parse import squeue_fields

GOLDEN = Path(__file__).parent / "golden" / "cli_backend.json"
PING = "Slurmctld(primary) at localhost is UP\n"
#: Slurm release -> (what `sinfo --version` prints, command prefix -> the data/ file of its output)
RELEASES = {
    "22.05": (
        "slurm-wlm 22.05.8\n",
        {
            ("sinfo", "--json"): "sinfo.json",
            ("squeue", "--json", "--states=all"): "squeue.json",
            ("scontrol", "-d", "-o", "show", "node"): "scontrol_show_-o_node.txt",
            ("scontrol", "-o", "show", "partition"): "scontrol_show_-o_partition.txt",
            ("scontrol", "-o", "show", "job"): "scontrol_show_-o_job.txt",
        },
    ),
    "24.11": (
        "slurm-wlm 24.11.5\n",
        {
            ("scontrol", "--json", "show", "node"): "24.11/scontrol_show_node_v0.0.42.json",
            ("scontrol", "--json", "show", "job", "2"): "24.11/scontrol_show_job_run_v0.0.42.json",
            ("scontrol", "-o", "show", "partition"): "24.11/scontrol_-o_show_partition.txt",
            ("squeue", "--json", "--states=all"): "24.11/squeue_v0.0.42.json",
            ("squeue", "--noheader"): "compact/24.11/squeue_compact.txt",  # recorded with TOKEN
        },
    ),
}
#: job 9 of the 22.05 set as it is: held in "all", features v100, 1 node, 2 GPUs, 1 task
PLACED = JobUpdate(
    partition="all", features="v100", num_nodes=1, gres_per_node=2, num_tasks=1, min_cpus_per_node=2, start_soon=True
)
#: job 2 ("run") of the 24.11 set as it is, except for Features (it has none), so this update ends
#: in UpdateNotApplied
EVERY_FIELD = JobUpdate(
    partition="a100",
    features="a100",
    num_nodes=2,
    req_nodes=("n1", "n2"),
    exc_nodes=(),
    gres_per_node=4,
    num_tasks=8,
    tasks_per_node=4,
    min_cpus_per_node=8,
    admin_comment='{"cell":"a100:2x4:pp1"}',
    start_soon=True,
)


def slurm(release: str, sample: Callable[[str], str]) -> ArgvRecorder:
    """A recorder answering as a cluster of `release` (sbatch prints job 4242)."""
    version, outputs = RELEASES[release]

    def answer(args: list[str]) -> str:
        if args[:2] == ["scontrol", "ping"]:
            return PING
        if args[:2] == ["sinfo", "--version"]:
            return version
        if args[0] == "sbatch":
            return "4242\n"
        for prefix, name in outputs.items():
            if tuple(args[: len(prefix)]) == prefix:
                return sample(name)
        return ""

    return ArgvRecorder(answer)


def requests(script: str) -> dict[str, SubmitRequest]:
    every = SubmitRequest(
        script=script,
        script_args=("--lr", "3e-4", "two words"),
        job_name="train",
        partition="a100,v100",
        gres_per_node=4,
        nodes=2,
        ntasks_per_node=4,
        cpus_per_task=2,
        time_limit="1:00:00",
        hold=True,
        comment='cellsched/v1 {"model":"gpt-1.3b"}',
        constraint="a100|v100",
        output="out-%j.txt",
        error="err-%j.txt",
        export="ALL,FOO=1",
        account="acct",
        qos="normal",
        extra_args=("--open-mode=append", "--mail-type=END"),
        workdir="/work",
        env={"CELLSCHED_X": "1"},
    )
    return {"submit: every field": every, "submit: script only": SubmitRequest(script=script)}


def test_cli_backend_argument_lists(tmp_path, sample, monkeypatch):
    # the compact query's token, random in each round, as data/compact/24.11 was recorded with
    token = sample("compact/24.11/token.txt").strip()
    monkeypatch.setattr(squeue_fields.Format, "draw", classmethod(lambda cls: cls(token)))
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsrun true\n")
    cases: dict[str, tuple[str, str, Callable[[CliBackend], object]]] = {
        "observe: 22.05 (sinfo --json)": ("22.05", "auto", lambda b: b.observe()),
        "observe: 24.11 (scontrol --json)": ("24.11", "auto", lambda b: b.observe()),
        "job: 24.11 (scontrol --json show job)": ("24.11", "auto", lambda b: b.job("2")),
        "jobs: 24.11 (squeue --json --jobs)": ("24.11", "auto", lambda b: b.jobs(["2", "4"])),
        "observe: text": ("22.05", "text", lambda b: b.observe()),
        "job: json": ("22.05", "auto", lambda b: b.job("9")),
        "job: text": ("22.05", "text", lambda b: b.job("9")),
        "update: placement, read back": ("22.05", "auto", lambda b: b.update("9", PLACED)),
        "update_many: two jobs, one read-back": (
            "22.05",
            "auto",
            lambda b: b.update_many({"9": PLACED, "7": JobUpdate(admin_comment="{}")}),
        ),
        "hold_many": ("22.05", "auto", lambda b: b.hold_many(["9", "7"])),
        "release_many": ("22.05", "auto", lambda b: b.release_many(["9", "7"])),
        "requeue_many: held": ("22.05", "auto", lambda b: b.requeue_many(["7", "9"], hold=True)),
        "hold": ("22.05", "auto", lambda b: b.hold("9")),
        "release": ("22.05", "auto", lambda b: b.release("9")),
        "requeue": ("22.05", "auto", lambda b: b.requeue("7")),
        "requeue: held": ("22.05", "auto", lambda b: b.requeue("7", hold=True)),
        "cancel": ("22.05", "auto", lambda b: b.cancel("7")),
        "signal: batch": ("22.05", "auto", lambda b: b.signal("7", "USR1")),
        "signal: steps": ("22.05", "auto", lambda b: b.signal("7", "SIGUSR1", target=STEPS)),
        "signal: all": ("22.05", "auto", lambda b: b.signal("7", "15", target=ALL)),
    }
    for name, req in requests(str(script)).items():
        cases[name] = ("22.05", "auto", lambda b, req=req: b.submit(req))
    recorded = {}
    for name, (release, mode, call) in cases.items():
        runner = slurm(release, sample)
        call(CliBackend(mode=mode, run=runner, workers=1))  # one worker: the commands in a fixed order
        recorded[name] = runner.calls
    runner = slurm("24.11", sample)
    with pytest.raises(UpdateNotApplied, match="features") as refused:
        CliBackend(run=runner).update("2", EVERY_FIELD)
    assert set(refused.value.mismatches) == {"features"}
    recorded["update: every field, read back with the partition's nodes"] = runner.calls
    text = str(tmp_path)
    check_golden(
        GOLDEN, {name: [[a.replace(text, "$TMP") for a in args] for args in calls] for name, calls in recorded.items()}
    )
