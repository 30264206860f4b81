"""Recorded real Slurm outputs (Slurm 22.05.8 dev cluster, UTC) and a
hand-written newer-schema (data_parser v0.0.41) set, under data/."""

import time
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture
def sample():
    """sample(name) -> the text of data/<name>."""
    return lambda name: (DATA / name).read_text()


@pytest.fixture
def utc(monkeypatch):
    """scontrol prints local time; the samples were recorded in UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
