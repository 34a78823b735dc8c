"""Groups and loop bodies (docs/concepts.md#groups-and-loop-bodies).

A group (`steps:`) runs its children in order. With `loop`, the whole group is the loop body: each
iteration is one pass over the children, on the same volumes; the loop's condition (and output,
usage and budget) is evaluated after each complete pass, with `iteration.last.control` = the control
of the last child that ran in the pass and `iteration.steps.<child>` = each child's phase and
control. A child that fails fails the iteration (and the loop stops with `LoopIterationFailed`).

The children's status entries (`status...steps[].steps`) describe the current pass; when a pass ends
its children's phases are kept in the iteration record (`iterations[].steps`) and the next pass
starts from fresh entries, at once or after `loop.intervalSeconds` (planner/interval.py), during which
the ended pass's entries stay. Every transition is recorded in status before the next Job starts, so a
restarted operator resumes inside a pass without running a child twice.
"""

from __future__ import annotations

from typing import Final

from agentrun_operator.api import IterationRecord, StepStatus, Usage
from agentrun_operator.control.envelope import ControlEnvelope
from agentrun_operator.planner.budgets import check_budget
from agentrun_operator.planner.context import REASON_STEP_FAILED, TERMINAL_STEP_PHASES, PlanContext, clip
from agentrun_operator.planner.facts import IterationFinished
from agentrun_operator.planner.interval import waiting_for_next_iteration
from agentrun_operator.planner.loops import control_of, decide_next, start_step
from agentrun_operator.planner.outcome import Outcome, PlanChildren
from agentrun_operator.planner.outputs import collect_output
from agentrun_operator.planner.run import stop_message
from agentrun_operator.planner.stall import check_stall, record_progress
from agentrun_operator.planner.state import StepView, end_step
from agentrun_operator.resolution import control_path

_MAX_PASSES: Final = 10_000  # a guard: every pass of one plan ends a loop iteration, at most 1000


def plan_group(ctx: PlanContext, view: StepView, plan_children: PlanChildren) -> Outcome:
    """Start the group, then plan the current pass; when a pass ends, conclude it (and start the next)."""
    st = view.st
    if st.phase == "Pending":
        if ctx.stopping is not None:
            return Outcome.HALTED
        if not start_step(ctx, view):
            return Outcome.DONE
        begin_pass(ctx, view, 1)
    elif st.phase not in TERMINAL_STEP_PHASES and st.steps is None:  # started, its pass never recorded
        begin_pass(ctx, view, max(view.iteration, 1))
    for _ in range(_MAX_PASSES):
        if st.phase in TERMINAL_STEP_PHASES:
            return Outcome.DONE
        if _between_passes(view):
            if ctx.stopping is not None:
                end_step(ctx, view, "Cancelled", None, stop_message(ctx, view))
                return Outcome.DONE
            if waiting_for_next_iteration(ctx, view):
                return Outcome.ACTIVE
            begin_pass(ctx, view, view.iteration + 1)
        outcome = plan_children(ctx, view.children())
        if outcome is Outcome.ACTIVE:
            return outcome
        if outcome is Outcome.HALTED:
            _end_halted_pass(ctx, view)
            return Outcome.DONE
        end_pass(ctx, view)
    return Outcome.ACTIVE  # pragma: no cover - a guard against a planner bug


def begin_pass(ctx: PlanContext, view: StepView, iteration: int) -> None:
    """Fresh entries for the children; for a loop body, iteration `iteration` and its record."""
    assert view.spec.steps is not None
    st = view.st
    st.steps = [StepStatus(name=child.name) for child in view.spec.steps]
    st.phase = "Running"
    loop = view.loop
    if loop is None:
        st.message = f"running {len(st.steps)} steps"
        return
    loop.current_iteration = iteration
    loop.next_iteration_at = None
    loop.iterations.append(IterationRecord(index=iteration, phase="Running", attempts=1, started_at=ctx.now))
    st.message = f"iteration {iteration}/{loop.max_iterations} running"
    ctx.emit(
        "Normal",
        "IterationStarted",
        f"step {view.label}: iteration {iteration}/{loop.max_iterations} started",
        view.where,
    )


