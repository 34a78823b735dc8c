"""Approval gates (docs/concepts.md#approval-gates): a step that runs no Job and waits for a person.

A gate starts like any step (`when` first), then waits: phase `AwaitingApproval`, an Event, a fact
for the metrics, and the run's condition `AwaitingApproval=True`. People append decisions to
`spec.approvals` (`agentrun approve|reject`); the API server keeps that list append-only. The operator
judges each entry once, in order: `status.workflow.approvalsJudged` counts the entries judged, so a
later entry is new. An entry is applied to the gate it names when that gate was already waiting in
the persisted status, in that iteration, and its inputs fit; any other entry is refused with a
Warning Event, and the gate keeps waiting. Applying a decision and advancing the count are one
status write: a replayed plan judges the same entries against the same status, so a decision is
applied exactly once.

An approved gate ends `Succeeded` with `{"decision": "Approved", "outputs": {...}}` as its control
(every input's default overlaid with the given inputs: `steps.<gate>.control.outputs.<name>`); a
rejected one ends `Failed` (`ApprovalRejected`); a gate past `timeoutSeconds` ends per `onTimeout`
(`ApprovalTimedOut`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from agentrun_operator.api import ApprovalDecision, StepApproval, StepStatus, WorkflowStep
from agentrun_operator.api.status import AgentRunStatus, ApprovalStatus
from agentrun_operator.planner.context import TERMINAL_STEP_PHASES, PlanContext, clip
from agentrun_operator.planner.facts import ApprovalDecided, ApprovalRequested
from agentrun_operator.planner.loops import start_step
from agentrun_operator.planner.outcome import Outcome
from agentrun_operator.planner.run import stop_message
from agentrun_operator.planner.state import StepView, end_step
from agentrun_operator.problem import Problem, concepts

PHASE_AWAITING: Final = "AwaitingApproval"
REASON_APPROVED: Final = "Approved"
REASON_REJECTED: Final = "ApprovalRejected"
REASON_TIMED_OUT: Final = "ApprovalTimedOut"
REASON_REFUSED: Final = "ApprovalRefused"
EVENT_AWAITING: Final = "AwaitingApproval"
DOCS: Final = concepts("approval-gates")
MAX_INPUT_NOTE: Final = 80


@dataclass(frozen=True)
class Gate:
    """A gate found by its path: its spec, its status entry and the iteration it is in."""

    path: str
    spec: StepApproval
    st: StepStatus
    iteration: int

    @property
    def waiting(self) -> bool:
        return self.st.phase == PHASE_AWAITING


def gate_iteration(view: StepView) -> int:
    """The iteration of the innermost loop body holding the gate (1 when none): decisions name it."""
    parent = view.parent
    while parent is not None:
        if parent.loop is not None:
            return max(parent.iteration, 1)
        parent = parent.parent
    return 1


def find_gate(steps: list[WorkflowStep], status: AgentRunStatus | None, path: str) -> Gate | StepView | None:
    """The step at `path` in the run's current tree: a `Gate` when it is an approval gate, the view of
    the step when it is another kind, None when no step has that path (yet: a loop body's children
    exist for its current pass, a switch's for the case taken). Pure, for the CLI and the planner."""
    workflow = status.workflow if status is not None else None
    if workflow is None or len(workflow.steps) != len(steps):
        return None
    names = path.strip("/").split("/")
    views = [
        StepView(i, spec, workflow.steps[i - 1], None, workflow.steps) for i, spec in enumerate(steps, 1)
    ]
    view: StepView | None = None
    for name in names:
        view = next((v for v in views if v.name == name), None)
        if view is None:
            return None
        views = view.children()
    assert view is not None
    if view.spec.approval is None:
        return view
    return Gate(view.path, view.spec.approval, view.st, gate_iteration(view))


def decision_problems(gate: StepApproval, decision: ApprovalDecision, where: str) -> list[Problem]:
    """Whether `decision` fits the gate's inputs: every given input declared, every required one given
    (for an approval). Shared by `agentrun approve|reject` (`where`: `--input`) and the operator
    (`spec.approvals[<i>].inputs`)."""
    declared = {i.name for i in gate.inputs or []}
    given = decision.inputs or {}
    problems: list[Problem] = []
    for name in sorted(set(given) - declared):
        problems.append(
            Problem(
                f"{where}.{name}" if where.startswith("spec.") else f"{where} {name}",
                given[name],
                f"input {name!r} is not declared by the gate "
                f"(declared: {', '.join(sorted(declared)) or 'none'})",
                "give only the gate's declared inputs (approval.inputs[].name)",
                DOCS,
            )
        )
    if decision.decision == "Approved":
        for spec in gate.inputs or []:
            if spec.required and spec.name not in given:
                problems.append(
                    Problem(
                        where,
                        given,
                        f"the gate requires input {spec.name!r}",
                        f"give it: agentrun approve NAME --step PATH --input {spec.name}=VALUE",
                        DOCS,
                    )
                )
    return problems


def why_not_waiting(found: Gate | StepView | None, decision: ApprovalDecision) -> str | None:
    """Why `decision` cannot apply to what is at its path now; None when a waiting gate matches."""
    if found is None:
        return f"there is no step {decision.step!r} in the run now (a step's path names no iterations)"
    if not isinstance(found, Gate):
        return f"step {decision.step!r} is a {found.spec.kind} step, not an approval gate"
    if not found.waiting:
        return f"the gate {decision.step!r} is not waiting (it is {found.st.phase})"
    if found.iteration != decision.iteration:
        return f"the gate {decision.step!r} waits in iteration {found.iteration}, not {decision.iteration}"
    return None


# ----------------------------------------------------------------------------------- planning


def plan_approval(ctx: PlanContext, view: StepView) -> Outcome:
    """Start the gate (it waits), apply a decision or a timeout, or keep waiting."""
    st = view.st
    if st.phase == "Pending":
        if ctx.stopping is not None:
            return Outcome.HALTED
        if not start_step(ctx, view):
            return Outcome.DONE
        _wait(ctx, view)
        return Outcome.ACTIVE
    if st.phase in TERMINAL_STEP_PHASES:
        return Outcome.DONE
    if _apply_decision(ctx, view) or _time_out(ctx, view):
        return Outcome.DONE
    if ctx.stopping is not None:
        end_step(ctx, view, "Cancelled", None, f"{stop_message(ctx, view)} (it was awaiting approval)")
        return Outcome.DONE
    _still_waiting(ctx, view)
    return Outcome.ACTIVE


def _spec(view: StepView) -> StepApproval:
    assert view.spec.approval is not None
    return view.spec.approval


def approve_command(run: str, namespace: str | None, path: str, gate: StepApproval) -> str:
    """The `agentrun approve` command that this gate accepts as it is: every required input as an
    `--input NAME=VALUE` flag (a command without them is refused), so a person can copy it and fill
    in the values. Shared by the condition, the Event, `agentrun status` and `agentrun dev run`."""
    target = f"{run} -n {namespace}" if namespace else run
    flags = "".join(f" --input {i.name}=VALUE" for i in gate.inputs or [] if i.required)
    return f"agentrun approve {target} --step {path}{flags}"


def required_inputs_note(gate: StepApproval) -> str:
    """`(verdict: revise (another iteration) or final)`: what each required input means, for the
    approver who fills in VALUE; empty when the gate requires none."""
    parts = [
        f"{i.name}: {clip(i.description, MAX_INPUT_NOTE)}" if i.description else i.name
        for i in gate.inputs or []
        if i.required
    ]
    return f" (required: {'; '.join(parts)})" if parts else ""


def _commands(ctx: PlanContext, view: StepView) -> str:
    spec = _spec(view)
    run = f"{ctx.name} -n {ctx.namespace}" if ctx.namespace else ctx.name
    return (
        f"approve with `{approve_command(ctx.name, ctx.namespace, view.path, spec)}`"
        f"{required_inputs_note(spec)}, reject with "
        f"`agentrun reject {run} --step {view.path} --reason TEXT`"
    )


def _wait(ctx: PlanContext, view: StepView) -> None:
    st = view.st
    iteration = gate_iteration(view)
    st.phase = PHASE_AWAITING
    st.approval = ApprovalStatus(iteration=iteration)
    st.message = clip(f"awaiting approval: {_spec(view).message}")
    ctx.facts.append(ApprovalRequested(view.path, view.label))
    ctx.emit("Normal", EVENT_AWAITING, f"step {view.label}: {st.message}; {_commands(ctx, view)}", view.where)
    _still_waiting(ctx, view)


def _still_waiting(ctx: PlanContext, view: StepView) -> None:
    ctx.awaiting.append(f"step {view.label}: {view.st.message}; {_commands(ctx, view)}")
    timeout = _spec(view).timeout_seconds
    if timeout is not None and view.st.started_at is not None:
        ctx.requeue((view.st.started_at + timedelta(seconds=timeout) - ctx.now).total_seconds())


def _decisions(ctx: PlanContext) -> list[ApprovalDecision]:
    return list(ctx.run.spec.approvals or [])


def judged(ctx: PlanContext) -> int:
    workflow = ctx.status.workflow
    return (workflow.approvals_judged or 0) if workflow is not None else 0


def _apply_decision(ctx: PlanContext, view: StepView) -> bool:
    """The first new entry for this waiting gate and iteration whose inputs fit; True when applied.
    Entries for it that do not fit are refused on the way (the gate keeps waiting)."""
    iteration = gate_iteration(view)
    decisions = _decisions(ctx)
    for index in range(judged(ctx), len(decisions)):
        decision = decisions[index]
        if index in ctx.approvals_consumed or decision.step != view.path or decision.iteration != iteration:
            continue
        ctx.approvals_consumed.add(index)
        problems = decision_problems(_spec(view), decision, f"spec.approvals[{index}].inputs")
        if problems:
            _refuse(ctx, index, decision, problems[0])
            continue
        _decide(ctx, view, index, decision)
        return True
    return False


def _decide(ctx: PlanContext, view: StepView, index: int, decision: ApprovalDecision) -> None:
    st = view.st
    approval = st.approval or ApprovalStatus(iteration=gate_iteration(view))
    st.approval = approval.model_copy(
        update={"decision": decision.decision, "index": index, "decided_at": ctx.now}
    )
    ctx.facts.append(ApprovalDecided(view.path, decision.decision, index))
    where = f"spec.approvals[{index}]"
    if decision.decision == "Approved":
        outputs = _spec(view).outputs(decision.inputs)
        st.control = {"decision": "Approved", "outputs": outputs}
        note = f": {decision.reason}" if decision.reason else ""
        message = f"approved ({where}){note}; outputs {_json(outputs)}"
        ctx.emit("Normal", REASON_APPROVED, f"step {view.label}: {message}", view.where)
        end_step(ctx, view, "Succeeded", REASON_APPROVED, message)
        return
    st.control = {"decision": "Rejected", "reason": decision.reason, "outputs": dict(decision.inputs or {})}
    message = f"rejected ({where}): {decision.reason}"
    ctx.emit("Warning", REASON_REJECTED, f"step {view.label}: {message}", view.where)
    end_step(ctx, view, "Failed", REASON_REJECTED, message)


def _time_out(ctx: PlanContext, view: StepView) -> bool:
    spec, st = _spec(view), view.st
    if spec.timeout_seconds is None or st.started_at is None:
        return False
    if ctx.now < st.started_at + timedelta(seconds=spec.timeout_seconds):
        return False
    approval = st.approval or ApprovalStatus(iteration=gate_iteration(view))
    st.approval = approval.model_copy(update={"decision": "TimedOut", "decided_at": ctx.now})
    ctx.facts.append(ApprovalDecided(view.path, "TimedOut"))
    waited = f"no decision within timeoutSeconds {spec.timeout_seconds}"
    if spec.on_timeout == "Approve":
        outputs = spec.outputs(None)
        st.control = {"decision": "Approved", "outputs": outputs}
        message = f"{waited}; onTimeout: Approve (outputs {_json(outputs)})"
        ctx.emit("Normal", REASON_TIMED_OUT, f"step {view.label}: {message}", view.where)
        end_step(ctx, view, "Succeeded", REASON_TIMED_OUT, message)
    else:
        message = f"{waited}; onTimeout: Fail"
        ctx.emit("Warning", REASON_TIMED_OUT, f"step {view.label}: {message}", view.where)
        end_step(ctx, view, "Failed", REASON_TIMED_OUT, message)
    return True


def _refuse(ctx: PlanContext, index: int, decision: ApprovalDecision, problem: Problem) -> None:
    ctx.facts.append(ApprovalDecided(decision.step, "Refused", index))
    ctx.emit("Warning", REASON_REFUSED, f"{problem.render()}; the entry is ignored")


def judge_rest(ctx: PlanContext) -> None:
    """After the walk: refuse every new entry no waiting gate took, and count all entries judged."""
    decisions = _decisions(ctx)
    workflow = ctx.status.workflow
    if workflow is None or judged(ctx) >= len(decisions):
        return
    for index in range(judged(ctx), len(decisions)):
        if index in ctx.approvals_consumed:
            continue
        decision = decisions[index]
        found = find_gate(ctx.steps, ctx.status, decision.step)
        why = why_not_waiting(found, decision) or "the gate was not waiting when the decision arrived"
        _refuse(
            ctx,
            index,
            decision,
            Problem(
                f"spec.approvals[{index}]",
                decision.model_dump(by_alias=True, exclude_none=True),
                f"decision for step {decision.step!r} iteration {decision.iteration} refused: {why}",
                "decide a gate while it is AwaitingApproval, naming its path and iteration as `agentrun "
                "status` shows them (agentrun approve|reject checks this)",
                DOCS,
            ),
        )
    workflow.approvals_judged = len(decisions)


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
