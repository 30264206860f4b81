"""Request validation, update read-back comparison, backend selection."""

import subprocess

import pytest

from slurm_ext.backends import get_backend
from slurm_ext.backends.base import (
    JobUpdate,
    SubmitRequest,
    UpdateNotApplied,
    check_job_id,
    check_signal,
    update_mismatches,
)
from slurm_ext.backends.cli import CliBackend, _stdin_line, _update_args, slurm_version
from slurm_ext.records import SlurmJob


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"script": ""}, "SubmitRequest.script"),
        ({"script": "x", "nodes": 0}, "SubmitRequest.nodes"),
        ({"script": "x", "gres_per_node": -1}, "SubmitRequest.gres_per_node"),
        ({"script": "x", "ntasks_per_node": True}, "SubmitRequest.ntasks_per_node"),
        ({"script": "x", "job_name": "a b"}, "SubmitRequest.job_name"),
        ({"script": "x", "comment": "two\nlines"}, "SubmitRequest.comment"),
        ({"script": "x", "time_limit": "soon"}, "SubmitRequest.time_limit"),
        ({"script": "x", "script_args": ["a"]}, "SubmitRequest.script_args"),
        ({"script": "x", "env": {"1BAD": "v"}}, "SubmitRequest.env"),
    ],
)
def test_submit_request_names_the_bad_field(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        SubmitRequest(**kwargs)


def test_submit_request_accepts_slurm_times():
    for t in (30, "30", "1:00:00", "2-00:00:00", "UNLIMITED"):
        assert SubmitRequest(script="x", time_limit=t).time_limit == t


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({}, "no field to change"),
        ({"num_nodes": 0}, r"JobUpdate\.num_nodes"),
        ({"req_nodes": ["n1"]}, r"JobUpdate\.req_nodes"),
        ({"req_nodes": ("n1;rm",)}, r"JobUpdate\.req_nodes"),
        ({"partition": "a b"}, r"JobUpdate\.partition"),
        ({"admin_comment": "a\nb"}, r"JobUpdate\.admin_comment"),
        ({"features": "a100 x"}, r"JobUpdate\.features"),
    ],
)
def test_job_update_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        JobUpdate(**kwargs)


def test_ids_and_signals():
    assert check_job_id("12") == "12" and check_job_id("12_3") == "12_3"
    for bad in ("", "12;rm", 12, "-1"):
        with pytest.raises(ValueError, match="job_id"):
            check_job_id(bad)
    assert check_signal("USR1") == "USR1" and check_signal("SIGTERM") == "SIGTERM" and check_signal("10") == "10"
    with pytest.raises(ValueError, match="signal"):
        check_signal("usr1; reboot")


def test_update_mismatches():
    job = SlurmJob(
        job_id="5",
        partition="a40",
        features="a40",
        num_nodes=2,
        required_nodes=("n5", "n4"),
        gpus_per_node=2,
        admin_comment="p",
    )
    ok = JobUpdate(
        partition="a40", features="a40", num_nodes=2, req_nodes=("n4", "n5"), gres_per_node=2, admin_comment="p"
    )
    assert update_mismatches(job, ok, partition_nodes={"n4", "n5"}) == {}
    bad = JobUpdate(partition="v100", gres_per_node=4, admin_comment="q")
    assert update_mismatches(job, bad) == {
        "partition": ("v100", "a40"),
        "gres_per_node": (4, 2),
        "admin_comment": ("q", "p"),
    }
    # a ReqNodeList outside the partition "sticks" but the job can never start
    outside = update_mismatches(job, JobUpdate(req_nodes=("n4", "n5")), partition_nodes={"n4"})
    assert outside == {"req_nodes": ("nodes of partition a40", "n5 outside it")}


def test_update_not_applied_message():
    err = UpdateNotApplied("7", {"gres_per_node": (2, 1)}, None, "Invalid GRES specification")
    assert "job 7" in str(err) and "gres_per_node: wanted 2, got 1" in str(err) and "Invalid GRES" in str(err)
    assert err.mismatches == {"gres_per_node": (2, 1)}


