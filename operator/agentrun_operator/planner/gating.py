"""Gating: one Job at a time. Which Job may be alive, which are strays to delete, when a new Job may
start (no other live or settling Job, no other non-terminal pod on the volume), and when a recorded
Job gets its TTL (docs/design.md#one-job-at-a-time)."""

from __future__ import annotations

from dataclasses import replace

from agentrun_operator import naming
from agentrun_operator.api import AgentRunStatus, StepStatus
from agentrun_operator.planner.actions import DeleteJob, SetJobTTL, Where
from agentrun_operator.planner.context import TERMINAL_RUN_PHASES, TERMINAL_STEP_PHASES, PlanContext
from agentrun_operator.planner.observed import ObservedJob
from agentrun_operator.planner.podgc import EndedJob, policy_of, ttl_changes
from agentrun_operator.planner.state import StepState, StepView, all_views, case_number, state_of


def _where(ctx: PlanContext, job: ObservedJob) -> Where | None:
    """The step, iteration and attempt of one of the run's Jobs (None for a step index not in the spec).

    A nested step's Job names its path in an annotation (`naming.ANNOTATION_STEP`); one without it
    (created by an older operator) is named by its top-level step and its address (`build@2i3-1`)."""
    if not 1 <= job.step_index <= len(ctx.steps):
        return None
    if job.label:
        return Where(naming.tree_path(job.label), job.iteration, job.attempt, job.label)
    name = ctx.steps[job.step_index - 1].name
    return Where(f"{name}@{job.path}" if job.path else name, job.iteration, job.attempt)


def active_job_name(ctx: PlanContext, views: list[StepView] | None = None) -> str | None:
    """The one Job that may be alive: the current attempt of the running workload step, if any."""
    if ctx.status.phase in TERMINAL_RUN_PHASES or ctx.status.workflow is None:
        return None
    for step in views if views is not None else all_views(ctx):
        if step.spec.kind != "workload":
            continue
        if state_of(step) is StepState.RUNNING and step.st.job_ref is not None:
            return step.st.job_ref.name
    return None


def delete_strays(ctx: PlanContext, expected: str | None, spared: frozenset[str] = frozenset()) -> None:
    """Delete every live Job of this run other than `expected` (orphans, cancelled, past deadline),
    and those `spared` (a warm pod told to end on its own, planner/warm.py)."""
    terminal = ctx.status.phase in TERMINAL_RUN_PHASES
    for job in ctx.observed.jobs:
        if not _live(ctx, job) or job.name == expected or job.name in spared:
            continue
        default = (
            f"the run {str(ctx.status.phase).lower()}; no Job may outlive it"
            if terminal
            else "not the active attempt of this run (one Job at a time)"
        )
        reason = ctx.delete_reasons.get(job.name, default)
        grace = ctx.delete_graces.get(job.name)
        uid = job.uid if grace is not None else None
        ctx.writes.insert(0, DeleteJob(job.name, reason, _where(ctx, job), grace, uid, foreground=job.warm))


def set_job_ttls(ctx: PlanContext) -> None:
    """Once a status records an attempt's result and its Job has ended, the Job may go (after the
    TTL the run's pod GC policy gives it: `planner/podgc.py`). The status may be the persisted one or
    the one this plan writes: the shell sets TTLs only after that write is committed
    (docs/operator.md#reconcile), so the iteration that records a result also sets its Job's TTL --
    no second reconcile and write per iteration for it. An attempt that succeeded by its pod counts
    as ended (`succeeded_by_pod`): the TTL only starts once the Job controller finishes the Job. A
    `settling` Job (decided, its pods maybe still stopping) gets none yet: its end opens the one-Job
    gate."""
    ended: list[EndedJob] = []
    by_name: dict[str, ObservedJob] = {}
    for job in ctx.observed.jobs:
        by_pod = succeeded_by_pod(ctx, job)
        if not (job.settled or by_pod is not None) or job.deleting:
            continue
        if not (result_recorded(ctx.prior, job) or result_recorded(ctx.status, job)):
            continue
        when = (by_pod or job).finished_at
        ended.append(
            EndedJob(
                job.name,
                (by_pod or job).outcome == "Succeeded",
                when,
                job.ttl_seconds_after_finished,
                job.warm,
            )
        )
        by_name[job.name] = job
    policy = policy_of(ctx.run, ctx.config)
    finished = ctx.status.phase in TERMINAL_RUN_PHASES
    for name, seconds in ttl_changes(policy, ended, finished):
        ctx.writes.append(SetJobTTL(name, seconds, _where(ctx, by_name[name])))


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
    if job.path:
        try:
            found = _nested_entry(st, job.path)
        except ValueError:  # a step-path label this operator did not write
            return False
        if isinstance(found, bool):
            return found
        st = found
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


