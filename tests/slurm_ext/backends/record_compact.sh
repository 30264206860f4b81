#!/usr/bin/env bash
# Record what a round reads of a running dev cluster, both ways, as test fixtures
# (data/compact/RELEASE): every job's whole JSON record (squeue --json --states=all)
# and the compact query of slurm_ext/parse/squeue_fields.py (squeue --Format, with
# the fixed token in token.txt in place of the random one a round draws, its fields
# named in fields.txt), plus the
# nodes and partitions. Run where the cluster's clients are, on a freshly started
# cluster, with a Python that imports cellsched:
#
#   DEVCLUSTER_SLURM=24.11 contrib/dev-cluster/devcluster.sh up
#   DEVCLUSTER_SLURM=24.11 contrib/dev-cluster/devcluster.sh exec -- \
#     bash tests/slurm_ext/backends/record_compact.sh tests/slurm_ext/backends/data/compact/24.11
#   contrib/dev-cluster/devcluster.sh up        # 22.05, the host's
#   eval "$(contrib/dev-cluster/devcluster.sh env)"
#   PYTHON=.venv/bin/python bash tests/slurm_ext/backends/record_compact.sh tests/slurm_ext/backends/data/compact/22.05
#
# The jobs (ids.txt names them): two running over all of n1's and n3's GPUs (one
# with tasks, a time limit, nodes asked for and excluded, a constraint and an
# AdminComment); plain
# GPU jobs pending behind them (in a100, and in `all`, where Slurm describes the
# reason in a sentence); one pending until tomorrow (BeginTime); held by the user
# and by an admin; managed ones as `cellsched sbatch` submits them (held, the spec
# in the Comment), one with an AdminComment; jobs whose name and comment hold
# newlines, the old delimiters `|`, a record's end under a guessed token, the field
# separator (0x1F, that job is read whole), or
# 1,000 characters (sbatch refuses more); a job requeued by Slurm and finished ones (failed, cancelled,
# done); one waiting for a drained node (its reason printed as a sentence). The
# full read is taken between two compact reads that must agree (the scheduler
# settled), tried up to 10 times.
set -euo pipefail
out=${1:?usage: record_compact.sh OUTDIR}
py=${PYTHON:-python}
mkdir -p "$out"
token=0f1e2d3c4b5a6978
forged='#0000000000000000$' # a guess at the token that ends a record

# shellcheck source=tests/slurm_ext/backends/record_jobs.sh
source "$(dirname "${BASH_SOURCE[0]}")/record_jobs.sh"
spec='cellsched/v1 {"elastic":false,"global_batch":256,"iterations":5000,"max_gpus":8,"min_gpus":1,"model":"gpt-1.3b","runtime":"ddp","version":1}'

busy1=$(submit -J busy-a100 -p a100 -w n1 -x n2 --ntasks-per-node=4 -t 60 --constraint=a100 --gres=gpu:a100:4 --wrap 'sleep 900')
scontrol update JobId="$busy1" AdminComment='{"plan":{"cell":"a100:1x4:pp1"}}'
busy3=$(submit -J busy-v100 -p v100 -w n3 --gres=gpu:v100:8 --wrap 'sleep 900')
wait_state "$busy1" RUNNING
wait_state "$busy3" RUNNING
pend_a100=$(submit -J pend-a100 -p a100 -N 2 --gres=gpu:a100:4 --wrap 'sleep 60')
pend_all=$(submit -J pend-all -p all --gres=gpu:8 --wrap 'sleep 60')
later=$(submit -J later -p a40 --gres=gpu:a40:1 --begin=now+1day --wrap 'sleep 60')
held_user=$(submit --hold -J held-user -p all --gres=gpu:2 --wrap 'sleep 60')
held_admin=$(submit -J held-admin -p a10 --gres=gpu:a10:2 -N 1 --begin=now+1day --wrap 'sleep 60')
scontrol hold "$held_admin"
managed=$(submit --hold -J train --gres=gpu:1 -N 1 --comment="$spec" --wrap 'sleep 60')
planned=$(submit --hold -J train-planned --gres=gpu:1 -N 1 --comment="$spec" --wrap 'sleep 60')
scontrol update JobId="$planned" AdminComment='{"plan":{"cell":"a40:1x2:pp1"}}'
evil_name=$(submit --hold -J $'evil|name\nline two' --gres=gpu:1 --comment="x$forged"$'\n4242 RUNNING' --wrap 'sleep 60')
unit=$(submit --hold -J $'unit\x1fsep' --gres=gpu:1 --comment=$'a\x1fb\x1fc' --wrap 'sleep 60')
evil_tag=$(submit --hold -J evil-tag --gres=gpu:1 --comment=$'cellsched/v1 {"model":\n"gpt-1.3b"}|'"$forged" --wrap 'sleep 60')
long=$(submit --hold -J long --gres=gpu:1 --comment="$(printf 'c%.0s' $(seq 1000))" --wrap 'sleep 60')
requeued=$(submit -J requeued -p a40 -w n4 --gres=gpu:a40:1 --wrap 'sleep 600')
failed=$(submit -J failed -p a10 --wrap 'exit 3')
cancelled=$(submit -J cancelled -p a40 -w n5 --gres=gpu:a40:1 --wrap 'sleep 600')
done_=$(submit -J done -p a10 --wrap 'true')
end_jobs "$requeued" "$failed" "$cancelled" "$done_"
scontrol update NodeName=n6 State=DRAIN Reason="bad gpu"
drained=$(submit -J drained -p a10 --gres=gpu:a10:1 --wrap 'sleep 60')
printf '%s=%s\n' busy1 "$busy1" busy3 "$busy3" pend_a100 "$pend_a100" pend_all "$pend_all" later "$later" \
  held_user "$held_user" held_admin "$held_admin" managed "$managed" planned "$planned" evil_name "$evil_name" \
  evil_tag "$evil_tag" unit "$unit" long "$long" drained "$drained" requeued "$requeued" failed "$failed" cancelled "$cancelled" done "$done_" >"$out/ids.txt"

echo "$token" >"$out/token.txt"
sinfo --version >"$out/version.txt"
if [ "$(head -n1 "$out/version.txt" | grep -o '[0-9][0-9]*' | head -n1)" -ge 23 ]; then
  nodes=(scontrol --json show node) fields=FIELDS
else
  nodes=(sinfo --json) fields=FIELDS_22_05
fi
echo "$fields" >"$out/fields.txt"
mapfile -t compact < <("$py" -c 'import sys; from slurm_ext.parse import squeue_fields as f
print(*f.argv(f.Format(sys.argv[1], getattr(f, sys.argv[2]))), sep="\n")' "$token" "$fields")
for try in $(seq 10); do
  sleep 2 # the scheduler sets the pending jobs' reasons
  SLURM_TIME_FORMAT=%s "${compact[@]}" >"$out/squeue_compact.txt"
  squeue --json --states=all >"$out/squeue.json"
  "${nodes[@]}" >"$out/nodes.json"
  scontrol -o show partition >"$out/scontrol_-o_show_partition.txt"
  SLURM_TIME_FORMAT=%s "${compact[@]}" >"$out/squeue_compact.again"
  if cmp -s "$out/squeue_compact.txt" "$out/squeue_compact.again"; then
    rm "$out/squeue_compact.again"
    echo "record: wrote $out ($(head -n1 "$out/version.txt"), try $try)"
    exit 0
  fi
done
echo "record: the jobs kept changing between reads" >&2
exit 1
