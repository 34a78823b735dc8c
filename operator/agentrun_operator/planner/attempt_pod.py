"""An attempt's pod as the planner plans it: where it leaves its control file, which loop's
iteration it is told about, and the `PlannedAttempt` the Job builder turns into a manifest."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentrun_operator.api import LoopWarm
from agentrun_operator.jobs.builder import PlannedAttempt
from agentrun_operator.planner.checkpoints import checkpoint_plan
from agentrun_operator.planner.context import (
    PlanContext,
)
from agentrun_operator.planner.feedback import (
    previous,
)
from agentrun_operator.planner.loops import collected_outputs, with_inherited_parameters
from agentrun_operator.planner.outputs import declared_outputs
from agentrun_operator.planner.placement import preferred_node
from agentrun_operator.planner.podgc import policy_of, warm_creation_ttl
from agentrun_operator.planner.state import StepView
from agentrun_operator.resolution import (
    control_path,
)


def pod_control_path(step: StepView) -> str:
    """Where the step's pod leaves its control file: its own loop's source path, else the source path
    of the nearest enclosing loop body with a condition (every child of a body reports the body's
    path), else the default."""
    view: StepView | None = step
    while view is not None:
        loop = view.spec.loop
        if loop is not None and loop.condition is not None:
            return loop.condition.source.path
        view = view.parent
    return control_path(step.spec)


def warm_of(step: StepView) -> LoopWarm | None:
    """loop.warm of the nearest loop around the step (its own, else its loop body's), when on: a
    top-level loop or loop body (validation refuses it deeper)."""
    view: StepView | None = step
    while view is not None:
        loop = view.spec.loop
        if loop is not None:
            warm = loop.warm if loop.warm is not None and loop.warm.enabled else None
            return warm if view.parent is None else None
        view = view.parent
    return None


def _loop_env(step: StepView, iteration: int) -> tuple[StepView, int] | None:
    """The loop whose iteration the pod is told about: the step's own, else the nearest looping
    ancestor's (a child of a loop body runs in the body's iteration)."""
    view: StepView | None = step
    while view is not None:
        if view.loop is not None:
            return view, iteration if view is step else view.iteration
        view = view.parent
    return None


def planned_attempt(ctx: PlanContext, step: StepView, iteration: int, attempt: int) -> PlannedAttempt:
    outputs = collected_outputs(ctx) if declared_outputs(ctx) else None
    nested = step.parent is not None
    planned = PlannedAttempt(
        step.index,
        1,
        attempt,
        outputs=outputs,
        previous=previous(step, iteration, attempt),
        ancestors=step.ancestors,
        step=with_inherited_parameters(step) if nested else None,
        control_path=pod_control_path(step) if nested else None,
        path=step.label if nested else None,
        prefer_node=preferred_node(ctx.observed.pods),
        checkpoint=checkpoint_plan(ctx, step, iteration, attempt),
        warm=(warm := warm_of(step)),
        warm_ttl_seconds=warm_creation_ttl(policy_of(ctx.run, ctx.config)) if warm is not None else None,
    )
    looping = _loop_env(step, iteration)
    if looping is None:
        return planned
    view, index = looping
    loop = view.loop
    assert loop is not None
    own = view is step
    item, item_index = _item_for(step, iteration)
    return replace(
        planned,
        iteration=iteration if own else 1,
        max_iterations=loop.max_iterations,
        previous_control=loop.last_control if index > 1 else None,
        item=item,
        item_index=item_index,
        env_iteration=None if own else index,
    )


def _item_for(step: StepView, iteration: int) -> tuple[Any, int | None]:
    """AGENTRUN_ITEM: the item of the nearest forEach loop among the step and its ancestors (a
    child of a forEach body, with or without a loop of its own, works on the body's item)."""
    view: StepView | None = step
    while view is not None:
        loop = view.loop
        if loop is not None and loop.items is not None:
            index = iteration if view is step else view.iteration
            if 1 <= index <= len(loop.items):
                return loop.items[index - 1], index - 1
            return None, None
        view = view.parent
    return None, None


def label_iteration(step: StepView) -> int:
    """The iteration a user names the step's attempt by (its Jobs' `iteration` label and
    AGENTRUN_ITERATION): its own loop's, else the nearest looping ancestor's, else 1."""
    looping = _loop_env(step, step.iteration)
    return looping[1] if looping is not None else step.iteration
