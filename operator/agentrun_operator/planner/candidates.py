"""loop.candidates in the planner (docs/concepts.md#candidates): best-of-N iterations.

An iteration of a loop with candidates is one Indexed Job of `count` pods; each pod's `main` works
on its own copy of the iteration's start checkpoint and its reporter records the copy's end as the
candidate's checkpoint (control/checkpointing.py). Once every pod has stopped, the planner reads each
candidate's envelope, counts every candidate's usage, asks `select` (CEL over the candidates whose
`main` succeeded) for the winner and records it in the iteration (`iterations[].candidates`). A second
Job then restores the winner's checkpoint over the workspace (jobs/promotion.py); only when it has
succeeded is the iteration recorded as succeeded, with the winner's control file deciding the loop as
any iteration's does. Both Jobs are the step's one Job in turn (`st.jobRef`), so the one-Job gate,
cancel and the TTLs treat them as they treat any attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from agentrun_operator import naming
from agentrun_operator.api import IterationCandidates, JobRef
from agentrun_operator.celeval import CANDIDATES_ROOT, CelError, compile_expression, evaluate_json, to_cel
from agentrun_operator.control.envelope import ControlEnvelope, decode_envelope
from agentrun_operator.jobs.promotion import build_promotion_job
from agentrun_operator.planner.actions import CreateJob
from agentrun_operator.planner.attempt_pod import planned_attempt, pod_control_path
from agentrun_operator.planner.attempt_results import (
    MAX_CAUSE_TAIL_BYTES,
    cancel_immediately,
    one_line_tail,
    pods_still_stopping,
    record_failure,
    record_success,
    refused_job_message,
    reporting_pod,
)
from agentrun_operator.planner.budgets import account_usage
from agentrun_operator.planner.checkpoints import record_checkpoint
from agentrun_operator.planner.context import RESULT_REQUEUE_SECONDS, PlanContext, clip
from agentrun_operator.planner.gating import gate_clear, succeeded_by_pod
from agentrun_operator.planner.loops import cel_context
from agentrun_operator.planner.observed import ObservedJob, ObservedPod
from agentrun_operator.planner.state import StepView

REASON_NO_CANDIDATE: Final = "NoCandidateSucceeded"
REASON_SELECT_FAILED: Final = "CandidateSelectFailed"
REASON_PROMOTION_FAILED: Final = "CandidatePromotionFailed"
PROMOTION_REQUEUE_SECONDS: Final = 2.0


def candidate_count(step: StepView) -> int:
    """How many candidates each iteration of the step runs (0: the step has none)."""
    loop = step.spec.loop
    if loop is None or loop.candidates is None or loop.checkpoint is None or not loop.checkpoint.enabled:
        return 0
    return loop.candidates.count


@dataclass(frozen=True)
class CandidateResult:
    """One candidate as its pod reported it."""

    index: int
    envelope: ControlEnvelope | None
    checkpoint: str | None
    """Its end checkpoint, when its `main` succeeded and the reporter recorded the copy."""
    why: str = ""
    """Why it lost before `select` (main failed, its copy not recorded, no report)."""

    @property
    def succeeded(self) -> bool:
        return self.checkpoint is not None

    @property
    def control(self) -> dict[str, Any] | None:
        envelope = self.envelope
        return envelope.control if envelope is not None and envelope.status == "found" else None


def _failed_why(pod: ObservedPod | None) -> str:
    if pod is None:
        return "its pod never reported"
    if pod.main_exit_code is not None and pod.main_exit_code != 0:
        tail = one_line_tail(pod.main_message or "", 200)
        return f"main exited with code {pod.main_exit_code}" + (f": {tail}" if tail else "")
    if pod.reason:
        return f"its pod failed ({pod.reason})"
    return "main did not end with code 0"


def candidate_results(ctx: PlanContext, step: StepView, job: ObservedJob) -> list[CandidateResult]:
    """Every candidate of the Job, by index."""
    path = pod_control_path(step)
    pods = ctx.observed.pods_of(job.name)
    out: list[CandidateResult] = []
    for index in range(candidate_count(step)):
        pod = reporting_pod([p for p in pods if p.completion_index == index], ctx.now)
        envelope = decode_envelope(pod.reporter_message, path) if pod is not None else None
        facts = envelope.checkpoint if envelope is not None else None
        found = facts.get("candidate") if isinstance(facts, dict) else None
        end: dict[str, Any] = found if isinstance(found, dict) else {}
        end_id = end.get("id")
        if pod is not None and pod.main_exit_code == 0 and isinstance(end_id, str) and "error" not in end:
            out.append(CandidateResult(index, envelope, end_id))
            continue
        why = _failed_why(pod)
        if pod is not None and pod.main_exit_code == 0:
            error = end.get("error")
            why = (
                f"its copy was not recorded: {error}"
                if isinstance(error, str)
                else "its copy was not recorded"
            )
        out.append(CandidateResult(index, envelope, None, why))
    return out


def select_winner(ctx: PlanContext, step: StepView, results: list[CandidateResult]) -> int | str:
    """The winner's index by `select`, or why there is none (one line)."""
    spec = step.spec.loop
    assert spec is not None and spec.candidates is not None
    expression = spec.candidates.select
    ok = [r for r in results if r.succeeded]
    try:
        context = cel_context(ctx, step, iteration_index=step.iteration, last_phase="Succeeded")
        context["candidates"] = to_cel([{"index": r.index, "control": r.control or {}} for r in ok])
        value = evaluate_json(compile_expression(expression, frozenset({CANDIDATES_ROOT})), context)
    except CelError as exc:
        return f"select: {exc}"
    indexes = [r.index for r in ok]
    if isinstance(value, bool) or not isinstance(value, int) or value not in indexes:
        return (
            f"select `{clip(expression, 200)}` gave {value!r}, not the index of a succeeded "
            f"candidate {indexes}"
        )
    return value


