"""An attempt's result in the status: a success (the loop decides what comes next) or a failure
(retry after the backoff while retries and budgets last), with its usage, checkpoint and facts."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from agentrun_operator.api import IterationRecord, format_timestamp
from agentrun_operator.control.envelope import ControlEnvelope, decode_envelope
from agentrun_operator.planner.attempt_pod import pod_control_path
from agentrun_operator.planner.budgets import account_usage, budget_reached, check_budget
from agentrun_operator.planner.checkpoints import record_checkpoint
from agentrun_operator.planner.context import (
    REASON_STEP_FAILED,
    PlanContext,
    clip,
)
from agentrun_operator.planner.facts import IterationFinished, IterationResult
from agentrun_operator.planner.feedback import (
    failure_of,
    tail,
)
from agentrun_operator.planner.loops import decide_next
from agentrun_operator.planner.observed import ObservedJob, ObservedPod, Refusal
from agentrun_operator.planner.outputs import collect_output
from agentrun_operator.planner.reported import record_reported
from agentrun_operator.planner.run import stop_message
from agentrun_operator.planner.stall import check_stall, record_progress
from agentrun_operator.planner.state import StepView, end_step
from agentrun_operator.resolution import cancel_grace_seconds, step_retries

RESULT_GRACE_SECONDS: Final = 10.0
"""How long a succeeded Job's pod may be missing from the observation before its result is read as lost."""

RESULT_MAX_WAIT_SECONDS: Final = 60.0
"""How long a succeeded Job's pod may stay non-terminal before the planner stops waiting for it."""


def refused_job_message(refusal: Refusal) -> str:
    """What a user reads when the API server refused an attempt's Job: its words (the step's stop
    adds what to do, planner/remedies.py)."""
    return (
        f"the API server refused to create Job {refusal.name} (HTTP {refusal.code}): "
        f"{refusal.message.strip()}; a refused Job is not retried"
    )


def _control_of(envelope: ControlEnvelope | None) -> dict[str, Any] | None:
    return envelope.control if envelope is not None and envelope.status == "found" else None


def _failed_attempt_envelope(
    ctx: PlanContext, step: StepView, job: ObservedJob | None
) -> ControlEnvelope | None:
    """The envelope of the failed attempt's pod whose `main` ran: its control file (None when it
    reported none, or a file this attempt did not write: `stale` is never counted twice) and its
    checkpoint. A duplicate pod of the Job never runs `main` (docs/concepts.md#exactly-once)."""
    if job is None:
        return None
    ran = [
        p
        for p in ctx.observed.pods_of(job.name)
        if p.reporter_message is not None and p.main_exit_code is not None
    ]
    if not ran:
        return None
    newest = max(ran, key=lambda p: (p.finished_at is not None, p.finished_at or ctx.now, p.name))
    return decode_envelope(newest.reporter_message, pod_control_path(step))


MAX_CAUSE_TAIL_BYTES = 400
"""How much of main's termination message (with FallbackToLogsOnError: its log's tail) a failed
attempt's message carries; `agentrun logs` shows the rest."""


