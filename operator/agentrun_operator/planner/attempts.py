"""Attempts: start (or adopt) an attempt's Job, observe it, read its result, and record a success,
a failure (retry after the backoff while the budget lasts) or a timeout."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Final

from agentrun_operator import naming
from agentrun_operator.api import IterationRecord, JobRef, format_timestamp
from agentrun_operator.control.envelope import ControlEnvelope, decode_envelope
from agentrun_operator.jobs.builder import PlannedAttempt, build_iteration_objects
from agentrun_operator.planner.actions import CreateJob
from agentrun_operator.planner.admission import problems_message
from agentrun_operator.planner.budgets import account_usage, budget_reached, check_budget
from agentrun_operator.planner.checkpoints import REASON_CHECKPOINT_FAILED, checkpoint_plan, record_checkpoint
from agentrun_operator.planner.context import (
    REASON_STEP_FAILED,
    RESULT_REQUEUE_SECONDS,
    PlanContext,
    clip,
)
from agentrun_operator.planner.facts import IterationFinished, IterationResult, NextIterationRequested
from agentrun_operator.planner.feedback import (
    REASON_DEADLINE,
    REASON_DELETED,
    REASON_REPORTER_BLIND,
    REASON_REPORTER_LOST,
    REASON_VANISHED,
    failure_of,
    previous,
    tail,
)
from agentrun_operator.planner.gating import gate_clear, succeeded_by_pod
from agentrun_operator.planner.loops import collected_outputs, decide_next, with_inherited_parameters
from agentrun_operator.planner.observed import ObservedJob, ObservedPod, Refusal
from agentrun_operator.planner.outputs import collect_output, declared_outputs
from agentrun_operator.planner.placement import preferred_node
from agentrun_operator.planner.reported import record_reported
from agentrun_operator.planner.run import stop_message
from agentrun_operator.planner.stall import check_stall, record_progress
from agentrun_operator.planner.state import StepView, end_step
from agentrun_operator.planner.validate import REASON_INVALID_SPEC
from agentrun_operator.planner.waiting import note_wait, running_message, waited_for
from agentrun_operator.resolution import (
    cancel_grace_seconds,
    control_path,
    step_retries,
    step_timeout_seconds,
)

JOB_VISIBILITY_GRACE_SECONDS: Final = 10.0
"""A Job the planner asked for but has never observed is waited for this long, then requested again."""

DEADLINE_GRACE_SECONDS: Final = 30.0
"""A Job still undecided this long past activeDeadlineSeconds is deleted by the planner itself: the
fallback for a Job controller that never decides (it sets `FailureTarget` at the deadline itself)."""

RESULT_GRACE_SECONDS: Final = 10.0
"""How long a succeeded Job's pod may be missing from the observation before its result is read as lost."""

RESULT_MAX_WAIT_SECONDS: Final = 60.0
"""How long a succeeded Job's pod may stay non-terminal before the planner stops waiting for it."""

GATE_REQUEUE_SECONDS: Final = 2.0

REASON_JOB_REFUSED: Final = "JobRefused"


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


def _loop_env(step: StepView, iteration: int) -> tuple[StepView, int] | None:
    """The loop whose iteration the pod is told about: the step's own, else the nearest looping
    ancestor's (a child of a loop body runs in the body's iteration)."""
    view: StepView | None = step
    while view is not None:
        if view.loop is not None:
            return view, iteration if view is step else view.iteration
        view = view.parent
    return None


def _planned_attempt(ctx: PlanContext, step: StepView, iteration: int, attempt: int) -> PlannedAttempt:
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


def _job_name(ctx: PlanContext, step: StepView, iteration: int, attempt: int) -> str:
    return naming.job_name(ctx.name, step.index, iteration, attempt, step.ancestors)


def start_attempt(
    ctx: PlanContext, step: StepView, iteration: int, attempt: int, not_before: datetime | None = None
) -> bool:
    """Start (or adopt) an attempt. True when an existing Job was adopted or the API server refused
    the Job (the step failed), so planning continues; False when a Job was requested or the start
    must wait (backoff, other pods still alive)."""
    name = _job_name(ctx, step, iteration, attempt)
    existing = ctx.observed.job(name)
    refusal = ctx.observed.refusal("Job", name)
    if existing is None and refusal is not None:
        _refuse_attempt(ctx, step, iteration, attempt, name, refusal)
        return True
    if existing is None:
        if not_before is not None and ctx.now < not_before:
            ctx.requeue((not_before - ctx.now).total_seconds())
            return False
        if not gate_clear(ctx, name):
            ctx.requeue(GATE_REQUEUE_SECONDS)
            return False
        if ctx.ref_problems:
            end_step(ctx, step, "Failed", REASON_INVALID_SPEC, problems_message(list(ctx.ref_problems)))
            return False
        manifest, companions = build_iteration_objects(
            ctx.run, _planned_attempt(ctx, step, iteration, attempt), ctx.refs, ctx.config
        )
        ctx.writes.append(CreateJob(manifest, tuple(companions)))
        _next_iteration_requested(ctx, step, iteration, attempt, name)
    _mark_attempt_started(ctx, step, iteration, attempt, name, existing)
    return existing is not None


