"""Steps and loops: `when`, loop set-up (forEach items frozen into status), the CEL context, and the
decision after a successful iteration (the cap, the condition, onMissing/onInvalid)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Literal

from agentrun_operator.api import LoopStatus, StepStatus, WorkflowStep
from agentrun_operator.celeval import (
    CelError,
    EarlierStep,
    build_context,
    compile_expression,
    evaluate_bool,
    evaluate_list,
)
from agentrun_operator.control.envelope import ControlEnvelope, effective_status
from agentrun_operator.planner.context import PlanContext, clip
from agentrun_operator.planner.remedies import with_remedy
from agentrun_operator.planner.state import StepView, end_step, step_ended
from agentrun_operator.resolution import condition_cel, control_path, effective_parameters

MAX_ITEMS_JSON_BYTES: Final = 8 * 1024

REASON_WHEN_ERROR: Final = "WhenConditionError"


def collected_outputs(ctx: PlanContext) -> dict[str, list[Any]]:
    """`outputs` of the CEL context: what the loops collected so far (docs/concepts.md#collected-outputs)."""
    workflow = ctx.status.workflow
    return dict(workflow.outputs or {}) if workflow is not None else {}


def cel_context(
    ctx: PlanContext,
    step: StepView,
    *,
    iteration_index: int = 0,
    last_phase: str = "",
    last_control: dict[str, Any] | None = None,
    item: Any = None,
) -> dict[str, Any]:
    return build_context(
        run_name=ctx.name,
        run_namespace=ctx.namespace,
        step_name=step.name,
        run_parameters=effective_parameters(ctx.run, with_inherited_parameters(step)),
        iteration_index=iteration_index,
        max_iterations=step.max_iterations if step.spec.loop is not None else 1,
        last_phase=last_phase,
        last_control=last_control,
        item=item,
        steps=_earlier_steps(step),
        outputs=collected_outputs(ctx),
        iteration_steps=_iteration_steps(step),
    )


def with_inherited_parameters(step: StepView) -> WorkflowStep:
    """The step's spec with the parameters of the groups and switches holding it laid under its own
    (the nearest wins), so a child sees its ancestors' parameters like the run's."""
    if step.parent is None:
        return step.spec
    merged: dict[str, str] = {}
    chain: list[StepView] = []
    view: StepView | None = step
    while view is not None:
        chain.append(view)
        view = view.parent
    for holder in reversed(chain):
        merged.update(holder.spec.parameters or {})
    if merged == (step.spec.parameters or {}):
        return step.spec
    return step.spec.model_copy(update={"parameters": merged})


def control_of(st: StepStatus) -> dict[str, Any] | None:
    """A step's last control: a loop's last one, else the one its attempt (or, for a group or a
    switch, its last child that ran) left."""
    return st.loop.last_control if st.loop is not None else st.control


def _earlier_steps(step: StepView) -> dict[str, EarlierStep]:
    """`steps.<name>` of the CEL context: phase, completed iterations and last control of the steps
    before this one in its list and before each of its ancestors in theirs (the nearest wins)."""
    out: dict[str, EarlierStep] = {}
    view: StepView | None = step
    while view is not None:
        for st in (view.siblings or [])[: view.index - 1]:
            if st.name in out:
                continue
            if st.loop is not None:
                out[st.name] = EarlierStep(st.phase, st.loop.completed_iterations, st.loop.last_control)
            else:
                out[st.name] = EarlierStep(st.phase, 1 if st.phase == "Succeeded" else 0, st.control)
        view = view.parent
    return out


def _iteration_steps(step: StepView) -> dict[str, dict[str, Any]]:
    """`iteration.steps.<child>` of a loop body: each child's phase and control in this iteration."""
    if step.spec.steps is None or step.spec.loop is None:
        return {}
    return {c.name: {"phase": c.st.phase, "control": control_of(c.st) or {}} for c in step.children()}


def start_step(ctx: PlanContext, step: StepView) -> bool:
    """Evaluate `when`, set up the loop (and freeze forEach items); True when an iteration is due."""
    st, spec = step.st, step.spec
    if spec.when is not None and not _when_allows(ctx, step, spec.when):
        return False
    st.phase = "Running"
    st.started_at = ctx.now
    st.attempt = 0
    st.message = "starting"
    if spec.loop is None:
        return True
    st.loop = LoopStatus(max_iterations=spec.loop.max_iterations)
    if spec.loop.items is not None and not _freeze_items(ctx, step, spec.loop.items):
        return False
    count = f", {st.loop.item_count} items" if st.loop.item_count is not None else ""
    ctx.emit(
        "Normal",
        "LoopStarted",
        f"step {step.label}: loop started (maxIterations {st.loop.max_iterations}{count})",
        step.where,
    )
    return True


def _when_allows(ctx: PlanContext, step: StepView, expression: str) -> bool:
    """True when the step should run; False after marking it Skipped (false) or Failed (CEL error)."""
    st = step.st
    try:
        allowed = evaluate_bool(compile_expression(expression), cel_context(ctx, step))
    except CelError as exc:
        st.phase = "Failed"
        st.reason = REASON_WHEN_ERROR
        st.message = with_remedy(REASON_WHEN_ERROR, f"when: {exc}")
        st.started_at = st.finished_at = ctx.now
        step_ended(ctx, step)
        return False
    if allowed:
        return True
    st.phase = "Skipped"
    st.reason = "WhenFalse"
    st.message = clip(f"skipped: when `{expression}` is false")
    st.finished_at = ctx.now
    ctx.emit("Normal", "StepSkipped", f"step {step.label}: {st.message}", step.where)
    step_ended(ctx, step)
    return False


def _freeze_items(ctx: PlanContext, step: StepView, expression: str) -> bool:
    """forEach: evaluate `items` once and freeze them in status; False when the step ended already."""
    loop = step.st.loop
    assert loop is not None and step.spec.loop is not None
    bound = step.spec.loop.max_iterations
    try:
        items = evaluate_list(compile_expression(expression), cel_context(ctx, step))
    except CelError as exc:
        end_step(ctx, step, "Failed", "LoopConditionError", f"loop.items: {exc}")
        return False
    loop.item_count = len(items)
    if len(items) > bound:
        end_step(
            ctx,
            step,
            "Failed",
            "LoopItemsExceedMaxIterations",
            f"loop.items gave {len(items)} items but maxIterations is {bound}",
            fix=f"raise maxIterations (this operator allows up to {ctx.config.loop_max_iterations}) or "
            "return fewer items",
        )
        return False
    size = len(json.dumps(items, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_ITEMS_JSON_BYTES:
        end_step(
            ctx,
            step,
            "Failed",
            "LoopConditionError",
            f"loop.items gave {len(items)} items whose JSON is {size} bytes; at most {MAX_ITEMS_JSON_BYTES} "
            "bytes are frozen into status: return smaller items (e.g. names or ids) and look details up "
            "in the iteration",
        )
        return False
    loop.items = items
    loop.max_iterations = len(items)
    if not items:
        end_step(
            ctx,
            step,
            "Succeeded",
            "LoopMaxIterationsReached",
            "loop.items is empty: nothing to do (0 iterations)",
        )
        return False
    return True


@dataclass(frozen=True)
class _Verdict:
    kind: Literal["continue", "stop", "missing", "invalid"]
    detail: str


def decide_next(ctx: PlanContext, step: StepView, envelope: ControlEnvelope) -> None:
    """After a successful iteration: stop at the cap, or ask the condition.

    See docs/concepts.md#conditional-loops.
    """
    spec_loop = step.spec.loop
    loop = step.loop
    assert spec_loop is not None and loop is not None
    done = loop.completed_iterations
    at_cap = done >= loop.max_iterations
    condition = spec_loop.condition
    what = "items" if loop.items is not None else "iterations"
    if at_cap:
        # At the cap the control file is not consulted (docs/concepts.md#on-max-iterations).
        # onMaxIterations only matters for a loop with a condition; a fixed loop or a plain forEach
        # reaching its count is its goal.
        if condition is not None and spec_loop.on_max_iterations == "Fail":
            end_step(
                ctx,
                step,
                "Failed",
                "LoopMaxIterationsReached",
                f"iteration {done}: reached maxIterations ({loop.max_iterations}) before the condition "
                "stopped the loop, and onMaxIterations is Fail",
            )
        else:
            end_step(
                ctx,
                step,
                "Succeeded",
                "LoopMaxIterationsReached",
                f"completed all {loop.max_iterations} {what}",
            )
        return
    if condition is None:
        return
    verdict = _evaluate_condition(ctx, step, envelope)
    source = condition.source
    if verdict.kind == "continue":
        return
    if verdict.kind == "stop":
        end_step(ctx, step, "Succeeded", "LoopConditionFalse", verdict.detail)
    elif verdict.kind == "missing":
        if source.on_missing == "stop":
            end_step(
                ctx,
                step,
                "Succeeded",
                "LoopConditionFalse",
                f"{verdict.detail}; onMissing: stop ends the loop",
            )
        else:
            end_step(
                ctx,
                step,
                "Failed",
                "LoopConditionError",
                f"{verdict.detail}; onMissing: fail",
                fix="write the control file in every iteration, at $AGENTRUN_LOOP_CONTROL_PATH on the volume "
                "that holds it, or set `onMissing: stop` to end the loop when it is absent",
            )
    else:
        stop_on_invalid(ctx, step, verdict.detail)


def stop_on_invalid(ctx: PlanContext, step: StepView, detail: str) -> None:
    """Something an iteration reported is unusable: the loop's `onInvalid` policy ends it (`fail` when
    the loop has no condition)."""
    spec_loop = step.spec.loop
    condition = spec_loop.condition if spec_loop is not None else None
    if condition is None or condition.source.on_invalid == "fail":
        end_step(ctx, step, "Failed", "LoopConditionError", f"{detail}; onInvalid: fail")
    else:
        end_step(ctx, step, "Succeeded", "LoopConditionError", f"{detail}; onInvalid: stop ends the loop")


def _evaluate_condition(ctx: PlanContext, step: StepView, envelope: ControlEnvelope) -> _Verdict:
    index = step.iteration
    path = envelope.path or control_path(step.spec)
    status = effective_status(envelope)
    because = f": {envelope.reason}" if envelope.reason else ""
    if status == "missing":
        state = "was not rewritten by this iteration (stale)" if envelope.status == "stale" else "is missing"
        verdict = _Verdict("missing", f"iteration {index}: control file {path} {state}{because}")
    elif status == "invalid":
        state = "is too large" if envelope.status == "tooLarge" else "is invalid"
        verdict = _Verdict("invalid", f"iteration {index}: control file {path} {state}{because}")
    else:
        verdict = _evaluate_cel_condition(ctx, step, envelope.control)
    event_type: Literal["Normal", "Warning"] = "Normal" if verdict.kind in ("continue", "stop") else "Warning"
    # A warm loop's decisions fold into one series: its iterations cost no Event write each
    # (docs/operator.md#events); the status records every iteration.
    fold = step.spec.loop is not None and step.spec.loop.warm_enabled
    ctx.emit(event_type, "ConditionEvaluated", f"step {step.label}: {verdict.detail}", step.where, fold=fold)
    return verdict


def _evaluate_cel_condition(ctx: PlanContext, step: StepView, control: dict[str, Any] | None) -> _Verdict:
    assert step.spec.loop is not None and step.spec.loop.condition is not None and step.loop is not None
    condition = step.spec.loop.condition
    index = step.iteration
    field_name, expression = condition_cel(condition)
    item = (
        step.loop.items[index - 1] if step.loop.items is not None and index <= len(step.loop.items) else None
    )
    try:
        context = cel_context(
            ctx, step, iteration_index=index, last_phase="Succeeded", last_control=control, item=item
        )
        value = evaluate_bool(compile_expression(expression), context)
    except CelError as exc:
        return _Verdict("invalid", f"iteration {index}: condition {field_name}: {exc}")
    keep_going = value if field_name == "expression" else not value
    then = "another iteration runs" if keep_going else "the loop stops"
    detail = f"iteration {index}: {field_name} `{expression}` is {str(value).lower()}, {then}"
    return _Verdict("continue" if keep_going else "stop", detail)