def observe_candidates(ctx: PlanContext, step: StepView, job: ObservedJob) -> bool:
    """The candidates' Job has ended: pick the winner and start its promotion, or fail the attempt.
    True when the step moved on (a failure recorded), False while it waits."""
    if pods_still_stopping(ctx, job):
        ctx.requeue(RESULT_REQUEUE_SECONDS)
        return False
    results = candidate_results(ctx, step, job)
    ok = [r for r in results if r.succeeded]
    lost = "; ".join(f"candidate {r.index}: {r.why}" for r in results if not r.succeeded)
    if not ok:
        if not _count_usage(ctx, step, results):
            return True
        cause = f"no candidate succeeded ({clip(lost, 600)})"
        return record_failure(ctx, step, job, cause, REASON_NO_CANDIDATE, usage_counted=True)
    winner = select_winner(ctx, step, results)
    if isinstance(winner, str):
        if not _count_usage(ctx, step, results):
            return True
        return record_failure(ctx, step, job, winner, REASON_SELECT_FAILED, usage_counted=True)
    best = next(r for r in ok if r.index == winner)
    if not _count_usage(ctx, step, [r for r in results if r.index != winner]):
        return True
    record = step.record()
    assert record is not None
    record_checkpoint(step, best.envelope)
    record.candidates = IterationCandidates(
        count=len(results),
        succeeded=[r.index for r in ok],
        winner=winner,
        checkpoint=best.checkpoint,
        promoted=False,
    )
    promotion = naming.promotion_job_name(job.name)
    step.st.job_ref = JobRef(name=promotion)
    others = f"; lost: {clip(lost, 300)}" if lost else ""
    step.st.message = clip(
        f"iteration {step.iteration}/{step.max_iterations}: candidate {winner} of {len(results)} "
        f"won{others}; putting its files into the workspace (Job {promotion})"
    )
    ctx.emit("Normal", "CandidateSelected", f"step {step.label}: {step.st.message}", step.where)
    _create_promotion(ctx, step, job.name, promotion)
    return False


def candidates_timed_out(ctx: PlanContext, step: StepView, job: ObservedJob, cause: str) -> bool:
    """The candidates' Job outlived `timeoutSeconds`: the attempt failed as any timed-out one does,
    with the usage of every candidate that reported before its pod was stopped."""
    if not _count_usage(ctx, step, candidate_results(ctx, step, job)):
        return True
    return record_failure(ctx, step, job, cause, usage_counted=True)


def _count_usage(ctx: PlanContext, step: StepView, results: list[CandidateResult]) -> bool:
    """Every listed candidate's usage counts in the budgets (the winner's when its iteration is
    recorded). False when unusable usage ended the step."""
    for result in results:
        whose = f"iteration {step.iteration}: candidate {result.index}'s control file"
        if not account_usage(ctx, step, result.control, whose):
            record = step.record()
            if record is not None:
                record.phase = "Failed"
                record.finished_at = ctx.now
                record.message = step.st.message
            return False
    return True