def _next_iteration_requested(
    ctx: PlanContext, step: StepView, iteration: int, attempt: int, name: str
) -> None:
    """The turnaround fact: the Job of the iteration after a succeeded one is requested now.

    It starts where the previous iteration's pod ended (its main container's finish time, as the
    kubelet reported it); a pod already gone gives no fact. Retries are not turnarounds (their wait
    is the backoff), nor is the first iteration.
    """
    previous = step.st.job_ref
    if step.loop is None or attempt != 1 or iteration < 2 or previous is None:
        return
    ends = [
        p.finished_at
        for p in ctx.observed.pods_of(previous.name)
        if (p.phase == "Succeeded" or p.reported) and p.finished_at is not None
    ]
    if ends:
        due = step.loop.next_iteration_at  # loop.intervalSeconds: the wait asked for is no turnaround
        since = max(ends) if due is None else max(*ends, due)
        ctx.facts.append(NextIterationRequested(step.path, iteration, name, since))


def _enter_attempt(
    ctx: PlanContext, step: StepView, iteration: int, attempt: int, name: str, existing: ObservedJob | None
) -> None:
    """The step (and its iteration record, for a loop) now stands at this attempt of its Job."""
    st = step.st
    st.phase = "Running"
    st.attempt = attempt
    st.job_ref = JobRef(name=name, uid=existing.uid if existing is not None else None)
    if attempt == 1:
        st.next_retry_at = None
        st.last_failure = None
    loop = step.loop
    if loop is not None:
        loop.current_iteration = iteration
        loop.next_iteration_at = None
        record = step.record()
        if attempt == 1 or record is None:
            loop.iterations.append(
                IterationRecord(
                    index=iteration,
                    phase="Running",
                    attempts=attempt,
                    started_at=ctx.now,
                    job_ref=JobRef(name=name),
                )
            )
        else:
            record.phase = "Running"
            record.attempts = attempt
            record.last_attempt_started_at = ctx.now
            record.job_ref = JobRef(name=name)


def _mark_attempt_started(
    ctx: PlanContext, step: StepView, iteration: int, attempt: int, name: str, existing: ObservedJob | None
) -> None:
    _enter_attempt(ctx, step, iteration, attempt, name, existing)
    loop = step.loop
    st = step.st
    retries = step_retries(step.spec, ctx.refs)
    where = f"iteration {iteration}/{step.max_iterations} " if loop is not None else ""
    st.message = running_message(where, attempt, retries + 1, name)
    ctx.emit(
        "Normal",
        "IterationStarted",
        f"step {step.label}: {where}attempt {attempt}/{retries + 1} started (Job {name})",
        step.where,
    )


def _refuse_attempt(
    ctx: PlanContext, step: StepView, iteration: int, attempt: int, name: str, refusal: Refusal
) -> None:
    """The API server refused the attempt's Job for good: the same manifest would be refused again,
    so the step fails now whatever retries are left (no Job ran; a retry would only be refused)."""
    if step.st.job_ref is None or step.st.job_ref.name != name:
        _enter_attempt(ctx, step, iteration, attempt, name, None)
    cause = refused_job_message(refusal)
    message = clip(f"{step.what()} failed: {cause}")
    record = step.record()
    if record is not None:
        record.phase = "Failed"
        record.finished_at = ctx.now
        record.message = message
    _iteration_finished(ctx, step, "Failed")
    ctx.emit("Warning", REASON_JOB_REFUSED, f"step {step.label}: {message}", step.where)
    end_step(ctx, step, "Failed", REASON_JOB_REFUSED, message)


def refused_job_message(refusal: Refusal) -> str:
    """What a user reads when the API server refused an attempt's Job: its words (the step's stop
    adds what to do, planner/remedies.py)."""
    return (
        f"the API server refused to create Job {refusal.name} (HTTP {refusal.code}): "
        f"{refusal.message.strip()}; a refused Job is not retried"
    )


