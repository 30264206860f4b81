#!/usr/bin/env bash
# Record a site's own files on the accounting dev cluster (Slurm 22.05), for
# `cellsched simulate --trace-format sacct --site-dump ... --partitions ...`
# (docs/simulator.md#a-sites-own-files): an account tree with limits and QOS,
# a few dozen short plain sbatch GPU jobs across the accounts, then
#   OUT/sacctmgr_dump.txt          sacctmgr dump cellsched
#   OUT/scontrol_show_partition.txt  scontrol show partition
#   OUT/sacctmgr_show_qos.txt      sacctmgr -n -P show qos format=... (a dump lists no QOS limits)
#   OUT/sacct.txt                  sacct -a -P -X -o ... (the columns --trace-format sacct reads)
# Usage (as root): contrib/record-site-fixture.sh OUT
#   (tests/slurm_ext/sim/data/site/ was recorded so).
# LAB, CTLD_PORT, SLURMD_BASEPORT move the cluster (default /tmp/cellsched-record-site, 19817, 19900);
# it is started from an empty database and stopped at the end.
set -euo pipefail

OUT=${1:?usage: record-site-fixture.sh OUT}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEV=$HERE/dev-cluster/devcluster.sh
export LAB=${LAB:-/tmp/cellsched-record-site} CTLD_PORT=${CTLD_PORT:-19817} SLURMD_BASEPORT=${SLURMD_BASEPORT:-19900}
export DEVCLUSTER_ACCOUNTING=1 DEVCLUSTER_SHAPE="n1:a100:4,n2:a100:4,n3:a40:2,n4:a40:2"
mkdir -p "$OUT"
"$DEV" up
trap '"$DEV" down' EXIT
eval "$("$DEV" env)"
sa=(timeout 20 sacctmgr -i)
# typed GPUs in the accounting (AllocTRES gres/gpu:a100=N): slurmctld reads AccountingStorageTRES at start
sed -i 's|^AccountingStorageTRES=.*|AccountingStorageTRES=gres/gpu,gres/gpu:a100,gres/gpu:a40|' "$SLURM_CONF"
"$DEV" stop-ctld
"$DEV" start-ctld

# The site: the dev cluster's acct-a (Fairshare=60, GrpTRES=gres/gpu=4), acct-b (Fairshare=40)
# and QOS gpu2 (GrpTRES=gres/gpu=2), and:
#   QOS big     Priority=100 GrpTRES=gres/gpu=8 MaxTRESPerUser=gres/gpu=6 MaxTRESPerJob=gres/gpu=4 GrpJobs=5 MaxWall=01:00:00
#   account lab (under root)   Fairshare=30 GrpTRES=gres/gpu=6 GrpJobs=3 MaxSubmitJobs=50
#   account lab-x (under lab)  Fairshare=2
#   account lab-y (under lab)  Fairshare=1 GrpTRES=gres/gpu=2 MaxJobs=1
#   user root in lab-x and lab-y (QOS normal,big), and in acct-b with GrpTRES=gres/gpu=3
"${sa[@]}" add qos big Priority=100 GrpTRES=gres/gpu=8 MaxTRESPerUser=gres/gpu=6 MaxTRESPerJob=gres/gpu=4 \
  GrpJobs=5 MaxWall=01:00:00 >/dev/null
"${sa[@]}" add account lab Cluster=cellsched Fairshare=30 GrpTRES=gres/gpu=6 GrpJobs=3 MaxSubmitJobs=50 \
  QOS=normal,big Description=lab Organization=dev >/dev/null
"${sa[@]}" add account lab-x Cluster=cellsched Parent=lab Fairshare=2 QOS=normal,big Description=lab-x Organization=dev >/dev/null
"${sa[@]}" add account lab-y Cluster=cellsched Parent=lab Fairshare=1 GrpTRES=gres/gpu=2 MaxJobs=1 \
  QOS=normal,big Description=lab-y Organization=dev >/dev/null
"${sa[@]}" add user root Account=lab-x,lab-y >/dev/null
"${sa[@]}" modify user root where account=acct-b set GrpTRES=gres/gpu=3 >/dev/null
# partitions: a time limit and who may use them (scontrol: in slurmctld's memory, as `show partition` prints it)
scontrol update PartitionName=a40 MaxTime=00:10:00 AllowQos=normal,gpu2
scontrol update PartitionName=a100 DenyAccounts=acct-b
sleep 2  # slurmctld takes the new associations from slurmdbd

# the jobs: account qos partition gres seconds, in bursts (sleep N between them)
submit() {
  sbatch --parsable -A "$1" -q "$2" -p "$3" --gres="gpu:$4" -t 5 -c 1 --mem=100M -J "$1-$5" \
    -o /dev/null --wrap "sleep $5" >/dev/null
}
jobs=(
  "acct-a normal a100 a100:2 20" "acct-b normal a40 a40:2 15" "lab-x big a100 a100:4 25" "lab-y normal a40 a40:1 10"
  "acct-a gpu2 all 1 12" "acct-b normal all 2 18" "lab-x normal a100 a100:1 8" "lab-y big a100 a100:2 14"
  "acct-a normal a100 a100:4 16" "acct-b gpu2 a40 a40:2 9" "lab-x big a100 a100:2 22" "acct-a normal a40 a40:1 11"
  "sleep 6"
  "acct-b normal all 1 13" "lab-x normal a40 a40:2 17" "lab-y normal a100 a100:1 7" "acct-a gpu2 a100 a100:1 19"
  "acct-b normal a40 a40:1 21" "lab-x big all 3 12" "acct-a normal a100 a100:2 10" "lab-y normal a40 a40:2 15"
  "sleep 10"
  "acct-a normal all 2 14" "acct-b normal a40 a40:2 16" "lab-x normal a100 a100:4 9" "lab-y normal a100 a100:1 20"
  "acct-a gpu2 a40 a40:2 8" "acct-b gpu2 all 1 12" "lab-x big a100 a100:1 18" "acct-a normal a100 a100:3 13"
  "sleep 4"
  "acct-b normal all 3 10" "lab-x normal a40 a40:1 15" "lab-y big a100 a100:2 11" "acct-a normal a40 a40:2 9"
  "acct-b normal a40 a40:1 14" "lab-x big a100 a100:2 16" "acct-a gpu2 a100 a100:2 12" "lab-y normal a40 a40:1 8"
)
for j in "${jobs[@]}"; do
  # shellcheck disable=SC2086  # one job's words
  case $j in sleep*) $j ;; *) submit $j ;; esac
done
deadline=$((SECONDS + 900))
until [ -z "$(squeue -h -o %i)" ]; do
  [ $SECONDS -lt $deadline ] || { squeue; echo "record-site: jobs still queued after 900 s" >&2; exit 1; }
  sleep 2
done
sleep 3  # slurmdbd records the last ends
sacctmgr -i dump cellsched file="$OUT/sacctmgr_dump.txt" >/dev/null 2>&1
sacctmgr -n -P show qos format=name,priority,grptres,maxtres,maxtrespu,maxtrespa,grpjobs,maxjobspu,maxjobspa \
  >"$OUT/sacctmgr_show_qos.txt"
scontrol show partition >"$OUT/scontrol_show_partition.txt"
sacct -a -P -X -S 2000-01-01 -E now \
  -o JobID,JobName,User,Account,QOS,Partition,Submit,Start,End,State,AllocTRES,ReqTRES,NNodes,Timelimit,Comment \
  >"$OUT/sacct.txt"
echo "record-site: $(($(wc -l <"$OUT/sacct.txt") - 1)) jobs recorded in $OUT"
