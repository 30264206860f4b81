"""SRSF(2), `srsf-accept` (Wang et al. 2020): shortest remaining service
first, contention accepted up to two jobs a link.

The paper's SRSF(2) lets at most two communicating jobs share a link,
whatever that costs them. Here a multi-node job may share a node's network
card with at most one other multi-node job (kappa = 2). Non-preemptive and
on each job's requested GPU type and count (see solver.policies.srsf_common).
"""

from __future__ import annotations

from solver.policies.srsf_common import SrsfPolicy


class SrsfAcceptPolicy(SrsfPolicy):
    name = "srsf-accept"
    kappa = 2