def _attempt_requested_at(step: StepView) -> datetime | None:
    """When the current attempt's Job was asked for (step start, iteration start or retry due time)."""
    record = step.record()
    moments = [
        m for m in (step.st.started_at, record.started_at if record else None, step.st.next_retry_at) if m
    ]
    return max(moments) if moments else None


def observe_attempt(ctx: PlanContext, step: StepView) -> bool:
    """Read the running attempt's Job. True when its result was recorded (the step moved on)."""
    st = step.st
    assert st.job_ref is not None
    name = st.job_ref.name
    job = ctx.observed.job(name)
    if job is not None and st.job_ref.uid is not None and job.uid != st.job_ref.uid:
        ctx.delete_reasons[name] = "a different Job took the name of a recorded attempt"
        job = None  # the Job we recorded is gone; this one is an impostor
    if ctx.stopping == "Immediate" and (job is None or not job.finished):
        ctx.delete_reasons[name] = "the run was cancelled (Immediate)"
        ctx.delete_graces[name] = cancel_grace_seconds(step.spec, ctx.config)
        end_step(
            ctx, step, "Cancelled", None, f"cancelled (Immediate) during {step.what()}; Job {name} deleted"
        )
        return True
    if job is None:
        return _handle_missing_job(ctx, step, name)
    if st.job_ref.uid is None:
        st.job_ref.uid = job.uid
    if not job.finished:
        succeeded = succeeded_by_pod(ctx, job)
        if succeeded is None:
            return _handle_active_job(ctx, step, job)
        job = succeeded
    if job.outcome == "Succeeded":
        envelope = _read_envelope(ctx, step, job)
        if envelope is None:
            ctx.requeue(RESULT_REQUEUE_SECONDS)
            return False
        _record_success(ctx, step, job, envelope)
        return True
    return _record_failure(ctx, step, job, _failure_cause(ctx, step, job))


def _handle_missing_job(ctx: PlanContext, step: StepView, name: str) -> bool:
    """Not observed: not visible yet (or its creation was lost: ask again), or vanished (a failed attempt)."""
    st = step.st
    assert st.job_ref is not None
    if st.job_ref.uid is None:
        waited = ctx.seconds_since(_attempt_requested_at(step))
        if waited < JOB_VISIBILITY_GRACE_SECONDS:
            ctx.requeue(JOB_VISIBILITY_GRACE_SECONDS - waited)
            return False
        refusal = ctx.observed.refusal("Job", name)
        if refusal is not None:
            _refuse_attempt(ctx, step, step.iteration, st.attempt, name, refusal)
            return True
        if gate_clear(ctx, name) and not ctx.ref_problems:
            planned = _planned_attempt(ctx, step, step.iteration, st.attempt)
            manifest, companions = build_iteration_objects(ctx.run, planned, ctx.refs, ctx.config)
            ctx.writes.append(CreateJob(manifest, tuple(companions)))
        ctx.requeue(JOB_VISIBILITY_GRACE_SECONDS)
        return False
    return _record_failure(
        ctx, step, None, f"Job {name} vanished before its result was recorded", REASON_VANISHED
    )


