"""A round's compact read of the jobs (slurm_ext.parse.squeue_fields, CliBackend._round_jobs)
against every job's whole JSON record, on outputs of real clusters recorded both ways at
one moment (data/compact/RELEASE, record_compact.sh: Slurm 22.05 and 24.11): the
snapshots must agree on everything the controller reads: each job's COMPACT fields, whole
records where the round needs them, and the controller's own reads of the two
snapshots (the managed jobs and their phases, the GPU view, the plain jobs' demand,
the jobs carrying a step)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from slurm_ext.backends.base import SlurmCommandError
from slurm_ext.backends.cli import CliBackend
from slurm_ext.controller import inputs as inp
from slurm_ext.controller.round import _marked_jobs
from slurm_ext.parse import json_output, scontrol_text, squeue_fields
from slurm_ext.parse.values import ParseError
from slurm_ext.records import ClusterSnapshot, SlurmJob
from slurm_ext.site import PriorityModel, unmanaged_demand
from slurm_ext.view import to_cluster_view

DATA = Path(__file__).parent / "data" / "compact"
RELEASES = sorted(p.name for p in DATA.iterdir())
VERSION = {"22.05": "slurm-wlm 22.05.8\n", "24.11": "slurm-wlm 24.11.5\n"}


def recorded(release: str) -> dict[str, str]:
    d = DATA / release
    return {p.name: p.read_text() for p in d.iterdir()}


def ids(release: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in recorded(release)["ids.txt"].split())


def compact_jobs(release: str, token: str | None = None) -> tuple[SlurmJob, ...]:
    """The recorded compact output parsed with the token it was recorded with (or `token`'s
    Format on the output with its token swapped in)."""
    files = recorded(release)
    fixed = files["token.txt"].strip()
    fmt = squeue_fields.Format(token or fixed, getattr(squeue_fields, files["fields.txt"].strip()))
    return squeue_fields.parse(files["squeue_compact.txt"].replace(fixed, fmt.token), fmt)


def whole_jobs(release: str) -> dict[str, SlurmJob]:
    return {j.job_id: j for j in json_output.parse_jobs(recorded(release)["squeue.json"])}


def snapshot(release: str, jobs: tuple[SlurmJob, ...]) -> ClusterSnapshot:
    files = recorded(release)
    return ClusterSnapshot(
        nodes=json_output.parse_nodes(files["nodes.json"]),
        partitions=scontrol_text.parse_partitions(files["scontrol_-o_show_partition.txt"]),
        jobs=jobs,
        taken_at=max(j.submit_time or 0.0 for j in whole_jobs(release).values()) + 5,
    )


@pytest.mark.parametrize("release", RELEASES)
def test_every_job_once_as_its_whole_record(release):
    """Each job's compact record equals its JSON record in every field (22.05: but the
    excluded nodes, which its squeue --Format does not print), but for the jobs read whole."""
    compact, whole = compact_jobs(release), whole_jobs(release)
    assert sorted(j.job_id for j in compact) == sorted(whole), "each job is one compact record"
    assert set(squeue_fields.COMPACT) == {f.name for f in dataclasses.fields(SlurmJob)} - {"state_flags"}
    for j in compact:
        o = whole[j.job_id]
        if squeue_fields.needs_full_record(j):
            continue
        if release == "22.05":
            o = dataclasses.replace(o, excluded_nodes=())
        assert j == o, f"job {j.job_id} ({o.name!r})"


@pytest.mark.parametrize("release", RELEASES)
def test_user_text_cannot_end_a_field_or_a_record(release):
    """Names and comments with newlines, `|` and a record's end under a guessed token come
    back exactly as the JSON record has them, and forge no job; a job whose text holds
    the field separator is read whole."""
    compact, whole, named = compact_jobs(release), whole_jobs(release), ids(release)
    by_id = {j.job_id: j for j in compact}
    evil, tag, unit = by_id[named["evil_name"]], by_id[named["evil_tag"]], by_id[named["unit"]]
    assert evil.name == "evil|name\nline two" == whole[evil.job_id].name
    assert evil.comment == "x#0000000000000000$\n4242 RUNNING" == whole[evil.job_id].comment
    assert tag.comment == whole[tag.job_id].comment and "\n" in tag.comment
    assert "4242" not in by_id
    assert unit.state == squeue_fields.UNREADABLE and squeue_fields.needs_full_record(unit)
    merged = {j.job_id: j for j in squeue_fields.merge(compact, {unit.job_id: whole[unit.job_id]})}
    assert merged[unit.job_id].name == "unit\x1fsep" and merged[unit.job_id].comment == "a\x1fb\x1fc"


@pytest.mark.parametrize("release", RELEASES)
def test_whole_records_asked_for_exactly_the_jobs_whose_text_does_not_say_all(release):
    compact, named = compact_jobs(release), ids(release)
    wanted = {j.job_id for j in compact if squeue_fields.needs_full_record(j)}
    assert wanted == {named["drained"], named["unit"]}  # its reason printed as a sentence; 0x1F in its text
    drained = next(j for j in compact if j.job_id == named["drained"])
    assert drained.reason.startswith("Nodes required for job are DOWN, DRAINED")
    assert whole_jobs(release)[named["drained"]].reason == "Resources"


@pytest.mark.parametrize("release", RELEASES)
def test_the_controller_reads_the_same_of_both_snapshots(release):
    compact, whole = compact_jobs(release), whole_jobs(release)
    full = {j.job_id: whole[j.job_id] for j in compact if squeue_fields.needs_full_record(j)}
    merged = squeue_fields.merge(compact, full)
    before = snapshot(release, tuple(whole.values()))
    after = snapshot(release, merged)
    assert [j.job_id for j in merged] == sorted(whole, key=int)
    assert {j.job_id: j for j in merged if j.job_id in full} == full
    managed_before = inp.classify(before, {}, {})
    assert managed_before and inp.classify(after, {}, {}) == managed_before
    ids_ = {m.job_id for m in managed_before}
    assert to_cluster_view(after, ids_) == to_cluster_view(before, ids_)
    demand = unmanaged_demand(before, ids_, PriorityModel())
    assert demand and unmanaged_demand(after, ids_, PriorityModel()) == demand
    assert _marked_jobs(after) == _marked_jobs(before)


def test_a_record_found_missing_from_the_whole_read_is_gone():
    compact = compact_jobs("24.11")
    named = ids("24.11")
    merged = squeue_fields.merge(compact, {})  # every whole record asked for left Slurm meanwhile
    assert {named["drained"], named["unit"]}.isdisjoint(j.job_id for j in merged)
    assert len(merged) == len(compact) - 2


def test_a_job_printed_as_last_round_is_last_rounds_record():
    """The Reader parses only what changed since its last round; the rest is the same
    record, whatever the token; a changed field makes a new record."""
    files, named = recorded("24.11"), ids("24.11")
    fixed = files["token.txt"].strip()
    a, b = squeue_fields.Format.draw(), squeue_fields.Format.draw()
    reader = squeue_fields.Reader()
    first = {j.job_id: j for j in reader.parse(files["squeue_compact.txt"].replace(fixed, a.token), a)}
    out = files["squeue_compact.txt"].replace(fixed, b.token)
    pend = named["pend_a100"]
    out = out.replace(f"{pend}{b.sep}PENDING{b.sep}Resources{b.sep}", f"{pend}{b.sep}PENDING{b.sep}Priority{b.sep}")
    second = {j.job_id: j for j in reader.parse(out, b)}
    assert second[pend].reason == "Priority" and first[pend].reason == "Resources"
    assert all(second[k] is first[k] for k in first if k != pend)
    assert tuple(second.values()) == squeue_fields.parse(out, b)


def test_each_query_draws_its_own_token():
    a, b = squeue_fields.Format.draw(), squeue_fields.Format.draw()
    assert a.token != b.token and len(a.token) == 16 and a.token in a.end
    spec = a.spec()
    assert spec.count(a.sep) == len(squeue_fields.FIELDS) - 1 and spec.endswith(a.end)
    assert "," not in a.sep + a.end and not a.sep[0].isdigit()  # squeue --Format: no comma; a digit is a size


@pytest.mark.parametrize(
    "damage",
    [
        lambda out, fmt: out[: out.rindex(fmt.end)],  # cut short
        lambda out, fmt: out.replace(fmt.sep, "|", 1),  # a field fewer
        lambda out, fmt: fmt.sep.join(["x", *out.split(fmt.sep)[1:]]),  # not a job id
    ],
)
def test_output_of_another_shape_is_an_error(damage):
    fmt = squeue_fields.Format.draw()
    files = recorded("24.11")
    out = files["squeue_compact.txt"].replace(files["token.txt"].strip(), fmt.token)
    with pytest.raises(ParseError, match="squeue --Format"):
        squeue_fields.parse(damage(out, fmt), fmt)


class Recorded:
    """A Slurm answering the cli backend from a compact/RELEASE recording: the
    compact query with the token it asks for, ``squeue --json --jobs`` with
    those jobs (24.11) or every job (22.05, as its squeue does)."""

    def __init__(self, release: str) -> None:
        self.release, self.files, self.calls = release, recorded(release), []

    def __call__(self, args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        self.calls.append((args, kw.get("env")))
        f = self.files
        if args[:2] == ["scontrol", "ping"]:
            out = "Slurmctld(primary) at ctl is UP\n"
        elif args[:2] == ["sinfo", "--version"]:
            out = VERSION[self.release]
        elif args[:2] in (["scontrol", "--json"], ["sinfo", "--json"]):
            out = f["nodes.json"]
        elif args[:2] == ["scontrol", "-o"]:
            out = f["scontrol_-o_show_partition.txt"]
        elif args[:2] == ["squeue", "--noheader"]:
            token = args[-1].rsplit("#", 1)[1].rstrip("$")
            out = f["squeue_compact.txt"].replace(f["token.txt"].strip(), token)
        elif args[:2] == ["squeue", "--json"]:
            doc = json.loads(f["squeue.json"])
            asked = [a.split("=", 1)[1].split(",") for a in args if a.startswith("--jobs=")]
            if asked and self.release != "22.05":
                doc["jobs"] = [j for j in doc["jobs"] if str(j["job_id"]) in asked[0]]
            out = json.dumps(doc)
        else:
            raise AssertionError(f"not recorded: {args}")
        return subprocess.CompletedProcess(args, 0, out, "")


@pytest.mark.parametrize("release", RELEASES)
def test_the_backend_reads_a_round_so(release):
    slurm = Recorded(release)
    snap = CliBackend(run=slurm).observe()
    full = CliBackend(run=Recorded(release), compact=False).observe()
    queries = [(a, env) for a, env in slurm.calls if a[0] == "squeue"]
    named = ids(release)
    if release == "22.05":  # its squeue --json ignores --jobs: every job's whole record, as before
        assert snap == dataclasses.replace(full, taken_at=snap.taken_at)
        assert [a for a, _ in queries] == [["squeue", "--json", "--states=all"]]
        return
    (compact_args, env), (json_args, _) = queries
    assert compact_args[:3] == ["squeue", "--noheader", "--states=all"] and env["SLURM_TIME_FORMAT"] == "%s"
    wanted = ",".join(sorted((named["drained"], named["unit"]), key=int))
    assert json_args == ["squeue", "--json", "--states=all", f"--jobs={wanted}"]
    assert snap.nodes == full.nodes and snap.partitions == full.partitions
    assert snap.jobs == full.jobs


def test_unexpected_compact_output_fails_the_observe():
    slurm = Recorded("24.11")
    slurm.files["squeue_compact.txt"] = "garbage\n"
    with pytest.raises(SlurmCommandError, match="squeue --Format"):
        CliBackend(run=slurm).observe()
