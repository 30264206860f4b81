# Helpers of the recording scripts (record_outputs.sh, record_compact.sh), sourced by them:
# submit a job and print its id, wait for a job's state, end the jobs of each kind.

state() { squeue -h -t all -j "$1" -o %T 2>/dev/null || true; }
wait_state() {  # wait_state JOB STATE...: until the job is in one of them (30 s)
  local job=$1 s _
  shift
  for _ in $(seq 300); do
    s=$(state "$job")
    for want in "$@"; do [ "$s" = "$want" ] && return 0; done
    sleep 0.1
  done
  echo "record: job $job is $s, not $*" >&2
  exit 1
}
submit() { sbatch --parsable -o /dev/null "$@" | cut -d';' -f1; }
end_jobs() { # end_jobs REQUEUED FAILED CANCELLED DONE: once running, cancel one and requeue the other; wait for all four
  wait_state "$1" RUNNING
  wait_state "$3" RUNNING
  scancel "$3"
  scontrol requeue "$1"
  wait_state "$2" FAILED
  wait_state "$3" CANCELLED
  wait_state "$4" COMPLETED
  wait_state "$1" PENDING
}
