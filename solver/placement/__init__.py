"""Joint placement: options per job -> CP-SAT -> concrete nodes -> plan.

See objective.py for the objective and cpsat.py for the model.
"""

from solver.placement.candidates import Option, make_options, option_picks, split_fixed, split_static
from solver.placement.joint import Result, place_jobs
from solver.placement.space import Space
from solver.placement.validate import PlacementError, validate_plan

__all__ = [
    "Option",
    "PlacementError",
    "Result",
    "Space",
    "make_options",
    "option_picks",
    "place_jobs",
    "split_fixed",
    "split_static",
    "validate_plan",
]
