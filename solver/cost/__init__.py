"""Cost formulas of the estimator: communication curves, per-layer costs,
stage splitting and the pipeline / data-parallel plan cost."""

from solver.cost.comm import CommCurve, Links
from solver.cost.layers import LayerCosts, StageCosts, analytic_layers, layers_from_records, split_stages
from solver.cost.pipeline import PlanCost, plan_cost

__all__ = [
    "CommCurve",
    "LayerCosts",
    "Links",
    "PlanCost",
    "StageCosts",
    "analytic_layers",
    "layers_from_records",
    "plan_cost",
    "split_stages",
]
