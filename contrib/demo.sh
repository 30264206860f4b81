#!/usr/bin/env bash
# The cellsched demo, end to end on one machine (Debian 12, as root):
#
#   bash contrib/demo.sh [--keep]
#
# Sets up Slurm + munge + .venv with cellsched (contrib/setup.sh: no test
# tools, no training frameworks), brings up a local Slurm
# dev cluster with fake GPUs of four types and accounting (slurmdbd +
# MariaDB: accounts acct-a, capped at 4 GPUs, and acct-b; LAB=/tmp/cellsched-demo),
# submits jobs of different models of both accounts through `cellsched sbatch`
# (held, untyped), runs the controller until every job has finished, prints
# `cellsched status`, and tears the cluster down (--keep leaves it running).
#
# CELLSCHED_DEMO_LAB, CELLSCHED_DEMO_CTLD_PORT and CELLSCHED_DEMO_SLURMD_BASEPORT
# move the cluster (the dev cluster's LAB, CTLD_PORT, SLURMD_BASEPORT), e.g. beside
# another demo.
#
# DEVCLUSTER_SLURM=24.11 runs it all on Slurm 24.11: inside the Debian 13 root
# that devcluster.sh builds (with that root's venv), or here on a Debian 13 machine.
set -euo pipefail
cd "$(dirname "$0")/.."
KEEP=0
case "${1:-}" in
  --keep) KEEP=1 ;;
  "") ;;
  *) echo "usage: $0 [--keep]" >&2; exit 2 ;;
esac

if [ -n "${DEVCLUSTER_SLURM:-}" ] && [ -z "${CELLSCHED_DEMO_THERE:-}" ]; then
  # where that release's clients are (devcluster.sh exec: in its root, or here)
  exec env CELLSCHED_DEMO_THERE=1 bash contrib/dev-cluster/devcluster.sh exec -- bash contrib/demo.sh "$@"
fi
if [ -f /.cellsched-root ]; then  # inside a devcluster.sh root: its venv has cellsched
  VENV=/opt/cellsched
else
  bash contrib/setup.sh
  VENV=${VENV:-.venv}
fi
export PATH="$PWD/$VENV/bin:$PATH"
export LAB=${CELLSCHED_DEMO_LAB:-/tmp/cellsched-demo}
unset CTLD_PORT SLURMD_BASEPORT DEVCLUSTER_SHAPE JOB_SUBMIT_LUA
if [ -n "${CELLSCHED_DEMO_CTLD_PORT:-}" ]; then export CTLD_PORT=$CELLSCHED_DEMO_CTLD_PORT; fi
if [ -n "${CELLSCHED_DEMO_SLURMD_BASEPORT:-}" ]; then export SLURMD_BASEPORT=$CELLSCHED_DEMO_SLURMD_BASEPORT; fi
# the site's accounts and limits bind the controller (Slurm 22.05; see docs/slurm-support.md for 24.11)
if [ "${DEVCLUSTER_SLURM:-}" = 24.11 ] || [ "$(cut -d. -f1 /etc/debian_version)" = 13 ]; then
  export DEVCLUSTER_ACCOUNTING=0
  echo "demo: Slurm 24.11: no accounting (slurmdbd 24.11 does not start against Debian 13's MariaDB), one account"
else
  export DEVCLUSTER_ACCOUNTING=1
fi
DEVCLUSTER=contrib/dev-cluster/devcluster.sh
WORK=$LAB/demo
CONFIG=$WORK/cellsched.toml
CTL_PID=

teardown() {
  if [ -n "$CTL_PID" ]; then kill "$CTL_PID" 2>/dev/null || true; wait "$CTL_PID" 2>/dev/null || true; fi
  if [ "$KEEP" = 1 ]; then
    echo "demo: cluster kept; use it with:  export SLURM_CONF=$LAB/etc/slurm.conf  (stop: LAB=$LAB bash $DEVCLUSTER down)"
  else
    bash "$DEVCLUSTER" down
  fi
}

echo "demo: starting the Slurm dev cluster under $LAB"
bash "$DEVCLUSTER" up
eval "$(bash "$DEVCLUSTER" env)"
trap teardown EXIT
rm -rf "$WORK"
mkdir -p "$WORK"
cat >"$CONFIG" <<CONF
[controller]
state_path = "$WORK/state.sqlite"
interval_s = 3.0
watch_s = 1.0
min_gap_s = 1.0
kick_file = "$WORK/kick"
checkpoint_root = "$WORK/checkpoints"
[metrics]
port = 0
[log]
format = "text"
CONF
bash "$DEVCLUSTER" network >>"$CONFIG"  # the nodes' network cards, from the cluster's shape

echo "demo: submitting jobs through cellsched sbatch"
ids=()
n=0
for spec in "gpt-1.3b 64" "gpt-350m 32" "bert__760M 64" "bert__1.3B 128" "moe__690M 64" "wide_resnet__500M 32" "moe__1.3B 64" "gpt-125m 16"; do
  read -r model batch <<<"$spec"
  account=()
  if [ "$DEVCLUSTER_ACCOUNTING" = 1 ]; then account=(-A "acct-$([ $((n % 2)) = 0 ] && echo a || echo b)"); fi
  n=$((n + 1))
  id=$(cellsched sbatch --parsable --model "$model" --global-batch "$batch" --iterations 100 "${account[@]}" \
         -J "demo-$model" -o "$WORK/%j.out" --export=ALL,DEMO_SLEEP=4 contrib/examples/demo_job.sh)
  echo "  job $id: $model, global batch $batch ${account[*]}"
  ids+=("$id")
done
squeue

echo "demo: what the first round would do (cellsched plan)"
cellsched plan --config "$CONFIG"

echo "demo: running the controller (log: $WORK/controller.log)"
cellsched controller run --config "$CONFIG" 2>"$WORK/controller.log" &
CTL_PID=$!
deadline=$((SECONDS + 300))
while :; do
  left=$(squeue -h -t PD,R,CG,CF -j "$(IFS=,; echo "${ids[*]}")" -o %i 2>/dev/null | wc -l)
  [ "$left" -eq 0 ] && break
  [ $SECONDS -lt $deadline ] || { echo "demo: jobs still unfinished after 300 s" >&2; squeue >&2; exit 1; }
  if [ -z "${shown:-}" ] && [ "$(squeue -h -t PD -j "$(IFS=,; echo "${ids[*]}")" -o %i | wc -l)" -gt 0 ]; then
    shown=1; sleep 8
    echo "demo: cellsched status while jobs wait (why each waits)"
    cellsched status --config "$CONFIG" || true
  fi
  sleep 2
done
sleep 4  # one more round records the ends

echo "demo: cellsched status --all"
cellsched status --all --config "$CONFIG"
echo
echo "demo: output of job ${ids[0]}:"
cat "$WORK/${ids[0]}.out"
failed=$(cellsched status --all --json --config "$CONFIG" | python3 -c 'import json,sys; print(sum(r["state"] != "COMPLETED" for r in json.load(sys.stdin)["jobs"]))')
[ "$failed" -eq 0 ] || { echo "demo: $failed job(s) did not complete" >&2; exit 1; }
echo "demo: all ${#ids[@]} jobs completed"
