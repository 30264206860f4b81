"""The controller daemon: observe -> decide -> act, one round at a time.

inputs (snapshot + state -> solver request) and reconcile.decide (desired vs
actual -> actions) are pure; reconcile.apply is the only place that changes
Slurm; round (the Controller) runs one round, reporting it as a
report.RoundReport, and daemon repeats rounds (when: watcher; one daemon per
state file: lock). progress, round_metrics, notify, metrics and logs are the
small pieces around them.
"""
