#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine (as root):
#
#   bash contrib/test.sh [PYTEST_ARGS...]
#
# Sets up Debian's Slurm + munge and a .venv (contrib/setup.sh), checks the
# code with ruff (lint and format, configured in pyproject.toml), then runs
# pytest. The integration tests start their own local Slurm dev cluster
# (contrib/dev-cluster/devcluster.sh, under /tmp/cellsched-test-cluster) and
# stop it at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash contrib/setup.sh
VENV=${VENV:-.venv}
# tests run the installed console scripts (cellsched, cellsched-launch) from the venv
export PATH="$PWD/$VENV/bin:$PATH"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
exec "$VENV/bin/python" -m pytest -q "$@"
