"""Usage and budgets: a control file may carry `usage: {inputTokens, outputTokens, costUSD}`; the
operator sums it per iteration, step and run, and `loop.budget` stops a loop once a sum reaches its
bound (`LoopBudgetExhausted`; docs/concepts.md#usage-and-budgets).

Every attempt's usage counts, failed or not: a failed (or timed-out) attempt's pod reports its
control file too, and an agent that fails expensively spends the budget like one that succeeds.
Usage is added in the one transition that records an attempt's result (success, retry or failure),
so a replayed plan never counts it twice; a control file a retry left untouched is `stale` and not
counted again. Fields that are not non-negative numbers follow the loop's `onInvalid` policy, for a
failed attempt as for a successful one (a step without a loop ignores unusable usage: it has no
policy to apply).
"""

from __future__ import annotations

import math
from typing import Any, Final

from agentrun_operator.api import Usage
from agentrun_operator.planner.context import PlanContext
from agentrun_operator.planner.facts import UsageReported
from agentrun_operator.planner.goal import goal_budget_spent
from agentrun_operator.planner.loops import stop_on_invalid
from agentrun_operator.planner.state import StepView, end_step

REASON_BUDGET_EXHAUSTED: Final = "LoopBudgetExhausted"

_FIELDS: Final = (("inputTokens", "input_tokens"), ("outputTokens", "output_tokens"), ("costUSD", "cost_usd"))


def parse_usage(control: dict[str, Any] | None) -> Usage | str | None:
    """The control's `usage` as a Usage, None when absent, or a message saying what is wrong."""
    if control is None or "usage" not in control:
        return None
    raw = control["usage"]
    if not isinstance(raw, dict):
        return f"usage must be an object {{inputTokens, outputTokens, costUSD}}, got {type(raw).__name__}"
    values: dict[str, Any] = {}
    for key, attr in _FIELDS:
        value = raw.get(key, 0)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < 0:
            return f"usage.{key} must be a non-negative number, got {value!r}"
        if key != "costUSD" and value != int(value):
            return f"usage.{key} must be a whole number of tokens, got {value!r}"
        values[attr] = int(value) if key != "costUSD" else float(value)
    return Usage(**values)


def account_usage(
    ctx: PlanContext, step: StepView, control: dict[str, Any] | None, whose: str | None = None
) -> bool:
    """Add the attempt's usage to its iteration, step and run; False when unusable usage ended the
    step. `whose` names the control file in that message (default: this iteration's)."""
    usage = parse_usage(control)
    if usage is None:
        return True
    if isinstance(usage, str):
        if step.loop is None:
            return True
        stop_on_invalid(ctx, step, f"{whose or f'iteration {step.iteration}: control file'}: {usage}")
        return False
    record = step.record()
    if record is not None:  # the iteration's attempts, failed ones included
        record.usage = (record.usage or Usage()).plus(usage)
    step.st.usage = (step.st.usage or Usage()).plus(usage)
    workflow = ctx.status.workflow
    if workflow is not None:
        workflow.usage = (workflow.usage or Usage()).plus(usage)
    ctx.facts.append(UsageReported(step.path, usage.tokens, usage.cost_usd))
    if ctx.stopping is None and goal_budget_spent(ctx) is not None:
        ctx.stopping = "budget"  # nothing further starts in this pass either (docs/api.md#goal)
    return True


def budget_reached(step: StepView) -> str | None:
    """What of `loop.budget` the loop's usage reached (`150 tokens of maxTokens 100`), else None."""
    spec_loop = step.spec.loop
    if spec_loop is None or spec_loop.budget is None:
        return None
    budget, used = spec_loop.budget, step.st.usage or Usage()
    reached: list[str] = []
    if budget.max_tokens is not None and used.tokens >= budget.max_tokens:
        reached.append(f"{used.tokens} tokens of maxTokens {budget.max_tokens}")
    if budget.max_cost_usd is not None and used.cost_usd >= budget.max_cost_usd:
        reached.append(f"{used.cost_usd:g} USD of maxCostUSD {budget.max_cost_usd:g}")
    return "; ".join(reached) or None


def check_budget(ctx: PlanContext, step: StepView, after: str | None = None) -> None:
    """Stop a loop still going once its usage reached `loop.budget` (step Failed unless
    `onBudgetExhausted: Succeed`). `after` says what came first (a failed attempt whose retry the
    budget prevents)."""
    if step.st.phase in ("Succeeded", "Failed", "Cancelled"):
        return
    reached = budget_reached(step)
    if reached is None:
        return
    assert step.spec.loop is not None
    succeed = step.spec.loop.on_budget_exhausted == "Succeed"
    what = f"{after}; no retry:" if after else f"iteration {step.iteration}:"
    message = f"{what} budget exhausted ({reached}); onBudgetExhausted: {'Succeed' if succeed else 'Fail'}"
    end_step(ctx, step, "Succeeded" if succeed else "Failed", REASON_BUDGET_EXHAUSTED, message)
