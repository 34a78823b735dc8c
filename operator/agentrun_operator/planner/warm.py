"""Warm iterations (`loop.warm`, docs/concepts.md#warm-iterations): the next iteration of a loop
runs in the pod that ran the last one, told through its supervisor (docs/design.md#warm-channel).

Every rule here reads the status and what the shell last heard from the pod (`ObservedWarm`) and
asks for idempotent commands (`WarmCommand`), sent after the status that says why is committed:

- **start** the next iteration in the live pod when the last one succeeded there, the pod is idle
  and still holds that result, and the next iteration's own Job would be the same pod
  (`template_digest`); otherwise the next attempt is a new Job and pod, as without `warm`;
- **record** an iteration from its result (the channel, or the pod's termination message once it
  ended), as a cold iteration is recorded;
- **fail** the attempt when its pod ends or its `main` loop ends during it, when the supervisor does
  not answer for `WARM_SILENCE_SECONDS`, or at the step's timeout (the pod is deleted: the retry is a
  new pod);
- **acknowledge** a recorded result the pod still holds when no iteration follows at once, so its
  idle clock starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from agentrun_operator import naming
from agentrun_operator.api import JobRef, LoopWarm
from agentrun_operator.control.envelope import decode_envelope
from agentrun_operator.jobs.builder import build_iteration_objects
from agentrun_operator.jobs.warm_pod import iteration_env, iteration_id, job_iteration_id, template_digest
from agentrun_operator.planner.actions import CreateJob, WarmCommand
from agentrun_operator.planner.attempt_pod import label_iteration, planned_attempt, pod_control_path, warm_of
from agentrun_operator.planner.attempt_results import record_failure, record_success
from agentrun_operator.planner.context import TERMINAL_RUN_PHASES, PlanContext, clip
from agentrun_operator.planner.feedback import REASON_DEADLINE
from agentrun_operator.planner.gating import gate_clear
from agentrun_operator.planner.observed import ObservedJob, ObservedPod, ObservedWarm, WarmResult
from agentrun_operator.planner.state import StepState, StepView, state_of
from agentrun_operator.resolution import step_timeout_seconds

WARM_SILENCE_SECONDS: Final = 60.0
"""A running warm pod whose supervisor has not answered (or answered garbage) for this long fails its
attempt: its pod is deleted and the retry is a new pod."""
WARM_COLD_REQUEUE_SECONDS: Final = 1.0
WARM_STOP_SECONDS: Final = 30.0
"""How long after its run finished a warm pod told to end may take before its Job is deleted."""

REASON_WARM_POD_ENDED: Final = "WarmPodEnded"
REASON_WARM_UNANSWERED: Final = "WarmSupervisorUnanswered"


def warm_loop(step: StepView) -> LoopWarm | None:
    """`loop.warm` of the step's own loop or of the loop body around it, when on (a top-level loop:
    validation refuses it deeper)."""
    return warm_of(step)


def current_id(step: StepView) -> str:
    """The id of the step's current attempt in a warm pod: the loop's iteration (a loop body's child:
    the body's pass) and the attempt."""
    return iteration_id(label_iteration(step), step.st.attempt)


def marked_warm(step: StepView) -> bool:
    """The step's current attempt runs in a pod an earlier iteration started (the status says so:
    its iteration record's `warm`, or the step's own for a loop body's child)."""
    record = step.record() if step.loop is not None else None
    return bool(record.warm if record is not None else step.st.warm)


def mark(step: StepView, pod: str | None, warm: bool | None) -> None:
    """Record which pod runs the current attempt, and whether an earlier iteration started it."""
    record = step.record() if step.loop is not None else None
    if record is not None:
        record.pod, record.warm = pod, warm
    else:
        step.st.pod, step.st.warm = pod, warm


def live_warm_jobs(ctx: PlanContext) -> list[ObservedJob]:
    """The run's warm Jobs that may still run an iteration (not ended, not being deleted, and not
    let go by this plan)."""
    return [
        job
        for job in ctx.observed.jobs
        if job.warm and not job.finished and not job.deleting and job.name not in ctx.delete_reasons
    ]


def live_pod(ctx: PlanContext, job: ObservedJob) -> ObservedPod | None:
    """The pod of a warm Job that can still run an iteration: it has its IP, is not being deleted, and
    neither `main` (its shell loop) nor the supervisor has ended. A duplicate pod of the Job never
    gets past its gate (docs/concepts.md#exactly-once) and never answers: the one that answers wins."""
    alive = [
        p
        for p in ctx.observed.pods_of(job.name)
        if p.warm_ip
        and not p.deleting
        and not p.terminal
        and not p.containers_ended
        and p.main_exit_code is None
        and p.reporter_message is None
    ]
    return max(alive, key=lambda p: (_answers(ctx.observed.warm.get(p.name)), p.name), default=None)


def _answers(heard: ObservedWarm | None) -> bool:
    """The pod's supervisor has answered and its last request did not fail: a duplicate pod of the
    Job serves nothing, so it never does."""
    return heard is not None and heard.phase is not None and heard.error is None


@dataclass(frozen=True)
class IdlePod:
    """A warm Job's live pod, heard idle with a result: the only pod a `start`, `ack` or `stop` goes to."""

    pod: ObservedPod
    ip: str
    heard: ObservedWarm
    result: WarmResult


def idle_pod(ctx: PlanContext, job: ObservedJob) -> IdlePod | None:
    """The live pod of `job` (`live_pod`) with its IP, whose supervisor last said it runs nothing and
    holds a result (its last request may since have failed: `heard.error`)."""
    pod = live_pod(ctx, job)
    heard = ctx.observed.warm.get(pod.name) if pod is not None else None
    if pod is None or pod.warm_ip is None or heard is None or heard.result is None:
        return None
    if heard.phase != "idle" or heard.running is not None:
        return None
    return IdlePod(pod, pod.warm_ip, heard, heard.result)


@dataclass(frozen=True)
class WarmStart:
    """The next iteration may run in this pod of this Job, with this id and these variables."""

    job: ObservedJob
    pod: ObservedPod
    id: str
    env: tuple[tuple[str, str], ...]


def warm_start(ctx: PlanContext, step: StepView, iteration: int, attempt: int) -> WarmStart | None:
    """Whether iteration `iteration` (attempt `attempt`) of the step runs in a live warm pod of the
    run: only a first attempt (a retry is a new pod), in a pod that is idle, answers, and whose last
    iteration succeeded (its result recorded: the planner moved past it), and only when the
    iteration's own Job would have the same pod (`template_digest`, which also names the step)."""
    if warm_loop(step) is None or attempt != 1 or ctx.ref_problems:
        return None
    jobs = live_warm_jobs(ctx)
    if not jobs:
        return None
    manifest = _manifest(ctx, step, iteration, attempt)
    digest, wanted = template_digest(manifest), job_iteration_id(manifest)
    for job in jobs:
        idle = idle_pod(ctx, job) if job.warm_template == digest else None
        if idle is None or idle.heard.error is not None or idle.result.exit_code:
            continue
        if idle.result.id != wanted:
            return WarmStart(job, idle.pod, wanted, tuple(sorted(iteration_env(manifest).items())))
    return None


def release_warm_jobs(ctx: PlanContext) -> None:
    """A new Job is about to start (`warm_start` found no pod for the attempt): every live warm Job of
    the run goes, so the one-Job gate opens for the new one."""
    for job in live_warm_jobs(ctx):
        ctx.delete_reasons[job.name] = "the next attempt cannot run in its warm pod; it starts a new pod"


def _manifest(ctx: PlanContext, step: StepView, iteration: int, attempt: int) -> dict[str, object]:
    planned = planned_attempt(ctx, step, iteration, attempt)
    return build_iteration_objects(ctx.run, planned, ctx.refs, ctx.config)[0]


def start_command(ctx: PlanContext, step: StepView, start: WarmStart) -> None:
    """Ask the pod to run `start` (sent after the status recording it as running there)."""
    assert start.pod.warm_ip is not None
    command = WarmCommand("start", start.pod.name, start.pod.warm_ip, start.id, start.env, step.where)
    ctx.writes.append(command)


@dataclass(frozen=True)
class EndedResult:
    """What a warm pod's supervisor left in its termination message when it exited."""

    id: str | None
    exit_code: int | None
    running: str | None
    envelope: str


def ended_result(message: str | None) -> EndedResult | None:
    """The `warm` part of a warm pod's termination message (docs/design.md#warm-pod); None when there
    is none or it is not such a message."""
    if not message or '"warm"' not in message:
        return None
    try:
        doc = json.loads(message)
    except ValueError:
        return None
    warm = doc.get("warm") if isinstance(doc, dict) else None
    if not isinstance(warm, dict):
        return None
    found, code, running = warm.get("id"), warm.get("exitCode"), warm.get("running")
    return EndedResult(
        found if isinstance(found, str) else None,
        code if isinstance(code, int) and not isinstance(code, bool) else None,
        running if isinstance(running, str) else None,
        message,
    )


def observe_warm_attempt(ctx: PlanContext, step: StepView, job: ObservedJob) -> bool:
    """The running attempt of a warm loop, in Job `job`: True when its result was recorded (or the
    attempt failed, or moved to a new pod) and the step moved on."""
    st = step.st
    current = current_id(step)
    pod = live_pod(ctx, job)
    heard = ctx.observed.warm.get(pod.name) if pod is not None else None
    if heard is not None and heard.result is not None and heard.result.id == current:
        result = heard.result
        return _record(ctx, step, job, pod, result.exit_code, result.envelope, result.finished_at)
    ended = [(p, ended_result(p.reporter_message)) for p in ctx.observed.pods_of(job.name)]
    for ended_pod, said in ended:
        if said is not None and said.id == current and said.exit_code is not None:
            return _record(ctx, step, job, ended_pod, said.exit_code, said.envelope, ended_pod.finished_at)
    if pod is None and not job.finished and not job.deleting and _pod_to_come(ctx, job):
        return _timed_out(ctx, step, job)  # the pod is being made (no IP yet): the timeout counts
    if pod is None or job.finished or job.deleting:
        if marked_warm(step) and _never_started(ended, current):
            return _start_cold_instead(ctx, step)
        ctx.delete_reasons[job.name] = "its warm pod ended during an iteration; the retry starts a new pod"
        return record_failure(ctx, step, None, _ended_cause(ctx, step, job), REASON_WARM_POD_ENDED)
    if _timed_out(ctx, step, job):
        return True
    if heard is not None and heard.error is not None:
        silent = ctx.seconds_since(heard.error_since)
        if silent >= WARM_SILENCE_SECONDS:
            ctx.delete_reasons[job.name] = "its warm pod's supervisor does not answer; the attempt failed"
            cause = (
                f"the supervisor of warm pod {pod.name} did not answer for {int(silent)}s: "
                f"{clip(heard.error, 400)}"
            )
            return record_failure(ctx, step, None, cause, REASON_WARM_UNANSWERED)
        ctx.requeue(WARM_SILENCE_SECONDS - silent)
    if marked_warm(step) and _start_pending(heard, current) and pod.warm_ip is not None:
        env = tuple(sorted(iteration_env(_manifest(ctx, step, step.iteration, st.attempt)).items()))
        ctx.writes.append(WarmCommand("start", pod.name, pod.warm_ip, current, env, step.where))
    return False


def _pod_to_come(ctx: PlanContext, job: ObservedJob) -> bool:
    """The Job's pod may still become a live warm pod: none observed yet (the Job controller makes
    it), or one that has not got its IP or started yet and has not ended."""
    pods = [p for p in ctx.observed.pods_of(job.name) if not p.deleting]
    return not pods or any(
        not p.terminal and not p.containers_ended and p.main_exit_code is None and p.reporter_message is None
        for p in pods
    )


def _start_pending(heard: ObservedWarm | None, current: str) -> bool:
    """The pod is idle and has neither run nor finished `current`: its start was not sent, or lost."""
    if heard is None or heard.phase != "idle" or heard.error is not None:
        return False
    return heard.running != current and (heard.result is None or heard.result.id != current)


def _never_started(ended: list[tuple[ObservedPod, EndedResult | None]], current: str) -> bool:
    """The warm pod ended saying what it ran last and that `current` was not running: the start came
    too late (it idled out, or was stopped), so nothing of the iteration ran."""
    said = [s for _, s in ended if s is not None]
    return bool(said) and all(s.running != current and s.id != current for s in said)


def _start_cold_instead(ctx: PlanContext, step: StepView) -> bool:
    """The warm pod ended before the iteration started in it: the same attempt starts in a new Job
    (nothing ran, so no attempt is spent)."""
    name = naming.job_name(ctx.name, step.index, step.iteration, step.st.attempt, step.ancestors)
    if ctx.observed.job(name) is None:
        if not gate_clear(ctx, name) or ctx.ref_problems:
            ctx.requeue(WARM_COLD_REQUEUE_SECONDS)
            return False
        manifest = _manifest(ctx, step, step.iteration, step.st.attempt)
        ctx.writes.append(CreateJob(manifest))
    step.st.job_ref = JobRef(name=name)
    record = step.record() if step.loop is not None else None
    if record is not None:
        record.job_ref = JobRef(name=name)
    mark(step, None, None)
    ctx.emit(
        "Normal",
        "IterationStarted",
        f"step {step.label}: iteration {step.iteration} starts in a new pod (Job {name}): the warm pod "
        "ended before it started there",
        step.where,
    )
    return False


def _record(
    ctx: PlanContext,
    step: StepView,
    job: ObservedJob,
    pod: ObservedPod | None,
    exit_code: int,
    text: str,
    finished_at: datetime | None,
) -> bool:
    """Record a warm iteration's result as any iteration's: its control envelope when `main`'s
    command exited 0, else a failed attempt (its usage counted; the retry is a new pod)."""
    envelope = decode_envelope(text, pod_control_path(step))
    if pod is not None:
        mark(step, pod.name, marked_warm(step) or None)
    duration = _seconds(_attempt_started(step), finished_at)
    if exit_code == 0:
        record_success(ctx, step, job, envelope, finished_at=finished_at, duration=duration)
        return True
    ctx.delete_reasons[job.name] = "its warm iteration failed; the retry starts a new pod"
    where = f" in warm pod {pod.name}" if pod is not None else ""
    namespace = f" -n {ctx.namespace}" if ctx.namespace else ""
    logs = (
        f"agentrun logs {ctx.name}{namespace} --step {step.path} --iteration {label_iteration(step)} "
        f"--attempt {step.st.attempt}"
    )
    cause = f"main container's command exited with code {exit_code}{where}; whole log: {logs}"
    return record_failure(ctx, step, None, cause, envelope=envelope, duration=duration)


def _attempt_started(step: StepView) -> datetime | None:
    """When the current attempt started, as the status says (its iteration record's, else the
    step's start: a loop body's child starts anew each pass)."""
    record = step.record() if step.loop is not None else None
    if record is not None:
        return record.last_attempt_started_at or record.started_at
    return step.st.started_at


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def _ended_cause(ctx: PlanContext, step: StepView, job: ObservedJob) -> str:
    """Why a warm iteration has no result: its pod (or its `main` loop) ended, or its Job went."""
    pods = ctx.observed.pods_of(job.name)
    what = f"iteration {step.iteration}"
    for pod in pods:
        if pod.main_exit_code is not None and pod.main_exit_code != 0:
            reason = f" ({pod.main_reason})" if pod.main_reason else ""
            code = pod.main_exit_code
            return f"warm pod {pod.name}'s main container ended with code {code}{reason} during {what}"
        if pod.phase == "Failed" or pod.reason:
            why = f"{pod.reason}: {clip((pod.message or '').strip(), 300)}" if pod.reason else pod.phase
            return f"warm pod {pod.name} ended during {what} ({why})"
    if job.deleting:
        return f"warm Job {job.name} was deleted during {what}"
    if not pods:
        return f"warm pod of Job {job.name} was gone before {what}'s result was read"
    return f"warm pod {pods[0].name} ended during {what} without its result"


def _timed_out(ctx: PlanContext, step: StepView, job: ObservedJob) -> bool:
    """The step's timeout, per iteration attempt, from the attempt's start in the status: a warm
    Job has no deadline of its own. Past it, the pod is deleted and the attempt fails."""
    timeout = step_timeout_seconds(step.spec, ctx.refs)
    started = _attempt_started(step)
    if timeout <= 0 or started is None:
        return False
    deadline = started + timedelta(seconds=timeout)
    if ctx.now < deadline:
        ctx.requeue((deadline - ctx.now).total_seconds())
        return False
    ctx.delete_reasons[job.name] = "its warm iteration timed out"
    record_failure(
        ctx,
        step,
        None,
        f"timed out after {timeout}s (a warm iteration: its pod was deleted)",
        REASON_DEADLINE,
    )
    return True


def expected_warm_job(ctx: PlanContext, views: list[StepView]) -> str | None:
    """The run's live warm Job while no attempt runs in it, kept for the next iteration or pass of its
    loop: until that loop's top-level step is done, the run ends, or a new Job lets it go."""
    if ctx.status.phase in TERMINAL_RUN_PHASES:
        return None
    tops = {v.index: v for v in views if v.parent is None}
    for job in live_warm_jobs(ctx):
        top = tops.get(job.step_index)
        if top is not None and state_of(top) is not StepState.DONE and live_pod(ctx, job) is not None:
            return job.name
    return None


def acknowledge_recorded(ctx: PlanContext, views: list[StepView]) -> None:
    """Tell each live warm pod that holds a result and runs nothing (no step's attempt runs in its
    Job) that the result is recorded: its idle clock starts (it never idles out holding one). Sent
    after the status that records it."""
    running = {
        v.st.job_ref.name for v in views if v.st.job_ref is not None and state_of(v) is StepState.RUNNING
    }
    told = {w.pod for w in ctx.writes if isinstance(w, WarmCommand)}
    for job in live_warm_jobs(ctx):
        if job.name in running:
            continue
        idle = idle_pod(ctx, job)
        if idle is None or idle.pod.name in told or idle.result.acked:
            continue
        ctx.writes.append(WarmCommand("ack", idle.pod.name, idle.ip, idle.result.id, ()))


def stop_finished_warm_pods(ctx: PlanContext, expected: str | None) -> frozenset[str]:
    """The warm Jobs no step needs any more because their loop (or the run) ended as it should: each
    live, idle pod that answers is told to end (`stop`), so its Job completes and is collected as any
    recorded attempt's is (its log kept as the run's pod GC says, docs/api.md#podgc). Returns those
    Jobs, which are not deleted; a pod that does not answer, an ended one, a cancelled run's and one
    let go for a new Job (`ctx.delete_reasons`) are deleted as any stray Job."""
    if ctx.stopping == "Immediate":
        return frozenset()
    spared: set[str] = set()
    for job in live_warm_jobs(ctx):
        if job.name == expected:
            continue
        pods = [p for p in ctx.observed.pods_of(job.name) if not p.deleting]
        pod = live_pod(ctx, job)
        heard = ctx.observed.warm.get(pod.name) if pod is not None else None
        # Told to end, it says so (and may no longer answer), or its `main` loop ended cleanly: its
        # Job completes on its own, then goes by its TTL. One that does not end in time is deleted.
        ending = (heard is not None and heard.phase == "stopping") or (
            bool(pods) and all(p.main_exit_code == 0 for p in pods)
        )
        if ending:
            waited = ctx.seconds_since(ctx.status.finished_at)
            if waited < WARM_STOP_SECONDS:
                spared.add(job.name)
                ctx.requeue(WARM_STOP_SECONDS - waited)
            continue
        idle = idle_pod(ctx, job)
        if idle is None or idle.heard.error is not None:
            continue
        ctx.writes.append(WarmCommand("stop", idle.pod.name, idle.ip, idle.result.id, ()))
        spared.add(job.name)
    return frozenset(spared)
