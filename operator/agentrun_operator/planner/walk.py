"""The dispatcher: planning is a walk over the tree of steps, one construct module per kind of step.

- a workload step runs Jobs (`workload`, with `attempts` and `loops`);
- a group runs its children in order, and with `loop` repeats them as a loop body (`group`);
- a switch runs the children of the case its expression selects (`switch`);
- an approval gate runs no Job and waits for a person's decision (`approval`).

Top-level steps run in order and the run stops at the first that fails. Inside a group or a switch
the same order holds, but a failed child does not end the walk at once: the children after it are
`Skipped` unless they set `alwaysRun: true` (docs/concepts.md#groups-and-loop-bodies).
"""

from __future__ import annotations

from agentrun_operator.planner.approval import plan_approval
from agentrun_operator.planner.context import PlanContext, clip
from agentrun_operator.planner.group import plan_group
from agentrun_operator.planner.outcome import Outcome
from agentrun_operator.planner.state import StepView, step_ended
from agentrun_operator.planner.switch import plan_switch
from agentrun_operator.planner.workload import plan_workload

REASON_PREVIOUS_STEP_FAILED = "PreviousStepFailed"


def plan_node(ctx: PlanContext, view: StepView) -> Outcome:
    """Plan one step of any kind as far as the observation allows."""
    kind = view.spec.kind
    if kind == "group":
        return plan_group(ctx, view, plan_body)
    if kind == "switch":
        return plan_switch(ctx, view, plan_body)
    if kind == "approval":
        return plan_approval(ctx, view)
    return plan_workload(ctx, view)


def plan_top(ctx: PlanContext, views: list[StepView]) -> None:
    """The top-level steps in order, until one waits, halts (the run is stopping) or fails."""
    for view in views:
        if view.st.phase in ("Succeeded", "Skipped"):
            continue
        outcome = plan_node(ctx, view)
        if outcome is Outcome.HALTED:
            ctx.halted = True
        if outcome is not Outcome.DONE or view.st.phase in ("Failed", "Cancelled"):
            return


def plan_body(ctx: PlanContext, views: list[StepView]) -> Outcome:
    """The children of one pass of a group (or of a switch's case), in order.

    DONE once every child is terminal, or a child was cancelled (the rest stay Pending); a child
    after a failed one is Skipped unless it has `alwaysRun: true`.
    """
    failed: StepView | None = None
    for view in views:
        phase = view.st.phase
        if phase == "Cancelled":
            return Outcome.DONE
        if phase in ("Succeeded", "Skipped", "Failed"):
            failed = failed or (view if phase == "Failed" else None)
            continue
        if failed is not None and not view.spec.always_run and phase == "Pending":
            _skip_after_failure(ctx, view, failed)
            continue
        outcome = plan_node(ctx, view)
        if outcome is not Outcome.DONE:
            return outcome
        if view.st.phase == "Cancelled":
            return Outcome.DONE
        if view.st.phase == "Failed":
            failed = failed or view
    return Outcome.DONE


def _skip_after_failure(ctx: PlanContext, view: StepView, failed: StepView) -> None:
    st = view.st
    st.phase = "Skipped"
    st.reason = REASON_PREVIOUS_STEP_FAILED
    st.message = clip(
        f"skipped: step {failed.name} failed before it (set alwaysRun: true to run this step anyway)"
    )
    st.finished_at = ctx.now
    ctx.emit("Normal", "StepSkipped", f"step {view.label}: {st.message}", view.where)
    step_ended(ctx, view)
