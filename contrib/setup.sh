#!/usr/bin/env bash
# Set up cellsched on Debian 12 or 13 (as root): what the product and the demo need,
# and with --test what the test suite needs besides.
#
#   bash contrib/setup.sh          # Debian's Slurm, slurmdbd, MariaDB, munge and Lua + .venv with cellsched[torch]
#                                  # (the demo, contrib/demo.sh, runs this)
#   bash contrib/setup.sh --test   # also systemd-analyze and debootstrap, cellsched's test extra, and
#                                  # the training frameworks of contrib/frameworks.txt (megatron-core,
#                                  # torchtitan, lightning) that the launcher's adapters are tested against
#                                  # (the test suite, contrib/test.sh, runs this)
#
# debootstrap builds the Debian 13 root in which the suite runs Slurm 24.11
# (contrib/dev-cluster/devcluster.sh, DEVCLUSTER_SLURM=24.11).
#
# Idempotent: installs only what is missing. The virtual environment lives in
# .venv (override with VENV=...). torch is pinned to the CPU build 2.13.0; on a
# machine without a local CPU wheel set TORCH_INDEX_URL (e.g. PyTorch's CPU
# wheel index) so that no CUDA build is pulled in.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
TEST=0
case "${1:-}" in
  --test) TEST=1 ;;
  "") ;;
  *) echo "usage: $0 [--test]" >&2; exit 2 ;;
esac

# command:package; slurmdbd + mariadb-server: the dev cluster with accounting (DEVCLUSTER_ACCOUNTING=1,
# as the demo runs it), Lua: what Slurm's job_submit/lua plugin loads (same names on Debian 12 and 13)
needs=(slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge lua5.3:lua5.3 slurmdbd:slurmdbd
  mariadbd:mariadb-server)
if [ "$TEST" = 1 ]; then
  # systemd-analyze checks the units, debootstrap builds the Slurm 24.11 root
  needs+=(systemd-analyze:systemd debootstrap:debootstrap)
fi
need_pkgs=()
for cmd_pkg in "${needs[@]}"; do
  cmd=${cmd_pkg%%:*}; pkg=${cmd_pkg#*:}
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || need_pkgs+=("$pkg")
done
if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then need_pkgs+=(python3-venv); fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  # system site packages: reuse what the machine already has (e.g. a preinstalled torch)
  "$PY" -m venv --system-site-packages "$VENV"
fi
pip_args=(-q)
if [ -n "${TORCH_INDEX_URL:-}" ]; then pip_args+=(--extra-index-url "$TORCH_INDEX_URL"); fi
"$VENV/bin/python" -m pip install "${pip_args[@]}" "torch==2.13.0"
if [ "$TEST" = 1 ]; then
  "$VENV/bin/python" -m pip install "${pip_args[@]}" -e ".[test,torch]"
  # the training frameworks the adapters are tested against: pinned, without their own dependency
  # resolution (which would pull wandb and could replace the CPU torch); torch==2.13.0 stays
  "$VENV/bin/python" -m pip install "${pip_args[@]}" --no-deps -r contrib/frameworks.txt "torch==2.13.0"
else
  "$VENV/bin/python" -m pip install "${pip_args[@]}" -e ".[torch]"
fi
echo "setup: ready ($("$VENV/bin/cellsched" --version))"