def _nested_entry(top: StepStatus, path: str) -> StepStatus | bool:
    """The status entry of a nested step's Job from its address (`2i3-1`, see `naming.step_address`),
    or whether the Job's result is recorded already when an ancestor moved past it (True: the ancestor
    finished, or is in a later iteration or another case) or has not reached it (False)."""
    segments = [_parse_segment(segment) for segment in path.split("-")]
    st = top
    for k, (_, kind, number) in enumerate(segments[:-1]):  # segment k describes `st`
        if st.phase in TERMINAL_STEP_PHASES:
            return True
        if st.phase == "Pending" or st.steps is None:
            return False
        if kind == "i":
            current = st.loop.current_iteration if st.loop is not None else 1
            if number != current:
                return number < current
        elif case_number(st.case) != number:
            return True
        child = segments[k + 1][0]
        if not 1 <= child <= len(st.steps):
            return False
        st = st.steps[child - 1]
    return st


def _parse_segment(segment: str) -> tuple[int, str, int]:
    """`2i3` -> (2, "i", 3); `4c0` -> (4, "c", 0); `1` -> (1, "", 0)."""
    for kind in ("i", "c"):
        if kind in segment:
            index, number = segment.split(kind, 1)
            return int(index), kind, int(number)
    return int(segment), "", 0


def _live(ctx: PlanContext, job: ObservedJob) -> bool:
    """A Job whose outcome is open: not decided, not being deleted, its pod not succeeded. Only such
    a Job is a stray to delete; a decided one is being ended by the Job controller itself."""
    return not job.finished and not job.deleting and succeeded_by_pod(ctx, job) is None


def holds_volume(ctx: PlanContext, job: ObservedJob) -> bool:
    """A Job whose pods may still touch a volume: live, or decided but still settling (the Job
    controller adds `Failed`/`Complete` only once all its pods have terminated; it tracks each pod
    with a finalizer, so it misses none that the operator's informer may not have seen yet)."""
    if job.deleting or succeeded_by_pod(ctx, job) is not None:
        return False
    return not job.settled


def gate_clear(ctx: PlanContext, name: str) -> bool:
    """True when no other Job of the run may still run a pod and no other pod can still touch a
    volume: both the Job controller's word (`holds_volume`) and the pods observed must agree."""
    for job in ctx.observed.jobs:
        if job.name != name and holds_volume(ctx, job):
            return False
    return all(pod.job_name == name or pod.stopped for pod in ctx.observed.pods)


def succeeded_by_pod(ctx: PlanContext, job: ObservedJob) -> ObservedJob | None:
    """The attempt as Succeeded when its one pod has, before the Job controller says so.

    With `backoffLimit: 0` a Job has exactly one pod, so that pod's success (every container
    terminated, none still on the volume) is the attempt's success. Acting on it saves the Job
    controller's status batching (about a second) from every iteration's turnaround. Failures still
    wait for the Job's own verdict, which names the cause (e.g. DeadlineExceeded).

    The pod need not be `Succeeded` yet: once it has `reported` (every container ended, `main`
    with 0, the envelope in its status) the attempt is decided, whatever the kubelet's teardown,
    the phase or a later eviction or deletion of the pod says (docs/design.md#early-result).
    """
    pods = ctx.observed.pods_of(job.name)
    if len(pods) != 1 or job.deleting or job.completions != 1:  # candidates: every pod decides
        return None
    pod = pods[0]
    if not pod.reported and (pod.phase != "Succeeded" or pod.deleting):
        return None
    return replace(job, outcome="Succeeded", finished_at=job.finished_at or pod.finished_at or ctx.now)
