"""`ada-srsf` (Wang et al. 2020): SRSF with AdaDUAL's admission of a
second job onto a busy link.

The paper's AdaDUAL admits a new communication task onto a link that is busy
with another only when the new task finishes sooner sharing than after the
running one. We decide per job, not per transfer: a multi-node job first
looks for nodes whose cards carry no other multi-node job; failing that, it
shares cards (at most two jobs a card) only when its remaining iterations
at the shared speed (solver.network's time-averaged contention) end before
waiting for the jobs on those cards to finish and then running alone
(solver.policies.srsf_common.admit). Non-preemptive, requested GPU type and
count, as the other SRSF baselines.
"""

from __future__ import annotations

from solver.policies.srsf_common import SrsfPolicy


class AdaSrsfPolicy(SrsfPolicy):
    name = "ada-srsf"
    kappa = 2
    adaptive = True
