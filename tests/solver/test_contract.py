"""The controller <-> job contract: one codec for the AdminComment, one
reader of CELLSCHED_PLAN."""

import json

import pytest

from solver import contract
from solver.contract.plan import JobPlan, PlanError

PLAN = JobPlan(pp=1, dp=2, tp=1, cell="a100 x 2", job_id="7")


def test_admin_comment_round_trip():
    text = contract.encode_admin_comment({"model": "gpt-s", "iterations": 10}, PLAN)
    assert json.loads(text) == {"spec": {"model": "gpt-s", "iterations": 10}, "plan": json.loads(PLAN.to_json())}
    assert contract.admin_comment_plan(text) == PLAN
    assert contract.admin_comment_spec(text) == {"model": "gpt-s", "iterations": 10}
    assert ", " not in text and ": " not in text  # compact separators


@pytest.mark.parametrize(
    "text", [None, "", "(null)", "not json", "[1, 2]", '{"spec": {}}', json.dumps(json.loads(PLAN.to_json()))]
)
def test_admin_comment_without_plan(text):
    assert contract.admin_comment_plan(text) is None


@pytest.mark.parametrize("plan", ['"a string"', '{"dp": 0}'])
def test_malformed_plan_is_an_error_not_none(plan):
    with pytest.raises(PlanError):
        contract.admin_comment_plan('{"plan": ' + plan + "}")
    assert contract.admin_comment_plan('{"plan": ' + plan + "}", strict=False) is None  # the scheduler's reading


def test_plan_from_env(tmp_path):
    assert contract.plan_from_env({}) is None and contract.plan_from_env({contract.ENV_PLAN: "  "}) is None
    assert contract.plan_from_env({contract.ENV_PLAN: PLAN.to_json()}) == PLAN
    f = tmp_path / "plan.json"
    f.write_text(PLAN.to_json())
    assert contract.plan_from_env({contract.ENV_PLAN: str(f)}) == PLAN
    with pytest.raises(PlanError, match="names file .* that cannot be read"):
        contract.plan_from_env({contract.ENV_PLAN: str(tmp_path / "missing.json")})
    with pytest.raises(PlanError):
        contract.plan_from_env({contract.ENV_PLAN: '{"dp": "two"}'})


def test_spec_that_is_not_an_object_is_none():
    assert contract.admin_comment_spec('{"spec": [1, 2]}') is None
    assert contract.admin_comment_spec('{"spec": "gpt-s"}') is None
    assert contract.admin_comment_spec('{"plan": {}}') is None
    assert contract.admin_comment_spec('{"spec": {"model": "gpt-s"}}') == {"model": "gpt-s"}


def test_step_to_dict_leaves_out_what_it_does_not_hold():
    assert contract.Step("requeued", 3.5).to_dict() == {"step": "requeued", "at": 3.5}
    assert contract.Step("signalled", 2.0, {"dp": 2}, "gpu").to_dict() == {
        "step": "signalled",
        "at": 2.0,
        "to": {"dp": 2},
        "partition": "gpu",
    }
    assert contract.Step("updated", 1.0, {}).to_dict() == {"step": "updated", "at": 1.0, "to": {}}


def test_with_step_writes_reads_and_removes_the_step():
    text = contract.encode_admin_comment({"model": "gpt-s"})
    moved = contract.with_step(text, contract.Step("signalled", 12.0, {"dp": 2}, "gpu"))
    assert moved == '{"spec":{"model":"gpt-s"},"step":{"at":12.0,"partition":"gpu","step":"signalled","to":{"dp":2}}}'
    assert contract.admin_comment_step(moved) == contract.Step("signalled", 12.0, {"dp": 2}, "gpu")
    # a new step replaces the old one; None removes it and leaves the rest as it was
    parked = contract.with_step(moved, contract.Step("parked", 13.0))
    assert json.loads(parked) == {"spec": {"model": "gpt-s"}, "step": {"step": "parked", "at": 13.0}}
    assert contract.with_step(parked, None) == '{"spec":{"model":"gpt-s"}}'
    assert contract.admin_comment_step(contract.with_step(parked, None)) is None
    # an AdminComment that is not a JSON object is left as it is
    for text in ("", "not json", "[1]", "{}"):
        assert contract.with_step(text, contract.Step("parked", 1.0)) == text


@pytest.mark.parametrize("step", ["signalled", "updated", "requeued", "parked"])
def test_each_step_reads_back(step):
    assert contract.admin_comment_step(json.dumps({"step": {"step": step, "at": 5}})) == contract.Step(step, 5.0)


def test_step_fields_are_read_with_their_types():
    read = contract.admin_comment_step('{"step": {"step": "updated", "at": 7, "to": {"pp": 1}, "partition": "p1"}}')
    assert read == contract.Step("updated", 7.0, {"pp": 1}, "p1")
    assert isinstance(read.at, float)
    # a `to` that is not an object is dropped, the step stands
    assert contract.admin_comment_step('{"step": {"step": "updated", "at": 7, "to": [1]}}') == contract.Step(
        "updated", 7.0
    )


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "[]",
        '"parked"',
        '{"at": 1}',
        '{"step": "moved", "at": 1}',
        '{"step": "parked"}',
        '{"step": "parked", "at": "1"}',
        '{"step": "parked", "at": true}',
        '{"step": "parked", "at": 1, "partition": 3}',
    ],
)
def test_a_malformed_step_is_none(raw):
    text = '{"spec": {}}' if raw is None else '{"spec": {}, "step": ' + raw + "}"
    assert contract.admin_comment_step(text) is None


def test_plan_from_env_reads_the_process_environment(monkeypatch):
    monkeypatch.setenv(contract.ENV_PLAN, PLAN.to_json())
    assert contract.plan_from_env() == PLAN
    monkeypatch.delenv(contract.ENV_PLAN)
    assert contract.plan_from_env() is None


def test_a_plan_that_is_not_an_object_is_named_in_the_error():
    with pytest.raises(PlanError, match="the AdminComment's plan must be a JSON object, got list"):
        contract.admin_comment_plan('{"plan": [1]}')


def test_admin_comment_keys_are_sorted():
    assert contract.encode_admin_comment({"z": 1, "a": {"y": 2, "b": 3}}) == '{"spec":{"a":{"b":3,"y":2},"z":1}}'
