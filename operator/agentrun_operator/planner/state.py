"""A step's state machine: the step view, its states, the transitions between them, and `end_step`.

The states and table below are those of a workload step; a group (`group`) or a switch (`switch`)
is Pending, then Running while its children run, then terminal, and its view gives its children.
A step is in exactly one `StepState`, derived from its persisted status entry by `state_of` (nothing
else is stored). `workload._advance` moves a step along these transitions as far as one observation
allows; each row names the function that takes it.

| from      | when                                                   | to             | taken by          |
|-----------|--------------------------------------------------------|----------------|-------------------|
| PENDING   | the run is stopping (cancel, workflow timeout)         | PENDING, halts | workload.plan_wo. |
| PENDING   | `when` is false                                        | DONE Skipped   | loops.start_step  |
| PENDING   | `when`/`loop.items` errs; too many or too large items  | DONE Failed    | loops.start_step  |
| PENDING   | `loop.items` is empty                                  | DONE Succeeded | loops.start_step  |
| PENDING   | started (loop set up, forEach items frozen)            | NEXT_DUE       | loops.start_step  |
| NEXT_DUE  | the run is stopping                                    | DONE Cancelled | workload._advance |
| NEXT_DUE  | loop.intervalSeconds since the last iteration not over | NEXT_DUE, waits | interval.waiting_ |
| NEXT_DUE  | gate clear: the next Job is created, or adopted        | RUNNING        | attempts.start_.. |
| NEXT_DUE  | a reference went missing before the Job's creation     | DONE Failed    | attempts.start_.. |
| RUNNING   | cancel Immediate (its Job is deleted)                  | DONE Cancelled | attempts.observe_ |
| RUNNING   | succeeded, no loop                                     | DONE Succeeded | attempts.record_. |
| RUNNING   | succeeded, and the loop goes on                        | NEXT_DUE       | loops.decide_next |
| RUNNING   | succeeded, and the cap or the condition ends the loop  | DONE Succ./Fa. | loops.decide_next |
| RUNNING   | failed, timed out or vanished; retries left, not stopping | RETRY_DUE   | attempts.record_. |
| RUNNING   | failed, timed out or vanished; no retries left         | DONE Failed    | attempts.record_. |
| RUNNING   | failed, timed out or vanished while the run is stopping | DONE Cancelled | attempts.record_. |
| RETRY_DUE | the run is stopping                                    | DONE Cancelled | workload._advance |
| RETRY_DUE | the backoff has passed, gate clear: the retry's Job    | RUNNING        | attempts.start_.. |

"Timed out" is the Job's DeadlineExceeded (activeDeadlineSeconds = the step's timeout), read from
`FailureTarget` as soon as the Job controller decides it (or `Failed`), or the Job still undecided
DEADLINE_GRACE_SECONDS past it (the planner deletes it): a retry after a timeout is
RUNNING -> RETRY_DUE -> RUNNING like any other failed attempt. "Gate clear": no other live or
settling Job and no other non-terminal pod of the run (`gating.gate_clear`).

Waiting (for a Job to appear or finish, a backoff, other pods to end) keeps the state and asks for
a requeue. Every move to DONE other than Skipped goes through `end_step`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Literal, cast

from agentrun_operator.api import (
    LOOP_STOP_REASONS,
    IterationRecord,
    LoopStatus,
    LoopStopReason,
    StepStatus,
    WorkflowStep,
)
from agentrun_operator.planner.actions import Where
from agentrun_operator.planner.context import REASON_CANCELLED, TERMINAL_STEP_PHASES, PlanContext, clip
from agentrun_operator.planner.facts import LoopStopped, StepEnded
from agentrun_operator.planner.remedies import needs_remedy, with_remedy


@dataclass
class StepView:
    """A spec step together with its (mutable, working-copy) status entry and where it sits.

    A top-level step has no parent; a child of a group or switch has the group or switch as parent,
    and `siblings` is the status list that holds its entry (what `steps.X` of its CEL may read).
    """

    index: int  # 1-based among its siblings, as in Job names
    spec: WorkflowStep
    st: StepStatus
    parent: StepView | None = None
    siblings: list[StepStatus] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def path(self) -> str:
        """The run path without iterations (`review/fix`): a top-level step's path is its name."""
        return self.name if self.parent is None else f"{self.parent.path}/{self.name}"

    @property
    def label(self) -> str:
        """The path as messages name it, with the iteration of every looping ancestor:
        `review/iteration 3/fix`."""
        if self.parent is None:
            return self.name
        parent = self.parent
        if parent.loop is not None:
            return f"{parent.label}/iteration {parent.iteration}/{self.name}"
        return f"{parent.label}/{self.name}"

    @property
    def depth(self) -> int:
        return 1 if self.parent is None else self.parent.depth + 1

    @property
    def ancestors(self) -> tuple[str, ...]:
        """The Job-name segments of the ancestors (`naming.step_address`); () for a top-level step."""
        if self.parent is None:
            return ()
        return (*self.parent.ancestors, self.parent.segment())

    def segment(self) -> str:
        """This step as an ancestor in Job names: `<index>i<iteration>` or, for a switch, `<index>c<case>`."""
        if self.spec.switch is not None:
            return f"{self.index}c{case_number(self.st.case)}"
        return f"{self.index}i{self.iteration}"

    def children(self) -> list[StepView]:
        """The child steps of the current pass (a group) or of the case taken (a switch)."""
        specs = child_specs(self.spec, self.st.case)
        entries = self.st.steps or []
        if len(entries) != len(specs):
            return []
        return [StepView(i, spec, entries[i - 1], self, entries) for i, spec in enumerate(specs, 1)]

    @property
    def loop(self) -> LoopStatus | None:
        return self.st.loop if self.spec.loop is not None else None

    @property
    def iteration(self) -> int:
        """The current (or last) iteration, 1-based; 1 for a step without a loop."""
        return self.st.loop.current_iteration if self.loop is not None and self.st.loop else 1

    @property
    def where(self) -> Where:
        """The step, iteration and attempt as the log fields name them (attempt 0: none started)."""
        return Where(
            self.path, self.iteration, self.st.attempt, self.label if self.parent is not None else None
        )

    @property
    def max_iterations(self) -> int:
        return self.st.loop.max_iterations if self.loop is not None and self.st.loop else 1

    def record(self) -> IterationRecord | None:
        """The history entry of the current iteration (always the newest, never pruned)."""
        loop = self.loop
        if loop is None or not loop.iterations:
            return None
        newest = loop.iterations[-1]
        return newest if newest.index == loop.current_iteration else None

    def what(self, attempt: int | None = None) -> str:
        """`iteration 3 attempt 2` (loops) or `attempt 2` — how messages name the current attempt."""
        attempt = self.st.attempt if attempt is None else attempt
        if self.loop is None:
            return f"attempt {attempt}"
        return f"iteration {self.iteration} attempt {attempt}"


