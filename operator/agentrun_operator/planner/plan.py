"""The planner: a pure function from (AgentRun, observed Jobs/Pods, clock, config) to (status, actions).

Every execution rule of SPEC §4 and the reference note lives here: validation before the first Job,
fixed / conditional / forEach loops, `when`, retries with backoff, per-attempt timeouts,
cancellation, the workflow timeout, idempotency claims, history compaction and restart safety.

How restart safety works (why the code is shaped like this):

- All progress is in `run.status`, which must be the status *as persisted* (the shell never feeds an
  unsaved status back). Observations only ever move a step forward from there.
- Job names are deterministic per (step, iteration, attempt). Before creating one the planner looks
  for it: an existing Job is adopted, so a plan replayed after a lost status write never duplicates
  an attempt, and a completed iteration is never run again (its Job keeps its result until the
  status that records it is persisted: only then does the planner give the Job a TTL).
- One Job at a time: a new attempt/iteration/step Job is created only once every other Job of the
  run is finished (or being deleted) and every other pod is terminal or gone, so two pods never
  share a ReadWriteOnce volume. Any live Job that is not the expected one is deleted.
- `plan` is idempotent: re-planning its own output against the same observation yields the same
  status, no events, and only convergent actions (Requeue, a DeleteJob of a Job still alive).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any, Final, Literal

from agentrun_operator import naming
from agentrun_operator.api import (
    AgentRun,
    AgentRunStatus,
    Condition,
    IterationRecord,
    JobRef,
    LoopStatus,
    StepStatus,
    WorkflowStatus,
    WorkflowStep,
    format_timestamp,
)
from agentrun_operator.celeval import (
    CelError,
    EarlierStep,
    build_context,
    compile_expression,
    evaluate_bool,
    evaluate_list,
)
from agentrun_operator.config import OperatorConfig
from agentrun_operator.control.envelope import ControlEnvelope, decode_envelope, effective_status
from agentrun_operator.jobs.builder import (
    PlannedAttempt,
    References,
    build_iteration_job,
    control_path,
    effective_parameters,
    effective_steps,
    step_retries,
    step_timeout_seconds,
)
from agentrun_operator.planner.actions import (
    Action,
    ClaimIdempotencyKey,
    CreateJob,
    DeleteJob,
    DeleteRun,
    EmitEvent,
    Requeue,
    SetJobTTL,
)
from agentrun_operator.planner.observed import Observed, ObservedJob
from agentrun_operator.planner.validate import (
    REASON_LOOPS_DISABLED,
    Problem,
    resolve_references,
    validate_run,
)

TERMINAL_RUN_PHASES: Final = frozenset({"Succeeded", "Failed", "Cancelled"})
TERMINAL_STEP_PHASES: Final = frozenset({"Succeeded", "Failed", "Skipped", "Cancelled"})

REFERENCE_GRACE_SECONDS: Final = 30.0
"""A missing Agent/AgentProvider/ImplementationSpec/PVC is waited for this long after creation."""
JOB_VISIBILITY_GRACE_SECONDS: Final = 10.0
"""A Job the planner asked for but has never observed is waited for this long, then requested again."""
DEADLINE_GRACE_SECONDS: Final = 30.0
"""A Job still Active this long past activeDeadlineSeconds is deleted by the planner itself."""
RESULT_GRACE_SECONDS: Final = 10.0
"""How long a succeeded Job's pod may be missing from the observation before its result is read as lost."""
RESULT_MAX_WAIT_SECONDS: Final = 60.0
"""How long a succeeded Job's pod may stay non-terminal before the planner stops waiting for it."""
GATE_REQUEUE_SECONDS: Final = 2.0
RESULT_REQUEUE_SECONDS: Final = 1.0
MAX_ITEMS_JSON_BYTES: Final = 8 * 1024
MAX_MESSAGE_CHARS: Final = 1024
MAX_PROBLEMS_IN_MESSAGE: Final = 5
_MAX_TRANSITIONS: Final = 100_000

REASON_WAITING_FOR_REFERENCES: Final = "WaitingForReferences"
REASON_CLAIMING: Final = "ClaimingIdempotencyKey"
REASON_KEY_IN_USE: Final = "IdempotencyKeyInUse"
REASON_KEY_COMPLETED: Final = "IdempotencyKeyCompleted"
REASON_TIMED_OUT: Final = "WorkflowTimedOut"
REASON_COMPLETED: Final = "Completed"
REASON_CANCELLED: Final = "Cancelled"
REASON_STEP_FAILED: Final = "StepFailed"
REASON_WHEN_ERROR: Final = "WhenConditionError"

StopMode = Literal["Graceful", "Immediate", "timeout"]


@dataclass(frozen=True)
class Plan:
    """The planner's answer: the status to write and the actions for the shell, in order."""

    status: AgentRunStatus
    actions: tuple[Action, ...]


class _Outcome(Enum):
    DONE = "done"  # the step is terminal (Succeeded, Skipped, Failed, Cancelled)
    ACTIVE = "active"  # the step waits for something (a Job, a backoff, pods to end)
    HALTED = "halted"  # the step was not started because the run is stopping


# ----------------------------------------------------------------------------------- context


