"""Generated malformed input (hypothesis): every case is refused with one
line naming the field, exit status 2, and never reaches the backend's
submit (the recording backend raises if it is called)."""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ext.wrapper.command import main
from slurm_ext.wrapper.options import DIRECTIVE_KEYS, OPTIONS
from solver.contract.jobspec import JobSpec, JobSpecError

ERROR = re.compile(r"^cellsched sbatch: error: (?P<field>[^:\n]+): (?P<msg>[^\n]+)\n$")
SCRIPT = "#!/bin/bash\nsrun true\n"
VALID = {"model": "gpt-1.3b", "global-batch": "64", "iterations": "10"}
INT_OPTIONS = ("global-batch", "iterations", "min-gpus", "max-gpus", "gpus", "virtual-workers")
ODD = st.characters(blacklist_categories=("Cs",))  # any code point incl. controls, RTL marks, digits of other scripts
FUZZ = settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture
def job_script(tmp_path):
    def write(text: str = SCRIPT) -> str:
        path = tmp_path / "job.sh"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        return str(path)

    return write


def refused(argv: list[str], rec) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, backend_for=lambda name: rec, stdout=out, stderr=err, environ={})
    assert not rec.submitted
    assert code == 2 and out.getvalue() == "", (argv, out.getvalue(), err.getvalue())
    m = ERROR.match(err.getvalue())
    assert m, err.getvalue()
    return m["field"], m["msg"]


def argv_of(values: dict[str, str]) -> list[str]:
    return [f"--{k}={v}" for k, v in values.items()]


def not_a_valid_count(v: str) -> bool:
    return not (re.fullmatch(r"[0-9]{1,12}", v) and 1 <= int(v) <= 1000)


@FUZZ
@given(
    option=st.sampled_from(INT_OPTIONS),
    value=st.one_of(
        st.text(ODD, max_size=20),
        st.integers(-(10**30), 0).map(str),
        st.integers(10**13, 10**40).map(str),
        st.floats(allow_nan=True).map(repr),
        st.sampled_from(["1e3", "0x10", "1_000", " 5 5", "٣", "５", "+-1"]),
    ),
)
def test_bad_numbers(option, value, make_recorder, job_script):
    if not not_a_valid_count(value.strip()):
        value = "-" + value
    field, msg = refused(argv_of({**VALID, option: value}) + [job_script()], make_recorder())
    assert field == ("arguments" if "\x00" in value else option), msg


@FUZZ
@given(
    key=st.text(ODD, min_size=1, max_size=15),
    value=st.text(ODD, max_size=15),
    shape=st.sampled_from(["kv", "k", "glued", "after"]),
)
def test_broken_directive_lines(key, value, shape, make_recorder, job_script):
    if shape == "kv":
        line = f"#CELLSCHED {key}={value}"
    elif shape == "k":
        line = f"#CELLSCHED {key.replace('=', '')}"
    elif shape == "glued":
        line = f"#CELLSCHED{key}={value}"
    else:
        line = "echo start\n#CELLSCHED model=gpt-1.3b"
    text = f"#!/bin/bash\n{line}\nsrun true\n"
    known = set(DIRECTIVE_KEYS)
    if shape == "kv" and key.strip() in known and value.strip() and "\n" not in key + value and "\r" not in key + value:
        return  # a well-formed line (its value is checked by the other tests)
    if "\x00" in text or "\r" in text:
        text = text.replace("\x00", "").replace("\r", "")
        if shape == "kv" and key.strip() in known:
            return
    field, msg = refused(argv_of(VALID) + [job_script(text)], make_recorder())
    assert field.startswith("script line ") or field.startswith("script") or "(script line " in field, (field, msg)


@FUZZ
@given(name=st.text(ODD, min_size=1, max_size=20))
def test_unknown_options(name, make_recorder, job_script):
    known = {o.name for o in OPTIONS} | {"no-elastic", "help"}
    if name.split("=", 1)[0] in known or "\x00" in name or name.startswith("-") or not name.split("=", 1)[0]:
        name = "x" + name.replace("\x00", "")
    field, msg = refused([f"--{name}"] + argv_of(VALID) + [job_script()], make_recorder())
    assert field in (f"--{name.split('=', 1)[0]}", "option"), (field, msg)
    assert "unknown option" in msg or "not accepted" in msg or "is not an option" in msg


@FUZZ
@given(argv=st.lists(st.text(ODD, max_size=12), max_size=6))
def test_random_argument_lists(argv, make_recorder):
    # no existing script anywhere in these: always refused, never submitted
    argv = [a for a in argv if a not in ("-h", "--help")]
    refused(argv, make_recorder())


