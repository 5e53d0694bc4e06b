"""Incremental snapshots: which names executed code could have touched, and which saved groups can be reused.

What a piece of code can read, bind or mutate (code_names), the tracker fed with each cell (access), and the
rule for reusing the previous snapshot's record of an untouched variable group (reuse).

May import: the engine's base modules.
"""

from .access import AccessTracker, Mark
from .code_names import notebook_code_names
from .reuse import Baseline, ReusePlan, StaleBaseline, Takeover, plan_reuse

__all__ = [
    "AccessTracker", "Baseline", "Mark", "notebook_code_names", "plan_reuse", "ReusePlan", "StaleBaseline",
    "Takeover",
]