def test_get_backend():
    assert isinstance(get_backend("cli", timeout=2.0), CliBackend)
    with pytest.raises(ValueError, match="unknown backend 'slurmy'; choose one of: auto, cli, pyslurm"):
        get_backend("slurmy")
    with pytest.raises(ValueError, match="mode"):
        get_backend("cli", mode="xml")
    # pyslurm is not installed here (PyPI's pyslurm targets a newer Slurm): auto falls back to the CLI
    assert get_backend("auto").name == "cli"


def test_slurm_version_text():
    assert slurm_version("slurm-wlm 22.05.8\n") == (22, 5)
    assert slurm_version("slurm 24.11.1") == (24, 11)
    assert slurm_version("nonsense") is None


@pytest.mark.parametrize(
    "comment",
    [
        '{"name":"two words"}',  # a blank: scontrol would split the token there
        '{"name":"tab\there"}',
        '{"x":"\x7f\x7fJobId=1"}',  # DEL: a line editor deletes the bytes before it
        '{"x":"\x15"}',  # ^U: kills the line in readline
        '{"name":"caf\u00e9"}',  # not ASCII
        '{"x":"' + "a" * 4000 + '"}',  # longer than scontrol's line buffer
    ],
)
def test_an_update_that_could_read_differently_is_not_fed_to_scontrol(comment):
    assert _stdin_line(_update_args("7", JobUpdate(partition="a40", admin_comment=comment))) is None


def test_a_plain_update_is_fed_as_exactly_its_arguments():
    change = JobUpdate(partition="a40", req_nodes=("n4", "n5"), admin_comment='{"a":"it\'s\\"#!$(id)`"}')
    args = _update_args("7", change)
    assert _stdin_line(args) == " ".join(args[1:]) and _stdin_line(args).split(" ") == args[1:]


def test_a_refusal_for_now_is_tried_again_and_any_other_is_not(monkeypatch):
    """Slurm 24.11 refuses some updates of held jobs with EAGAIN that pass when tried again
    (seen on the dev cluster): those are tried again, TRANSIENT_TRIES in all; others once."""
    from slurm_ext.backends import cli

    monkeypatch.setattr(cli.time, "sleep", lambda s: None)
    answers: list[tuple[int, str]] = []
    calls: list[list[str]] = []

    def run(args, **kw):
        calls.append(args)
        rc, err = answers.pop(0)
        return subprocess.CompletedProcess(args, rc, "", err)

    backend = cli.CliBackend(run=run)
    update = ["scontrol", "update", "JobId=5", "Partition=a40"]
    answers[:] = [(1, "Resource temporarily unavailable for job 5"), (1, "Interrupted system call for job 5"), (0, "")]
    assert backend._try(update) == "" and len(calls) == 3
    calls.clear()
    answers[:] = [(1, "Invalid partition name specified for job 5")]
    assert backend._try(update) == "Invalid partition name specified for job 5" and len(calls) == 1
    calls.clear()
    answers[:] = [(1, "Resource temporarily unavailable for job 5")] * cli.TRANSIENT_TRIES
    assert "temporarily" in backend._try(update) and len(calls) == cli.TRANSIENT_TRIES


def test_an_update_refused_for_now_goes_in_two_parts_the_partition_last(monkeypatch):
    from slurm_ext.backends import cli

    monkeypatch.setattr(cli.time, "sleep", lambda s: None)
    calls: list[list[str]] = []

    def run(args, **kw):  # refuses any update naming a partition and other fields together
        calls.append(args)
        both = any(a.startswith("Partition=") for a in args) and len(args) > 4
        return subprocess.CompletedProcess(args, 1 if both else 0, "", "Resource temporarily unavailable" * both)

    update = ["scontrol", "update", "JobId=5", "Partition=v100", "ReqNodeList=n3", "NumNodes=1-1"]
    assert cli.CliBackend(run=run)._update_alone(update) == ""
    assert calls[cli.TRANSIENT_TRIES :] == [
        ["scontrol", "update", "JobId=5", "ReqNodeList=n3", "NumNodes=1-1"],
        ["scontrol", "update", "JobId=5", "Partition=v100"],
    ]
    calls.clear()
    assert cli.CliBackend(run=run)._update_alone(["scontrol", "update", "JobId=5", "Partition=v100"]) == ""
    assert len(calls) == 1
