"""The run's `goal.tokenBudget`: a token budget for the whole run (docs/api.md#goal).

The tokens are the run's summed usage (input + output, from the pods' control files,
docs/concepts.md#usage-and-budgets). Once they reach the budget the run stops like a graceful cancel
-- nothing further starts -- and fails with reason and condition `GoalTokenBudgetExhausted`.
"""

from __future__ import annotations

from typing import Final

from agentrun_operator.planner.context import PlanContext

REASON_GOAL_BUDGET_EXHAUSTED: Final = "GoalTokenBudgetExhausted"
"""The run's reason, and the type of the condition set True when the goal's budget is spent."""


def goal_budget_spent(ctx: PlanContext) -> tuple[int, int] | None:
    """(tokens used, budget) once the run's usage reached `spec.goal.tokenBudget`; else None."""
    goal = ctx.run.spec.goal
    if goal is None or goal.token_budget is None:
        return None
    workflow = ctx.status.workflow
    used = workflow.usage.tokens if workflow is not None and workflow.usage is not None else 0
    return (used, goal.token_budget) if used >= goal.token_budget else None


def goal_budget_message(ctx: PlanContext) -> str:
    spent = goal_budget_spent(ctx)
    used, budget = spent if spent is not None else (0, 0)
    return f"the run's goal.tokenBudget is spent ({used} of {budget} tokens)"