@dataclass
class _Ctx:
    """Everything one `plan` call reads and accumulates; discarded when it returns."""

    run: AgentRun
    observed: Observed
    now: datetime
    config: OperatorConfig
    prior: AgentRunStatus | None
    status: AgentRunStatus
    steps: list[WorkflowStep]
    refs: References = field(default_factory=References)
    ref_problems: tuple[Problem, ...] = ()
    stopping: StopMode | None = None
    halted: bool = False
    writes: list[Action] = field(default_factory=list)
    events: list[EmitEvent] = field(default_factory=list)
    requeue_after: float | None = None
    delete_reasons: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.run.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.run.metadata.get("namespace", ""))

    @property
    def uid(self) -> str:
        return str(self.run.metadata.get("uid", ""))

    def emit(self, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        self.events.append(EmitEvent(type_, reason, _clip(message)))

    def requeue(self, seconds: float) -> None:
        """Ask to be planned again after `seconds` at the latest (the earliest request wins)."""
        seconds = max(round(seconds, 3), 0.1)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds

    def seconds_since(self, moment: datetime | None) -> float:
        return float("inf") if moment is None else (self.now - moment).total_seconds()

    def result(self) -> Plan:
        actions: list[Action] = [*self.writes, *self.events]
        if self.requeue_after is not None:
            actions.append(Requeue(self.requeue_after))
        return Plan(self.status, tuple(actions))


def _clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ts(moment: datetime) -> str:
    return format_timestamp(moment)


# ----------------------------------------------------------------------------------- step view


@dataclass
class _Step:
    """A spec step together with its (mutable, working-copy) status entry."""

    index: int  # 1-based, as in Job names
    spec: WorkflowStep
    st: StepStatus

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def loop(self) -> LoopStatus | None:
        return self.st.loop if self.spec.loop is not None else None

    @property
    def iteration(self) -> int:
        """The current (or last) iteration, 1-based; 1 for a step without a loop."""
        return self.st.loop.current_iteration if self.loop is not None and self.st.loop else 1

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


def _step_views(ctx: _Ctx) -> list[_Step]:
    workflow = ctx.status.workflow
    assert workflow is not None
    return [_Step(i, spec, workflow.steps[i - 1]) for i, spec in enumerate(ctx.steps, 1)]


# ----------------------------------------------------------------------------------- entry point


def plan(run: AgentRun, observed: Observed, now: datetime, config: OperatorConfig) -> Plan:
    """Decide the next status of `run` and the actions that bring the cluster there.

    `run.status` must be the persisted status; `now` must be timezone-aware. Pure: no I/O, and the
    same inputs always give the same plan.
    """
    prior = run.status
    ctx = _Ctx(
        run=run,
        observed=observed,
        now=now if now.tzinfo is not None else now.replace(tzinfo=UTC),
        config=config,
        prior=prior,
        status=_working_copy(prior) if prior is not None else AgentRunStatus(),
        steps=effective_steps(run),
    )
    _plan_run(ctx)
    return ctx.result()


def _working_copy(prior: AgentRunStatus) -> AgentRunStatus:
    """A copy of `prior` that the planner may mutate without touching `prior` (copy-on-write).

    A deep copy of a 50-record history costs milliseconds; the planner only ever mutates the
    top-level status, the step entries, their loop blocks and job refs, and the *newest* iteration
    record of each loop (older records are never modified, only dropped), so only those are copied.
    """
    status = prior.model_copy()
    status.conditions = list(prior.conditions)
    if prior.workflow is not None:
        workflow = prior.workflow.model_copy()
        workflow.steps = [_copy_step_status(st) for st in prior.workflow.steps]
        status.workflow = workflow
    return status


def _copy_step_status(st: StepStatus) -> StepStatus:
    copy = st.model_copy()
    if st.job_ref is not None:
        copy.job_ref = st.job_ref.model_copy()
    if st.loop is not None:
        loop = st.loop.model_copy()
        iterations = list(st.loop.iterations)
        if iterations:
            iterations[-1] = iterations[-1].model_copy()
        loop.iterations = iterations
        copy.loop = loop
    return copy


def _plan_run(ctx: _Ctx) -> None:
    status = ctx.status
    generation = ctx.run.metadata.get("generation")
    if isinstance(generation, int):
        status.observed_generation = generation
    if status.phase in TERMINAL_RUN_PHASES:
        _plan_finished_run(ctx)
        return
    if status.started_at is None:
        if not _admit(ctx):
            _delete_strays(ctx, expected=None)
            return
        _start_run(ctx)
    _execute(ctx)


# ----------------------------------------------------------------------------------- admission


def _admit(ctx: _Ctx) -> bool:
    """Before the first Job: cancel, validation (with the reference grace), the idempotency claim."""
    spec = ctx.run.spec
    if spec.cancel is not None:
        _finish_run(ctx, "Cancelled", REASON_CANCELLED, f"cancelled ({spec.cancel}) before any Job started")
        return False
    problems = validate_run(ctx.run, ctx.observed, ctx.config)
    if problems:
        waiting = _reference_wait_seconds(ctx, problems)
        if waiting is not None:
            _wait_for_references(ctx, problems, waiting)
        else:
            _fail_invalid(ctx, problems)
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


def _reference_wait_seconds(ctx: _Ctx, problems: list[Problem]) -> float | None:
    """Seconds left to wait when every problem is a missing reference young enough; else None."""
    if not all(p.missing for p in problems):
        return None
    age = ctx.seconds_since(_creation_time(ctx.run))
    return REFERENCE_GRACE_SECONDS - age if age < REFERENCE_GRACE_SECONDS else None


def _wait_for_references(ctx: _Ctx, problems: list[Problem], seconds: float) -> None:
    missing = ", ".join(sorted({p.missing for p in problems if p.missing}))
    _set_pending(
        ctx,
        REASON_WAITING_FOR_REFERENCES,
        f"waiting for {missing} to exist; the run fails with InvalidSpec if still missing "
        f"{REFERENCE_GRACE_SECONDS:g}s after creation",
    )
    ctx.requeue(seconds + 0.5)


def _problems_message(problems: list[Problem]) -> str:
    lines = [p.render() for p in problems[:MAX_PROBLEMS_IN_MESSAGE]]
    if len(problems) > MAX_PROBLEMS_IN_MESSAGE:
        lines.append(f"(and {len(problems) - MAX_PROBLEMS_IN_MESSAGE} more; run `agentrun validate`)")
    return "; ".join(lines)


def _fail_invalid(ctx: _Ctx, problems: list[Problem]) -> None:
    reason = (
        REASON_LOOPS_DISABLED if any(p.reason == REASON_LOOPS_DISABLED for p in problems) else "InvalidSpec"
    )
    message = _clip(_problems_message(problems), 4 * MAX_MESSAGE_CHARS)
    _set_condition(ctx, "InvalidSpec", "True", reason, message)
    ctx.emit("Warning", "InvalidSpec", message)
    _finish_run(ctx, "Failed", reason, message)


def _hold_idempotency_claim(ctx: _Ctx, key: str) -> bool:
    """True when this run holds the (namespace, agentRef, key) claim; else claim it or fail."""
    agent = ctx.run.spec.agent_ref.name if ctx.run.spec.agent_ref else ""
    claim = ctx.observed.claim
    if claim is None:
        if ctx.observed.claim_checked:
            name = naming.idempotency_claim_name(ctx.namespace, agent, key)
            ctx.writes.append(ClaimIdempotencyKey(name=name, agent_ref=agent, key=key))
        _set_pending(ctx, REASON_CLAIMING, f"claiming idempotencyKey {key!r} before the first Job")
        ctx.requeue(RESULT_REQUEUE_SECONDS)
        return False
    if claim.holder_uid == ctx.uid:
        return True
    reason = REASON_KEY_COMPLETED if claim.holder_finished else REASON_KEY_IN_USE
    state = "has finished" if claim.holder_finished else "is still running"
    message = (
        f"idempotencyKey {key!r} (agent {agent or '-'}) belongs to AgentRun {claim.holder_name!r} "
        f"(uid {claim.holder_uid}), which {state}; this run starts no Jobs and does not resume its loops"
    )
    _set_condition(ctx, "Duplicate", "True", reason, message)
    _finish_run(ctx, "Failed", reason, message)
    return False


def _set_pending(ctx: _Ctx, reason: str, message: str) -> None:
    ctx.status.phase = "Pending"
    ctx.status.reason = reason
    ctx.status.message = _clip(message)


def _set_condition(
    ctx: _Ctx, type_: str, status: Literal["True", "False"], reason: str, message: str
) -> None:
    conditions = ctx.status.conditions
    for i, cond in enumerate(conditions):
        if cond.type == type_:
            changed = cond.status != status
            conditions[i] = Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=ctx.now if changed else cond.last_transition_time,
                observed_generation=ctx.status.observed_generation,
            )
            return
    conditions.append(
        Condition(
            type=type_,
            status=status,
            reason=reason,
            message=message,
            last_transition_time=ctx.now,
            observed_generation=ctx.status.observed_generation,
        )
    )


