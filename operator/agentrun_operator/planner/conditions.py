"""The run's conditions, derived from the status the planner has just decided. Pure.

Conditions follow the Kubernetes API conventions (type, status, reason, message,
observedGeneration, lastTransitionTime that moves only when the status changes) and kstatus:

- `Ready`      True once the run has Succeeded; False otherwise, with the reason it is not (yet).
- `Succeeded`  Unknown while Pending/Running; True when Succeeded; False when Failed or Cancelled.
               (`kubectl wait --for=condition=Succeeded ar/NAME` returns when the run succeeds.)
- `Reconciling` True while the run is Pending or Running, False once it has finished: kstatus (Flux,
               `kpt`, cli-utils) reports the run InProgress while it is True.
- `Stalled`    True when the run Failed (it will not progress without a new run): kstatus reports
               Failed; False otherwise.
- `InvalidSpec`, `Duplicate` are set by admission when they apply and kept as they are here.
- `AwaitingApproval` True while an approval gate waits, with what it asks and how to decide; it goes
               False (reason `NoApprovalPending`) once no gate waits, and is absent in runs that never
               waited.
- `StatusSizeWarning` True while the serialized status is over 80 % of the status budget; it goes
               False (not away) once the status is back under, so the history of the warning stays.
- `JobClaimUnavailable` True once a pod of the run could not claim its Job (planner/claims.py, which
               runs right after `conclude`).

The planner calls `derive` once at the end of every plan, so every code path that changes the
phase gets the same conditions, and a re-plan of the same status changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from agentrun_operator.api import AgentRunStatus, Condition, StepStatus
from agentrun_operator.planner.context import PlanContext

READY: Final = "Ready"
SUCCEEDED: Final = "Succeeded"
RECONCILING: Final = "Reconciling"
STALLED: Final = "Stalled"
INVALID_SPEC: Final = "InvalidSpec"
DUPLICATE: Final = "Duplicate"
STATUS_SIZE_WARNING: Final = "StatusSizeWarning"
AWAITING_APPROVAL: Final = "AwaitingApproval"
REASON_NO_APPROVAL_PENDING: Final = "NoApprovalPending"

DERIVED: Final = (READY, SUCCEEDED, RECONCILING, STALLED)
"""The types `derive` owns, in the order they are listed; any other type keeps its place after them."""

STATUS_WARNING_FRACTION: Final = 0.8

REASON_PENDING: Final = "Pending"
REASON_RUNNING: Final = "Running"
REASON_STATUS_LARGE: Final = "StatusNearBudget"
REASON_STATUS_OK: Final = "StatusWithinBudget"

ConditionStatus = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class Want:
    """What a condition should say now (before times and generations are filled in)."""

    type: str
    status: ConditionStatus
    reason: str
    message: str


def wanted(status: AgentRunStatus) -> list[Want]:
    """Ready, Succeeded, Reconciling and Stalled for the run's phase, reason and message."""
    phase = status.phase or "Pending"
    reason = status.reason or (REASON_RUNNING if phase == "Running" else REASON_PENDING)
    if phase == "Running" and status.reason is None:
        message = status.message or "the run is in progress"
    else:
        message = status.message or f"the run is {phase.lower()}"
    if phase in ("Pending", "Running"):
        return [
            Want(READY, "False", reason, message),
            Want(SUCCEEDED, "Unknown", reason, message),
            Want(RECONCILING, "True", reason, message),
            Want(STALLED, "False", reason, message),
        ]
    if phase == "Succeeded":
        return [
            Want(READY, "True", reason, message),
            Want(SUCCEEDED, "True", reason, message),
            Want(RECONCILING, "False", reason, message),
            Want(STALLED, "False", reason, message),
        ]
    return [
        Want(READY, "False", reason, message),
        Want(SUCCEEDED, "False", reason, message),
        Want(RECONCILING, "False", reason, message),
        Want(STALLED, "True" if phase == "Failed" else "False", reason, message),
    ]


