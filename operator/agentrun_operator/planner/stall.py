"""Stall detection (`loop.stall`): a loop that stopped making progress stops with `LoopStalled`
instead of burning its whole budget (docs/concepts.md#stall-detection).

After each successful iteration the loop's `progress` expression is evaluated (any JSON value) and
kept in `status...loop.progress`, newest last, at most `window` values. When the loop would go on
and the last `window` values are all equal, it stops: the step fails, or succeeds with
`onStall: Succeed`. A progress expression that fails follows the loop's `onInvalid`.

The value is recorded in the one transition that records the iteration's success (like outputs and
usage), so a replayed plan never records it twice and a stalled loop never runs past its window.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

from agentrun_operator.celeval import CelError, compile_expression, evaluate_json
from agentrun_operator.planner.context import TERMINAL_STEP_PHASES, PlanContext, clip
from agentrun_operator.planner.loops import cel_context, stop_on_invalid
from agentrun_operator.planner.state import StepView, end_step

REASON_LOOP_STALLED: Final = "LoopStalled"

MAX_KEPT_VALUE_BYTES: Final = 256
"""A progress value larger than this (compact JSON) is kept as its digest: status has a budget, and
equality is all the rule needs."""


def canonical(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def kept_value(value: Any) -> Any:
    """What status keeps of a progress value: the value, or `{"sha256": ...}` when it is large."""
    text = canonical(value)
    if len(text.encode()) <= MAX_KEPT_VALUE_BYTES:
        return value
    return {"sha256": hashlib.sha256(text.encode()).hexdigest()}


def stalled(values: list[Any], window: int) -> bool:
    """The rule itself: at least `window` values, and the last `window` of them all equal."""
    if window < 2 or len(values) < window:
        return False
    last = [canonical(v) for v in values[-window:]]
    return all(v == last[0] for v in last)


def record_progress(ctx: PlanContext, step: StepView, control: dict[str, Any] | None) -> bool:
    """Evaluate `loop.stall.progress` for the iteration that just succeeded and keep its value;
    False when the expression failed and the loop's `onInvalid` policy ended the step."""
    spec_loop, loop = step.spec.loop, step.loop
    if spec_loop is None or spec_loop.stall is None or loop is None:
        return True
    stall = spec_loop.stall
    index = step.iteration
    item = loop.items[index - 1] if loop.items and index <= len(loop.items) else None
    try:
        context = cel_context(
            ctx, step, iteration_index=index, last_phase="Succeeded", last_control=control, item=item
        )
        value = evaluate_json(compile_expression(stall.progress), context)
    except CelError as exc:
        stop_on_invalid(ctx, step, f"iteration {index}: loop.stall.progress: {exc}")
        return False
    loop.progress = [*(loop.progress or []), kept_value(value)][-stall.window :]
    return True


def check_stall(ctx: PlanContext, step: StepView) -> None:
    """Stop a loop still going whose last `window` progress values are equal (`LoopStalled`)."""
    spec_loop, loop = step.spec.loop, step.loop
    if spec_loop is None or spec_loop.stall is None or loop is None or step.st.phase in TERMINAL_STEP_PHASES:
        return
    stall = spec_loop.stall
    values = loop.progress or []
    if not stalled(values, stall.window):
        return
    succeed = stall.on_stall == "Succeed"
    message = (
        f"iteration {step.iteration}: no progress in the last {stall.window} iterations: "
        f"`{stall.progress}` gave {clip(canonical(values[-1]), 200)} each time; "
        f"onStall: {'Succeed' if succeed else 'Fail'}"
    )
    ctx.emit(
        "Normal" if succeed else "Warning", REASON_LOOP_STALLED, f"step {step.label}: {message}", step.where
    )
    end_step(ctx, step, "Succeeded" if succeed else "Failed", REASON_LOOP_STALLED, message)
