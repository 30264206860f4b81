"""Recorded real Slurm outputs under data/: the Slurm 22.05.8 dev cluster
(UTC) at its top, and the 24.11.5 one in data/24.11/ (text, and JSON at each
data_parser version it offers; record_outputs.sh made them)."""

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


@pytest.fixture
def contract_backend(request, slurm_cluster):
    """The backend under contract on the live cluster: `--backend cli` (default) or `pyslurm`."""
    from slurm_ext.backends import get_backend

    name = request.config.getoption("backend")
    return get_backend(name, **({"timeout": 10.0} if name == "cli" else {}))