# ----------------------------------------------------------------------------------- the run


def _start_run(ctx: _Ctx) -> None:
    status = ctx.status
    status.started_at = ctx.now
    status.phase = "Running"
    status.reason = None
    status.message = None


def _align_step_statuses(ctx: _Ctx) -> None:
    """One status entry per spec step, in spec order (entries are matched by name)."""
    status = ctx.status
    if status.workflow is None:
        status.workflow = WorkflowStatus()
    existing = status.workflow.steps
    names = [s.name for s in ctx.steps]
    if [s.name for s in existing] == names:
        return
    by_name = {s.name: s for s in existing}
    status.workflow.steps = [by_name.get(name) or StepStatus(name=name) for name in names]


def _stop_request(ctx: _Ctx) -> StopMode | None:
    """Cancellation wins over the workflow timeout; the timeout asks for a requeue at its deadline."""
    spec = ctx.run.spec
    if spec.cancel is not None:
        return spec.cancel
    timeout = spec.workflow.timeout_seconds if spec.workflow is not None else 0
    started = ctx.status.started_at
    if timeout > 0 and started is not None:
        left = timeout - ctx.seconds_since(started)
        if left <= 0:
            return "timeout"
        ctx.requeue(left)
    return None


def _execute(ctx: _Ctx) -> None:
    _align_step_statuses(ctx)
    resolution = resolve_references(ctx.run, ctx.observed)
    ctx.refs, ctx.ref_problems = resolution.refs, resolution.problems
    ctx.stopping = _stop_request(ctx)
    for step in _step_views(ctx):
        if step.st.phase in ("Succeeded", "Skipped"):
            continue
        outcome = _plan_step(ctx, step)
        if outcome is _Outcome.HALTED:
            ctx.halted = True
        if outcome is not _Outcome.DONE or step.st.phase in ("Failed", "Cancelled"):
            break
    for step in _step_views(ctx):
        if step.st.loop is not None:
            _compact(step.st.loop, ctx.config.loop_status_history_limit)
    _conclude(ctx)
    _delete_strays(ctx, expected=_active_job_name(ctx))
    _set_job_ttls(ctx)


def _conclude(ctx: _Ctx) -> None:
    """The run's phase from its steps' phases; terminal transitions finish the run."""
    steps = _step_views(ctx)
    failed = next((s for s in steps if s.st.phase == "Failed"), None)
    if failed is not None:
        if failed.st.reason == "InvalidSpec":
            _set_condition(ctx, "InvalidSpec", "True", "InvalidSpec", failed.st.message or "")
            ctx.emit("Warning", "InvalidSpec", failed.st.message or "")
        _finish_run(
            ctx, "Failed", failed.st.reason or REASON_STEP_FAILED, f"step {failed.name}: {failed.st.message}"
        )
        return
    if ctx.halted or any(s.st.phase == "Cancelled" for s in steps):
        if ctx.stopping == "timeout":
            _finish_run(ctx, "Failed", REASON_TIMED_OUT, _timeout_message(ctx))
        else:
            _finish_run(
                ctx, "Cancelled", REASON_CANCELLED, f"cancelled ({ctx.run.spec.cancel or 'Graceful'})"
            )
        return
    if all(s.st.phase in ("Succeeded", "Skipped") for s in steps):
        skipped = sum(1 for s in steps if s.st.phase == "Skipped")
        detail = f" ({skipped} skipped)" if skipped else ""
        _finish_run(ctx, "Succeeded", REASON_COMPLETED, f"all {len(steps)} steps finished{detail}")
        return
    status = ctx.status
    status.phase = "Running"
    status.reason = None
    active = next((s for s in steps if s.st.phase not in TERMINAL_STEP_PHASES), None)
    status.message = (
        _clip(f"step {active.name}: {active.st.message}") if active and active.st.message else None
    )
    _summarize(ctx)


def _timeout_message(ctx: _Ctx) -> str:
    timeout = ctx.run.spec.workflow.timeout_seconds if ctx.run.spec.workflow else 0
    return f"the workflow timed out after {timeout}s (spec.workflow.timeoutSeconds)"


