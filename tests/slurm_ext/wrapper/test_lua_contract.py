"""job_submit.lua runs inside slurmctld and cannot import the Python side:
its copies of the Comment contract must say what solver.contract.jobspec says."""

import re

from support import ADMIN

from solver.contract.jobspec import ADMIN_MARKER, MAX_SPEC_BYTES, TAG


def test_job_submit_lua_speaks_the_same_contract():
    lua = (ADMIN / "job_submit.lua").read_text(encoding="utf-8")
    assert re.search(r'^local TAG = "([^"]*)"$', lua, re.M).group(1) == TAG
    assert re.search(r"^local MARKER = TAG \.\. \"([^\"]*)\"$", lua, re.M).group(1) == ADMIN_MARKER[len(TAG) :]
    assert int(re.search(r"^local MAX_SPEC_BYTES = (\d+)", lua, re.M).group(1)) == MAX_SPEC_BYTES
