"""The controller <-> job contract: one codec for the AdminComment, one
reader of CELLSCHED_PLAN."""

import json

import pytest

from solver import contract
from solver.plan import JobPlan, PlanError

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
