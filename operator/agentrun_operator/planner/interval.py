"""`loop.intervalSeconds`: the wait between an iteration's end and the next iteration's start
(docs/concepts.md#loop-interval).

No pod runs while a loop waits: the planner asks to be planned again when the next iteration is due
(the way a retry waits for its backoff). The due time is computed once, from the end the iteration
record holds, and kept in status (`loop.nextIterationAt`), so a restarted operator keeps the schedule.
The condition, the cap, the budget and stall detection are decided when the iteration ends, so a
loop that stops never waits; only an iteration that will run is waited for. A run that stops (cancel
of either mode, workflow timeout, goal budget) ends a waiting loop at once: there is no pod to let
finish (`workload._advance`, `group.plan_group`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from agentrun_operator.api import format_timestamp
from agentrun_operator.planner.context import PlanContext
from agentrun_operator.planner.state import StepView


def next_iteration_due(ctx: PlanContext, step: StepView) -> datetime | None:
    """When the loop's next iteration may start: `intervalSeconds` after the current iteration ended
    (recorded as `nextIterationAt` the first time it is asked); None when it may start at once."""
    spec_loop, loop = step.spec.loop, step.loop
    if spec_loop is None or loop is None or spec_loop.interval_seconds <= 0:
        return None
    if loop.next_iteration_at is not None:
        return loop.next_iteration_at
    record = step.record()
    if record is None or record.phase != "Succeeded":
        return None  # no iteration ended yet (the first one never waits)
    ended = record.finished_at or ctx.now
    due = ended + timedelta(seconds=spec_loop.interval_seconds)
    loop.next_iteration_at = due
    ctx.emit(
        "Normal",
        "IterationScheduled",
        f"step {step.label}: iteration {step.iteration + 1} starts at {format_timestamp(due)} "
        f"(loop.intervalSeconds {spec_loop.interval_seconds})",
        step.where,
    )
    return due


def waiting_for_next_iteration(ctx: PlanContext, step: StepView) -> bool:
    """True while the loop waits for its next iteration: the step says until when, and the planner
    is requeued for that moment. False once it is due (or the loop has no interval)."""
    due = next_iteration_due(ctx, step)
    loop = step.loop
    if due is None or loop is None or ctx.now >= due:
        return False
    step.st.message = (
        f"iteration {step.iteration}/{loop.max_iterations} succeeded; iteration {step.iteration + 1} "
        f"starts at {format_timestamp(due)} (loop.intervalSeconds); no pod runs until then"
    )
    ctx.requeue((due - ctx.now).total_seconds())
    return True
