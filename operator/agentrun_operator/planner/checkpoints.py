"""loop.checkpoint in the planner (docs/concepts.md#checkpoints): what each attempt's pod restores
and records before `main`, the checkpoint its pod reported into the iteration's record, and the
first pod of a resumed run (`spec.resumeFrom`). Pure: the pod does the work (control/checkpointing.py).

The status is a working copy that shares records with the persisted one (`context.working_copy`), so
a record's checkpoint is replaced, never changed in place.
"""

from __future__ import annotations

from typing import Any, Final

from agentrun_operator import naming
from agentrun_operator.api import AgentRun, IterationCheckpoint, WorkflowStep
from agentrun_operator.control.envelope import ControlEnvelope
from agentrun_operator.jobs.checkpoint_args import CheckpointPlan
from agentrun_operator.planner.context import PlanContext
from agentrun_operator.planner.state import StepView

REASON_CHECKPOINT_FAILED: Final = "CheckpointFailed"


def _address(step: StepView) -> str:
    return naming.step_address(step.ancestors, step.index)


def checkpoint_plan(ctx: PlanContext, step: StepView, iteration: int, attempt: int) -> CheckpointPlan | None:
    """The attempt's checkpoint, for a looping step whose loop asks for one; None otherwise.

    Every attempt of an iteration names the iteration's checkpoint. With `onFailedAttempt: Restore` an
    attempt after the first restores it, and must find it once an earlier attempt reported it
    (`expected`). The first iteration of a resumed run's resumed loop starts from the source run's
    checkpoint until an attempt has recorded its own."""
    loop = step.spec.loop
    if loop is None or loop.checkpoint is None or not loop.checkpoint.enabled or step.loop is None:
        return None
    spec = loop.checkpoint
    address = _address(step)
    own = naming.checkpoint_id(ctx.name, address, iteration)
    record = step.record() if step.loop.current_iteration == iteration else None
    reported = record.checkpoint if record is not None else None
    restore = spec.on_failed_attempt == "Restore" and attempt > 1
    source = resume_source(ctx.run, step) if iteration == 1 and reported is None else None
    return CheckpointPlan(
        checkpoint_id=own,
        prefix=naming.checkpoint_prefix(ctx.name, address),
        keep=spec.keep,
        owner=str(ctx.run.metadata.get("uid") or ""),
        restore_own=restore,
        expected=restore and reported is not None and reported.id == own,
        restore_from=source,
        exclude=tuple(spec.exclude or ()),
        candidates=loop.candidates.count if loop.candidates is not None else 0,
    )


def resumed_step(run: AgentRun) -> WorkflowStep | None:
    """The top-level step a resumed run starts from its source's checkpoint: `resumeFrom.step`, else
    the first looping step with checkpoints."""
    resume = run.spec.resume_from
    if resume is None or run.spec.workflow is None:
        return None
    for step in run.spec.workflow.steps:
        loop = step.loop
        if loop is None or loop.checkpoint is None or not loop.checkpoint.enabled:
            continue
        if resume.step is None or resume.step == step.name:
            return step
    return None


def resume_source(run: AgentRun, step: StepView) -> str | None:
    """The source run's checkpoint a resumed run's step starts from: the one recorded at the start of
    the iteration after `resumeFrom.iteration`, which is that iteration's end."""
    resume = run.spec.resume_from
    if resume is None or step.parent is not None or resumed_step(run) is not step.spec:
        return None
    return naming.checkpoint_id(resume.run, _address(step), resume.iteration + 1)


def record_checkpoint(step: StepView, envelope: ControlEnvelope | None) -> None:
    """The checkpoint the attempt's pod reported, into the iteration's record (kept from the first
    attempt that recorded it; a later attempt adds what it restored)."""
    facts = envelope.checkpoint if envelope is not None else None
    record = step.record()
    if not isinstance(facts, dict) or record is None or not isinstance(facts.get("id"), str):
        return
    before = record.checkpoint
    fresh = IterationCheckpoint(
        id=facts["id"],
        files=_count(facts.get("files")),
        bytes=_count(facts.get("bytes")),
        added_bytes=_count(facts.get("addedBytes")),
        restored=facts["restored"] if isinstance(facts.get("restored"), str) else None,
    )
    if before is not None and before.id == fresh.id:
        fresh = before.model_copy(update={"restored": fresh.restored or before.restored})
    record.checkpoint = fresh


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
