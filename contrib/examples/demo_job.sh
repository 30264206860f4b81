#!/usr/bin/env bash
# A managed demo job: shows what Slurm gave it and the plan cellsched wrote
# into its AdminComment, sleeps a little, and (optionally) appends its job id
# to $DEMO_DONE_FILE so a test can count completions.
#   DEMO_SLEEP=3  seconds to sleep
set -euo pipefail
echo "== job $SLURM_JOB_ID on $(hostname): nodes=${SLURM_JOB_NODELIST:-?} partition=${SLURM_JOB_PARTITION:-?}"
env | grep -E '^(SLURM_(JOB_ID|JOB_NAME|JOB_NODELIST|JOB_NUM_NODES|JOB_PARTITION|NNODES|NTASKS|GPUS_ON_NODE|JOB_GPUS|TRES_PER_NODE)|CUDA_VISIBLE_DEVICES)=' | sort || true
echo "== plan (AdminComment):"
scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *AdminComment=//p' || echo "(scontrol unavailable)"
sleep "${DEMO_SLEEP:-3}"
if [ -n "${DEMO_DONE_FILE:-}" ]; then
  echo "$SLURM_JOB_ID" >>"$DEMO_DONE_FILE"
fi
echo "== job $SLURM_JOB_ID done"
