#!/usr/bin/env bash
# Set up a development/test environment for cellsched on Debian 12 (as root).
#
#   bash contrib/setup.sh            # Debian packages (Slurm, slurmdbd, MariaDB, munge, systemd-analyze, debootstrap) + .venv with cellsched[test,torch]
#                                    # and the training frameworks of contrib/frameworks.txt (megatron-core, torchtitan, lightning)
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

need_pkgs=()
# slurmdbd + mariadb-server: the dev cluster with accounting (DEVCLUSTER_ACCOUNTING=1; same names on Debian 12 and 13)
for cmd_pkg in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge lua5.3:lua5.3 systemd-analyze:systemd \
  slurmdbd:slurmdbd mariadbd:mariadb-server debootstrap:debootstrap; do
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
"$VENV/bin/python" -m pip install "${pip_args[@]}" -e ".[test,torch]"
# the training frameworks the adapters are tested against: pinned, without their own dependency
# resolution (which would pull wandb and could replace the CPU torch); torch==2.13.0 stays
"$VENV/bin/python" -m pip install "${pip_args[@]}" --no-deps -r contrib/frameworks.txt "torch==2.13.0"
echo "setup: ready ($("$VENV/bin/cellsched" --version))"
