"""How planning one step (of any construct) ended for this plan."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TypeAlias

from agentrun_operator.planner.context import PlanContext
from agentrun_operator.planner.state import StepView


class Outcome(Enum):
    DONE = "done"  # the step is terminal (Succeeded, Skipped, Failed, Cancelled)
    ACTIVE = "active"  # the step waits for something (a Job, a backoff, pods to end)
    HALTED = "halted"  # the step was not started because the run is stopping


PlanChildren: TypeAlias = Callable[[PlanContext, list[StepView]], Outcome]
"""Plans the children of a group or switch in order (`walk.plan_body`), handed to the construct
modules so that they need not import the dispatcher."""
