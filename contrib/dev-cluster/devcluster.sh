#!/usr/bin/env bash
# A real Slurm cluster with fake GPUs on this one machine, for development and
# integration tests (Debian 12, slurm-wlm 22.05; run as root).
#
# Usage: devcluster.sh up|down|status|env|network|stop-ctld|start-ctld
#   up          install slurm + munge if missing, write the config, start a
#               private munged, slurmctld and one `slurmd -N <node>` per node,
#               wait until every node is idle. Starts from a wiped state and
#               stops a previous instance under the same LAB first.
#   down        cancel all jobs, stop the daemons this script started (pids from
#               $LAB/run and $LAB/munge), keep logs and config for post-mortems.
#   status      sinfo of the cluster.
#   env         print the line clients need:  eval "$(devcluster.sh env)"
#   network     print the controller's [network] section: the NIC (Gb/s) of
#               each node whose shape line says nic=GBPS
#   stop-ctld   stop slurmctld only (its state is saved; slurmds keep running).
#   start-ctld  start slurmctld again from the saved state.
#   exec -- CMD...  run CMD where this cluster's Slurm clients are, with its
#               SLURM_CONF: here, or inside the Slurm root (see DEVCLUSTER_SLURM)
#
# Environment (all optional):
#   LAB=/tmp/cellsched-devcluster  everything lives here (conf, state, logs, pids)
#   DEVCLUSTER_SHAPE               a shape file, or inline "n1:a100:4,n2:v100:8";
#                                  default: cluster.conf next to this script
#   CTLD_PORT=17817                SlurmctldPort
#   SLURMD_BASEPORT=17900          node i (1-based) listens on SLURMD_BASEPORT+i
#   MEM_MB=16000                   RealMemory of every fake node
#   CRED_EXPIRE=10                 seconds; also the delay before a requeued job may start
#   JOB_SUBMIT_LUA=path            install this job_submit.lua and enable JobSubmitPlugins=lua
#   DEVCLUSTER_ACCOUNTING=1        also start MariaDB + slurmdbd (accounting, fair share,
#                                  accounts/users/QOS; see the accounting block below and
#                                  docs/site-policy-slurm.md); off (unset or 0): no accounting
#   DBD_PORT=CTLD_PORT+2           slurmdbd's port (accounting only)
#   DB_PORT=CTLD_PORT+3            MariaDB's TCP port on 127.0.0.1 (accounting only)
#   DEVCLUSTER_GPU_TYPE_TRES=1     accounting only: also account each GPU type as a TRES
#                                  (AccountingStorageTRES gres/gpu:TYPE), so that sacct's AllocTRES
#                                  names the type (gres/gpu:a100=4); off (unset or 0): gres/gpu only
#   DEVCLUSTER_SCHED_PARAMS=a=b,c=d  appended to SchedulerParameters (e.g. bf_resolution=1 for
#                                  time-compressed replays, benchmarks/slurm_fidelity.py); default none
#   DEVCLUSTER_PREEMPT=qos|partition  Slurm's own preemption (see the preemption block below and
#                                  docs/preemption.md): qos (needs DEVCLUSTER_ACCOUNTING=1) adds QOS
#                                  `urgent` that preempts `normal`; partition adds a partition `urgent`
#                                  over every node that preempts the others; off (unset or 0): none
#   DEVCLUSTER_PREEMPT_MODE=REQUEUE  REQUEUE or CANCEL: what Slurm does to a preempted job
#   DEVCLUSTER_GRACE_S=20          GraceTime (seconds) of the preempted QOS or partitions: SIGTERM,
#                                  then this long before the job is stopped; 0: stopped at once
#   DEVCLUSTER_MAX_JOBS=10000      MaxJobCount: how many jobs slurmctld keeps (benchmarks/observe_live.py
#                                  queues 10,000 and asks for more)
#   DEVCLUSTER_SLURM=22.05|24.11   the Slurm release to run. Unset: the one installed here.
#                                  One this Debian does not ship (24.11 on Debian 12) runs in a
#                                  Debian root of its own (debootstrap: trixie for 24.11, bookworm
#                                  for 22.05), built once under DEVCLUSTER_CACHE and rebuilt when
#                                  missing; its daemons, clients and `exec` run chrooted there
#                                  (/proc, /dev, /sys and this checkout mounted, at its own path and
#                                  at /cellsched, in a mount namespace of their own), with a Python
#                                  venv holding cellsched (editable, from /cellsched) and the test
#                                  tools. 24.11 has its own defaults: LAB=/tmp/cellsched-devcluster-24.11
#                                  (inside the root), CTLD_PORT=18817, SLURMD_BASEPORT=18900.
#   DEVCLUSTER_CACHE=/var/cache/cellsched   where the roots are built
#   DEVCLUSTER_BIND=/path[:/path...]  folders of this machine mounted (read-only) at their own path
#                                  in the root, for what jobs need from here: e.g. the Python that
#                                  runs this checkout's .venv (with torch), which the root lacks
#   DEVCLUSTER_MIRROR=http://deb.debian.org/debian   the archive debootstrap installs from
#
# Two instances with different LAB and ports can run side by side: each has its
# own munged (socket under $LAB/munge), so `down` never touches the other.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ "${DEVCLUSTER_SLURM:-}" = 24.11 ]; then  # its own state and ports, beside a 22.05 cluster
  LAB=${LAB:-/tmp/cellsched-devcluster-24.11} CTLD_PORT=${CTLD_PORT:-18817} SLURMD_BASEPORT=${SLURMD_BASEPORT:-18900}
