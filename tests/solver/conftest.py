import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_virtual_workers reuses test_estimator's hand store
