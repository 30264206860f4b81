"""cellsched's solver: a pure library (state in, plan out). Imports nothing of ours."""