def _summarize(ctx: _Ctx) -> None:
    """Printer columns: the active (or last run) step, and its iteration as `current/max`."""
    status = ctx.status
    if status.workflow is None:
        return
    steps = _step_views(ctx)
    active = next((s for s in steps if s.st.phase in ("Running", "Retrying")), None)
    if active is None:
        ran = [s for s in steps if s.st.phase != "Pending"]
        active = ran[-1] if ran else None
    status.current_step = active.name if active else None
    loop = active.st.loop if active else None
    status.iteration = f"{loop.current_iteration}/{loop.max_iterations}" if loop is not None else None


_RUN_FINISHED_EVENTS: Final = {
    "Succeeded": "RunSucceeded",
    "Failed": "RunFailed",
    "Cancelled": "RunCancelled",
}
"""The Event of each final phase, spelled out so the docs check finds every reason in the code."""


def _finish_run(
    ctx: _Ctx, phase: Literal["Succeeded", "Failed", "Cancelled"], reason: str, message: str
) -> None:
    status = ctx.status
    status.phase = phase
    status.reason = reason
    status.message = _clip(message, 4 * MAX_MESSAGE_CHARS)
    status.finished_at = ctx.now
    if status.workflow is not None:
        status.workflow.phase = phase
        for st in status.workflow.steps:
            if st.phase == "Pending":
                st.message = f"not started: the run {phase.lower()} ({reason})"
    _summarize(ctx)
    event_type: Literal["Normal", "Warning"] = "Normal" if phase == "Succeeded" else "Warning"
    ctx.emit(event_type, _RUN_FINISHED_EVENTS[phase], f"{reason}: {message}")
    ttl = ctx.run.spec.ttl_seconds_after_finished
    if ttl is not None:
        ctx.requeue(float(ttl))


def _plan_finished_run(ctx: _Ctx) -> None:
    """A finished run starts nothing: delete leftover Jobs, TTL the recorded ones, honour the run's TTL."""
    _delete_strays(ctx, expected=None)
    _set_job_ttls(ctx)
    ttl = ctx.run.spec.ttl_seconds_after_finished
    finished = ctx.status.finished_at
    if ttl is None or finished is None:
        return
    left = ttl - ctx.seconds_since(finished)
    if left <= 0:
        ctx.writes.append(DeleteRun(uid=ctx.uid))
    else:
        ctx.requeue(left)


# ----------------------------------------------------------------------------------- Jobs


def _active_job_name(ctx: _Ctx) -> str | None:
    """The one Job that may be alive: the current attempt of the running step, if any."""
    if ctx.status.phase in TERMINAL_RUN_PHASES or ctx.status.workflow is None:
        return None
    for step in _step_views(ctx):
        if step.st.phase == "Running" and _state_of(step) == "running" and step.st.job_ref is not None:
            return step.st.job_ref.name
    return None


def _delete_strays(ctx: _Ctx, expected: str | None) -> None:
    """Delete every live Job of this run other than `expected` (orphans, cancelled, past deadline)."""
    terminal = ctx.status.phase in TERMINAL_RUN_PHASES
    for job in ctx.observed.jobs:
        if not _live(ctx, job) or job.name == expected:
            continue
        default = (
            f"the run {str(ctx.status.phase).lower()}; no Job may outlive it"
            if terminal
            else "not the active attempt of this run (one Job at a time)"
        )
        ctx.writes.insert(0, DeleteJob(job.name, ctx.delete_reasons.get(job.name, default)))


def _set_job_ttls(ctx: _Ctx) -> None:
    """Once the *persisted* status records an attempt, its Job may go (after the configured TTL)."""
    for job in ctx.observed.jobs:
        fresh = job.finished and not job.deleting and job.ttl_seconds_after_finished is None
        if fresh and result_recorded(ctx.prior, job):
            ctx.writes.append(SetJobTTL(job.name, ctx.config.job_ttl_seconds_after_recorded))


def result_recorded(prior: AgentRunStatus | None, job: ObservedJob) -> bool:
    """Whether `prior` (a persisted status) already holds the result of `job`'s attempt.

    Such a Job is done with: it may get a TTL, and a late change of its outcome (e.g. it completes
    after the planner recorded it as timed out) no longer matters.
    """
    if prior is None or prior.workflow is None:
        return False
    if prior.phase in TERMINAL_RUN_PHASES:
        return True
    if not 1 <= job.step_index <= len(prior.workflow.steps):
        return False
    st = prior.workflow.steps[job.step_index - 1]
    if st.phase in TERMINAL_STEP_PHASES:
        return True
    if st.phase == "Pending":
        return False
    current = st.loop.current_iteration if st.loop is not None else 1
    if job.iteration != current:
        return job.iteration < current
    if job.attempt != st.attempt:
        return job.attempt < st.attempt
    if st.phase == "Retrying":
        return True
    if st.loop is not None and st.loop.iterations:
        newest = st.loop.iterations[-1]
        return newest.index == current and newest.phase in ("Succeeded", "Failed", "Cancelled")
    return False


def _live(ctx: _Ctx, job: ObservedJob) -> bool:
    """A Job that can still run something: not finished, not being deleted, its pod not succeeded."""
    return not job.finished and not job.deleting and _succeeded_by_pod(ctx, job) is None


def _gate_clear(ctx: _Ctx, name: str) -> bool:
    """True when no other Job of the run is live and no other pod can still touch a volume."""
    for job in ctx.observed.jobs:
        if job.name != name and _live(ctx, job):
            return False
    return all(pod.job_name == name or pod.terminal for pod in ctx.observed.pods)


# ----------------------------------------------------------------------------------- steps


def _plan_step(ctx: _Ctx, step: _Step) -> _Outcome:
    if step.st.phase == "Pending":
        if ctx.stopping is not None:
            return _Outcome.HALTED
        if not _start_step(ctx, step):
            return _Outcome.DONE
    return _advance(ctx, step)


StepState = Literal["running", "retry_wait", "next"]