def _create_promotion(ctx: PlanContext, step: StepView, candidates_job: str, name: str) -> None:
    if not gate_clear(ctx, name):  # the candidates' pods are still leaving the volume
        ctx.requeue(PROMOTION_REQUEUE_SECONDS)
        return
    record = step.record()
    assert record is not None and record.candidates is not None and record.candidates.checkpoint is not None
    planned = planned_attempt(ctx, step, step.iteration, step.st.attempt)
    manifest = build_promotion_job(ctx.run, planned, ctx.config, record.candidates.checkpoint, candidates_job)
    if manifest is None:
        return
    ctx.writes.append(CreateJob(manifest))
    ctx.requeue(PROMOTION_REQUEUE_SECONDS)


def promoting(step: StepView) -> bool:
    """The iteration's winner is picked and its files are not in the workspace yet."""
    record = step.record() if step.loop is not None else None
    found = record.candidates if record is not None else None
    return (
        found is not None
        and found.winner is not None
        and not found.promoted
        and record is not None
        and record.phase == "Running"
    )


def observe_promotion(ctx: PlanContext, step: StepView) -> bool:
    """The winner's promotion Job: create it, wait for it, then record the iteration with the winner's
    control file (or fail the attempt). True when the step moved on."""
    st = step.st
    record = step.record()
    assert st.job_ref is not None and record is not None and record.candidates is not None
    name = st.job_ref.name
    candidates_job = record.job_ref.name if record.job_ref is not None else ""
    observed = ctx.observed.job(candidates_job)
    job = ctx.observed.job(name)
    if job is not None and st.job_ref.uid is not None and job.uid != st.job_ref.uid:
        job = None
    if ctx.stopping == "Immediate" and (job is None or not job.finished):
        return cancel_immediately(ctx, step, name)
    if job is None:
        if st.job_ref.uid is not None:
            return _promotion_failed(ctx, step, None, f"promotion Job {name} vanished before it finished")
        refusal = ctx.observed.refusal("Job", name)
        if refusal is not None:
            return _promotion_failed(ctx, step, None, refused_job_message(refusal))
        _create_promotion(ctx, step, candidates_job, name)
        return False
    st.job_ref.uid = job.uid
    if not job.finished:
        by_pod = succeeded_by_pod(ctx, job)
        if by_pod is None:
            if job.deleting:
                return _promotion_failed(
                    ctx, step, job, f"promotion Job {name} was deleted before it finished"
                )
            ctx.requeue(PROMOTION_REQUEUE_SECONDS * 5)
            return False
        job = by_pod
    if job.outcome != "Succeeded":
        return _promotion_failed(ctx, step, job, _promotion_cause(ctx, job))
    best = _winner(ctx, step)
    envelope = (
        best.envelope
        if best is not None and best.envelope is not None
        else decode_envelope(None, pod_control_path(step))
    )
    record.candidates = record.candidates.model_copy(update={"promoted": True})
    st.job_ref = JobRef(name=candidates_job, uid=observed.uid if observed is not None else None)
    record_success(ctx, step, observed or job, envelope)
    return True


def _promotion_cause(ctx: PlanContext, job: ObservedJob) -> str:
    for pod in ctx.observed.pods_of(job.name):
        if pod.main_exit_code not in (None, 0):
            tail = one_line_tail(pod.main_message or "", MAX_CAUSE_TAIL_BYTES)
            return f"the promotion of the winning candidate failed (exit code {pod.main_exit_code}): {tail}"
    return f"the promotion of the winning candidate failed: {job.message or f'Job {job.name} failed'}"


def _winner(ctx: PlanContext, step: StepView) -> CandidateResult | None:
    """The recorded winner as its pod reported it (read once the promotion has ended, not while it
    runs); None when the candidates' Job or the winner's pod is gone."""
    record = step.record()
    if record is None or record.candidates is None or record.job_ref is None:
        return None
    observed = ctx.observed.job(record.job_ref.name)
    results = candidate_results(ctx, step, observed) if observed is not None else []
    return next((r for r in results if r.index == record.candidates.winner), None)


def _promotion_failed(ctx: PlanContext, step: StepView, job: ObservedJob | None, cause: str) -> bool:
    """The attempt failed after its winner was picked: the winner's usage counts now (the others'
    counted at the pick), and a retry runs every candidate again from the iteration's start."""
    best = _winner(ctx, step)
    if not account_usage(ctx, step, best.control if best is not None else None):
        return True
    return record_failure(ctx, step, job, cause, REASON_PROMOTION_FAILED, usage_counted=True)
