"""The status to write once the shell has created the Jobs a plan asked for: the uid the API server
gave each one recorded in the references that name it (docs/design.md#data-direction).

A plan cannot know the uid of a Job it asks to create: the API server assigns it. The shell applies
the plan's `CreateJob` actions, then hands the uids it got back to `status_with_job_uids`, and writes
what that returns; it never edits the planner's status itself. Recording the uid in the same write
saves a second status write per iteration (the next plan would otherwise record it on its next look
at the Job, `attempts.observe_attempt`), and it takes no second plan: this is the one part of the
status that depends on an answer of the API server, and it is a pure function of the plan's status
and that answer. Done on the model, not on a dumped dict, so the written status needs no validation
to be remembered by the shell.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrun_operator.api import AgentRunStatus, IterationRecord, JobRef, StepStatus


def _ref(ref: JobRef | None, uids: Mapping[str, str]) -> JobRef | None:
    if ref is not None and not ref.uid and uids.get(ref.name):
        return ref.model_copy(update={"uid": uids[ref.name]})
    return ref


def _iteration(record: IterationRecord, uids: Mapping[str, str]) -> IterationRecord:
    ref = _ref(record.job_ref, uids)
    return record if ref is record.job_ref else record.model_copy(update={"job_ref": ref})


def _step(step: StepStatus, uids: Mapping[str, str]) -> StepStatus:
    update: dict[str, Any] = {}
    ref = _ref(step.job_ref, uids)
    if ref is not step.job_ref:
        update["job_ref"] = ref
    if step.loop is not None:
        records = [_iteration(r, uids) for r in step.loop.iterations]
        if any(a is not b for a, b in zip(records, step.loop.iterations, strict=True)):
            update["loop"] = step.loop.model_copy(update={"iterations": records})
    if step.steps:
        children = [_step(child, uids) for child in step.steps]
        if any(a is not b for a, b in zip(children, step.steps, strict=True)):
            update["steps"] = children
    return step.model_copy(update=update) if update else step


def status_with_job_uids(status: AgentRunStatus, uids: Mapping[str, str]) -> AgentRunStatus:
    """`status` with `uids` (Job name -> the uid its create or adopt answered with) filled into the
    Job references that name those Jobs and have no uid yet. A copy of only what changes: `status`
    itself is never mutated, and the same object is returned when nothing is filled."""
    workflow = status.workflow
    if workflow is None or not uids:
        return status
    steps = [_step(step, uids) for step in workflow.steps]
    if all(a is b for a, b in zip(steps, workflow.steps, strict=True)):
        return status
    return status.model_copy(update={"workflow": workflow.model_copy(update={"steps": steps})})
