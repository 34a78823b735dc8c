"""Collected outputs (`loop.output`): after each successful iteration the loop's output expression is
evaluated and its value appended to `status.workflow.outputs[<name>]`, which later steps read as
`outputs.<name>` in CEL and pods get as AGENTRUN_OUTPUTS (docs/concepts.md#collected-outputs).

Appending happens in the one transition that records the iteration's success, so a replayed plan
never appends twice, and what was collected stays when the loop later fails or is cancelled.
"""

from __future__ import annotations

import json
from typing import Any, Final

from agentrun_operator.celeval import CelError, compile_expression, evaluate_json
from agentrun_operator.planner.context import PlanContext
from agentrun_operator.planner.loops import cel_context, stop_on_invalid
from agentrun_operator.planner.state import StepView
from agentrun_operator.planner.tree import outputs_in

MAX_OUTPUT_VALUE_BYTES: Final = 4 * 1024
"""One collected value, as compact JSON: outputs live in status, which has a size budget."""

MAX_OUTPUTS_BYTES: Final = 64 * 1024
"""Everything collected by the run, as compact JSON."""


def _json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def collect_output(ctx: PlanContext, step: StepView, control: dict[str, Any] | None) -> bool:
    """Append this iteration's output value; False when the value could not be computed and the
    loop's `onInvalid` policy ended the step."""
    spec_loop = step.spec.loop
    loop = step.loop
    workflow = ctx.status.workflow
    if spec_loop is None or spec_loop.output is None or loop is None or workflow is None:
        return True
    output = spec_loop.output
    item = loop.items[step.iteration - 1] if loop.items and step.iteration <= len(loop.items) else None
    try:
        context = cel_context(
            ctx,
            step,
            iteration_index=step.iteration,
            last_phase="Succeeded",
            last_control=control,
            item=item,
        )
        value = evaluate_json(compile_expression(output.expression), context)
    except CelError as exc:
        stop_on_invalid(ctx, step, f"iteration {step.iteration}: loop.output {output.name!r}: {exc}")
        return False
    outputs = dict(workflow.outputs or {})
    outputs[output.name] = [*outputs.get(output.name, []), value]
    size, total = _json_size(value), _json_size(outputs)
    if size > MAX_OUTPUT_VALUE_BYTES or total > MAX_OUTPUTS_BYTES:
        stop_on_invalid(
            ctx,
            step,
            f"iteration {step.iteration}: loop.output {output.name!r}: the value is {size} bytes of JSON "
            f"(at most {MAX_OUTPUT_VALUE_BYTES}) and all outputs would be {total} bytes (at most "
            f"{MAX_OUTPUTS_BYTES}); collect names or ids and keep the details in files on the volume",
        )
        return False
    workflow.outputs = outputs
    return True


def declared_outputs(ctx: PlanContext) -> bool:
    """Whether any loop of the run collects an output (only then do pods get AGENTRUN_OUTPUTS)."""
    return any(outputs_in(s) for s in ctx.steps)