def case_number(case: str | None) -> int:
    """`cases[i]` -> i + 1, `default` (or none) -> 0: a switch's case in Job names."""
    if case is not None and case.startswith("cases["):
        return int(case[len("cases[") : -1]) + 1
    return 0


def child_specs(spec: WorkflowStep, case: str | None) -> list[WorkflowStep]:
    """A group's children, or the steps of the switch case `case` (none before a case is taken)."""
    if spec.steps is not None:
        return list(spec.steps)
    if spec.switch is None or case is None:
        return []
    if case == "default":
        return list(spec.switch.default.steps) if spec.switch.default is not None else []
    return list(spec.switch.cases[case_number(case) - 1].steps)


def step_views(ctx: PlanContext) -> list[StepView]:
    workflow = ctx.status.workflow
    assert workflow is not None
    entries = workflow.steps
    return [StepView(i, spec, entries[i - 1], None, entries) for i, spec in enumerate(ctx.steps, 1)]


def all_views(ctx: PlanContext) -> Iterator[StepView]:
    """Every step that has a status entry, depth first (children of the current pass only)."""

    def below(view: StepView) -> Iterator[StepView]:
        yield view
        for child in view.children():
            yield from below(child)

    for top in step_views(ctx):
        yield from below(top)


class StepState(Enum):
    """Where a step is; see the transition table in this module's docstring."""

    PENDING = "pending"  # not started: `when`, the loop set-up and the first attempt are ahead
    NEXT_DUE = "next_due"  # started, and its next iteration (or its one attempt) is due
    RUNNING = "running"  # an attempt's Job is requested or running
    RETRY_DUE = "retry_due"  # an attempt failed; the next one starts after the backoff
    DONE = "done"  # terminal: Succeeded, Skipped, Failed or Cancelled


