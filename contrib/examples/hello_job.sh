#!/bin/bash
# A minimal managed job for the wrapper's tests and a first try:
#   cellsched sbatch contrib/examples/hello_job.sh
#CELLSCHED model=gpt-tiny
#CELLSCHED global-batch=8
#CELLSCHED iterations=10
#SBATCH --job-name=hello
echo "hello from $(hostname): $# arguments"
for a in "$@"; do printf '  %s\n' "$a"; done
