"""The run as a whole: its start, its stop requests (cancel, workflow timeout), its conclusion from
the steps' phases, its conditions and its own TTL once finished."""

from __future__ import annotations

from typing import Final, Literal

from agentrun_operator.api import Condition, StepStatus, WorkflowStatus
from agentrun_operator.planner.actions import DeleteRun
from agentrun_operator.planner.conditions import INVALID_SPEC
from agentrun_operator.planner.context import (
    MAX_MESSAGE_CHARS,
    REASON_CANCELLED,
    REASON_STEP_FAILED,
    TERMINAL_STEP_PHASES,
    PlanContext,
    StopMode,
    clip,
)
from agentrun_operator.planner.gating import delete_strays, set_job_ttls
from agentrun_operator.planner.goal import (
    REASON_GOAL_BUDGET_EXHAUSTED,
    goal_budget_message,
    goal_budget_spent,
)
from agentrun_operator.planner.observed import Refusal
from agentrun_operator.planner.remedies import needs_remedy, with_remedy
from agentrun_operator.planner.state import StepView, all_views, step_views
from agentrun_operator.planner.validate import REASON_INVALID_SPEC

REASON_TIMED_OUT: Final = "WorkflowTimedOut"

REASON_COMPLETED: Final = "Completed"

REASON_STATUS_REFUSED: Final = "StatusRefused"


def set_pending(ctx: PlanContext, reason: str, message: str) -> None:
    ctx.status.phase = "Pending"
    ctx.status.reason = reason
    ctx.status.message = clip(message)


def set_condition(
    ctx: PlanContext, type_: str, status: Literal["True", "False"], reason: str, message: str
) -> None:
    conditions = ctx.status.conditions
    for i, cond in enumerate(conditions):
        if cond.type == type_:
            changed = cond.status != status
            conditions[i] = Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=ctx.now if changed else cond.last_transition_time,
                observed_generation=ctx.status.observed_generation,
            )
            return
    conditions.append(
        Condition(
            type=type_,
            status=status,
            reason=reason,
            message=message,
            last_transition_time=ctx.now,
            observed_generation=ctx.status.observed_generation,
        )
    )


def mark_invalid_spec(ctx: PlanContext, reason: str, message: str) -> None:
    """The InvalidSpec condition and its Warning Event (the run itself is finished by the caller)."""
    set_condition(ctx, INVALID_SPEC, "True", reason, message)
    ctx.emit("Warning", REASON_INVALID_SPEC, message)


def start_run(ctx: PlanContext) -> None:
    status = ctx.status
    status.started_at = ctx.now
    status.phase = "Running"
    status.reason = None
    status.message = None


def align_step_statuses(ctx: PlanContext) -> None:
    """One status entry per spec step, in spec order (entries are matched by name)."""
    status = ctx.status
    if status.workflow is None:
        status.workflow = WorkflowStatus()
    existing = status.workflow.steps
    names = [s.name for s in ctx.steps]
    if [s.name for s in existing] == names:
        return
    by_name = {s.name: s for s in existing}
    status.workflow.steps = [by_name.get(name) or StepStatus(name=name) for name in names]


def stop_request(ctx: PlanContext) -> StopMode | None:
    """Cancellation wins over the goal's token budget, which wins over the workflow timeout; the
    timeout asks for a requeue at its deadline."""
    spec = ctx.run.spec
    if spec.cancel is not None:
        return spec.cancel
    if goal_budget_spent(ctx) is not None:
        return "budget"
    timeout = spec.workflow.timeout_seconds if spec.workflow is not None else 0
    started = ctx.status.started_at
    if timeout > 0 and started is not None:
        left = timeout - ctx.seconds_since(started)
        if left <= 0:
            return "timeout"
        ctx.requeue(left)
    return None


def conclude(ctx: PlanContext, views: list[StepView] | None = None) -> None:
    """The run's phase from its steps' phases; terminal transitions finish the run."""
    steps = step_views(ctx)
    failed = next((s for s in steps if s.st.phase == "Failed"), None)
    if failed is not None:
        if failed.st.reason == REASON_INVALID_SPEC:
            mark_invalid_spec(ctx, REASON_INVALID_SPEC, failed.st.message or "")
        finish_run(
            ctx, "Failed", failed.st.reason or REASON_STEP_FAILED, f"step {failed.name}: {failed.st.message}"
        )
        return
    if ctx.halted or any(s.st.phase == "Cancelled" for s in steps):
        if ctx.stopping == "timeout":
            finish_run(ctx, "Failed", REASON_TIMED_OUT, _timeout_message(ctx))
        elif ctx.stopping == "budget":
            message = goal_budget_message(ctx)
            set_condition(ctx, REASON_GOAL_BUDGET_EXHAUSTED, "True", REASON_GOAL_BUDGET_EXHAUSTED, message)
            finish_run(ctx, "Failed", REASON_GOAL_BUDGET_EXHAUSTED, message)
        else:
            finish_run(ctx, "Cancelled", REASON_CANCELLED, f"cancelled ({ctx.run.spec.cancel or 'Graceful'})")
        return
    if all(s.st.phase in ("Succeeded", "Skipped") for s in steps):
        skipped = sum(1 for s in steps if s.st.phase == "Skipped")
        detail = f" ({skipped} skipped)" if skipped else ""
        finish_run(ctx, "Succeeded", REASON_COMPLETED, f"all {len(steps)} steps finished{detail}")
        return
    status = ctx.status
    status.phase = "Running"
    status.reason = None
    active = _deepest_active(ctx, views)
    status.message = (
        clip(f"step {active.label}: {active.st.message}") if active and active.st.message else None
    )
    _summarize(ctx, active)