def _handle_active_job(ctx: PlanContext, step: StepView, job: ObservedJob) -> bool:
    if job.deleting:
        return _record_failure(
            ctx, step, job, f"Job {job.name} was deleted before it finished", REASON_DELETED
        )
    refused = next((p for p in ctx.observed.pods_of(job.name) if p.reporter_refusal), None)
    if refused is not None and refused.reporter_refusal:
        # The pod can never report (docs/design.md#reporter-first): fail now, not at the timeout.
        cause = f"pod {refused.name} cannot run main: {clip(refused.reporter_refusal, 600)}"
        if refused.reporter_refusal_reason == REASON_CHECKPOINT_FAILED:
            ctx.delete_reasons[job.name] = "its pod's checkpoint failed before main; the attempt failed"
            ctx.emit("Warning", REASON_CHECKPOINT_FAILED, f"step {step.label}: {cause}", step.where)
            return _record_failure(ctx, step, None, cause, REASON_CHECKPOINT_FAILED)
        ctx.delete_reasons[job.name] = "its pod's reporter cannot see main; the attempt failed"
        return _record_failure(ctx, step, None, cause, REASON_REPORTER_BLIND)
    pods = [p for p in ctx.observed.pods_of(job.name) if not p.deleting]
    if pods and all(p.reporter_lost for p in pods):
        # No pod of the Job can ever start main (a duplicate held at its gate while another pod
        # runs is not this): fail now, not at the timeout, or never when there is none.
        lost = pods[0]
        ctx.delete_reasons[job.name] = "its pod's reporter ended before main started; the attempt failed"
        cause = f"pod {lost.name} never started main: {clip(lost.reporter_lost or '', 600)}"
        return _record_failure(ctx, step, None, cause, REASON_REPORTER_LOST)
    where = f"iteration {step.iteration}/{step.max_iterations} " if step.loop is not None else ""
    base = running_message(where, step.st.attempt, step_retries(step.spec, ctx.refs) + 1, job.name)
    note_wait(ctx, step, base, ctx.observed.pods_of(job.name))
    timeout = step_timeout_seconds(step.spec, ctx.refs)
    if timeout > 0:
        start = job.started_at or _attempt_requested_at(step) or ctx.now
        kill_at = start + timedelta(seconds=timeout + DEADLINE_GRACE_SECONDS)
        if ctx.now >= kill_at:
            ctx.delete_reasons[job.name] = "still active past its activeDeadlineSeconds"
            waited = waited_for(step.st.message)
            tail = f"; its pod never started: {waited}" if waited else ""
            return _record_failure(
                ctx,
                step,
                None,
                f"timed out after {timeout}s (the Job outlived its deadline and was deleted){tail}",
                REASON_DEADLINE,
            )
        ctx.requeue((kill_at - ctx.now).total_seconds())
    return False


def _read_envelope(ctx: PlanContext, step: StepView, job: ObservedJob) -> ControlEnvelope | None:
    """The control envelope of a succeeded attempt, or None while its pod has not reported yet."""
    path = pod_control_path(step)
    pods = ctx.observed.pods_of(job.name)
    since_finished = ctx.seconds_since(job.finished_at) if job.finished_at else RESULT_MAX_WAIT_SECONDS
    if any(not p.stopped for p in pods) and since_finished < RESULT_MAX_WAIT_SECONDS:
        return None
    reported = [p for p in pods if p.reporter_message is not None]
    if reported:
        # The pod whose main container ran and succeeded: a duplicate pod of the Job (which waited
        # without running main, docs/concepts.md#exactly-once) may report too, and may end later.
        newest = max(
            reported,
            key=lambda p: (
                p.main_exit_code == 0,
                p.finished_at is not None,
                p.finished_at or ctx.now,
                p.name,
            ),
        )
        return decode_envelope(newest.reporter_message, path)
    if not pods and since_finished < RESULT_GRACE_SECONDS:
        return None
    envelope = decode_envelope(None, path)
    if not pods:
        return envelope.replace(reason=f"the pod of Job {job.name} was gone before its report could be read")
    return envelope


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


def _failure_cause(ctx: PlanContext, step: StepView, job: ObservedJob) -> str:
    if job.outcome == "DeadlineExceeded":
        timeout = step_timeout_seconds(step.spec, ctx.refs)
        waited = waited_for(step.st.message)
        tail = f"; its pod never started: {waited}" if waited else ""
        return f"timed out after {timeout}s (activeDeadlineSeconds){tail}"
    pods = ctx.observed.pods_of(job.name)
    for pod in pods:
        if pod.main_exit_code == 0:
            return _lost_pod_cause(pod, job)
        if pod.main_exit_code is not None or pod.main_reason:
            cause = f"main container exited with code {pod.main_exit_code}"
            if pod.main_reason:
                cause += f" ({pod.main_reason})"
            if pod.main_message and pod.main_message.strip():
                cause += f": {one_line_tail(pod.main_message, MAX_CAUSE_TAIL_BYTES)}"
            return f"{cause}; whole log: {logs_command(ctx, step, job)}"
    for pod in pods:
        if pod.phase == "Failed" and pod.reason:
            return f"pod {pod.name} failed before its main container ended ({_pod_reason(pod)})"
    return job.message or f"Job {job.name} failed"


MAX_CAUSE_TAIL_BYTES = 400
"""How much of main's termination message (with FallbackToLogsOnError: its log's tail) a failed
attempt's message carries; `agentrun logs` shows the rest."""


