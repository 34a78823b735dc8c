"""What one `plan` call reads and accumulates (`PlanContext`), what it returns (`Plan`), and the
constants and helpers every concern of the planner shares."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal

from agentrun_operator.api import AgentRun, AgentRunStatus, StepStatus, WorkflowStep
from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner.actions import Action, EmitEvent, Requeue, Where
from agentrun_operator.planner.facts import Fact, RunPhaseChanged
from agentrun_operator.planner.job_uids import status_with_job_uids
from agentrun_operator.planner.observed import Observed
from agentrun_operator.planner.validate import Problem
from agentrun_operator.resolution import References

TERMINAL_RUN_PHASES: Final = frozenset({"Succeeded", "Failed", "Cancelled"})

TERMINAL_STEP_PHASES: Final = frozenset({"Succeeded", "Failed", "Skipped", "Cancelled"})

RESULT_REQUEUE_SECONDS: Final = 1.0

MAX_MESSAGE_CHARS: Final = 1024

REASON_CANCELLED: Final = "Cancelled"

REASON_STEP_FAILED: Final = "StepFailed"

StopMode = Literal["Graceful", "Immediate", "timeout", "budget"]


@dataclass(frozen=True)
class Plan:
    """The planner's answer: the status to write, the actions for the shell in order, and the facts
    (what happened, for metrics)."""

    status: AgentRunStatus
    actions: tuple[Action, ...]
    facts: tuple[Fact, ...] = ()

    def status_after(self, job_uids: Mapping[str, str]) -> AgentRunStatus:
        """The status to write once this plan's `CreateJob` actions are applied: `job_uids` (Job name
        -> the uid the API server answered with) recorded in the references to those Jobs
        (planner/job_uids.py). The plan itself is never edited."""
        return status_with_job_uids(self.status, job_uids)


@dataclass
class PlanContext:
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
    facts: list[Fact] = field(default_factory=list)
    requeue_after: float | None = None
    delete_reasons: dict[str, str] = field(default_factory=dict)
    delete_graces: dict[str, int] = field(default_factory=dict)
    """Jobs whose pods are deleted with this grace period (an immediate cancel), by Job name."""
    awaiting: list[str] = field(default_factory=list)
    """What every approval gate waiting after this plan asks (the AwaitingApproval condition)."""
    approvals_consumed: set[int] = field(default_factory=set)
    """Indices of spec.approvals judged by a waiting gate in this plan (planner/approval.py)."""

    @property
    def name(self) -> str:
        return str(self.run.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.run.metadata.get("namespace", ""))

    @property
    def uid(self) -> str:
        return str(self.run.metadata.get("uid", ""))

    def emit(
        self,
        type_: Literal["Normal", "Warning"],
        reason: str,
        message: str,
        where: Where | None = None,
        *,
        fold: bool = False,
    ) -> None:
        """Post an Event; `where` names the step, iteration and attempt it is about (None: the run);
        `fold`: a warm loop's routine progress, held and folded (shell/events.py)."""
        self.events.append(EmitEvent(type_, reason, clip(message), where, fold))

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
        facts = list(self.facts)
        previous = self.prior.phase if self.prior is not None else None
        if self.status.phase is not None and self.status.phase != previous:
            facts.append(RunPhaseChanged(previous, self.status.phase, self.status.reason))
        return Plan(self.status, tuple(actions), tuple(facts))


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def working_copy(prior: AgentRunStatus) -> AgentRunStatus:
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
        # outputs is replaced, never mutated in place (planner/outputs.py), so sharing it is safe
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
    if st.steps is not None:
        copy.steps = [_copy_step_status(child) for child in st.steps]
    return copy
