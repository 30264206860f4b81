"""The controller tests use the shared `slurm_cluster` fixture (tests/conftest.py)
and the helpers in controller_support.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "contrib" / "examples"))  # minigpt