def status_size_want(size_bytes: int, budget_bytes: int, current: Sequence[Condition]) -> Want | None:
    """`StatusSizeWarning` for a status of `size_bytes`: True over 80 % of the budget, False once a
    warned status is back under it, absent for a run that was never near it."""
    limit = int(budget_bytes * STATUS_WARNING_FRACTION)
    if size_bytes > limit:
        return Want(
            STATUS_SIZE_WARNING,
            "True",
            REASON_STATUS_LARGE,
            f"the status is {size_bytes} bytes, over 80% of the {budget_bytes}-byte status budget "
            "(AGENTS_CONTROLLER_STATUS_BUDGET_BYTES); keep fewer iterations "
            "(AGENTS_CONTROLLER_WORKFLOW_LOOP_STATUS_HISTORY_LIMIT) or smaller control payloads",
        )
    if any(c.type == STATUS_SIZE_WARNING for c in current):
        return Want(
            STATUS_SIZE_WARNING,
            "False",
            REASON_STATUS_OK,
            f"the status is {size_bytes} bytes, under 80% of the {budget_bytes}-byte status budget",
        )
    return None


_RECORD_FIXED_BYTES: Final = 400
"""More than an iteration record takes in JSON besides its message (keys, index, phase, attempts,
two timestamps, a Job name of at most 63 characters and a uid)."""
_STEP_FIXED_BYTES: Final = 800
_RUN_FIXED_BYTES: Final = 1200


def _json_bytes(value: Any) -> int:
    return 0 if value is None else len(json.dumps(value, separators=(",", ":"))) * 2


def _text_bytes(*texts: str | None) -> int:
    return sum(4 * len(t) for t in texts if t)  # at most 4 bytes per character in UTF-8


def size_upper_bound(status: AgentRunStatus) -> int:
    """A cheap bound on the serialized status (without its conditions): never below the real size.

    Serializing a status with a long history costs a few hundred microseconds per plan; this bound
    costs a few, so the exact size is measured only when the bound comes near the budget."""
    total = _RUN_FIXED_BYTES + _text_bytes(
        status.reason, status.message, status.current_step, status.iteration
    )
    for step in status.workflow.steps if status.workflow is not None else []:
        total += _step_bytes(step)
    if status.workflow is not None:
        total += _json_bytes(status.workflow.outputs) + _json_bytes(status.workflow.pruned_outputs)
    return total


def _step_bytes(step: StepStatus) -> int:
    """The bound for one step entry, its children's entries (groups, switches) included."""
    total = _STEP_FIXED_BYTES + _text_bytes(step.name, step.reason, step.message, step.case)
    total += _json_bytes(step.control)
    if step.job_ref is not None:
        total += _text_bytes(step.job_ref.name, step.job_ref.uid)
    if step.last_failure is not None:
        total += 200 + _text_bytes(step.last_failure.reason, step.last_failure.message)
    if step.approval is not None:
        total += 200
    for child in step.steps or []:
        total += _step_bytes(child)
    loop = step.loop
    if loop is None:
        return total
    total += _text_bytes(loop.stop_reason) + _json_bytes(loop.last_control) + _json_bytes(loop.items)
    total += _json_bytes(loop.progress)
    for record in loop.iterations:
        total += _RECORD_FIXED_BYTES + _text_bytes(record.message)
        if record.steps:  # `"<child>":"<phase>",` per child; phases are ASCII words of ≤ 9 letters
            total += sum(4 * len(name) + 16 for name in record.steps)
    return total


def exact_size(status: AgentRunStatus) -> int:
    """The serialized size of the status as written, without its conditions (bytes)."""
    return len(status.model_dump_json(by_alias=True, exclude_none=True, exclude={"conditions"}).encode())


def status_size(status: AgentRunStatus, budget_bytes: int, bound: int | None = None) -> int | None:
    """The status size when it matters for `StatusSizeWarning` (near the budget, or warned before);
    None when the bound (`size_upper_bound`, computed here unless given) shows it is far below and
    no warning is to be lifted."""
    warned = any(c.type == STATUS_SIZE_WARNING for c in status.conditions)
    if bound is None:
        bound = size_upper_bound(status)
    if not warned and bound <= budget_bytes * STATUS_WARNING_FRACTION:
        return None
    return exact_size(status)