def one_line_tail(text: str, limit: int) -> str:
    """The last `limit` bytes of `text` on one line (its lines joined with ` | `): a status message is
    shown in one table cell."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return tail(" | ".join(lines), limit)


def label_iteration(step: StepView) -> int:
    """The iteration a user names the step's attempt by (its Jobs' `iteration` label and
    AGENTRUN_ITERATION): its own loop's, else the nearest looping ancestor's, else 1."""
    looping = _loop_env(step, step.iteration)
    return looping[1] if looping is not None else step.iteration


def logs_command(ctx: PlanContext, step: StepView, job: ObservedJob) -> str:
    """The command that prints the whole log of `job`'s attempt (docs/operations.md#logs)."""
    namespace = f" -n {ctx.namespace}" if ctx.namespace else ""
    return (
        f"agentrun logs {ctx.name}{namespace} --step {step.path} "
        f"--iteration {label_iteration(step)} --attempt {job.attempt}"
    )


def _lost_pod_cause(pod: ObservedPod, job: ObservedJob) -> str:
    """A failed attempt whose main container exited 0: the work ended well, the pod did not (the
    reporter never fails a pod), so the node lost it or it was killed -- not an exit code to fix."""
    why = _pod_reason(pod) if pod.reason else clip((job.message or "no reason recorded").strip(), 300)
    return (
        f"pod {pod.name} failed although its main container exited 0: the node lost the pod or it was "
        f"killed before the attempt could complete ({why})"
    )


def _pod_reason(pod: ObservedPod) -> str:
    return f"{pod.reason}: {clip(pod.message.strip(), 300)}" if pod.message else str(pod.reason)


def _iteration_finished(
    ctx: PlanContext, step: StepView, result: IterationResult, job: ObservedJob | None = None
) -> None:
    duration = attempt_duration(job, ctx.observed.pods_of(job.name), ctx.now) if job is not None else None
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


def _record_failure(
    ctx: PlanContext, step: StepView, job: ObservedJob | None, cause: str, reason: str | None = None
) -> bool:
    """A failed attempt: its usage counts; retry after the backoff while the retries and the budgets
    last, else the iteration fails. Why it failed is kept for the retry's AGENTRUN_PREVIOUS
    (`feedback`)."""
    st = step.st
    attempt = st.attempt
    st.last_failure = failure_of(ctx, attempt, job, cause, reason)
    retries = step_retries(step.spec, ctx.refs)
    finished = job.finished_at if job is not None and job.finished_at is not None else ctx.now
    message = clip(f"{step.what()} failed: {cause}")
    record = step.record()
    stopping = ctx.stopping  # a stop requested before this result (the usage may spend the goal's)
    whose = f"{clip(message, 300)}; its control file"
    failed_envelope = _failed_attempt_envelope(ctx, step, job)
    record_checkpoint(step, failed_envelope)
    if not account_usage(ctx, step, _control_of(failed_envelope), whose):
        if record is not None:  # the loop's onInvalid ended the step
            record.phase = "Failed"
            record.finished_at = _not_before_start(finished, record)
            record.message = message
        _iteration_finished(ctx, step, "Failed", job)
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
        _iteration_finished(ctx, step, "Retrying", job)
        ctx.emit("Warning", "IterationRetrying", f"step {step.label}: {st.message}", step.where)
        return True
    if record is not None:
        record.phase = "Failed"
        record.finished_at = _not_before_start(finished, record)
        record.message = message
    _iteration_finished(ctx, step, "Failed", job)
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


def _record_success(ctx: PlanContext, step: StepView, job: ObservedJob, envelope: ControlEnvelope) -> None:
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
        _iteration_finished(ctx, step, "Succeeded", job)
        ctx.emit(
            "Normal",
            "IterationSucceeded",
            f"step {step.label}: succeeded{tries} (Job {job.name})",
            step.where,
        )
        end_step(ctx, step, "Succeeded", None, f"succeeded{tries}")
        return
    record = step.record()
    if record is not None:
        record.phase = "Succeeded"
        record.finished_at = _not_before_start(job.finished_at or ctx.now, record)
        record.message = f"succeeded{tries}" if tries else None
    loop.completed_iterations = min(max(loop.completed_iterations, step.iteration), loop.max_iterations)
    loop.last_control = control
    st.message = f"iteration {step.iteration}/{loop.max_iterations} succeeded{tries}"
    _iteration_finished(ctx, step, "Succeeded", job)
    ctx.emit("Normal", "IterationSucceeded", f"step {step.label}: {st.message} (Job {job.name})", step.where)
    if not account_usage(ctx, step, control) or not collect_output(ctx, step, control):
        return
    if not record_progress(ctx, step, control):
        return
    decide_next(ctx, step, envelope)
    check_budget(ctx, step)
    check_stall(ctx, step)
