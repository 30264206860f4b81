"""``python -m launch [--] CMD [ARGS...]``, the same as ``cellsched-launch``."""

import sys

from launch.cli import main

sys.exit(main())
