"""cellsched's in-job runtime: srun wrapper, parallel groups, elastic training."""