def _state_of(step: _Step) -> StepState:
    """Where a started, non-terminal step is: an attempt in flight, a retry due, or the next iteration due."""
    st = step.st
    if st.phase == "Retrying":
        return "retry_wait"
    if st.job_ref is None:
        return "next"
    if step.loop is not None:
        record = step.record()
        if record is None or record.phase == "Succeeded":
            return "next"
        if record.phase == "Retrying":
            return "retry_wait"
    return "running"


def _advance(ctx: _Ctx, step: _Step) -> _Outcome:
    """Move the step forward as far as the observation allows (adopted Jobs may already be done)."""
    for _ in range(_MAX_TRANSITIONS):
        st = step.st
        if st.phase in TERMINAL_STEP_PHASES:
            return _Outcome.DONE
        state = _state_of(step)
        if state == "running":
            if not _observe_attempt(ctx, step):
                return _Outcome.ACTIVE
            continue
        if ctx.stopping is not None:
            _cancel_step(ctx, step, _stop_message(ctx, step))
            return _Outcome.DONE
        if state == "retry_wait":
            started = _start_attempt(ctx, step, step.iteration, st.attempt + 1, not_before=st.next_retry_at)
        else:
            started = _start_attempt(ctx, step, step.iteration + 1 if step.loop is not None else 1, 1)
        if not started:
            return _Outcome.ACTIVE
    ctx.requeue(RESULT_REQUEUE_SECONDS)  # pragma: no cover - a guard against a planner bug
    return _Outcome.ACTIVE  # pragma: no cover


def _stop_message(ctx: _Ctx, step: _Step) -> str:
    if ctx.stopping == "timeout":
        return f"{_timeout_message(ctx)}; no further iteration or attempt was started"
    done = f" after iteration {step.iteration}" if step.loop is not None and step.iteration else ""
    return f"cancelled ({ctx.stopping}){done}; no further iteration or attempt was started"


def _cel_context(
    ctx: _Ctx,
    step: _Step,
    *,
    iteration_index: int = 0,
    last_phase: str = "",
    last_control: dict[str, Any] | None = None,
    item: Any = None,
) -> dict[str, Any]:
    return build_context(
        run_name=ctx.name,
        run_namespace=ctx.namespace,
        step_name=step.name,
        run_parameters=effective_parameters(ctx.run, step.spec),
        iteration_index=iteration_index,
        max_iterations=step.max_iterations if step.spec.loop is not None else 1,
        last_phase=last_phase,
        last_control=last_control,
        item=item,
        steps=_earlier_steps(ctx, step.index),
    )


def _earlier_steps(ctx: _Ctx, index: int) -> dict[str, EarlierStep]:
    """`steps.<name>` of the CEL context: phase, completed iterations and last control of earlier steps."""
    assert ctx.status.workflow is not None
    out: dict[str, EarlierStep] = {}
    for st in ctx.status.workflow.steps[: index - 1]:
        if st.loop is not None:
            out[st.name] = EarlierStep(st.phase, st.loop.completed_iterations, st.loop.last_control)
        else:
            out[st.name] = EarlierStep(st.phase, 1 if st.phase == "Succeeded" else 0, st.control)
    return out


def _start_step(ctx: _Ctx, step: _Step) -> bool:
    """Evaluate `when`, set up the loop (and freeze forEach items); True when an iteration is due."""
    st, spec = step.st, step.spec
    if spec.when is not None and not _when_allows(ctx, step, spec.when):
        return False
    st.phase = "Running"
    st.started_at = ctx.now
    st.attempt = 0
    st.message = "starting"
    if spec.loop is None:
        return True
    st.loop = LoopStatus(max_iterations=spec.loop.max_iterations)
    if spec.loop.items is not None and not _freeze_items(ctx, step, spec.loop.items):
        return False
    count = f", {st.loop.item_count} items" if st.loop.item_count is not None else ""
    ctx.emit(
        "Normal",
        "LoopStarted",
        f"step {step.name}: loop started (maxIterations {st.loop.max_iterations}{count})",
    )
    return True


def _when_allows(ctx: _Ctx, step: _Step, expression: str) -> bool:
    """True when the step should run; False after marking it Skipped (false) or Failed (CEL error)."""
    st = step.st
    try:
        allowed = evaluate_bool(compile_expression(expression), _cel_context(ctx, step))
    except CelError as exc:
        st.phase = "Failed"
        st.reason = REASON_WHEN_ERROR
        st.message = _clip(f"when: {exc}")
        st.started_at = st.finished_at = ctx.now
        return False
    if allowed:
        return True
    st.phase = "Skipped"
    st.reason = "WhenFalse"
    st.message = _clip(f"skipped: when `{expression}` is false")
    st.finished_at = ctx.now
    ctx.emit("Normal", "StepSkipped", f"step {step.name}: {st.message}")
    return False


