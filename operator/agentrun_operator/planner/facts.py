"""What happened in one plan, as structured facts for the shell's metrics (never parsed from Events).

Each fact is reported once, with the Event that tells a user the same thing: re-planning a persisted
status reports nothing again, so the shell may count facts after the status write succeeds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from agentrun_operator.api import RunPhase

IterationResult = Literal["Succeeded", "Failed", "Retrying"]


@dataclass(frozen=True)
class IterationFinished:
    """An attempt of an iteration ended: Succeeded, Failed (no retry left) or Retrying (one is due).

    `iteration` is 1 for a step without a loop. `duration_seconds`: from the attempt's Job starting
    to its pod ending (`attempt_duration`); None for a loop body's pass or an attempt no Job ran.
    """

    step: str
    iteration: int
    attempt: int
    result: IterationResult
    duration_seconds: float | None = field(default=None, compare=False)  # a measurement, not what happened


@dataclass(frozen=True)
class LoopStopped:
    """A looped step's loop ended, with its `status...loop.stopReason`."""

    step: str
    reason: str
    completed_iterations: int


@dataclass(frozen=True)
class RunPhaseChanged:
    """The run's phase differs from the persisted one (`previous` is None for a new run)."""

    previous: RunPhase | None
    phase: RunPhase
    reason: str | None


@dataclass(frozen=True)
class NextIterationRequested:
    """The Job `job` of `iteration` (after a succeeded iteration of the same loop) was requested.

    `previous_finished_at` is when the previous iteration's pod ended (its main container's finish
    time as the kubelet reported it, whole seconds): the shell measures the turnaround from there to
    the moment it created `job`.
    """

    step: str
    iteration: int
    job: str
    previous_finished_at: datetime


@dataclass(frozen=True)
class UsageReported:
    """A succeeded attempt reported usage in its control file (summed into status)."""

    step: str
    tokens: int
    cost_usd: float


StepKind = Literal["workload", "group", "switch", "approval"]


@dataclass(frozen=True)
class StepEnded:
    """A step (at any depth) reached its final phase: Succeeded, Failed, Cancelled or Skipped.

    `path` is the run path without iterations (`review/fix`), `label` the same with the iteration of
    every looping ancestor (`review/iteration 3/fix`); `kind` is the construct; `depth` is 1 for a
    top-level step; `case` is the branch a switch took (`cases[1]` or `default`), else None;
    `iterations` the completed iterations of a looped step (None without a loop).
    """

    path: str
    label: str
    kind: StepKind
    depth: int
    phase: str
    reason: str | None
    case: str | None = None
    iterations: int | None = None


@dataclass(frozen=True)
class SwitchCaseTaken:
    """A switch evaluated its expression and took a branch (`cases[<i>]` or `default`)."""

    path: str
    label: str
    depth: int
    case: str
    value: str  # the expression's result, as compact JSON


@dataclass(frozen=True)
class ApprovalRequested:
    """An approval gate started waiting (`path` without iterations, `label` with them)."""

    path: str
    label: str


@dataclass(frozen=True)
class ApprovalDecided:
    """A gate's wait ended (Approved, Rejected, TimedOut), or a spec.approvals entry was Refused."""

    path: str
    decision: str
    index: int | None = None  # the spec.approvals entry (None for a timeout)


Fact = (
    IterationFinished
    | LoopStopped
    | RunPhaseChanged
    | NextIterationRequested
    | UsageReported
    | StepEnded
    | SwitchCaseTaken
    | ApprovalRequested
    | ApprovalDecided
)
