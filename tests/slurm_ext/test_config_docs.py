"""The config's documentation: every key documented where it is declared,
docs/config.md generated from those docs and current, slurm_ext/admin/cellsched.toml
naming only real keys (and every one of them)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from slurm_ext import config
from slurm_ext.config import SECTIONS, Config, ConfigError, from_dict
from solver.policies import POLICIES

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "config.md"
EXAMPLE = ROOT / "slurm_ext" / "admin" / "cellsched.toml"


def keys(section: str) -> list[str]:
    """The keys the loader accepts in `section`: its dataclass's fields."""
    return [f.name for f in fields(SECTIONS[section])]


def page_entries(text: str) -> dict[str, dict[str, tuple[str, str, str]]]:
    """section -> key -> (type, default, doc), as docs/config.md lists them."""
    out: dict[str, dict[str, tuple[str, str, str]]] = {}
    section = ""
    for line in text.splitlines():
        if m := re.fullmatch(r"## \[(\w+)\]", line):
            section = m[1]
            out[section] = {}
        elif m := re.fullmatch(r"- \*\*`(\w+)`\*\* \(([^,]+), default `(.*?)`\): (.+)", line):
            assert section, line
            out[section][m[1]] = (m[2], m[3], m[4])
    return out


def test_the_sections_are_the_configs():
    assert list(SECTIONS) == [f.name for f in fields(Config) if f.name != "source"]


@pytest.mark.parametrize("section", list(SECTIONS))
def test_every_key_has_a_doc_at_its_declaration(section):
    for f in fields(SECTIONS[section]):
        doc = f.metadata.get("doc")
        assert isinstance(doc, str) and doc.strip(), f"{section}.{f.name} has no doc"
        assert from_dict({section: {f.name: getattr(SECTIONS[section](), f.name)}}), f.name  # a key the loader takes


def test_the_page_is_the_generators_output():
    assert PAGE.read_text() == config.markdown(), "docs/config.md is stale: python -m slurm_ext.config --markdown"


def test_the_documented_command_writes_the_page():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_ext.config", "--markdown"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == PAGE.read_text()


def test_the_page_lists_every_key_with_its_default_and_doc():
    entries = page_entries(PAGE.read_text())
    assert list(entries) == list(SECTIONS)
    for section, cls in SECTIONS.items():
        assert list(entries[section]) == keys(section), section
        defaults = cls()
        for f in fields(cls):
            type_name, default, doc = entries[section][f.name]
            assert tomllib.loads(f"v = {default}")["v"] == getattr(defaults, f.name), (section, f.name)
            assert doc == " ".join(f.metadata["doc"].split())


WRONG = {
    "boolean": 1,
    "integer": 1.5,
    "number": "fast",
    "string": 1,
    "table of numbers": {"x": "fast"},
    "table of strings": {"x": 1},
}


def test_the_documented_types_are_what_the_loader_checks():
    """A value of another type is an error naming the key; a number takes an integer."""
    for section, entries in page_entries(PAGE.read_text()).items():
        for key, (type_name, default, _) in entries.items():
            with pytest.raises(ConfigError, match=re.escape(f"{section}.{key}")):
                from_dict({section: {key: WRONG[type_name]}})
            if type_name == "number":
                whole = math.ceil(tomllib.loads(f"v = {default}")["v"])
                got = getattr(getattr(from_dict({section: {key: whole}}), section), key)
                assert got == whole and isinstance(got, float), (section, key)


def test_the_page_has_no_raw_html():
    """Outside code spans, `<root>` would be read as an HTML tag (and dropped)."""
    text = PAGE.read_text()
    body = re.sub(r"`[^`\n]*`", "", text[text.index("-->") + 3 :])
    assert not re.findall(r"<[A-Za-z/!?][^>]*>?", body)


def test_the_policy_doc_names_every_policy():
    doc = next(f.metadata["doc"] for f in fields(SECTIONS["controller"]) if f.name == "policy")
    named = set(re.findall(r"[\w-]+", doc.split(":", 1)[1]))
    assert set(POLICIES) <= named, sorted(set(POLICIES) - named)


def example_keys() -> dict[str, set[str]]:
    """section -> the keys the example config sets, or shows in a comment (``# key = value``)."""
    text = EXAMPLE.read_text()
    out = {section: set(values) for section, values in tomllib.loads(text).items()}
    section = ""
    for line in text.splitlines():
        if m := re.fullmatch(r"\[(\w+)\]", line):
            section = m[1]
        elif m := re.fullmatch(r"# (\w+) = .+", line):
            assert section, line
            tomllib.loads(line[2:])  # a commented example is valid TOML
            out.setdefault(section, set()).add(m[1])
    return out


def test_the_example_config_names_only_real_keys_and_every_key():
    shown = example_keys()
    assert set(shown) == set(SECTIONS)
    for section in SECTIONS:
        assert shown[section] <= set(keys(section)), (section, sorted(shown[section] - set(keys(section))))
        assert set(keys(section)) <= shown[section], (section, sorted(set(keys(section)) - shown[section]))


def test_the_example_config_reads_as_the_defaults():
    example = config.load(EXAMPLE)
    for section in SECTIONS:
        assert getattr(example, section) == getattr(Config(), section), section