def _freeze_items(ctx: _Ctx, step: _Step, expression: str) -> bool:
    """forEach: evaluate `items` once and freeze them in status; False when the step ended already."""
    loop = step.st.loop
    assert loop is not None and step.spec.loop is not None
    bound = step.spec.loop.max_iterations
    try:
        items = evaluate_list(compile_expression(expression), _cel_context(ctx, step))
    except CelError as exc:
        _fail_step(ctx, step, "LoopConditionError", f"loop.items: {exc}")
        return False
    loop.item_count = len(items)
    if len(items) > bound:
        _fail_step(
            ctx,
            step,
            "LoopItemsExceedMaxIterations",
            f"loop.items gave {len(items)} items but maxIterations is {bound}; raise maxIterations "
            f"(this operator allows up to {ctx.config.loop_max_iterations}) or return fewer items",
        )
        return False
    size = len(json.dumps(items, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_ITEMS_JSON_BYTES:
        _fail_step(
            ctx,
            step,
            "LoopConditionError",
            f"loop.items gave {len(items)} items whose JSON is {size} bytes; at most {MAX_ITEMS_JSON_BYTES} "
            "bytes are frozen into status: return smaller items (e.g. names or ids) and look details up "
            "in the iteration",
        )
        return False
    loop.items = items
    loop.max_iterations = len(items)
    if not items:
        _succeed_step(
            ctx, step, "LoopMaxIterationsReached", "loop.items is empty: nothing to do (0 iterations)"
        )
        return False
    return True


# ----------------------------------------------------------------------------------- attempts


def _planned_attempt(step: _Step, iteration: int, attempt: int) -> PlannedAttempt:
    loop = step.loop
    if loop is None:
        return PlannedAttempt(step.index, 1, attempt, 1)
    item: Any = None
    item_index: int | None = None
    if loop.items is not None and 1 <= iteration <= len(loop.items):
        item, item_index = loop.items[iteration - 1], iteration - 1
    previous = loop.last_control if iteration > 1 else None
    return PlannedAttempt(step.index, iteration, attempt, loop.max_iterations, previous, item, item_index)


def _job_name(ctx: _Ctx, step: _Step, iteration: int, attempt: int) -> str:
    return naming.job_name(ctx.name, step.index, iteration, attempt)


def _start_attempt(
    ctx: _Ctx, step: _Step, iteration: int, attempt: int, not_before: datetime | None = None
) -> bool:
    """Start (or adopt) an attempt. True when an existing Job was adopted, so planning continues;
    False when a Job was requested or the start must wait (backoff, other pods still alive)."""
    name = _job_name(ctx, step, iteration, attempt)
    existing = ctx.observed.job(name)
    if existing is None:
        if not_before is not None and ctx.now < not_before:
            ctx.requeue((not_before - ctx.now).total_seconds())
            return False
        if not _gate_clear(ctx, name):
            ctx.requeue(GATE_REQUEUE_SECONDS)
            return False
        if ctx.ref_problems:
            _fail_step(ctx, step, "InvalidSpec", _problems_message(list(ctx.ref_problems)))
            return False
        manifest = build_iteration_job(
            ctx.run, _planned_attempt(step, iteration, attempt), ctx.refs, ctx.config
        )
        ctx.writes.append(CreateJob(manifest))
    _mark_attempt_started(ctx, step, iteration, attempt, name, existing)
    return existing is not None


def _mark_attempt_started(
    ctx: _Ctx, step: _Step, iteration: int, attempt: int, name: str, existing: ObservedJob | None
) -> None:
    st = step.st
    st.phase = "Running"
    st.attempt = attempt
    st.job_ref = JobRef(name=name, uid=existing.uid if existing is not None else None)
    if attempt == 1:
        st.next_retry_at = None
    loop = step.loop
    if loop is not None:
        loop.current_iteration = iteration
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
            record.job_ref = JobRef(name=name)
    retries = step_retries(step.spec, ctx.refs)
    where = f"iteration {iteration}/{step.max_iterations} " if loop is not None else ""
    st.message = f"{where}attempt {attempt}/{retries + 1} running (Job {name})"
    ctx.emit(
        "Normal",
        "IterationStarted",
        f"step {step.name}: {where}attempt {attempt}/{retries + 1} started (Job {name})",
    )


def _attempt_requested_at(step: _Step) -> datetime | None:
    """When the current attempt's Job was asked for (step start, iteration start or retry due time)."""
    record = step.record()
    moments = [
        m for m in (step.st.started_at, record.started_at if record else None, step.st.next_retry_at) if m
    ]
    return max(moments) if moments else None


def _observe_attempt(ctx: _Ctx, step: _Step) -> bool:
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
        _cancel_step(ctx, step, f"cancelled (Immediate) during {step.what()}; Job {name} deleted")
        return True
    if job is None:
        return _handle_missing_job(ctx, step, name)
    if st.job_ref.uid is None:
        st.job_ref.uid = job.uid
    if not job.finished:
        succeeded = _succeeded_by_pod(ctx, job)
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


def _succeeded_by_pod(ctx: _Ctx, job: ObservedJob) -> ObservedJob | None:
    """The attempt as Succeeded when its one pod has, before the Job controller says so.

    With `backoffLimit: 0` a Job has exactly one pod, so that pod's success (every container
    terminated, none still on the volume) is the attempt's success. Acting on it saves the Job
    controller's status batching (about a second) from every iteration's turnaround. Failures still
    wait for the Job's own verdict, which names the cause (e.g. DeadlineExceeded).
    """
    pods = ctx.observed.pods_of(job.name)
    if len(pods) != 1 or job.deleting:
        return None
    pod = pods[0]
    if pod.phase != "Succeeded" or pod.deleting:
        return None
    return replace(job, outcome="Succeeded", finished_at=job.finished_at or pod.finished_at or ctx.now)


def _handle_missing_job(ctx: _Ctx, step: _Step, name: str) -> bool:
    """Not observed: not visible yet (or its creation was lost: ask again), or vanished (a failed attempt)."""
    st = step.st
    assert st.job_ref is not None
    if st.job_ref.uid is None:
        waited = ctx.seconds_since(_attempt_requested_at(step))
        if waited < JOB_VISIBILITY_GRACE_SECONDS:
            ctx.requeue(JOB_VISIBILITY_GRACE_SECONDS - waited)
            return False
        if _gate_clear(ctx, name) and not ctx.ref_problems:
            planned = _planned_attempt(step, step.iteration, st.attempt)
            ctx.writes.append(CreateJob(build_iteration_job(ctx.run, planned, ctx.refs, ctx.config)))
        ctx.requeue(JOB_VISIBILITY_GRACE_SECONDS)
        return False
    return _record_failure(ctx, step, None, f"Job {name} vanished before its result was recorded")


def _handle_active_job(ctx: _Ctx, step: _Step, job: ObservedJob) -> bool:
    if job.deleting:
        return _record_failure(ctx, step, job, f"Job {job.name} was deleted before it finished")
    timeout = step_timeout_seconds(step.spec, ctx.refs)
    if timeout > 0:
        start = job.started_at or _attempt_requested_at(step) or ctx.now
        kill_at = start + timedelta(seconds=timeout + DEADLINE_GRACE_SECONDS)
        if ctx.now >= kill_at:
            ctx.delete_reasons[job.name] = "still active past its activeDeadlineSeconds"
            return _record_failure(
                ctx, step, None, f"timed out after {timeout}s (the Job outlived its deadline and was deleted)"
            )
        ctx.requeue((kill_at - ctx.now).total_seconds())
    return False


def _read_envelope(ctx: _Ctx, step: _Step, job: ObservedJob) -> ControlEnvelope | None:
    """The control envelope of a succeeded attempt, or None while its pod has not reported yet."""
    path = control_path(step.spec)
    pods = ctx.observed.pods_of(job.name)
    since_finished = ctx.seconds_since(job.finished_at) if job.finished_at else RESULT_MAX_WAIT_SECONDS
    if any(not p.terminal for p in pods) and since_finished < RESULT_MAX_WAIT_SECONDS:
        return None
    reported = [p for p in pods if p.reporter_message is not None]
    if reported:
        newest = max(reported, key=lambda p: (p.finished_at is not None, p.finished_at or ctx.now, p.name))
        return decode_envelope(newest.reporter_message, path)
    if not pods and since_finished < RESULT_GRACE_SECONDS:
        return None
    envelope = decode_envelope(None, path)
    if not pods:
        return envelope.model_copy(
            update={"reason": f"the pod of Job {job.name} was gone before its report could be read"}
        )
    return envelope


def _failure_cause(ctx: _Ctx, step: _Step, job: ObservedJob) -> str:
    if job.outcome == "DeadlineExceeded":
        timeout = step_timeout_seconds(step.spec, ctx.refs)
        return f"timed out after {timeout}s (activeDeadlineSeconds)"
    for pod in ctx.observed.pods_of(job.name):
        if pod.main_exit_code is not None or pod.main_reason:
            cause = f"main container exited with code {pod.main_exit_code}"
            if pod.main_reason:
                cause += f" ({pod.main_reason})"
            if pod.main_message:
                cause += f": {_clip(pod.main_message.strip(), 300)}"
            return cause
    return job.message or f"Job {job.name} failed"


def _record_failure(ctx: _Ctx, step: _Step, job: ObservedJob | None, cause: str) -> bool:
    """A failed attempt: retry after the backoff while the budget lasts, else the iteration fails."""
    st = step.st
    attempt = st.attempt
    retries = step_retries(step.spec, ctx.refs)
    finished = job.finished_at if job is not None and job.finished_at is not None else ctx.now
    message = _clip(f"{step.what()} failed: {cause}")
    record = step.record()
    if attempt <= retries and ctx.stopping is None:
        due = finished + timedelta(seconds=step.spec.retry_backoff_seconds)
        st.phase = "Retrying"
        st.next_retry_at = due
        st.message = _clip(f"{message}; attempt {attempt + 1}/{retries + 1} starts at {_ts(due)}")
        if record is not None:
            record.phase = "Retrying"
            record.message = message
        ctx.emit("Warning", "IterationRetrying", f"step {step.name}: {st.message}")
        return True
    if record is not None:
        record.phase = "Failed"
        record.finished_at = finished
        record.message = message
    ctx.emit("Warning", "IterationFailed", f"step {step.name}: {message}")
    if ctx.stopping is not None:
        _cancel_step(ctx, step, f"{message}; {_stop_message(ctx, step)}")
        return True
    reason = "LoopIterationFailed" if step.loop is not None else REASON_STEP_FAILED
    budget = f"no retries left ({retries} allowed)" if retries else "no retries configured"
    _fail_step(ctx, step, reason, f"{message}; {budget}")
    return True


def _record_success(ctx: _Ctx, step: _Step, job: ObservedJob, envelope: ControlEnvelope) -> None:
    st = step.st
    control = envelope.control if envelope.status == "found" else None
    loop = step.loop
    retries = step_retries(step.spec, ctx.refs)
    tries = f" on attempt {st.attempt}/{retries + 1}" if st.attempt > 1 else ""
    if loop is None:
        st.control = control
        ctx.emit("Normal", "IterationSucceeded", f"step {step.name}: succeeded{tries} (Job {job.name})")
        _succeed_step(ctx, step, None, f"succeeded{tries}")
        return
    record = step.record()
    if record is not None:
        record.phase = "Succeeded"
        record.finished_at = job.finished_at or ctx.now
        record.message = f"succeeded{tries}" if tries else None
    loop.completed_iterations = min(max(loop.completed_iterations, step.iteration), loop.max_iterations)
    loop.last_control = control
    st.message = f"iteration {step.iteration}/{loop.max_iterations} succeeded{tries}"
    ctx.emit("Normal", "IterationSucceeded", f"step {step.name}: {st.message} (Job {job.name})")
    _decide_next(ctx, step, envelope)


# ----------------------------------------------------------------------------------- loop decisions


@dataclass(frozen=True)
class _Verdict:
    kind: Literal["continue", "stop", "missing", "invalid"]
    detail: str


def _decide_next(ctx: _Ctx, step: _Step, envelope: ControlEnvelope) -> None:
    """After a successful iteration: stop at the cap, or ask the condition (SPEC §4)."""
    spec_loop = step.spec.loop
    loop = step.loop
    assert spec_loop is not None and loop is not None
    done = loop.completed_iterations
    at_cap = done >= loop.max_iterations
    condition = spec_loop.condition
    what = "items" if loop.items is not None else "iterations"
    if at_cap:
        # SPEC §4: at the cap the control file is not consulted. onMaxIterations only matters for
        # a loop with a condition; a fixed loop or a plain forEach reaching its count is its goal.
        if condition is not None and spec_loop.on_max_iterations == "Fail":
            _fail_step(
                ctx,
                step,
                "LoopMaxIterationsReached",
                f"iteration {done}: reached maxIterations ({loop.max_iterations}) before the condition "
                "stopped the loop, and onMaxIterations is Fail",
            )
        else:
            _succeed_step(
                ctx, step, "LoopMaxIterationsReached", f"completed all {loop.max_iterations} {what}"
            )
        return
    if condition is None:
        return
    verdict = _evaluate_condition(ctx, step, envelope)
    source = condition.source
    if verdict.kind == "continue":
        return
    if verdict.kind == "stop":
        _succeed_step(ctx, step, "LoopConditionFalse", verdict.detail)
    elif verdict.kind == "missing":
        if source.on_missing == "stop":
            _succeed_step(ctx, step, "LoopConditionFalse", f"{verdict.detail}; onMissing: stop ends the loop")
        else:
            _fail_step(ctx, step, "LoopConditionError", f"{verdict.detail}; onMissing: fail")
    elif source.on_invalid == "fail":
        _fail_step(ctx, step, "LoopConditionError", f"{verdict.detail}; onInvalid: fail")
    else:
        _succeed_step(ctx, step, "LoopConditionError", f"{verdict.detail}; onInvalid: stop ends the loop")


def _evaluate_condition(ctx: _Ctx, step: _Step, envelope: ControlEnvelope) -> _Verdict:
    spec_loop = step.spec.loop
    loop = step.loop
    assert spec_loop is not None and spec_loop.condition is not None and loop is not None
    condition = spec_loop.condition
    index = step.iteration
    path = envelope.path or condition.source.path
    status = effective_status(envelope)
    because = f": {envelope.reason}" if envelope.reason else ""
    if status == "missing":
        state = "was not rewritten by this iteration (stale)" if envelope.status == "stale" else "is missing"
        verdict = _Verdict("missing", f"iteration {index}: control file {path} {state}{because}")
    elif status == "invalid":
        state = "is too large" if envelope.status == "tooLarge" else "is invalid"
        verdict = _Verdict("invalid", f"iteration {index}: control file {path} {state}{because}")
    else:
        verdict = _evaluate_cel_condition(ctx, step, envelope.control)
    event_type: Literal["Normal", "Warning"] = "Normal" if verdict.kind in ("continue", "stop") else "Warning"
    ctx.emit(event_type, "ConditionEvaluated", f"step {step.name}: {verdict.detail}")
    return verdict


def _evaluate_cel_condition(ctx: _Ctx, step: _Step, control: dict[str, Any] | None) -> _Verdict:
    assert step.spec.loop is not None and step.spec.loop.condition is not None and step.loop is not None
    condition = step.spec.loop.condition
    index = step.iteration
    field_name, expression = (
        ("expression", condition.expression)
        if condition.expression is not None
        else ("until", condition.until)
    )
    assert expression is not None
    item = (
        step.loop.items[index - 1] if step.loop.items is not None and index <= len(step.loop.items) else None
    )
    try:
        context = _cel_context(
            ctx, step, iteration_index=index, last_phase="Succeeded", last_control=control, item=item
        )
        value = evaluate_bool(compile_expression(expression), context)
    except CelError as exc:
        return _Verdict("invalid", f"iteration {index}: condition {field_name}: {exc}")
    keep_going = value if field_name == "expression" else not value
    then = "another iteration runs" if keep_going else "the loop stops"
    detail = f"iteration {index}: {field_name} `{expression}` is {str(value).lower()}, {then}"
    return _Verdict("continue" if keep_going else "stop", detail)


# ----------------------------------------------------------------------------------- step endings


def _end_loop_event(ctx: _Ctx, step: _Step, warning: bool) -> None:
    loop = step.loop
    if loop is None:
        return
    ctx.emit(
        "Warning" if warning else "Normal",
        "LoopCompleted",
        f"step {step.name}: loop stopped: {loop.stop_reason} after {loop.completed_iterations} completed "
        f"iteration(s): {step.st.message}",
    )


def _succeed_step(ctx: _Ctx, step: _Step, stop_reason: str | None, message: str) -> None:
    st = step.st
    st.phase = "Succeeded"
    st.reason = stop_reason
    st.message = _clip(message)
    st.finished_at = ctx.now
    st.next_retry_at = None
    if step.loop is not None:
        step.loop.stop_reason = stop_reason
        _end_loop_event(ctx, step, warning=False)


def _fail_step(ctx: _Ctx, step: _Step, reason: str, message: str) -> None:
    st = step.st
    st.phase = "Failed"
    st.reason = reason
    st.message = _clip(message)
    st.finished_at = ctx.now
    st.next_retry_at = None
    if step.loop is not None:
        step.loop.stop_reason = reason if reason.startswith("Loop") else "LoopIterationFailed"
        _end_loop_event(ctx, step, warning=True)


def _cancel_step(ctx: _Ctx, step: _Step, message: str) -> None:
    """Stop the step for a cancel request or the workflow timeout; an unfinished iteration is Cancelled."""
    st = step.st
    record = step.record()
    if record is not None and record.phase in ("Running", "Retrying", "Pending"):
        record.phase = "Cancelled"
        record.finished_at = ctx.now
        record.message = _clip(message)
    st.phase = "Cancelled"
    st.reason = "LoopCancelled" if step.loop is not None else REASON_CANCELLED
    st.message = _clip(message)
    st.finished_at = ctx.now
    st.next_retry_at = None
    if step.loop is not None:
        step.loop.stop_reason = "LoopCancelled"
        _end_loop_event(ctx, step, warning=True)


# ----------------------------------------------------------------------------------- compaction


def compact_history(records: Iterable[IterationRecord], limit: int) -> tuple[list[IterationRecord], int]:
    """Keep the newest `limit` records, plus the newest Failed/Cancelled one if it is older.

    Returns (kept records, number dropped). Pure, so the rule is tested on its own.
    """
    items = list(records)
    if len(items) <= limit:
        return items, 0
    kept = items[len(items) - limit :] if limit > 0 else []
    dropped = items[: len(items) - limit]
    if not any(r.phase in ("Failed", "Cancelled") for r in kept):
        bad = next((r for r in reversed(dropped) if r.phase in ("Failed", "Cancelled")), None)
        if bad is not None:
            kept.insert(0, bad)
            return kept, len(dropped) - 1
    return kept, len(dropped)


def _compact(loop: LoopStatus, limit: int) -> None:
    kept, dropped = compact_history(loop.iterations, limit)
    if dropped:
        loop.iterations = kept
        loop.pruned_iterations += dropped
    loop.retained_iterations = len(loop.iterations)
