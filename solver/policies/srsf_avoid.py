"""SRSF(1), `srsf-avoid` (Wang et al. 2020): shortest remaining service
first, contention avoided.

The paper's SRSF(1) never lets two communicating jobs share a link. Here a
multi-node job goes only onto nodes whose network card carries no other
multi-node job; one-node jobs go anywhere. Non-preemptive and on each job's
requested GPU type and count (see solver.policies.srsf_common).
"""

from __future__ import annotations

from solver.policies.srsf_common import SrsfPolicy


class SrsfAvoidPolicy(SrsfPolicy):
    name = "srsf-avoid"
    kappa = 1