def end_pass(ctx: PlanContext, view: StepView) -> None:
    """Every child of the pass is terminal (or the pass was cancelled): record it and decide."""
    children = view.children()
    st, loop, record = view.st, view.loop, view.record()
    phases: dict[str, str] = {child.name: child.st.phase for child in children}
    ran = [child for child in children if child.st.phase not in ("Pending", "Skipped")]
    control = control_of(ran[-1].st) if ran else None
    if record is not None:
        record.steps = phases
    _add_pass_usage(view, children)
    st.control = control if loop is None else None
    if any(child.st.phase == "Cancelled" for child in children):
        end_step(ctx, view, "Cancelled", None, stop_message(ctx, view))
        return
    failed = next((child for child in children if child.st.phase == "Failed"), None)
    prefix = f"iteration {view.iteration}: " if loop is not None else ""
    if failed is not None:
        message = clip(f"{prefix}step {failed.name} failed: {failed.st.message}")
        if record is not None:
            record.phase, record.finished_at, record.message = "Failed", ctx.now, message
            ctx.facts.append(IterationFinished(view.path, view.iteration, 1, "Failed"))
            ctx.emit("Warning", "IterationFailed", f"step {view.label}: {message}", view.where)
        end_step(
            ctx, view, "Failed", "LoopIterationFailed" if loop is not None else REASON_STEP_FAILED, message
        )
        return
    skipped = sum(1 for p in phases.values() if p == "Skipped")
    done = f"all {len(phases)} steps finished" + (f" ({skipped} skipped)" if skipped else "")
    if loop is None:
        end_step(ctx, view, "Succeeded", None, done)
        return
    _pass_succeeded(ctx, view, children, control, done)


def _end_halted_pass(ctx: PlanContext, view: StepView) -> None:
    """The run stops (cancel or workflow timeout) before the pass's next child: the record keeps the
    children's phases and usage, and the message says how far the pass got."""
    children = view.children()
    record = view.record()
    if record is not None:
        record.steps = {child.name: child.st.phase for child in children}
    _add_pass_usage(view, children)
    message = stop_message(ctx, view)
    if view.loop is not None and view.iteration and ctx.stopping in ("Graceful", "Immediate"):
        ran = sum(1 for child in children if child.st.phase not in ("Pending", "Skipped"))
        message = (
            f"cancelled ({ctx.stopping}) during iteration {view.iteration} after {ran} of "
            f"{len(children)} steps; no further step, iteration or attempt was started"
        )
    end_step(ctx, view, "Cancelled", None, message)


def _pass_succeeded(
    ctx: PlanContext, view: StepView, children: list[StepView], control: dict[str, object] | None, done: str
) -> None:
    st, loop, record = view.st, view.loop, view.record()
    assert loop is not None
    if record is not None:
        record.phase, record.finished_at = "Succeeded", ctx.now
    loop.completed_iterations = min(max(loop.completed_iterations, view.iteration), loop.max_iterations)
    loop.last_control = control
    st.message = f"iteration {view.iteration}/{loop.max_iterations} succeeded: {done}"
    ctx.facts.append(IterationFinished(view.path, view.iteration, 1, "Succeeded"))
    ctx.emit("Normal", "IterationSucceeded", f"step {view.label}: {st.message}", view.where)
    if not collect_output(ctx, view, control) or not record_progress(ctx, view, control):
        return
    decide_next(ctx, view, _pass_envelope(view, children, control))
    check_budget(ctx, view)
    check_stall(ctx, view)
    # The loop goes on: `plan_group` starts the next pass (after loop.intervalSeconds, if set).


def _between_passes(view: StepView) -> bool:
    """A loop body whose pass succeeded and whose next pass has not begun (it may be waiting for
    loop.intervalSeconds): its children's entries still describe the pass that ended."""
    record = view.record()
    return record is not None and record.phase == "Succeeded" and view.st.phase not in TERMINAL_STEP_PHASES


def _add_pass_usage(view: StepView, children: list[StepView]) -> None:
    """What the children of the pass reported goes to the body's record and the body (for its
    budget), whether the pass succeeded or not; the run's sum got it from the children already."""
    usage = _pass_usage(children)
    if usage is None:
        return
    record = view.record()
    if record is not None:
        record.usage = usage
    view.st.usage = (view.st.usage or Usage()).plus(usage)


def _pass_usage(children: list[StepView]) -> Usage | None:
    used = [child.st.usage for child in children if child.st.usage is not None]
    if not used:
        return None
    total = Usage()
    for usage in used:
        total = total.plus(usage)
    return total


def _pass_envelope(
    view: StepView, children: list[StepView], control: dict[str, object] | None
) -> ControlEnvelope:
    """What the body's condition reads: the control of the last child that ran, or missing."""
    path = control_path(view.spec)
    if control is not None:
        return ControlEnvelope(status="found", path=path, control=dict(control))
    ran = [child.name for child in children if child.st.phase not in ("Pending", "Skipped")]
    reason = (
        f"step {ran[-1]}, the last step that ran in this iteration, left no control file"
        if ran
        else "no step ran in this iteration"
    )
    return ControlEnvelope(status="missing", path=path, reason=reason)