def _deepest_active(ctx: PlanContext, views: list[StepView] | None = None) -> StepView | None:
    """The innermost step not finished yet that has started (the one a user wants to read about)."""
    active = None
    for view in views if views is not None else all_views(ctx):
        if view.st.phase not in TERMINAL_STEP_PHASES and view.st.phase != "Pending":
            active = view
    if active is None:
        active = next((s for s in step_views(ctx) if s.st.phase not in TERMINAL_STEP_PHASES), None)
    return active


def _timeout_message(ctx: PlanContext) -> str:
    timeout = ctx.run.spec.workflow.timeout_seconds if ctx.run.spec.workflow else 0
    return f"the workflow timed out after {timeout}s (spec.workflow.timeoutSeconds)"


def _summarize(ctx: PlanContext, deepest: StepView | None = None) -> None:
    """Printer columns: the active (or last run) step, and its iteration as `current/max`."""
    status = ctx.status
    if status.workflow is None:
        return
    steps = step_views(ctx)
    active = next((s for s in steps if s.st.phase in ("Running", "Retrying", "AwaitingApproval")), None)
    if active is not None:
        active = deepest or _deepest_active(ctx)
    else:
        ran = [s for s in steps if s.st.phase != "Pending"]
        active = ran[-1] if ran else None
    status.current_step = active.path if active else None
    looping = active
    while looping is not None and looping.st.loop is None:  # a body's child: the body's iteration
        looping = looping.parent
    loop = looping.st.loop if looping is not None else None
    status.iteration = f"{loop.current_iteration}/{loop.max_iterations}" if loop is not None else None


RUN_FINISHED_EVENTS: Final = {
    "Succeeded": "RunSucceeded",
    "Failed": "RunFailed",
    "Cancelled": "RunCancelled",
}
"""The Event of each final phase, spelled out so the docs check finds every reason in the code."""


def finish_run(
    ctx: PlanContext, phase: Literal["Succeeded", "Failed", "Cancelled"], reason: str, message: str
) -> None:
    status = ctx.status
    status.phase = phase
    status.reason = reason
    limit = 4 * MAX_MESSAGE_CHARS
    remedy = needs_remedy(phase, reason)
    status.message = with_remedy(reason, message, limit=limit) if remedy else clip(message, limit)
    status.finished_at = ctx.now
    if status.workflow is not None:
        status.workflow.phase = phase
        for st in status.workflow.steps:
            if st.phase == "Pending":
                st.message = f"not started: the run {phase.lower()} ({reason})"
    _summarize(ctx)
    event_type: Literal["Normal", "Warning"] = "Normal" if phase == "Succeeded" else "Warning"
    ctx.emit(event_type, RUN_FINISHED_EVENTS[phase], f"{reason}: {message}")
    ttl = ctx.run.spec.ttl_seconds_after_finished
    if ttl is not None:
        ctx.requeue(float(ttl))


def fail_refused_status(ctx: PlanContext, refusal: Refusal) -> None:
    """The API server refused the run's next status for good (the same status would be refused
    again). A run whose progress cannot be recorded must not go on -- its Jobs would run unrecorded --
    so it ends Failed on its persisted status, with the API server's words; no Job may outlive it."""
    finish_run(
        ctx,
        "Failed",
        REASON_STATUS_REFUSED,
        f"the API server refused the run's status update (HTTP {refusal.code}): {refusal.message.strip()}; "
        "the run cannot record its progress, so it stops here",
    )
    delete_strays(ctx, expected=None)


def plan_finished_run(ctx: PlanContext, spared: frozenset[str] = frozenset()) -> None:
    """A finished run starts nothing: delete leftover Jobs but those `spared` (a warm pod told to end
    is given the time to, planner/warm.py), TTL the recorded ones, honour the run's TTL."""
    delete_strays(ctx, None, spared)
    set_job_ttls(ctx)
    ttl = ctx.run.spec.ttl_seconds_after_finished
    finished = ctx.status.finished_at
    if ttl is None or finished is None:
        return
    left = ttl - ctx.seconds_since(finished)
    if left <= 0:
        ctx.writes.append(DeleteRun(uid=ctx.uid))
    else:
        ctx.requeue(left)


def stop_message(ctx: PlanContext, step: StepView) -> str:
    if ctx.stopping == "timeout":
        return f"{_timeout_message(ctx)}; no further iteration or attempt was started"
    if ctx.stopping == "budget":
        return f"{goal_budget_message(ctx)}; no further iteration or attempt was started"
    done = f" after iteration {step.iteration}" if step.loop is not None and step.iteration else ""
    if step.loop is not None and step.loop.next_iteration_at is not None:
        done += f", while waiting for iteration {step.iteration + 1} (loop.intervalSeconds)"
    return f"cancelled ({ctx.stopping}){done}; no further iteration or attempt was started"
