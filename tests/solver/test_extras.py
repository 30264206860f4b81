"""solver.contract.extras: an optional package that is missing or does not import is
one line naming the extra that installs it."""

from __future__ import annotations

import sys
import tomllib

import pytest
from support import ROOT

from solver.contract import extras
from solver.contract.extras import MissingExtra, install_hint, require


@pytest.fixture
def fake_extra(monkeypatch, tmp_path):
    """Registers `cellsched_fake_extra` (provided by the extra "fake") and puts tmp_path on sys.path."""
    monkeypatch.setitem(extras.EXTRAS, "cellsched_fake_extra", ("FakeLib", "fake"))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("cellsched_fake_extra")]:
        monkeypatch.delitem(sys.modules, name)
    return tmp_path


def test_every_extra_named_is_one_of_the_project():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {extra for _, extra in extras.EXTRAS.values()} <= set(declared)
    assert install_hint("torch") == "pip install 'cellsched[torch]'"


def test_require_returns_the_module(fake_extra):
    (fake_extra / "cellsched_fake_extra").mkdir()
    (fake_extra / "cellsched_fake_extra" / "__init__.py").write_text("")
    (fake_extra / "cellsched_fake_extra" / "sub.py").write_text("X = 42\n")
    assert require("cellsched_fake_extra.sub").X == 42


def test_a_missing_package_names_its_extra(fake_extra):
    with pytest.raises(MissingExtra) as info:
        require("cellsched_fake_extra.sub")
    assert str(info.value) == "needs FakeLib; install it with: pip install 'cellsched[fake]'"
    assert isinstance(info.value, ImportError) and info.value.extra == "fake" and info.value.__cause__ is None


def test_a_package_that_does_not_import_says_so(fake_extra):
    (fake_extra / "cellsched_fake_extra.py").write_text(
        "raise ImportError('libfake.so.41: cannot open shared object file')\n"
    )
    with pytest.raises(MissingExtra) as info:
        require("cellsched_fake_extra")
    assert str(info.value) == (
        "needs FakeLib, which is installed but does not import (libfake.so.41: cannot open shared object file); "
        "reinstall it with: pip install 'cellsched[fake]'"
    )


def test_torch_hidden_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # what an interpreter without torch sees
    with pytest.raises(MissingExtra, match=r"^needs PyTorch; install it with: pip install 'cellsched\[torch\]'$"):
        require("torch")


def test_only_optional_packages_are_required():
    with pytest.raises(ValueError, match="not an optional dependency"):
        require("numpy")
