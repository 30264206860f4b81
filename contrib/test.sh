#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine (as root):
#
#   bash contrib/test.sh [PYTEST_ARGS...]
#
# Sets up Debian's Slurm + munge, systemd-analyze and debootstrap, and a
# .venv with cellsched's test extra and the training frameworks of
# contrib/frameworks.txt (contrib/setup.sh --test; the demo installs neither), checks the
# code with ruff (lint and format) and mypy (types: strict on solver/ and
# launch/), all configured in pyproject.toml, then runs
# pytest on 2 workers (pytest-xdist): the integration tests, in two groups,
# run one at a time on each worker, against that worker's own local Slurm
# dev cluster (contrib/dev-cluster/devcluster.sh, under
# /tmp/cellsched-test-cluster[-gwN], started and stopped by the session);
# the other tests fill in beside them. CELLSCHED_TEST_WORKERS=0 runs
# everything in one process.
#
# Then (unless PYTEST_ARGS were given, or CELLSCHED_SLURM24=0) the same
# tests that prove the Slurm contract run again on Slurm 24.11 (docs/slurm-support.md):
# the backend contract, the job_submit.lua contract, controller rounds end to
# end, the hostile-user suite and Slurm preempting a managed job, inside the Debian 13 root that
# `devcluster.sh` builds once with debootstrap and keeps under
# /var/cache/cellsched (on a Debian 13 machine, on its own Slurm), on ports of
# their own, in one process (about 1.5 minutes on 2 cores; about 4 more the first time,
# to build the root). CELLSCHED_SLURM24=1 runs that stage after PYTEST_ARGS too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash contrib/setup.sh --test
VENV=${VENV:-.venv}
# tests run the installed console scripts (cellsched, cellsched-launch) from the venv
export PATH="$PWD/$VENV/bin:$PATH"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy"  # the files and settings of [tool.mypy]
workers=${CELLSCHED_TEST_WORKERS:-2}
parallel=()
if [ "$workers" != 0 ]; then parallel=(-n "$workers" --dist loadgroup); fi
status=0
"$VENV/bin/python" -m pytest -q "${parallel[@]}" "$@" || status=$?
if [ "${CELLSCHED_SLURM24:-$([ $# = 0 ] && echo 1 || echo 0)}" = 1 ]; then
  slurm24_tests=(
    tests/slurm_ext/wrapper/test_lua_contract.py
    tests/slurm_ext/wrapper/test_wrapper_slurm.py
    tests/slurm_ext/wrapper/test_untrusted_slurm.py
    tests/slurm_ext/backends/test_slurm_jobs.py
    tests/slurm_ext/backends/test_slurm_observe.py
    tests/slurm_ext/backends/test_slurm_bulk.py
    tests/slurm_ext/backends/test_slurm_outage.py
    tests/slurm_ext/controller/test_round_moves_slurm.py
    tests/slurm_ext/controller/test_controller_slurm.py::test_jobs_of_different_models_are_placed_run_and_complete
  )
  echo "test: the Slurm contract again on Slurm 24.11"
  DEVCLUSTER_SLURM=24.11 CELLSCHED_TEST_CTLD_PORT=26817 CELLSCHED_TEST_SLURMD_BASEPORT=26900 \
    CELLSCHED_TEST_WRAP_CTLD_PORT=24817 CELLSCHED_TEST_WRAP_SLURMD_BASEPORT=24900 \
    bash contrib/dev-cluster/devcluster.sh exec -- python -m pytest -q -p no:cacheprovider "${slurm24_tests[@]}" ||
    status=$?
  # Slurm preempting a managed job of the reference trainer: it needs torch, which the root lacks, so it runs
  # on this .venv's Python, mounted into the root (DEVCLUSTER_BIND: its own prefix; not Debian's /usr)
  base=$("$VENV/bin/python" -c 'import sys; print(sys.base_prefix)')
  if [ "$base" != /usr ]; then
    echo "test: Slurm 24.11 preempts a managed job"
    DEVCLUSTER_SLURM=24.11 DEVCLUSTER_BIND=$base CELLSCHED_TEST_PREEMPT_CTLD_PORT=27817 \
      CELLSCHED_TEST_PREEMPT_SLURMD_BASEPORT=27900 CELLSCHED_TEST_PREEMPT_LAB=/tmp/cellsched-test-preempt-24.11 \
      bash contrib/dev-cluster/devcluster.sh exec -- "$PWD/$VENV/bin/python" -m pytest -q -p no:cacheprovider \
      tests/slurm_ext/controller/test_slurm_preemption_slurm.py || status=$?
  else
    echo "test: Slurm 24.11 preempting a managed job skipped: $VENV's Python is Debian's own (/usr), not one to mount"
  fi
fi
exit "$status"
