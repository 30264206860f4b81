import sys
from pathlib import Path

# the benchmark scripts import their sibling modules (local_step) as they do when run as scripts
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
