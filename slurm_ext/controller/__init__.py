"""The controller daemon: observe -> decide -> act, one round at a time.

inputs (snapshot + state -> solver request) and reconcile.decide (desired vs
actual -> actions) are pure; reconcile.apply is the only place that changes
Slurm; loop runs the rounds. progress, notify, metrics and logs are the
small pieces around them.
"""