def state_of(step: StepView) -> StepState:
    """The step's state, derived from its status entry (and the newest iteration record of a loop)."""
    st = step.st
    if st.phase in TERMINAL_STEP_PHASES:
        return StepState.DONE
    if st.phase == "Pending":
        return StepState.PENDING
    if st.phase == "Retrying":
        return StepState.RETRY_DUE
    if st.job_ref is None:
        return StepState.NEXT_DUE
    if step.loop is not None:
        record = step.record()
        if record is None or record.phase == "Succeeded":
            return StepState.NEXT_DUE
        if record.phase == "Retrying":
            return StepState.RETRY_DUE
    return StepState.RUNNING


def _end_loop_event(ctx: PlanContext, step: StepView, warning: bool) -> None:
    loop = step.loop
    if loop is None:
        return
    ctx.facts.append(LoopStopped(step.path, str(loop.stop_reason), loop.completed_iterations))
    ctx.emit(
        "Warning" if warning else "Normal",
        "LoopCompleted",
        f"step {step.label}: loop stopped: {loop.stop_reason} after {loop.completed_iterations} completed "
        f"iteration(s): {step.st.message}",
        step.where,
    )


def _loop_stop_reason(phase: str, reason: str | None) -> LoopStopReason | None:
    if phase == "Cancelled":
        return "LoopCancelled"
    if reason in LOOP_STOP_REASONS:
        return cast(LoopStopReason, reason)
    return "LoopIterationFailed" if phase == "Failed" else None


def end_step(
    ctx: PlanContext,
    step: StepView,
    phase: Literal["Succeeded", "Failed", "Cancelled"],
    reason: str | None,
    message: str,
    *,
    fix: str | None = None,
) -> None:
    """The step's one way to DONE (but Skipped): phase, reason, message, and for a loop its stop reason.

    `reason` is the step's reason (for a loop that succeeded, its stop reason; it may be None).
    Cancelled (a cancel request or the workflow timeout) ignores it: the reason is LoopCancelled for
    a loop, Cancelled otherwise, and an unfinished iteration record is Cancelled too. A failed
    loop's stop reason is the reason when it is a loop reason, else LoopIterationFailed. A stop that
    needs one gets its reason's fix (or `fix`) and docs anchor (planner/remedies.py).
    """
    st = step.st
    loop = step.loop
    if phase == "Cancelled":
        reason = "LoopCancelled" if loop is not None else REASON_CANCELLED
        record = step.record()
        if record is not None and record.phase in ("Running", "Retrying", "Pending"):
            record.phase = "Cancelled"
            record.finished_at = ctx.now
            record.message = clip(message)
    st.phase = phase
    st.reason = reason
    remedy = reason is not None and needs_remedy(phase, reason)
    st.message = with_remedy(str(reason), message, fix=fix) if remedy else clip(message)
    st.finished_at = ctx.now
    st.next_retry_at = None
    if loop is not None:
        loop.next_iteration_at = None
        loop.stop_reason = _loop_stop_reason(phase, reason)
        _end_loop_event(ctx, step, warning=phase != "Succeeded")
    step_ended(ctx, step)


def step_ended(ctx: PlanContext, step: StepView) -> None:
    """The `StepEnded` fact of a step that just reached its final phase (Skipped included), and the
    output the step's loop collects made present (`[]` when nothing was collected)."""
    st = step.st
    _declare_output(ctx, step)
    ctx.facts.append(
        StepEnded(
            step.path,
            step.label,
            step.spec.kind,
            step.depth,
            st.phase,
            st.reason,
            st.case,
            step.loop.completed_iterations if step.loop is not None else None,
        )
    )


def _declare_output(ctx: PlanContext, step: StepView) -> None:
    """Once a collecting loop has ended -- however it ended, also after zero iterations or skipped --
    its output is in `status.workflow.outputs`, so a later `outputs.<name>` reads `[]` instead of
    failing on a missing key (docs/concepts.md#collected-outputs). Outputs are replaced, never
    changed in place (they are shared with the persisted status)."""
    output = step.spec.loop.output if step.spec.loop is not None else None
    workflow = ctx.status.workflow
    if output is None or workflow is None or output.name in (workflow.outputs or {}):
        return
    workflow.outputs = {**(workflow.outputs or {}), output.name: []}
