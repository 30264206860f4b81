"""Arena's published tables as estimators: the lookup of its measured cells
(`lookup.ArenaTable`, the truth and estimate of ``--arena-compat``) and its
profiler's estimates filled by ours (`estimates.ArenaEstimates`)."""
