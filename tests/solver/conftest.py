import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from solver.types import SolverConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_virtual_workers reuses test_estimator's hand store

#: Wall-clock limit of `exact` configs: a safety net far above any deterministic budget used here.
EXACT_WALL_S = 600.0


def exact(**overrides) -> SolverConfig:
    """Exact results: the deterministic budget decides, never the wall clock."""
    return SolverConfig(**overrides, time_limit_s=EXACT_WALL_S, deterministic=True)


@pytest.fixture
def exact_config() -> Callable[..., SolverConfig]:
    """`exact` for tests that assert exact plans, OPTIMAL or the same plan twice."""
    return exact
