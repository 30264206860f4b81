"""The fail-safe: when no controller has completed a round for
``failsafe_after_s``, `cellsched failsafe` releases the jobs the controller
holds, each on its static request, so that a dead controller never leaves
managed jobs held for good. It stands down as soon as a round completes again.

* `decision`: pure: act or stand down (from the state DB's last completed
  round), and which jobs qualify.
* `hint`: pure: the static cell of a job (its requested GPU type and count,
  else a conservative default) and the Slurm update that carries it.
* `check`: one check against Slurm and the state DB (read-only), and the loop.
"""
