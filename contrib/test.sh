#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine (as root):
#
#   bash contrib/test.sh [PYTEST_ARGS...]
#
# Sets up Debian's Slurm + munge and a .venv (contrib/setup.sh), checks the
# code with ruff (lint and format) and mypy (types: strict on solver/ and
# launch/), all configured in pyproject.toml, then runs
# pytest on 2 workers (pytest-xdist): the integration tests, in two groups,
# run one at a time on each worker, against that worker's own local Slurm
# dev cluster (contrib/dev-cluster/devcluster.sh, under
# /tmp/cellsched-test-cluster[-gwN], started and stopped by the session);
# the other tests fill in beside them. CELLSCHED_TEST_WORKERS=0 runs
# everything in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash contrib/setup.sh
VENV=${VENV:-.venv}
# tests run the installed console scripts (cellsched, cellsched-launch) from the venv
export PATH="$PWD/$VENV/bin:$PATH"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy"  # the files and settings of [tool.mypy]
workers=${CELLSCHED_TEST_WORKERS:-2}
parallel=()
if [ "$workers" != 0 ]; then parallel=(-n "$workers" --dist loadgroup); fi
exec "$VENV/bin/python" -m pytest -q "${parallel[@]}" "$@"
