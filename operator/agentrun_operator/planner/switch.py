"""Switch (docs/concepts.md#switch): the first case whose `value` equals the expression's result runs,
else `default`; no match and no default fails the step with `SwitchNoMatch`, naming the value and the
case values. The branch taken is recorded in `status...case` before its first child starts, so a
restarted operator never re-evaluates it; its children run like a group's (`walk.plan_body`)."""

from __future__ import annotations

import json
from typing import Any, Final

from agentrun_operator.api import StepStatus
from agentrun_operator.api.agentrun import same_scalar
from agentrun_operator.celeval import CelError, compile_expression, evaluate_json
from agentrun_operator.planner.context import REASON_STEP_FAILED, TERMINAL_STEP_PHASES, PlanContext, clip
from agentrun_operator.planner.facts import SwitchCaseTaken
from agentrun_operator.planner.loops import cel_context, control_of, start_step
from agentrun_operator.planner.outcome import Outcome, PlanChildren
from agentrun_operator.planner.run import stop_message
from agentrun_operator.planner.state import StepView, child_specs, end_step

REASON_SWITCH_NO_MATCH: Final = "SwitchNoMatch"
REASON_SWITCH_ERROR: Final = "SwitchExpressionError"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def plan_switch(ctx: PlanContext, view: StepView, plan_children: PlanChildren) -> Outcome:
    st = view.st
    if st.phase == "Pending":
        if ctx.stopping is not None:
            return Outcome.HALTED
        if not start_step(ctx, view) or not _take_case(ctx, view):
            return Outcome.DONE
    if st.phase in TERMINAL_STEP_PHASES:
        return Outcome.DONE
    if st.case is None and not _take_case(ctx, view):  # started, its branch never recorded
        return Outcome.DONE
    children = view.children()
    outcome = plan_children(ctx, children)
    if outcome is Outcome.ACTIVE:
        return outcome
    if outcome is Outcome.HALTED or any(c.st.phase == "Cancelled" for c in children):
        end_step(ctx, view, "Cancelled", None, stop_message(ctx, view))
        return Outcome.DONE
    ran = [c for c in children if c.st.phase not in ("Pending", "Skipped")]
    st.control = control_of(ran[-1].st) if ran else None
    failed = next((c for c in children if c.st.phase == "Failed"), None)
    if failed is not None:
        end_step(
            ctx,
            view,
            "Failed",
            REASON_STEP_FAILED,
            clip(f"{st.case}: step {failed.name} failed: {failed.st.message}"),
        )
    else:
        end_step(ctx, view, "Succeeded", None, f"{st.case}: all {len(children)} steps finished")
    return Outcome.DONE


def _take_case(ctx: PlanContext, view: StepView) -> bool:
    """Evaluate the expression and record the branch; False when the step ended (no match, CEL error)."""
    switch = view.spec.switch
    assert switch is not None
    st = view.st
    try:
        value = evaluate_json(compile_expression(switch.expression), cel_context(ctx, view))
    except CelError as exc:
        end_step(ctx, view, "Failed", REASON_SWITCH_ERROR, f"switch.expression: {exc}")
        return False
    case = _matching_case(switch.cases, value)
    if case is None and switch.default is not None:
        case = "default"
    if case is None:
        values = ", ".join(_json(c.value) for c in switch.cases)
        end_step(
            ctx,
            view,
            "Failed",
            REASON_SWITCH_NO_MATCH,
            f"switch `{switch.expression}` gave {clip(_json(value), 200)}, which matches no case "
            f"(case values: {values}) and there is no default",
        )
        return False
    st.case = case
    st.steps = [StepStatus(name=child.name) for child in child_specs(view.spec, case)]
    st.message = f"took {case} (the expression gave {clip(_json(value), 200)})"
    ctx.facts.append(SwitchCaseTaken(view.path, view.label, view.depth, case, clip(_json(value), 200)))
    ctx.emit("Normal", "SwitchCaseTaken", f"step {view.label}: {st.message}", view.where)
    return True


def _matching_case(cases: list[Any], value: Any) -> str | None:
    """`cases[<i>]` of the first case equal to `value` (CEL equality of scalars), else None."""
    if isinstance(value, dict | list):
        return None
    for i, case in enumerate(cases):
        if same_scalar(case.value, value):
            return f"cases[{i}]"
    return None
