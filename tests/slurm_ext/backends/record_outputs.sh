#!/usr/bin/env bash
# Record a running dev cluster's outputs as test fixtures: squeue, sinfo and
# scontrol show, as text and as JSON at every data_parser version the release
# offers. Run where the cluster's clients are, on a freshly started cluster:
#
#   DEVCLUSTER_SLURM=24.11 contrib/dev-cluster/devcluster.sh up
#   DEVCLUSTER_SLURM=24.11 contrib/dev-cluster/devcluster.sh exec -- \
#     bash tests/slurm_ext/backends/record_outputs.sh tests/slurm_ext/backends/data/24.11
#
# It first makes one job of each kind the parsers meet (names say which):
# held (sbatch --hold, untyped GPUs, a comment), run (2 a100 nodes pinned, 4
# typed GPUs and 4 tasks a node, a time limit and an AdminComment), requeued
# (ran, then requeued: pending until its BeginTime, one node excluded), failed
# (exit 3), cancelled (while running) and done (exit 0); then drains n3
# ("bad gpu 3"), sets n6 down ("fault") and gives partition a100 a MaxTime of
# 2 days. Times are printed in UTC. ids.txt names each job's id.
set -euo pipefail
out=${1:?usage: record_outputs.sh OUTDIR}
mkdir -p "$out"
export TZ=UTC

# shellcheck source=tests/slurm_ext/backends/record_jobs.sh
source "$(dirname "${BASH_SOURCE[0]}")/record_jobs.sh"

held=$(submit --hold -J held -p all --gres=gpu:2 --comment='cellsched/v1 {"model":"gpt-1.3b"}' --wrap 'sleep 300')
run=$(submit -J run -p a100 -N 2 -w n1,n2 --ntasks-per-node=4 --gres=gpu:a100:4 -t 60 --wrap 'sleep 600')
scontrol update JobId="$run" AdminComment='{"cell":"a100:2x4:pp1"}'
requeued=$(submit -J requeued -p a40 -x n5 --gres=gpu:a40:1 --wrap 'sleep 600')
failed=$(submit -J failed -p a10 --wrap 'exit 3')
cancelled=$(submit -J cancelled -p v100 --gres=gpu:v100:2 --wrap 'sleep 600')
done_=$(submit -J done -p v100 --wrap 'true')
wait_state "$run" RUNNING
end_jobs "$requeued" "$failed" "$cancelled" "$done_"
scontrol update NodeName=n3 State=DRAIN Reason="bad gpu 3"
scontrol update NodeName=n6 State=DOWN Reason=fault
scontrol update PartitionName=a100 MaxTime=2-00:00:00
printf '%s=%s\n' held "$held" run "$run" requeued "$requeued" failed "$failed" cancelled "$cancelled" \
  done "$done_" >"$out/ids.txt"

sinfo --version >"$out/version.txt"
sinfo -N -h -o '%N|%P|%T|%G|%f|%C|%m|%o|%E' >"$out/sinfo_-N_-h_-o.txt"
squeue -h -t all -o '%i|%j|%P|%T|%r|%D|%b|%f|%N|%k|%Q|%V|%S' >"$out/squeue_-h_-t_all_-o.txt"
scontrol -d -o show node >"$out/scontrol_-d_-o_show_node.txt"
scontrol -o show partition >"$out/scontrol_-o_show_partition.txt"
scontrol -o show job >"$out/scontrol_-o_show_job.txt"
scontrol -d show job "$run" >"$out/scontrol_-d_show_job_run.txt"
# the data_parser versions on offer: `--json=list` names them (on stderr)
versions=$(squeue --json=list 2>&1 | grep -o 'v[0-9]\+\.[0-9]\+\.[0-9]\+' | sort -uV)
[ -n "$versions" ] || { echo "record: no data_parser versions listed" >&2; exit 1; }
echo "$versions" >"$out/data_parsers.txt"
for v in $versions; do
  squeue --json="$v" --states=all >"$out/squeue_$v.json"
  squeue --json="$v" --states=all --jobs="$run,$failed" >"$out/squeue_--jobs_$v.json"
  sinfo --json="$v" >"$out/sinfo_$v.json"
  scontrol --json="$v" show node >"$out/scontrol_show_node_$v.json"
  scontrol --json="$v" show partition >"$out/scontrol_show_partition_$v.json"
  scontrol --json="$v" show job >"$out/scontrol_show_job_$v.json"
  scontrol --json="$v" show job "$run" >"$out/scontrol_show_job_run_$v.json"
done
echo "record: wrote $(find "$out" -type f | wc -l) files to $out ($(head -n1 "$out/version.txt"))"
