"""Admission: what happens before the first Job -- cancel before start, validation with the
reference grace period, and the idempotency claim."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from pydantic import ValidationError

from agentrun_operator import naming
from agentrun_operator.api import AgentRun, AgentRunStatus, Condition, format_validation_error
from agentrun_operator.api.base import DOCS_API
from agentrun_operator.planner import compat, compat_status, conditions, volumes
from agentrun_operator.planner.actions import ClaimIdempotencyKey
from agentrun_operator.planner.context import (
    MAX_MESSAGE_CHARS,
    REASON_CANCELLED,
    RESULT_REQUEUE_SECONDS,
    TERMINAL_RUN_PHASES,
    PlanContext,
    clip,
)
from agentrun_operator.planner.observed import IdempotencyClaim
from agentrun_operator.planner.run import (
    finish_run,
    mark_invalid_spec,
    set_condition,
    set_pending,
)
from agentrun_operator.planner.validate import (
    REASON_INVALID_SPEC,
    Problem,
    validate_run,
)

MAX_PROBLEMS_IN_MESSAGE: Final = 5

REASON_WAITING_FOR_REFERENCES: Final = "WaitingForReferences"

REASON_CLAIMING: Final = "ClaimingIdempotencyKey"

REASON_KEY_IN_USE: Final = "IdempotencyKeyInUse"

REASON_KEY_COMPLETED: Final = "IdempotencyKeyCompleted"


def admit(ctx: PlanContext) -> bool:
    """Before the first Job: templates (never run), cancel, validation (with the reference grace),
    bound claims, the idempotency claim."""
    spec = ctx.run.spec
    if compat.is_template(ctx.run):
        set_pending(
            ctx,
            compat.REASON_TEMPLATE,
            f'this AgentRun is a template ({compat.TEMPLATE_ANNOTATION}: "true"): it never runs; '
            "create a copy without the annotation to run it",
        )
        return False
    if spec.cancel is not None:
        finish_run(ctx, "Cancelled", REASON_CANCELLED, f"cancelled ({spec.cancel}) before any Job started")
        return False
    compat_status.record(ctx)
    problems = validate_run(ctx.run, ctx.observed, ctx.config)
    if problems:
        waiting = _reference_wait_seconds(ctx, problems)
        if waiting is not None:
            _wait_for_references(ctx, problems, waiting)
        else:
            _fail_invalid(ctx, problems)
        return False
    unbound = volumes.unbound_claims(ctx.observed)
    if unbound is not None:
        set_pending(ctx, unbound.reason, unbound.message)
        ctx.requeue(volumes.RECHECK_SECONDS)
        return False
    if spec.idempotency_key is not None:
        return _hold_idempotency_claim(ctx, spec.idempotency_key)
    return True


def _creation_time(run: AgentRun) -> datetime | None:
    raw = run.metadata.get("creationTimestamp")
    moment: datetime | None = None
    if isinstance(raw, datetime):
        moment = raw
    elif isinstance(raw, str) and raw:
        try:
            moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            return None
    if moment is not None and moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment


def _reference_wait_seconds(ctx: PlanContext, problems: list[Problem]) -> float | None:
    """Seconds left to wait when every problem is a missing reference young enough; else None."""
    if not all(p.missing for p in problems):
        return None
    grace = ctx.config.reference_grace_seconds
    age = ctx.seconds_since(_creation_time(ctx.run))
    return grace - age if age < grace else None


def _wait_for_references(ctx: PlanContext, problems: list[Problem], seconds: float) -> None:
    missing = ", ".join(sorted({p.missing for p in problems if p.missing}))
    set_pending(
        ctx,
        REASON_WAITING_FOR_REFERENCES,
        f"waiting for {missing} to exist; the run fails with InvalidSpec if still missing "
        f"{ctx.config.reference_grace_seconds:g}s after creation",
    )
    ctx.requeue(seconds + 0.5)


def problems_message(problems: list[Problem]) -> str:
    lines = [p.render() for p in problems[:MAX_PROBLEMS_IN_MESSAGE]]
    if len(problems) > MAX_PROBLEMS_IN_MESSAGE:
        lines.append(f"(and {len(problems) - MAX_PROBLEMS_IN_MESSAGE} more; run `agentrun validate`)")
    return "; ".join(lines)


def _fail_invalid(ctx: PlanContext, problems: list[Problem]) -> None:
    # A more specific reason than InvalidSpec (WorkflowLoopsDisabled, NestingTooDeep) names the run's.
    reason = next((p.reason for p in problems if p.reason != REASON_INVALID_SPEC), REASON_INVALID_SPEC)
    message = clip(problems_message(problems), 4 * MAX_MESSAGE_CHARS)
    mark_invalid_spec(ctx, reason, message)
    finish_run(ctx, "Failed", reason, message)


def _hold_idempotency_claim(ctx: PlanContext, key: str) -> bool:
    """True when this run holds the (namespace, agentRef, key) claim; else claim it or fail."""
    agent = ctx.run.spec.agent_ref.name if ctx.run.spec.agent_ref else ""
    claim = ctx.observed.claim
    if claim is None:
        if ctx.observed.claim_checked:
            name = naming.idempotency_claim_name(ctx.namespace, agent, key)
            ctx.writes.append(ClaimIdempotencyKey(name=name, agent_ref=agent, key=key))
        set_pending(ctx, REASON_CLAIMING, f"claiming idempotencyKey {key!r} before the first Job")
        ctx.requeue(RESULT_REQUEUE_SECONDS)
        return False
    if claim.holder_uid == ctx.uid:
        return True
    finished = holder_finished(claim)
    reason = REASON_KEY_COMPLETED if finished else REASON_KEY_IN_USE
    state = "has finished" if finished else "is still running"
    message = (
        f"idempotencyKey {key!r} (agent {agent or '-'}) belongs to AgentRun {claim.holder_name!r} "
        f"(uid {claim.holder_uid}), which {state}; this run starts no Jobs and does not resume its loops"
    )
    set_condition(ctx, conditions.DUPLICATE, "True", reason, message)
    finish_run(ctx, "Failed", reason, message)
    return False


def holder_finished(claim: IdempotencyClaim) -> bool:
    """The claim's holder run has reached a terminal phase, or is gone (its key is then "completed")."""
    return claim.holder_gone or claim.holder_phase in TERMINAL_RUN_PHASES


def unparseable_status(
    prior_phase: str | None, generation: int | None, err: ValidationError, now: datetime
) -> AgentRunStatus | None:
    """The status of a run the CRD admitted but the models refuse: Failed, InvalidSpec, the first
    problem named. None when the run is already Failed (nothing to write, nothing to retry)."""
    if prior_phase == "Failed":
        return None
    first = format_validation_error(err)[0]
    see = "" if "docs/" in first else f" (see {DOCS_API})"
    message = f"spec is not valid: {first}{see}"
    status = AgentRunStatus(
        phase="Failed",
        reason=REASON_INVALID_SPEC,
        message=message,
        observed_generation=generation,
        conditions=[
            Condition(
                type=conditions.INVALID_SPEC,
                status="True",
                reason=REASON_INVALID_SPEC,
                message=message,
                last_transition_time=now.replace(microsecond=0),
            )
        ],
    )
    status.conditions = conditions.derive(status, generation, now.replace(microsecond=0))
    return status
