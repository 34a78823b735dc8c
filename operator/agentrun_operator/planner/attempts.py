"""Attempts: start (or adopt) an attempt's Job, observe it, read its result, and record a success,
a failure (retry after the backoff while the budget lasts) or a timeout."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from agentrun_operator import naming
from agentrun_operator.api import IterationRecord, JobRef
from agentrun_operator.control.envelope import ControlEnvelope, decode_envelope
from agentrun_operator.jobs.builder import build_iteration_objects
from agentrun_operator.planner import candidates
from agentrun_operator.planner.actions import CreateJob
from agentrun_operator.planner.admission import problems_message
from agentrun_operator.planner.attempt_pod import label_iteration, planned_attempt, pod_control_path
from agentrun_operator.planner.attempt_results import (
    MAX_CAUSE_TAIL_BYTES,
    RESULT_GRACE_SECONDS,
    RESULT_MAX_WAIT_SECONDS,
    cancel_immediately,
    iteration_finished,
    one_line_tail,
    pods_still_stopping,
    record_failure,
    record_success,
    refused_job_message,
    reporting_pod,
)
from agentrun_operator.planner.checkpoints import REASON_CHECKPOINT_FAILED
from agentrun_operator.planner.context import (
    RESULT_REQUEUE_SECONDS,
    PlanContext,
    clip,
)
from agentrun_operator.planner.facts import NextIterationRequested
from agentrun_operator.planner.feedback import (
    REASON_DEADLINE,
    REASON_DELETED,
    REASON_REPORTER_BLIND,
    REASON_REPORTER_LOST,
    REASON_VANISHED,
)
from agentrun_operator.planner.gating import gate_clear, succeeded_by_pod
from agentrun_operator.planner.observed import ObservedJob, ObservedPod, Refusal
from agentrun_operator.planner.state import StepView, end_step
from agentrun_operator.planner.validate import REASON_INVALID_SPEC
from agentrun_operator.planner.waiting import note_wait, running_message, waited_for
from agentrun_operator.planner.warm import (
    WarmStart,
    mark,
    marked_warm,
    observe_warm_attempt,
    release_warm_jobs,
    start_command,
    warm_start,
)
from agentrun_operator.resolution import (
    step_retries,
    step_timeout_seconds,
)

JOB_VISIBILITY_GRACE_SECONDS: Final = 10.0
"""A Job the planner asked for but has never observed is waited for this long, then requested again."""

DEADLINE_GRACE_SECONDS: Final = 30.0
"""A Job still undecided this long past activeDeadlineSeconds is deleted by the planner itself: the
fallback for a Job controller that never decides (it sets `FailureTarget` at the deadline itself)."""


GATE_REQUEUE_SECONDS: Final = 2.0

REASON_JOB_REFUSED: Final = "JobRefused"


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
        warm = warm_start(ctx, step, iteration, attempt)
        if warm is not None:
            _start_warm(ctx, step, iteration, warm)
            return False
        release_warm_jobs(ctx)
        if not gate_clear(ctx, name):
            ctx.requeue(GATE_REQUEUE_SECONDS)
            return False
        if ctx.ref_problems:
            end_step(ctx, step, "Failed", REASON_INVALID_SPEC, problems_message(list(ctx.ref_problems)))
            return False
        manifest, companions = build_iteration_objects(
            ctx.run, planned_attempt(ctx, step, iteration, attempt), ctx.refs, ctx.config
        )
        ctx.writes.append(CreateJob(manifest, tuple(companions)))
        _next_iteration_requested(ctx, step, iteration, attempt, name)
    _mark_attempt_started(ctx, step, iteration, attempt, name, existing)
    return existing is not None


def _start_warm(ctx: PlanContext, step: StepView, iteration: int, start: WarmStart) -> None:
    """The attempt runs in a live warm pod (planner/warm.py): the status says so (`pod` and `warm` of
    its iteration record, or of the step in a loop body), and the pod is told once that status is
    committed."""
    heard = ctx.observed.warm.get(start.pod.name)
    ended = heard.result.finished_at if heard is not None and heard.result is not None else None
    if ended is not None and step.loop is not None:
        due = step.loop.next_iteration_at
        ctx.facts.append(
            NextIterationRequested(step.path, iteration, start.job.name, max(ended, due or ended))
        )
    _enter_attempt(ctx, step, iteration, 1, start.job.name, start.job)
    mark(step, start.pod.name, True)
    retries = step_retries(step.spec, ctx.refs)
    where = f"iteration {iteration}/{step.max_iterations} " if step.loop is not None else ""
    step.st.message = (
        running_message(where, 1, retries + 1, start.job.name) + f" in warm pod {start.pod.name}"
    )
    ctx.emit(
        "Normal",
        "IterationStarted",
        f"step {step.label}: {where}attempt 1/{retries + 1} started in warm pod {start.pod.name} "
        f"(Job {start.job.name})",
        step.where,
        fold=True,  # a warm hand-over: routine, held by the Event writer (docs/operator.md#events)
    )
    start_command(ctx, step, start)


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
    st.warm = st.pod = None  # a warm start marks them (planner/warm.py)
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
            record.candidates = None  # a retry runs every candidate again
            record.warm = record.pod = None  # and a warm loop's retry is a new pod
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
    iteration_finished(ctx, step, "Failed")
    ctx.emit("Warning", REASON_JOB_REFUSED, f"step {step.label}: {message}", step.where)
    end_step(ctx, step, "Failed", REASON_JOB_REFUSED, message)


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
    if candidates.promoting(step):
        return candidates.observe_promotion(ctx, step)
    name = st.job_ref.name
    job = ctx.observed.job(name)
    if job is not None and st.job_ref.uid is not None and job.uid != st.job_ref.uid:
        ctx.delete_reasons[name] = "a different Job took the name of a recorded attempt"
        job = None  # the Job we recorded is gone; this one is an impostor
    if ctx.stopping == "Immediate" and (job is None or not job.finished):
        return cancel_immediately(ctx, step, name)
    if job is None:
        return _handle_missing_job(ctx, step, name)
    if st.job_ref.uid is None:
        st.job_ref.uid = job.uid
    if job.warm:
        return _observe_warm(ctx, step, job)
    if candidates.candidate_count(step) and job.finished:
        if job.outcome == "DeadlineExceeded":  # every candidate that reported counts its usage
            return candidates.candidates_timed_out(ctx, step, job, _failure_cause(ctx, step, job))
        return candidates.observe_candidates(ctx, step, job)
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
        record_success(ctx, step, job, envelope)
        return True
    return record_failure(ctx, step, job, _failure_cause(ctx, step, job))


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
            planned = planned_attempt(ctx, step, step.iteration, st.attempt)
            manifest, companions = build_iteration_objects(ctx.run, planned, ctx.refs, ctx.config)
            ctx.writes.append(CreateJob(manifest, tuple(companions)))
        ctx.requeue(JOB_VISIBILITY_GRACE_SECONDS)
        return False
    return record_failure(
        ctx, step, None, f"Job {name} vanished before its result was recorded", REASON_VANISHED
    )


def _handle_active_job(ctx: PlanContext, step: StepView, job: ObservedJob) -> bool:
    if job.deleting:
        return record_failure(
            ctx, step, job, f"Job {job.name} was deleted before it finished", REASON_DELETED
        )
    if _pod_cannot_run_main(ctx, step, job):
        return True
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
            return record_failure(
                ctx,
                step,
                None,
                f"timed out after {timeout}s (the Job outlived its deadline and was deleted){tail}",
                REASON_DEADLINE,
            )
        ctx.requeue((kill_at - ctx.now).total_seconds())
    return False


def _pod_cannot_run_main(ctx: PlanContext, step: StepView, job: ObservedJob) -> bool:
    """A pod of the Job can never run `main` (its reporter refused, or ended before it was ready):
    the attempt fails now, not at the timeout (True)."""
    refused = next((p for p in ctx.observed.pods_of(job.name) if p.reporter_refusal), None)
    if refused is not None and refused.reporter_refusal:
        # The pod can never report (docs/design.md#reporter-first): fail now, not at the timeout.
        cause = f"pod {refused.name} cannot run main: {clip(refused.reporter_refusal, 600)}"
        if refused.reporter_refusal_reason == REASON_CHECKPOINT_FAILED:
            ctx.delete_reasons[job.name] = "its pod's checkpoint failed before main; the attempt failed"
            ctx.emit("Warning", REASON_CHECKPOINT_FAILED, f"step {step.label}: {cause}", step.where)
            record_failure(ctx, step, None, cause, REASON_CHECKPOINT_FAILED)
            return True
        ctx.delete_reasons[job.name] = "its pod's reporter cannot see main; the attempt failed"
        record_failure(ctx, step, None, cause, REASON_REPORTER_BLIND)
        return True
    pods = [p for p in ctx.observed.pods_of(job.name) if not p.deleting]
    if pods and all(p.reporter_lost for p in pods):
        # No pod of the Job can ever start main (a duplicate held at its gate while another pod
        # runs is not this): fail now, not at the timeout, or never when there is none.
        lost = pods[0]
        ctx.delete_reasons[job.name] = "its pod's reporter ended before main started; the attempt failed"
        cause = f"pod {lost.name} never started main: {clip(lost.reporter_lost or '', 600)}"
        record_failure(ctx, step, None, cause, REASON_REPORTER_LOST)
        return True
    return False


def _observe_warm(ctx: PlanContext, step: StepView, job: ObservedJob) -> bool:
    """The attempt runs in a warm loop's Job (planner/warm.py); its pod's start is watched as any
    attempt's (what it waits for, a reporter that cannot run `main`)."""
    if _pod_cannot_run_main(ctx, step, job):
        return True
    if not marked_warm(step):  # the pod's first iteration: the pod is starting
        where = f"iteration {step.iteration}/{step.max_iterations} " if step.loop is not None else ""
        base = running_message(where, step.st.attempt, step_retries(step.spec, ctx.refs) + 1, job.name)
        note_wait(ctx, step, base, ctx.observed.pods_of(job.name))
    return observe_warm_attempt(ctx, step, job)


def _read_envelope(ctx: PlanContext, step: StepView, job: ObservedJob) -> ControlEnvelope | None:
    """The control envelope of a succeeded attempt, or None while its pod has not reported yet."""
    path = pod_control_path(step)
    pods = ctx.observed.pods_of(job.name)
    if pods_still_stopping(ctx, job):
        return None
    newest = reporting_pod(pods, ctx.now)
    if newest is not None:
        return decode_envelope(newest.reporter_message, path)
    since_finished = ctx.seconds_since(job.finished_at) if job.finished_at else RESULT_MAX_WAIT_SECONDS
    if not pods and since_finished < RESULT_GRACE_SECONDS:
        return None
    envelope = decode_envelope(None, path)
    if not pods:
        return envelope.replace(reason=f"the pod of Job {job.name} was gone before its report could be read")
    return envelope


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