fi
LAB=${LAB:-/tmp/cellsched-devcluster}
SHAPE=${DEVCLUSTER_SHAPE:-$HERE/cluster.conf}
CTLD_PORT=${CTLD_PORT:-17817}
SLURMD_BASEPORT=${SLURMD_BASEPORT:-17900}
MEM_MB=${MEM_MB:-16000}
CRED_EXPIRE=${CRED_EXPIRE:-10}
ETC=$LAB/etc
RUN=$LAB/run
LOGS=$LAB/log
MUNGE_DIR=$LAB/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
export SLURM_CONF=$ETC/slurm.conf

die() { echo "devcluster: $*" >&2; exit 1; }

fail() {  # die with the tail of every log
  echo "devcluster: ERROR: $*" >&2
  local f
  for f in "$LOGS"/*.log "$MUNGE_DIR"/munged.log; do
    [ -s "$f" ] && { echo "--- $f" >&2; tail -n 15 "$f" >&2; }
  done
  exit 1
}

# Print the shape as lines "name gpu_type gpus cpus nic_gbps" (nic_gbps "-"
# when the line names none), validated.
read_shape() {
  local text line name type gpus cpus nic rest tok
  if [ -f "$SHAPE" ]; then
    text=$(cat "$SHAPE")
  else  # inline "n1:a100:4,n2:v100:8": one node per line, fields by spaces
    text=${SHAPE//[, ]/$'\n'}
    text=${text//:/ }
  fi
  while IFS= read -r line; do
    line=${line%%#*}
    read -r name type gpus rest <<<"$line" || true
    [ -n "${name:-}" ] || continue
    [[ $name =~ ^[A-Za-z][A-Za-z0-9-]*$ ]] || die "shape: bad node name '$name'"
    [[ ${type:-} =~ ^[A-Za-z0-9_-]+$ ]] || die "shape: node $name: bad gpu_type '${type:-}'"
    [[ ${gpus:-} =~ ^[1-9][0-9]*$ ]] || die "shape: node $name: gpus must be a positive integer, got '${gpus:-}'"
    cpus= nic=-
    for tok in ${rest:-}; do
      case $tok in
        nic=*) nic=${tok#nic=}
          [[ $nic =~ ^[0-9]+([.][0-9]+)?$ ]] && [[ ! $nic =~ ^0+([.]0+)?$ ]] ||
            die "shape: node $name: nic must be a positive number of Gb/s, got '$nic'" ;;
        *) [ -z "$cpus" ] || die "shape: node $name: unexpected field '$tok'"
          cpus=$tok ;;
      esac
    done
    if [ -z "${cpus:-}" ]; then cpus=$(( gpus > 8 ? gpus : 8 )); fi
    [[ $cpus =~ ^[1-9][0-9]*$ ]] && [ "$cpus" -ge "$gpus" ] || die "shape: node $name: cpus '$cpus' must be >= gpus ($gpus)"
    echo "$name $type $gpus $cpus $nic"
  done <<<"$text"
}

node_names() { read_shape | awk '{print $1}'; }

# The controller's [network] section for the nodes whose shape line names a NIC.
network() {
  local shape
  shape=$(read_shape)
  echo "[network]"
  awk '$5 != "-" {printf "%s%s = %s", (n++ ? ", " : "nodes = { "), $1, $5} END {if (n) print " }"}' <<<"$shape"
}

# Is pid alive (not a zombie) and one of our daemons?
ours_alive() {
  local pid=$1 comm
  [ -r "/proc/$pid/status" ] || return 1
  grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" && return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  [[ $comm == slurmctld || $comm == slurmd || $comm == munged || $comm == slurmdbd || $comm == mariadbd ]]
}

ctld_up() { [ -f "$SLURM_CONF" ] && timeout 3 scontrol ping 2>/dev/null | grep -q 'is UP'; }

install_packages() {
  local missing=0 p
  for p in slurmctld slurmd scontrol munged; do command -v "$p" >/dev/null || missing=1; done
  if [ $missing = 1 ]; then
    echo "devcluster: installing slurm and munge" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge
  fi
}

write_conf() {
  local shape maxgpus i name type gpus cpus types t nodes
  shape=$(read_shape)
  [ -n "$shape" ] || die "shape '$SHAPE' has no nodes"
  mkdir -p "$ETC" "$RUN" "$LOGS" "$LAB/state" "$LAB/spool" "$LAB/fakegpu"
  maxgpus=$(awk '$3>m{m=$3} END{print m}' <<<"$shape")
  [[ -z ${DEVCLUSTER_SCHED_PARAMS:-} || $DEVCLUSTER_SCHED_PARAMS =~ ^[a-z_]+(=[A-Za-z0-9_.:-]+)?(,[a-z_]+(=[A-Za-z0-9_.:-]+)?)*$ ]] ||
    die "DEVCLUSTER_SCHED_PARAMS: expected key[=value],... got '$DEVCLUSTER_SCHED_PARAMS'"
  for ((i = 0; i < maxgpus; i++)); do ln -sfn /dev/null "$LAB/fakegpu/nvidia$i"; done

  cat >"$SLURM_CONF" <<EOF
# written by devcluster.sh; edits are lost on the next 'up'
ClusterName=cellsched
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_BASEPORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=$CRED_EXPIRE
StateSaveLocation=$LAB/state
SlurmdSpoolDir=$LAB/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,batch_sched_delay=0,bf_interval=1${DEVCLUSTER_SCHED_PARAMS:+,$DEVCLUSTER_SCHED_PARAMS}
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=3600
MaxJobCount=${DEVCLUSTER_MAX_JOBS:-10000}
EOF
  if [ -n "${JOB_SUBMIT_LUA:-}" ]; then
    [ -f "$JOB_SUBMIT_LUA" ] || die "JOB_SUBMIT_LUA=$JOB_SUBMIT_LUA is not a file"
    cp "$JOB_SUBMIT_LUA" "$ETC/job_submit.lua"
    echo "JobSubmitPlugins=lua" >>"$SLURM_CONF"
  else
    rm -f "$ETC/job_submit.lua"
  fi

  echo "AutoDetect=off" >"$ETC/gres.conf"
  i=0
  while read -r name type gpus cpus _; do
    i=$((i + 1))
    echo "NodeName=$name NodeAddr=127.0.0.1 Port=$((SLURMD_BASEPORT + i)) CPUs=$cpus RealMemory=$MEM_MB Gres=gpu:$type:$gpus Features=$type State=UNKNOWN" >>"$SLURM_CONF"
    echo "NodeName=$name Name=gpu Type=$type File=$LAB/fakegpu/nvidia[0-$((gpus - 1))]" >>"$ETC/gres.conf"
  done <<<"$shape"
  types=$(awk '{print $2}' <<<"$shape" | awk '!seen[$0]++')
  for t in $types; do
    nodes=$(awk -v t="$t" '$2==t{print $1}' <<<"$shape" | paste -sd,)
    echo "PartitionName=$t Nodes=$nodes MaxTime=INFINITE State=UP$(preempt_partition_opts)" >>"$SLURM_CONF"
  done
  nodes=$(awk '{print $1}' <<<"$shape" | paste -sd,)
  echo "PartitionName=all Nodes=$nodes Default=YES MaxTime=INFINITE State=UP$(preempt_partition_opts)" >>"$SLURM_CONF"
  if acct_on; then acct_write_conf "$types"; fi
  if preempt_on; then preempt_write_conf "$nodes"; fi
}

start_munge() {
  mkdir -p "$MUNGE_DIR"
  [ -s "$MUNGE_DIR/munge.key" ] || dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none
  chown -R munge:munge "$MUNGE_DIR"
  chmod 0755 "$MUNGE_DIR"
  chmod 0400 "$MUNGE_DIR/munge.key"
  runuser -u munge -- munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
    --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" \
    --seed-file="$MUNGE_DIR/munged.seed" || fail "munged did not start"
  local _
  for _ in $(seq 50); do
    munge -S "$MUNGE_SOCKET" -n 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  fail "munged is not answering on $MUNGE_SOCKET"
}

wait_ctld() {  # wait until slurmctld answers, or fail
  local deadline=$((SECONDS + 20)) pid
  until ctld_up; do
    pid=$(cat "$RUN/slurmctld.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && ! ours_alive "$pid"; then fail "slurmctld died"; fi
    [ $SECONDS -lt $deadline ] || fail "slurmctld not answering on port $CTLD_PORT"
    sleep 0.1
  done
}

wait_nodes() {  # wait until every node is in one of the states "$1" (regex), e.g. idle
  local want deadline=$((SECONDS + 30))
  want=$(node_names | wc -l)
  until [ "$(timeout 3 sinfo -h -N -p all -o '%N %T' 2>/dev/null | awk -v re="^($1)\$" '$2 ~ re' | wc -l)" -eq "$want" ]; do
    if [ $SECONDS -ge $deadline ]; then
      timeout 3 sinfo -N -p all -o '%N %T %E' >&2 || true
      fail "nodes not $1 after 30 s"
    fi
    sleep 0.2
  done
}

our_pids() {  # live pids of the daemons started under this LAB
  local f pid
  for f in "$RUN"/*.pid "$MUNGE_DIR"/munged.pid; do
    [ -s "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null) || continue
    [[ $pid =~ ^[0-9]+$ ]] && ours_alive "$pid" && echo "$pid"
  done
  our_munged
  return 0
}

our_munged() {  # munged serving this LAB's socket, by its command line: a dying one may have removed its pid file
  local d
  for d in /proc/[0-9]*; do
    [ "$(cat "$d/comm" 2>/dev/null)" = munged ] || continue
    tr '\0' '\n' <"$d/cmdline" 2>/dev/null | grep -qxF -- "--socket=$MUNGE_SOCKET" && ours_alive "${d#/proc/}" && echo "${d#/proc/}"
  done 2>/dev/null
  return 0
}

cluster_steps() {  # slurmstepd processes of this cluster: they carry its SLURM_CONF
  local d
  for d in /proc/[0-9]*; do
    [ "$(cat "$d/comm" 2>/dev/null)" = slurmstepd ] || continue
    tr '\0' '\n' <"$d/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF" && echo "${d#/proc/}"
  done 2>/dev/null  # a step ending meanwhile: no environ to read
  return 0
}

descendants() {  # every descendant pid of $1
  local child
  # shellcheck disable=SC2013  # the file is one line of space separated pids
  for child in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    echo "$child"
    descendants "$child"
  done
}

stop_pids() {  # TERM, wait, then KILL the given pids
  local p _
  [ $# -gt 0 ] || return 0
  kill "$@" 2>/dev/null || true
  for p in "$@"; do
    for _ in $(seq 60); do ours_alive "$p" || break; sleep 0.05; done
    ours_alive "$p" || continue
    kill -9 "$p" 2>/dev/null || true  # slurmd ignores TERM while slurmctld is gone
    # until it is gone: a munged still dying holds its socket's lock, and the next `up` cannot start one
    for _ in $(seq 200); do ours_alive "$p" || break; sleep 0.05; done
  done
}

# ==== accounting (DEVCLUSTER_ACCOUNTING=1) =================================
# MariaDB (own datadir, socket and 127.0.0.1 port under $LAB) + slurmdbd (own
# port), multifactor priority with fair share, limits enforced, and the site
# below made with sacctmgr (the cluster before slurmctld starts, the rest once
# slurmctld has registered the gres/gpu TRES). Every function here runs only
# when acct_on; without it the cluster is exactly the one above.
#
# The site (docs/site-policy-slurm.md):
#   cluster cellsched; QOS normal (Slurm's) and gpu2 (GrpTRES=gres/gpu=2)
#   account acct-a  Fairshare=60  GrpTRES=gres/gpu=4   (QOS normal,gpu2)
#   account acct-b  Fairshare=40                       (QOS normal,gpu2)
#   user root in acct-a (default) and acct-b; users named in
#   DEVCLUSTER_ACCT_USERS="alice:acct-a bob:acct-b" are added too
ACCOUNTING=${DEVCLUSTER_ACCOUNTING:-0}
DBD_PORT=${DBD_PORT:-$((CTLD_PORT + 2))}
DB_PORT=${DB_PORT:-$((CTLD_PORT + 3))}
DB_DIR=$LAB/mariadb
DB_SOCKET=$DB_DIR/mysqld.sock

acct_on() {
  case $ACCOUNTING in
    1)
      # Debian 13's slurmdbd 24.11.5 against its MariaDB 11.8 stops at start-up (slurmdbd.log:
      # "_check_mysql_concat_is_sane: null result", the client library refusing the result
      # of `select @var := concat('')`): accounting runs on Slurm 22.05 only, for now
      [ "$(release_of_host)" != 24.11 ] ||
        die "DEVCLUSTER_ACCOUNTING=1 needs Slurm 22.05: slurmdbd 24.11 does not start against Debian 13's MariaDB 11.8 (docs/slurm-support.md)"
      return 0 ;;
    0 | "") return 1 ;;
    *) die "DEVCLUSTER_ACCOUNTING must be 0 or 1, got '$ACCOUNTING'" ;;
  esac
}

acct_install_packages() {
  command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null && command -v mariadb-install-db >/dev/null && return 0
  echo "devcluster: installing mariadb-server and slurmdbd" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mariadb-server slurmdbd
}

acct_write_conf() {  # slurm.conf's accounting lines (typed GPU TRES of the types "$1" when asked), and slurmdbd.conf
  local tres=gres/gpu t
  case ${DEVCLUSTER_GPU_TYPE_TRES:-0} in
    1) for t in $1; do tres="$tres,gres/gpu:$t"; done ;;
    0) ;;
    *) die "DEVCLUSTER_GPU_TYPE_TRES must be 0 or 1, got '$DEVCLUSTER_GPU_TYPE_TRES'" ;;
  esac
  sed -i -e 's|^AccountingStorageType=.*|AccountingStorageType=accounting_storage/slurmdbd|' "$SLURM_CONF"
  cat >>"$SLURM_CONF" <<CONF
# --- accounting (DEVCLUSTER_ACCOUNTING=1)
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageEnforce=associations,limits,qos,safe
AccountingStorageTRES=$tres
PriorityType=priority/multifactor
PriorityWeightFairshare=10000
PriorityWeightAge=1000
PriorityWeightQOS=1000
PriorityWeightJobSize=0
PriorityWeightPartition=0
PriorityMaxAge=1-0
PriorityDecayHalfLife=1-0
PriorityCalcPeriod=1
CONF
  [ -s "$DB_DIR/pass" ] || { mkdir -p "$DB_DIR"; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$DB_DIR/pass"; }
  chmod 0600 "$DB_DIR/pass"
  (
    umask 077
    cat >"$ETC/slurmdbd.conf" <<CONF
# written by devcluster.sh; edits are lost on the next 'up'
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$LOGS/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$(cat "$DB_DIR/pass")
StorageLoc=slurm_acct_db
CONF
  )
}

acct_sql() { mariadb --no-defaults -S "$DB_SOCKET" -u root --batch -e "$1"; }

acct_start_db() {  # a fresh MariaDB in $DB_DIR/data, listening on 127.0.0.1:$DB_PORT and $DB_SOCKET
  rm -rf "$DB_DIR/data"
  mkdir -p "$DB_DIR/data"
  mariadb-install-db --no-defaults --datadir="$DB_DIR/data" --user=root --auth-root-authentication-method=socket \
    --skip-test-db >"$LOGS/mariadb-install.log" 2>&1 || fail "mariadb-install-db failed (see $LOGS/mariadb-install.log)"
  # its own session, every descriptor closed: the caller (a test's subprocess) waits for its pipes' end
  setsid mariadbd --no-defaults --datadir="$DB_DIR/data" --socket="$DB_SOCKET" --port="$DB_PORT" \
    --bind-address=127.0.0.1 --pid-file="$RUN/mariadbd.pid" --log-error="$LOGS/mariadb.log" --user=root \
    --skip-name-resolve --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 \
    </dev/null >/dev/null 2>&1 &
  local deadline=$((SECONDS + 60))
  until acct_sql 'SELECT 1' >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "MariaDB not answering on $DB_SOCKET"
    sleep 0.2
  done
  acct_sql "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$(cat "$DB_DIR/pass")';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || fail "could not create MariaDB user slurm"
}

acct_start_dbd() {
  slurmdbd || fail "slurmdbd did not start"
  local deadline=$((SECONDS + 90)) pid
  until timeout 5 sacctmgr -n -P show cluster format=cluster >/dev/null 2>&1; do
    pid=$(cat "$RUN/slurmdbd.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && ! ours_alive "$pid"; then fail "slurmdbd died"; fi
    [ $SECONDS -lt $deadline ] || fail "slurmdbd not answering on port $DBD_PORT"
    sleep 0.3
  done
}

acct_site() {  # QOS, accounts and users (sacctmgr -i: no questions), once slurmctld registered the gres/gpu TRES
  local sa=(timeout 20 sacctmgr -i) pair user account deadline=$((SECONDS + 30))
  until timeout 5 sacctmgr -n -P show tres format=type,name 2>/dev/null | grep -qx 'gres|gpu'; do
    [ $SECONDS -lt $deadline ] || fail "slurmctld did not register the gres/gpu TRES with slurmdbd"
    sleep 0.3
  done
  "${sa[@]}" add qos gpu2 GrpTRES=gres/gpu=2 >/dev/null || fail "sacctmgr add qos failed"
  "${sa[@]}" add account acct-a Cluster=cellsched Fairshare=60 GrpTRES=gres/gpu=4 QOS=normal,gpu2 \
    Description=acct-a Organization=dev >/dev/null || fail "sacctmgr add account acct-a failed"
  "${sa[@]}" add account acct-b Cluster=cellsched Fairshare=40 QOS=normal,gpu2 \
    Description=acct-b Organization=dev >/dev/null || fail "sacctmgr add account acct-b failed"
  "${sa[@]}" add user root Account=acct-a,acct-b >/dev/null || fail "sacctmgr add user root failed"
  "${sa[@]}" modify user root set DefaultAccount=acct-a >/dev/null || fail "sacctmgr modify user root failed"
  if [ "$PREEMPT" = qos ]; then preempt_qos; fi
  for pair in ${DEVCLUSTER_ACCT_USERS:-}; do
    user=${pair%%:*} account=${pair#*:}
    [[ $user =~ ^[a-z_][a-z0-9_-]*$ && $account =~ ^acct-[ab]$ ]] || die "DEVCLUSTER_ACCT_USERS: bad entry '$pair' (user:acct-a|acct-b)"
    "${sa[@]}" add user "$user" Account="$account" DefaultAccount="$account" >/dev/null || fail "sacctmgr add user $user failed"
  done
}

acct_up() {  # after munged, before slurmctld (acct_site follows once the nodes are up)
  acct_start_db
  acct_start_dbd
  timeout 20 sacctmgr -i add cluster cellsched >/dev/null || fail "sacctmgr add cluster failed"
}
# ==== end of accounting ======================================================

# ==== Slurm's preemption (DEVCLUSTER_PREEMPT=qos|partition) ==================
# Jobs of higher priority take the GPUs of running jobs (docs/preemption.md):
#   qos        PreemptType=preempt/qos; QOS `urgent` (Preempt=normal, Priority=1000) that
#              every account may use; `normal` gets GraceTime=DEVCLUSTER_GRACE_S.
#              Needs accounting (QOS live in slurmdbd).
#   partition  PreemptType=preempt/partition_prio; every partition PriorityTier=1 with
#              GraceTime=DEVCLUSTER_GRACE_S, and a partition `urgent` over every node with
#              PriorityTier=2 and PreemptMode=OFF (never preempted itself). No accounting needed.
# Both: PreemptMode=DEVCLUSTER_PREEMPT_MODE (REQUEUE or CANCEL). A job submitted with
# `-q urgent` (qos) or `-p urgent` (partition) preempts what it needs.
PREEMPT=${DEVCLUSTER_PREEMPT:-0}
PREEMPT_MODE=${DEVCLUSTER_PREEMPT_MODE:-REQUEUE}
GRACE_S=${DEVCLUSTER_GRACE_S:-20}

preempt_on() {
  case $PREEMPT in
    qos)
      acct_on || die "DEVCLUSTER_PREEMPT=qos needs DEVCLUSTER_ACCOUNTING=1 (QOS live in slurmdbd)" ;;
    partition) ;;
    0 | "") return 1 ;;
    *) die "DEVCLUSTER_PREEMPT must be qos, partition or 0, got '$PREEMPT'" ;;
  esac
  [[ $PREEMPT_MODE =~ ^(REQUEUE|CANCEL)$ ]] || die "DEVCLUSTER_PREEMPT_MODE must be REQUEUE or CANCEL, got '$PREEMPT_MODE'"
  [[ $GRACE_S =~ ^[0-9]+$ ]] || die "DEVCLUSTER_GRACE_S must be a number of seconds, got '$GRACE_S'"
  return 0
}

preempt_partition_opts() {  # what an ordinary partition's line gets with partition preemption
  if preempt_on && [ "$PREEMPT" = partition ]; then echo " PriorityTier=1 GraceTime=$GRACE_S"; fi
}

preempt_write_conf() {  # slurm.conf's preemption lines ($1: every node)
  cat >>"$SLURM_CONF" <<CONF
# --- preemption (DEVCLUSTER_PREEMPT=$PREEMPT)
PreemptType=preempt/$([ "$PREEMPT" = qos ] && echo qos || echo partition_prio)
PreemptMode=$PREEMPT_MODE
CONF
  if [ "$PREEMPT" = partition ]; then
    echo "PartitionName=urgent Nodes=$1 MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF" >>"$SLURM_CONF"
  fi
}

preempt_qos() {  # QOS urgent over normal (acct_site: slurmdbd and the accounts are there)
  local sa=(timeout 20 sacctmgr -i)
  "${sa[@]}" modify qos normal set GraceTime="$GRACE_S" >/dev/null || fail "sacctmgr modify qos normal failed"
  "${sa[@]}" add qos urgent Preempt=normal Priority=1000 >/dev/null || fail "sacctmgr add qos urgent failed"
  "${sa[@]}" modify account acct-a,acct-b set QOS+=urgent >/dev/null || fail "sacctmgr: QOS urgent for the accounts failed"
}
# ==== end of preemption ======================================================

up() {
  [ "$(id -u)" = 0 ] || die "up must run as root"
  install_packages
  if acct_on; then acct_install_packages; fi
  if preempt_on; then :; fi  # its settings checked before anything starts
  read_shape >/dev/null
  if [ -n "$(our_pids)" ]; then down; fi
  rm -rf "$LAB/state" "$LAB/spool" "$LOGS" "$RUN"
  write_conf
  write_release_conf
  start_munge
  if acct_on; then acct_up; fi
  slurmctld -i || fail "slurmctld did not start"
  wait_ctld
  local n
  for n in $(node_names); do
    mkdir -p "$LAB/spool/$n"
    slurmd -N "$n" || fail "slurmd -N $n did not start"
  done
  wait_nodes idle  # exactly idle: not idle* (not responding), inval or drained
  if acct_on; then acct_site; fi
  timeout 5 sinfo
}

down() {
  if ctld_up; then
    local jobs _
    jobs=$(timeout 5 squeue -h -t PD,R,CG,S,CF,RQ,RS,SO -o %i 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086  # one job id per word
      timeout 5 scancel --full $jobs >/dev/null 2>&1 || true
      for _ in $(seq 50); do
        [ -z "$(timeout 3 squeue -h -t R,CG -o %i 2>/dev/null)" ] && break
        sleep 0.1
      done
    fi
    timeout 5 scontrol shutdown >/dev/null 2>&1 || true  # stops slurmctld and every slurmd
  fi
  local pids step
  mapfile -t pids < <(our_pids | sort -u)
  stop_pids "${pids[@]}"
  # job steps left behind when the daemons died before their jobs (a crash, or
  # down while slurmctld was stopped): kill each step with its processes
  for step in $(cluster_steps); do
    mapfile -t pids < <(descendants "$step")
    kill -9 "${pids[@]}" "$step" 2>/dev/null || true
  done
  rm -f "$RUN"/*.pid
}

stop_ctld() {
  local pid
  pid=$(cat "$RUN/slurmctld.pid" 2>/dev/null || true)
  if [ -z "$pid" ] || ! ours_alive "$pid"; then die "slurmctld is not running under $LAB"; fi
  timeout 5 scontrol shutdown slurmctld >/dev/null 2>&1 || true
  local _
  for _ in $(seq 100); do ours_alive "$pid" || return 0; sleep 0.05; done
  stop_pids "$pid"
}

start_ctld() {
  local pid
  pid=$(cat "$RUN/slurmctld.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && ours_alive "$pid"; then die "slurmctld already running (pid $pid)"; fi
  slurmctld || fail "slurmctld did not start"
  wait_ctld
  # every node registered and responding again (no trailing *, not unknown); one may be drained or down on purpose
  wait_nodes '(idle|mixed|allocated|completing|drained|draining|down)([+][a-z]+)*'
}

# --- Slurm releases: the release this host ships runs here; another one runs in
# a Debian root of its own, built once with debootstrap (kept apart from the
# functions above so that they stay the same for every release) ---

CACHE=${DEVCLUSTER_CACHE:-/var/cache/cellsched}
MIRROR=${DEVCLUSTER_MIRROR:-http://deb.debian.org/debian}
#: what a root holds: Slurm, munge, Lua for job_submit.lua, and a Python for cellsched and its tests
ROOT_PKGS=slurmctld,slurmd,slurm-client,munge,lua5.3,python3,python3-venv,procps
#: pip packages of the root's venv besides cellsched's own dependencies (no torch: no test run there needs it)
ROOT_PIP="pytest pytest-xdist hypothesis setuptools>=77"
ROOT_VENV=/opt/cellsched
#: where the checkout is mounted in a root (besides its own path): the venv's editable cellsched points here
ROOT_REPO=/cellsched

release_of_host() {  # the Slurm release this Debian ships
  case "$(cut -d. -f1 /etc/debian_version 2>/dev/null)" in
    12) echo 22.05 ;;
    13) echo 24.11 ;;
    *) echo "" ;;
  esac
}

suite_of() {
  case $1 in
    22.05) echo bookworm ;;
    24.11) echo trixie ;;
    *) die "DEVCLUSTER_SLURM must be 22.05 or 24.11, got '$1'" ;;
  esac
}

in_a_root() { [ -n "${DEVCLUSTER_SLURM:-}" ] && [ "$DEVCLUSTER_SLURM" != "$(release_of_host)" ]; }

root_dir() { echo "$CACHE/slurm-$DEVCLUSTER_SLURM-$(suite_of "$DEVCLUSTER_SLURM")"; }

write_release_conf() {  # what Slurm 23.02 and later need besides slurm.conf
  local v
  v=$(slurmctld -V | awk '{print $2}')
  if [ "$(printf '%s\n' "$v" 23.02 | sort -V | head -n1)" = 23.02 ]; then
    # slurmd would take over a cgroup mount (none in a chroot or container); the dev cluster tracks by pid
    echo "CgroupPlugin=disabled" >"$ETC/cgroup.conf"
  fi
}

exec_here() {  # exec -- CMD...: CMD with this cluster's SLURM_CONF
  [ "${1:-}" = -- ] && shift
  [ $# -gt 0 ] || die "usage: $0 exec -- CMD..."
  exec "$@"
}

# chroot_run ROOT CMD...: in a fresh mount namespace (see in_root), mount what
# the daemons and clients need into ROOT and run CMD there, in the same folder
# when the root has it, with the root's venv first on PATH.
chroot_run() {
  local root=$1 repo cwd
  shift
  repo=$(cd "$HERE/../.." && pwd)
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  mount --rbind /sys "$root/sys"
  mkdir -p "$root$ROOT_REPO" "$root$repo"
  mount --bind "$repo" "$root$ROOT_REPO"
  mount --bind "$repo" "$root$repo"
  local bind
  for bind in ${DEVCLUSTER_BIND:+${DEVCLUSTER_BIND//:/ }}; do
    [ -d "$bind" ] || die "DEVCLUSTER_BIND: '$bind' is not a folder"
    mkdir -p "$root$bind"
    mount --bind "$bind" "$root$bind"
    mount -o remount,bind,ro "$root$bind" 2>/dev/null || true
  done
  cp /etc/hosts "$root/etc/hosts"
  cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
  # this machine's CA trust (a TLS proxy's own CA): pip in the root reaches the index as pip here does
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    mkdir -p "$root/etc/ssl/certs"
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  fi
  cwd=$PWD
  [ -d "$root$cwd" ] || cwd=/
  exec chroot "$root" /usr/bin/env -u VIRTUAL_ENV -u TMPDIR -C "$cwd" HOME=/root \
    PATH="$ROOT_VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "$@"
}

# in_root ROOT CMD...: CMD chrooted in ROOT. Its mounts live in a mount
# namespace of its own, private to CMD and what it starts (daemons included),
# so each checkout sees itself at /cellsched and nothing is left mounted.
in_root() {
  unshare --mount --propagation private -- bash "$HERE/devcluster.sh" _chroot "$@"
}

build_root() {  # build ROOT for SUITE unless it is there with this recipe
  local root=$1 suite=$2 recipe tmp started=$SECONDS
  recipe="$suite $ROOT_PKGS | $ROOT_PIP"
  [ "$(cat "$root/.cellsched-root" 2>/dev/null)" = "$recipe" ] && return 0
  mkdir -p "$CACHE"
  exec 8>"$root.lock"
  flock 8  # one build at a time; a second waits and finds it done
  if [ "$(cat "$root/.cellsched-root" 2>/dev/null)" = "$recipe" ]; then exec 8>&-; return 0; fi
  command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >&2
  tmp=$root.build
  rm -rf "$tmp"
  echo "devcluster: building the Slurm $DEVCLUSTER_SLURM root ($suite) in $root (a few minutes, once)" >&2
  debootstrap --variant=minbase --include="$ROOT_PKGS" "$suite" "$tmp" "$MIRROR" >"$root.log" 2>&1 ||
    { tail -n 20 "$root.log" >&2; die "debootstrap failed (log: $root.log)"; }
  rm -f "$tmp"/var/cache/apt/archives/*.deb
  chroot "$tmp" python3 -m venv --system-site-packages "$ROOT_VENV"
  # shellcheck disable=SC2086  # ROOT_PIP is a list of requirements
  in_root "$tmp" "$ROOT_VENV/bin/pip" install -q --no-cache-dir $ROOT_PIP -e "$ROOT_REPO" >>"$root.log" 2>&1 ||
    { tail -n 20 "$root.log" >&2; die "pip in the root failed (log: $root.log)"; }
  echo "$recipe" >"$tmp/.cellsched-root"
  rm -rf "$root"
  mv "$tmp" "$root"
  echo "devcluster: built $root in $((SECONDS - started)) s ($(du -sh "$root" | cut -f1))" >&2
  exec 8>&-
}

files_into_root() {  # copy a shape or job_submit.lua file the root does not have at the same path
  local root=$1 var path
  for var in DEVCLUSTER_SHAPE JOB_SUBMIT_LUA; do
    path=${!var:-}
    [ -n "$path" ] && [ -f "$path" ] || continue
    [ -f "$root$path" ] && cmp -s "$path" "$root$path" && continue
    mkdir -p "$root/tmp/cellsched-devcluster-files"
    cp "$path" "$root/tmp/cellsched-devcluster-files/$var"
    export "$var=/tmp/cellsched-devcluster-files/$var"
  done
}

via_root() {  # run this script's command inside the root of $DEVCLUSTER_SLURM
  local root
  root=$(root_dir)
  case $1 in
    network) network; return ;;
    env) echo "export SLURM_CONF=$SLURM_CONF  # inside $root: run clients with '$0 exec -- CMD'"; return ;;
    down | status | stop-ctld | start-ctld)
      if [ ! -f "$root/.cellsched-root" ]; then
        [ "$1" = down ] && return 0
        die "no Slurm $DEVCLUSTER_SLURM root at $root: run up first"
      fi ;;
    *)
      [ "$(id -u)" = 0 ] || die "the Slurm $DEVCLUSTER_SLURM root needs root"
      build_root "$root" "$(suite_of "$DEVCLUSTER_SLURM")" ;;
  esac
  files_into_root "$root"
  export DEVCLUSTER_SLURM
  if [ "$1" = exec ]; then
    shift
    [ "${1:-}" = -- ] && shift
    [ $# -gt 0 ] || die "usage: $0 exec -- CMD..."
    in_root "$root" "$@"
  else
    in_root "$root" bash "$HERE/devcluster.sh" "$@"
  fi
}

if [ "${1:-}" = _chroot ]; then
  shift
  chroot_run "$@"
fi
if in_a_root && [ -n "${1:-}" ]; then
  via_root "$@"
  exit
fi

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) timeout 5 sinfo -N -o '%N %P %T %G %f' ;;
  env) echo "export SLURM_CONF=$SLURM_CONF" ;;
  network) network ;;
  stop-ctld) stop_ctld ;;
  start-ctld) start_ctld ;;
  exec) shift; exec_here "$@" ;;
  *) echo "usage: $0 up|down|status|env|network|stop-ctld|start-ctld|exec -- CMD..." >&2; exit 2 ;;
esac