def apply(
    current: Sequence[Condition], wants: Sequence[Want], generation: int | None, now: datetime
) -> list[Condition]:
    """`current` with each wanted condition set: lastTransitionTime moves only when the status
    changes; reason, message and observedGeneration follow the latest decision. The derived types
    come first in a fixed order, every other condition keeps its relative place after them."""
    by_type = {c.type: c for c in current}
    updated: dict[str, Condition] = {}
    for want in wants:
        old = by_type.get(want.type)
        if (
            old is not None
            and (old.status, old.reason, old.message, old.observed_generation)
            == (want.status, want.reason, want.message, generation)
            and old.last_transition_time is not None
        ):
            updated[want.type] = old  # the steady state: nothing to build
            continue
        moved = old is None or old.status != want.status or old.last_transition_time is None
        updated[want.type] = Condition(
            type=want.type,
            status=want.status,
            reason=want.reason,
            message=want.message,
            observed_generation=generation,
            last_transition_time=now if moved or old is None else old.last_transition_time,
        )
    ordered = [updated[t] for t in DERIVED if t in updated]
    seen = {c.type for c in ordered}
    for cond in current:
        if cond.type in seen:
            continue
        ordered.append(updated.get(cond.type, cond))
        seen.add(cond.type)
    ordered.extend(c for t, c in updated.items() if t not in seen)
    return ordered


def awaiting_want(awaiting: Sequence[str], current: Sequence[Condition]) -> Want | None:
    """`AwaitingApproval` for the gates waiting after this plan (`awaiting`: what each one asks)."""
    if awaiting:
        return Want(AWAITING_APPROVAL, "True", AWAITING_APPROVAL, "; ".join(awaiting))
    if any(c.type == AWAITING_APPROVAL for c in current):
        return Want(AWAITING_APPROVAL, "False", REASON_NO_APPROVAL_PENDING, "no approval gate is waiting")
    return None


def derive(
    status: AgentRunStatus,
    generation: int | None,
    now: datetime,
    size_bytes: int | None = None,
    budget_bytes: int | None = None,
    awaiting: Sequence[str] = (),
) -> list[Condition]:
    """The run's conditions after this plan (see the module docstring for the rules).

    `size_bytes` is the status size from `status_size` (None: far below the budget); `awaiting`
    what each waiting approval gate asks."""
    wants = wanted(status)
    gate = awaiting_want(awaiting, status.conditions)
    if gate is not None:
        wants.append(gate)
    if size_bytes is not None and budget_bytes:
        size = status_size_want(size_bytes, budget_bytes, status.conditions)
        if size is not None:
            wants.append(size)
    return apply(status.conditions, wants, generation, now)


def became_true(before: Sequence[Condition], after: Sequence[Condition], type_: str) -> bool:
    """Whether `type_` turned True in this plan (e.g. to post a Warning Event once, not every time)."""
    old = next((c for c in before if c.type == type_), None)
    new = next((c for c in after if c.type == type_), None)
    return new is not None and new.status == "True" and (old is None or old.status != "True")


def conclude(ctx: PlanContext, size_bound: int | None = None) -> None:
    """The last step of every plan: the conditions of the status just decided, and a Warning Event
    `StatusSizeWarning` when the status has just crossed 80 % of its budget. `size_bound` is the
    status's `size_upper_bound` when the caller has it already (one walk of the status per plan)."""
    status = ctx.status
    before = list(status.conditions)
    budget = ctx.config.status_budget_bytes
    status.conditions = derive(
        status,
        status.observed_generation,
        ctx.now,
        status_size(status, budget, size_bound),
        budget,
        ctx.awaiting if status.phase not in ("Succeeded", "Failed", "Cancelled") else (),
    )
    if became_true(before, status.conditions, STATUS_SIZE_WARNING):
        warning = next(c for c in status.conditions if c.type == STATUS_SIZE_WARNING)
        ctx.emit("Warning", STATUS_SIZE_WARNING, warning.message or "")