def one_line_tail(text: str, limit: int) -> str:
    """The last `limit` bytes of `text` on one line (its lines joined with ` | `): a status message is
    shown in one table cell."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return tail(" | ".join(lines), limit)


def iteration_finished(
    ctx: PlanContext,
    step: StepView,
    result: IterationResult,
    job: ObservedJob | None = None,
    duration: float | None = None,
) -> None:
    """The fact of an attempt's end; its duration from its Job (`attempt_duration`) unless given (a
    warm iteration: from its start in the status to its end in the pod, planner/warm.py)."""
    if duration is None and job is not None:
        duration = attempt_duration(job, ctx.observed.pods_of(job.name), ctx.now)
    ctx.facts.append(IterationFinished(step.path, step.iteration, step.st.attempt, result, duration))


def attempt_duration(job: ObservedJob, pods: Sequence[ObservedPod], now: datetime) -> float | None:
    """Seconds from the Job starting (`status.startTime`, when its pod was created) to the attempt's
    end: the latest `main` end among its pods, else the Job's completion, else now (the result is
    recorded once every container ended, docs/design.md#early-result). Both ends are the API server's
    whole seconds; None when the Job never started (refused, or deleted before it did)."""
    if job.started_at is None:
        return None
    ends = [p.finished_at for p in pods if p.finished_at is not None]
    end = max(ends) if ends else (job.finished_at or now)
    return max(0.0, (end - job.started_at).total_seconds())


def _not_before_start(finished: datetime, record: IterationRecord) -> datetime:
    """A Job's completionTime has whole seconds, the record's start (the operator's clock) has
    microseconds: an iteration that ended within the second it started would end before it began."""
    return max(finished, record.started_at) if record.started_at is not None else finished


def record_failure(
    ctx: PlanContext,
    step: StepView,
    job: ObservedJob | None,
    cause: str,
    reason: str | None = None,
    *,
    usage_counted: bool = False,
    envelope: ControlEnvelope | None = None,
    duration: float | None = None,
) -> bool:
    """A failed attempt: its usage counts (unless the caller counted it: a loop's candidates); retry
    after the backoff while the retries and the budgets last, else the iteration fails. Why it failed
    is kept for the retry's AGENTRUN_PREVIOUS (`feedback`)."""
    st = step.st
    attempt = st.attempt
    st.last_failure = failure_of(ctx, attempt, job, cause, reason)
    retries = step_retries(step.spec, ctx.refs)
    finished = job.finished_at if job is not None and job.finished_at is not None else ctx.now
    message = clip(f"{step.what()} failed: {cause}")
    record = step.record()
    stopping = ctx.stopping  # a stop requested before this result (the usage may spend the goal's)
    whose = f"{clip(message, 300)}; its control file"
    failed_envelope = envelope if envelope is not None else _failed_attempt_envelope(ctx, step, job)
    record_checkpoint(step, failed_envelope)
    counted = None if usage_counted else _control_of(failed_envelope)
    if not account_usage(ctx, step, counted, whose):
        if record is not None:  # the loop's onInvalid ended the step
            record.phase = "Failed"
            record.finished_at = _not_before_start(finished, record)
            record.message = message
        iteration_finished(ctx, step, "Failed", job, duration)
        return True
    exhausted = budget_reached(step) is not None
    if attempt <= retries and ctx.stopping is None and not exhausted:
        due = finished + timedelta(seconds=step.spec.retry_backoff_seconds)
        st.phase = "Retrying"
        st.next_retry_at = due
        st.message = clip(f"{message}; attempt {attempt + 1}/{retries + 1} starts at {format_timestamp(due)}")
        if record is not None:
            record.phase = "Retrying"
            record.message = message
        iteration_finished(ctx, step, "Retrying", job, duration)
        ctx.emit("Warning", "IterationRetrying", f"step {step.label}: {st.message}", step.where)
        return True
    if record is not None:
        record.phase = "Failed"
        record.finished_at = _not_before_start(finished, record)
        record.message = message
    iteration_finished(ctx, step, "Failed", job, duration)
    ctx.emit("Warning", "IterationFailed", f"step {step.label}: {message}", step.where)
    if stopping is not None or (attempt <= retries and ctx.stopping is not None):
        end_step(ctx, step, "Cancelled", None, f"{message}; {stop_message(ctx, step)}")
        return True
    if attempt <= retries:  # the loop's budget, spent, prevents the retry
        check_budget(ctx, step, message)
        return True
    reason = "LoopIterationFailed" if step.loop is not None else REASON_STEP_FAILED
    budget = f"no retries left ({retries} allowed)" if retries else "no retries configured"
    end_step(ctx, step, "Failed", reason, f"{message}; {budget}")
    return True


def record_success(
    ctx: PlanContext,
    step: StepView,
    job: ObservedJob,
    envelope: ControlEnvelope,
    *,
    finished_at: datetime | None = None,
    duration: float | None = None,
) -> None:
    """A succeeded attempt: its control file decides the loop. `finished_at` and `duration` when
    its Job does not say them (a warm iteration's end is its pod's word, planner/warm.py)."""
    st = step.st
    control = envelope.control if envelope.status == "found" else None
    loop = step.loop
    record_reported(ctx, step, envelope)
    record_checkpoint(step, envelope)
    retries = step_retries(step.spec, ctx.refs)
    tries = f" on attempt {st.attempt}/{retries + 1}" if st.attempt > 1 else ""
    if loop is None:
        st.control = control
        account_usage(ctx, step, control)
        iteration_finished(ctx, step, "Succeeded", job, duration)
        ctx.emit(
            "Normal",
            "IterationSucceeded",
            f"step {step.label}: succeeded{tries} (Job {job.name})",
            step.where,
            fold=job.warm,
        )
        end_step(ctx, step, "Succeeded", None, f"succeeded{tries}")
        return
    record = step.record()
    if record is not None:
        record.phase = "Succeeded"
        record.finished_at = _not_before_start(finished_at or job.finished_at or ctx.now, record)
        record.message = f"succeeded{tries}" if tries else None
    loop.completed_iterations = min(max(loop.completed_iterations, step.iteration), loop.max_iterations)
    loop.last_control = control
    st.message = f"iteration {step.iteration}/{loop.max_iterations} succeeded{tries}"
    iteration_finished(ctx, step, "Succeeded", job, duration)
    # An iteration that ran in a warm pod is routine: its Event is held with the warm hand-over's
    # (docs/operator.md#events); a cold loop's is posted as always.
    ctx.emit(
        "Normal",
        "IterationSucceeded",
        f"step {step.label}: {st.message} (Job {job.name})",
        step.where,
        fold=job.warm,
    )
    if not account_usage(ctx, step, control) or not collect_output(ctx, step, control):
        return
    if not record_progress(ctx, step, control):
        return
    decide_next(ctx, step, envelope)
    check_budget(ctx, step)
    check_stall(ctx, step)


def cancel_immediately(ctx: PlanContext, step: StepView, name: str) -> bool:
    """An immediate cancel while Job `name` of the step runs: it is deleted with the cancel's short
    grace and the step ends Cancelled (True: the step moved on)."""
    ctx.delete_reasons[name] = "the run was cancelled (Immediate)"
    ctx.delete_graces[name] = cancel_grace_seconds(step.spec, ctx.config)
    end_step(ctx, step, "Cancelled", None, f"cancelled (Immediate) during {step.what()}; Job {name} deleted")
    return True


def reporting_pod(pods: Sequence[ObservedPod], now: datetime) -> ObservedPod | None:
    """Of a Job's pods (or one candidate's), the one whose report counts: the one whose `main` ran
    and succeeded, else the newest to end. A duplicate pod of the Job (which waited without running
    main, docs/concepts.md#exactly-once) may report too, and may end later."""
    reported = [p for p in pods if p.reporter_message is not None]
    return max(
        reported,
        key=lambda p: (p.main_exit_code == 0, p.finished_at is not None, p.finished_at or now, p.name),
        default=None,
    )


def pods_still_stopping(ctx: PlanContext, job: ObservedJob) -> bool:
    """A decided Job's pods are not all stopped yet, and it decided less than
    `RESULT_MAX_WAIT_SECONDS` ago: wait for their reports rather than read them now."""
    since = ctx.seconds_since(job.finished_at) if job.finished_at else RESULT_MAX_WAIT_SECONDS
    return any(not p.stopped for p in ctx.observed.pods_of(job.name)) and since < RESULT_MAX_WAIT_SECONDS
