"""Hostlist expansion and compression."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_ext.records import compress_hostlist, expand_hostlist


@pytest.mark.parametrize(
    "text, names",
    [
        ("n[1-3,5]", ("n1", "n2", "n3", "n5")),
        ("n3", ("n3",)),
        ("n[1-2],gv03,ga7", ("n1", "n2", "gv03", "ga7")),
        ("gpu[08-11]", ("gpu08", "gpu09", "gpu10", "gpu11")),
        ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
        ("rack1-n[001-002]", ("rack1-n001", "rack1-n002")),
        ("", ()),
        ("(null)", ()),
        (None, ()),
    ],
)
def test_expand(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("bad", ["n[1-3", "n1-3]", "n[a-b]", "n[3-1]"])
def test_expand_rejects_bad_text(bad):
    with pytest.raises(ValueError, match="hostlist"):
        expand_hostlist(bad)


@pytest.mark.parametrize(
    "names, text",
    [
        (["n1", "n2", "n3", "n5"], "n[1-3,5]"),
        (["n3"], "n3"),
        (["n2", "n1"], "n[1-2]"),
        (["gpu08", "gpu09", "gpu10"], "gpu[08-10]"),
        (["login", "n1", "n2"], "login,n[1-2]"),
        ([], ""),
    ],
)
def test_compress(names, text):
    assert compress_hostlist(names) == text


@given(st.lists(st.tuples(st.sampled_from(["n", "gpu", "r1-n"]), st.integers(0, 300), st.booleans()), max_size=30))
def test_compress_then_expand_keeps_the_set(items):
    names = [f"{p}{str(i).zfill(3) if pad else i}" for p, i, pad in items]
    assert set(expand_hostlist(compress_hostlist(names))) == set(names)