@FUZZ
@given(
    option=st.sampled_from(
        ["gpu-types", "gpu-type", "partition", "job-name", "time", "account", "qos", "mail-type", "model"]
    ),
    value=st.text(ODD, min_size=1, max_size=30).filter(lambda v: not re.fullmatch(r"[a-z0-9]+", v)),
)
def test_bad_names_and_texts(option, value, make_recorder, job_script):
    if option in ("job-name", "account", "qos") and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
        value += " "
    if option == "time" and re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}|UNLIMITED", value):
        value += "x"
    if option == "mail-type" and re.fullmatch(r"[A-Z0-9_]+(,[A-Z0-9_]+)*", value):
        value += "X"  # a list of mail types, maybe valid (TIME_LIMIT_80): no mail type ends in X
    field, msg = refused(argv_of({**VALID, option: value}) + [job_script()], make_recorder())
    assert field in (option, "arguments", "--" + option), (field, msg)


SPEC_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(),
    st.text(ODD, max_size=10),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
VALID_SPEC = {"model": "gpt-1.3b", "global_batch": 64, "iterations": 10}
NOT_INT = st.one_of(
    st.none(), st.booleans(), st.floats(), st.text(ODD, max_size=5), st.lists(st.integers(), max_size=2)
)
NOT_NAMES = st.one_of(
    st.none(),
    st.just([]),
    st.integers(),
    st.text(ODD, max_size=5),
    st.lists(st.sampled_from(["", "A100 ", "a/b", "-x", "x" * 65, "\n", 7]), min_size=1, max_size=3),
)
#: per field, values that are wrong whatever the other fields say (None: only where the field is required)
BAD = {
    "model": st.one_of(st.none(), st.integers(), st.sampled_from(["", "no-such-model", "gpt\n1.3b", "x" * 256])),
    "global_batch": st.one_of(NOT_INT, st.integers(max_value=0), st.integers(min_value=10**9 + 1)),
    "iterations": st.one_of(NOT_INT, st.integers(max_value=0), st.integers(min_value=10**12 + 1)),
    "min_gpus": st.one_of(
        NOT_INT.filter(lambda v: v is not None), st.integers(max_value=0), st.integers(min_value=100_001)
    ),
    "max_gpus": st.one_of(NOT_INT.filter(lambda v: v is not None), st.integers(max_value=0)),
    "virtual_workers": st.one_of(NOT_INT.filter(lambda v: v is not None), st.integers(max_value=0)),
    "elastic": st.one_of(st.integers(), st.text(max_size=5), st.just("true")),
    "gpu_types": NOT_NAMES.filter(lambda v: v is not None),
    "partitions": NOT_NAMES.filter(lambda v: v is not None),
    "model_def": st.one_of(st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=2)),
    "version": st.one_of(st.integers().filter(lambda v: v != 1), st.text(max_size=3)),
    "bogus": SPEC_VALUES,  # an unknown field, whatever its value
}


@FUZZ
@given(data=st.data(), field=st.sampled_from(sorted(BAD)))
def test_a_malformed_spec_is_refused_naming_its_field(data, field):
    """Every one of these specs is wrong in `field` alone: it must be refused, naming that field."""
    d = {**VALID_SPEC, field: data.draw(BAD[field])}
    if d[field] is None and field in VALID_SPEC:
        del d[field]  # a required field left out
    named = {"model_def": ("model_def", "model")}.get(field, (field,))  # a model_def's content is the model's
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_dict(d)
    assert caught.value.field in named and str(caught.value).startswith(f"{caught.value.field}: "), (
        d,
        str(caught.value),
    )


@FUZZ
@given(
    d=st.dictionaries(
        st.sampled_from(
            [
                "model",
                "global_batch",
                "iterations",
                "gpu_types",
                "min_gpus",
                "max_gpus",
                "elastic",
                "requested_gpus",
                "virtual_workers",
                "partitions",
                "version",
                "model_def",
                "bogus",
            ]
        ),
        SPEC_VALUES,
        max_size=8,
    )
)
def test_any_spec_is_refused_naming_a_field_or_accepted_as_it_is(d):
    """Random dicts: a JobSpecError naming a field, or a spec that keeps every value it was given."""
    try:
        spec = JobSpec.from_dict(d)
    except JobSpecError as exc:
        assert exc.field in {f for f in JobSpec.__dataclass_fields__} | {"spec", "bogus"}
        assert str(exc).startswith(f"{exc.field}: ")
        return
    assert "bogus" not in d and {"model", "global_batch", "iterations"} <= set(d), d
    for k, v in d.items():
        got = getattr(spec, k)
        assert got == (tuple(v) if isinstance(v, list) else v) and type(got) is not float, (k, v, got)
    assert JobSpec.from_json(spec.to_json()) == spec
