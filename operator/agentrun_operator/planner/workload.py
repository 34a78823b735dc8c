"""A workload step: the state machine of its attempts and iterations (see `state`), one Job at a time."""

from __future__ import annotations

from typing import Final

from agentrun_operator.planner.attempts import observe_attempt, start_attempt
from agentrun_operator.planner.context import RESULT_REQUEUE_SECONDS, PlanContext
from agentrun_operator.planner.interval import waiting_for_next_iteration
from agentrun_operator.planner.loops import start_step
from agentrun_operator.planner.outcome import Outcome
from agentrun_operator.planner.run import stop_message
from agentrun_operator.planner.state import StepState, StepView, end_step, state_of

_MAX_TRANSITIONS: Final = 100_000


def plan_workload(ctx: PlanContext, step: StepView) -> Outcome:
    if state_of(step) is StepState.PENDING:
        if ctx.stopping is not None:
            return Outcome.HALTED
        if not start_step(ctx, step):
            return Outcome.DONE
    return _advance(ctx, step)


def _advance(ctx: PlanContext, step: StepView) -> Outcome:
    """Move the step along its transitions (see `state`) as far as the observation allows.

    Adopted Jobs may already be done, so one call can take several transitions.
    """
    for _ in range(_MAX_TRANSITIONS):
        state = state_of(step)
        if state is StepState.DONE:
            return Outcome.DONE
        if state is StepState.RUNNING:
            if not observe_attempt(ctx, step):
                return Outcome.ACTIVE
            continue
        if ctx.stopping is not None:
            end_step(ctx, step, "Cancelled", None, stop_message(ctx, step))
            return Outcome.DONE
        if state is StepState.RETRY_DUE:
            started = start_attempt(
                ctx, step, step.iteration, step.st.attempt + 1, not_before=step.st.next_retry_at
            )
        elif waiting_for_next_iteration(ctx, step):
            return Outcome.ACTIVE
        else:
            started = start_attempt(ctx, step, step.iteration + 1 if step.loop is not None else 1, 1)
        if not started:
            return Outcome.ACTIVE
    ctx.requeue(RESULT_REQUEUE_SECONDS)  # pragma: no cover - a guard against a planner bug
    return Outcome.ACTIVE  # pragma: no cover
