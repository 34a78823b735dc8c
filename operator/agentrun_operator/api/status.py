"""The AgentRun's status: the run's phase and conditions, each step's progress, each loop's counters
and bounded iteration history, collected outputs and usage. Written by the operator only; every model
ignores unknown fields, so an older operator reads a newer status (docs/concepts.md#status-history).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .base import StatusModel, Timestamp
from .common import Condition, JobRef

RunPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Cancelled"]
StepPhase = Literal[
    "Pending", "Running", "Retrying", "AwaitingApproval", "Succeeded", "Failed", "Skipped", "Cancelled"
]
IterationPhase = Literal["Pending", "Running", "Retrying", "Succeeded", "Failed", "Cancelled"]


class Usage(StatusModel):
    """Usage reported in control files (`usage`), summed; fields appear once something was reported."""

    input_tokens: int = Field(default=0, ge=0, description="Input tokens.")
    output_tokens: int = Field(default=0, ge=0, description="Output tokens.")
    cost_usd: float = Field(default=0.0, ge=0, alias="costUSD", description="Cost in USD.")

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def plus(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost_usd=round(self.cost_usd + other.cost_usd, 6),
        )


class IterationCheckpoint(StatusModel):
    """The checkpoint recorded at an iteration's start (loop.checkpoint), as its pod reported it."""

    id: str = Field(description="The checkpoint's id in the volume's store (agentrun checkpoints NAME).")
    files: int | None = Field(default=None, ge=0, description="Files in the checkpoint.")
    bytes: int | None = Field(default=None, ge=0, description="Bytes of the files in the checkpoint.")
    added_bytes: int | None = Field(
        default=None, ge=0, description="Bytes this checkpoint added to the store (what changed)."
    )
    restored: str | None = Field(
        default=None,
        description="The checkpoint the pod restored before main (a retry's own, or a resumed run's source).",
    )


class IterationCandidates(StatusModel):
    """loop.candidates: how the iteration's candidates went and which one the loop kept."""

    count: int = Field(ge=0, description="Candidates the iteration ran.")
    succeeded: list[int] | None = Field(
        default=None, description="Indexes of the candidates whose main succeeded (the ones select saw)."
    )
    winner: int | None = Field(
        default=None, ge=0, description="The index select picked: its files are the workspace now."
    )
    checkpoint: str | None = Field(
        default=None, description="The winner's end checkpoint (the next iteration's start)."
    )
    promoted: bool | None = Field(
        default=None,
        description="The winner's files were put into the workspace (by the iteration's promotion pod).",
    )


class IterationRecord(StatusModel):
    """One iteration of a looped step, kept in the bounded history."""

    index: int = Field(ge=1, description="1-based iteration number.")
    phase: IterationPhase = Field(description="Pending, Running, Retrying, Succeeded, Failed or Cancelled.")
    attempts: int = Field(default=0, ge=0, description="Attempts started for this iteration so far.")
    started_at: Timestamp | None = Field(default=None, description="When the first attempt started.")
    last_attempt_started_at: Timestamp | None = Field(
        default=None,
        description=(
            "When its latest attempt started, once it had more than one: the time before it went to "
            "the failed attempts and their backoff (agentrun status --timeline draws both)."
        ),
    )
    finished_at: Timestamp | None = Field(default=None, description="When the iteration finished.")
    message: str | None = Field(default=None, description="Outcome in words, e.g. why it failed.")
    job_ref: JobRef | None = Field(default=None, description="Job of the latest attempt.")
    usage: Usage | None = Field(default=None, description="Usage the iteration reported, if any.")
    steps: dict[str, str] | None = Field(
        default=None,
        description="For a loop body (a looped group): the phase each child ended this iteration with.",
    )
    commit: str | None = Field(
        default=None,
        description="The commit the iteration left the repository checkout at, when it made a new one.",
    )
    checkpoint: IterationCheckpoint | None = Field(
        default=None, description="loop.checkpoint: the checkpoint of the iteration's start."
    )
    candidates: IterationCandidates | None = Field(
        default=None, description="loop.candidates: the iteration's candidates and its winner."
    )
    pod: str | None = Field(
        default=None,
        description="loop.warm: the pod that ran the iteration's latest attempt (its Job is jobRef).",
    )
    warm: bool | None = Field(
        default=None,
        description=(
            "loop.warm: true when the latest attempt ran in a pod an earlier iteration started (no new "
            "Job or pod for it)."
        ),
    )


class LoopStatus(StatusModel):
    """Progress of a looped step; counters stay exact while the iteration history is compacted."""

    current_iteration: int = Field(default=0, ge=0, description="Iteration running or last run (1-based).")
    completed_iterations: int = Field(default=0, ge=0, description="Iterations that finished successfully.")
    max_iterations: int = Field(
        default=0,
        ge=0,
        description=(
            "The loop's bound: spec loop.maxIterations, or a forEach's item count once its items are "
            "frozen. A spec above the operator's cap is refused (InvalidSpec), never clamped."
        ),
    )
    # A str, not LoopStopReason: a status written by a newer operator (with a new reason) must parse.
    stop_reason: str | None = Field(
        default=None,
        description=(
            "Why the loop stopped: LoopMaxIterationsReached, LoopConditionFalse, LoopConditionError, "
            "LoopIterationFailed, LoopCancelled, LoopItemsExceedMaxIterations, LoopBudgetExhausted or "
            "LoopStalled."
        ),
    )
    retained_iterations: int = Field(default=0, ge=0, description="Entries currently kept in iterations.")
    pruned_iterations: int = Field(default=0, ge=0, description="Old entries dropped from iterations.")
    last_control: dict[str, Any] | None = Field(
        default=None, description="The last control payload read (JSON object)."
    )
    item_count: int | None = Field(
        default=None, ge=0, description="Number of forEach items (frozen at start)."
    )
    items: list[Any] | None = Field(
        default=None, description="The forEach items, evaluated once when the loop started (frozen)."
    )
    iterations: list[IterationRecord] = Field(
        default_factory=list, description="Newest iterations (bounded; the newest failure is always kept)."
    )
    next_iteration_at: Timestamp | None = Field(
        default=None,
        description=(
            "loop.intervalSeconds: when the next iteration starts; set while the loop waits between "
            "iterations (no pod runs), absent otherwise."
        ),
    )
    progress: list[Any] | None = Field(
        default=None,
        description=(
            "loop.stall: the progress values of the newest successful iterations (at most window, newest "
            "last; a value over 256 bytes of JSON is kept as its sha256)."
        ),
    )


class AttemptFailure(StatusModel):
    """Why the step's latest failed attempt failed, kept for the next attempt's AGENTRUN_PREVIOUS."""

    attempt: int = Field(ge=1, description="The attempt that failed (1-based).")
    reason: str = Field(
        description="Error, OOMKilled, DeadlineExceeded, JobVanished, JobDeleted, PodFailed, ..."
    )
    exit_code: int | None = Field(default=None, description="main's exit code, when it ran and ended.")
    message: str | None = Field(
        default=None, description="Why it failed, with the tail of main's termination message."
    )


class ApprovalStatus(StatusModel):
    """An approval gate's wait and the decision that ended it."""

    iteration: int = Field(
        default=1, ge=1, description="The iteration (of the loop body holding it) it waits in."
    )
    decision: str | None = Field(default=None, description="Approved, Rejected or TimedOut, once decided.")
    index: int | None = Field(
        default=None, ge=0, description="The spec.approvals entry applied (absent for a timeout)."
    )
    decided_at: Timestamp | None = Field(default=None, description="When the decision was applied.")


class StepStatus(StatusModel):
    """Progress of one workflow step."""

    name: str = Field(description="The step's name.")
    phase: StepPhase = Field(
        default="Pending",
        description=(
            "Pending, Running, Retrying, AwaitingApproval, Succeeded, Failed, Skipped or Cancelled."
        ),
    )
    attempt: int = Field(
        default=0, ge=0, description="Current attempt within the current iteration (1-based)."
    )
    started_at: Timestamp | None = Field(default=None, description="When the step started.")
    finished_at: Timestamp | None = Field(default=None, description="When the step finished.")
    reason: str | None = Field(default=None, description="Machine-readable reason of the phase.")
    message: str | None = Field(default=None, description="Human-readable detail.")
    next_retry_at: Timestamp | None = Field(
        default=None, description="When the next retry attempt may start."
    )
    job_ref: JobRef | None = Field(default=None, description="The step's current or last Job.")
    pod: str | None = Field(
        default=None,
        description=(
            "loop.warm on the loop body around the step: the pod that ran the step's latest attempt "
            "in this pass (a looping step keeps it per iteration, loop.iterations[].pod)."
        ),
    )
    warm: bool | None = Field(
        default=None,
        description=(
            "loop.warm on the loop body around the step: true when its latest attempt ran in a pod an "
            "earlier pass started (no new Job or pod for it)."
        ),
    )
    loop: LoopStatus | None = Field(default=None, description="Loop progress, for looped steps.")
    last_failure: AttemptFailure | None = Field(
        default=None,
        description="The current iteration's latest failed attempt (AGENTRUN_PREVIOUS of the retry).",
    )
    usage: Usage | None = Field(default=None, description="Usage summed over the step's iterations.")
    control: dict[str, Any] | None = Field(
        default=None,
        description=(
            "The control payload (JSON object) the step's last attempt left, for steps without a loop "
            "(looped steps keep it in loop.lastControl); read by later steps' CEL as steps.<name>.control."
        ),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    case: str | None = Field(
        default=None,
        description="For a switch: the branch taken, `cases[<i>]` (0-based) or `default`.",
    )
    approval: ApprovalStatus | None = Field(
        default=None, description="For an approval gate: its wait and the decision that ended it."
    )
    steps: list[StepStatus] | None = Field(
        default=None,
        description=(
            "For a group or a switch: its children's progress (for a loop body, in the current or last "
            "iteration; earlier iterations keep their children's phases in loop.iterations[].steps)."
        ),
    )


StepStatus.model_rebuild()


class WorkflowStatus(StatusModel):
    """Progress of the workflow as a whole."""

    phase: RunPhase | None = Field(
        default=None, description="Pending, Running, Succeeded, Failed or Cancelled."
    )
    steps: list[StepStatus] = Field(default_factory=list, description="One entry per spec step, in order.")
    outputs: dict[str, list[Any]] | None = Field(
        default=None,
        description="Collected outputs (loop.output): one value per successful iteration, by name.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    pruned_outputs: dict[str, int] | None = Field(
        default=None,
        description=(
            "Collected values dropped (oldest first) to keep the status within its budget, by output "
            "name; outputs.<name> holds the values kept."
        ),
    )
    usage: Usage | None = Field(default=None, description="Usage summed over the whole run.")
    approvals_judged: int | None = Field(
        default=None,
        ge=0,
        description=(
            "How many spec.approvals entries the operator has judged (applied to a waiting gate, or "
            "refused with an Event); later entries are new."
        ),
    )


class ArtifactStatus(StatusModel):
    """An output artifact the run's pods left (AgentProvider outputArtifacts)."""

    name: str = Field(description="The artifact's name.")
    path: str | None = Field(default=None, description="Its path in the container.")
    key: str | None = Field(default=None, description="Storage key, from the provider.")
    url: str | None = Field(default=None, description="Where it can be fetched, from the provider.")
    size: int | None = Field(default=None, ge=0, description="Size in bytes, when the file was found.")
    digest: str | None = Field(default=None, description="sha256:<hex> of the file, when it was found.")
    step: str | None = Field(default=None, description="The step (path) whose pod left it.")
    iteration: int | None = Field(default=None, ge=1, description="The iteration that left it, for loops.")


class VcsStatus(StatusModel):
    """The run's repository, as resolved from its VersionControlProvider."""

    provider: str | None = Field(default=None, description="The VersionControlProvider's name.")
    repository: str | None = Field(default=None, description="owner/name of the repository.")
    base_branch: str | None = Field(default=None, description="Branch the work starts from.")
    head_branch: str | None = Field(default=None, description="Branch the work is pushed to.")
    mode: str | None = Field(default=None, description="read-write, read-only or none.")
    commit: str | None = Field(default=None, description="The newest commit an iteration reported.")


class ContractStatus(StatusModel):
    """The task contract's keys, as checked against the run's parameters."""

    required_keys: list[str] | None = Field(default=None, description="Keys the contract requires.")
    missing_keys: list[str] | None = Field(default=None, description="Required keys the parameters lack.")


_FREE_FORM: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}


class AgentRunStatus(StatusModel):
    """Observed state of an AgentRun, written by the operator only."""

    phase: RunPhase | None = Field(
        default=None, description="Pending, Running, Succeeded, Failed or Cancelled."
    )
    reason: str | None = Field(default=None, description="Machine-readable reason, e.g. InvalidSpec.")
    message: str | None = Field(default=None, description="Human-readable detail, e.g. how to fix the spec.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Standard conditions, e.g. InvalidSpec, Duplicate.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(default=None, description="metadata.generation last acted on.")
    started_at: Timestamp | None = Field(default=None, description="When the first Job was created.")
    finished_at: Timestamp | None = Field(default=None, description="When the run reached a final phase.")
    workflow: WorkflowStatus | None = Field(default=None, description="Per-step progress.")
    current_step: str | None = Field(
        default=None, description="Name of the active step, or of the last one run (printer column Step)."
    )
    iteration: str | None = Field(
        default=None,
        description="Iteration of the current looped step, current/max, e.g. 3/8 (printer column Iteration).",
    )
    updated_at: Timestamp | None = Field(default=None, description="When the status was last written.")
    artifacts: list[ArtifactStatus] | None = Field(
        default=None, description="Output artifacts the pods left (name, path, size, digest)."
    )
    vcs: VcsStatus | None = Field(default=None, description="The run's repository and its newest commit.")
    spec_hash: str | None = Field(default=None, description="sha256 of the spec the run was started with.")
    system_prompt_hash: str | None = Field(
        default=None, description="sha256 of the system prompt given to the pods."
    )
    runner: dict[str, Any] | None = Field(
        default=None, description="The runner contract in use (free-form).", json_schema_extra=_FREE_FORM
    )
    runtime_ref: dict[str, Any] | None = Field(
        default=None,
        description="Reference to the runtime's own object (free-form).",
        json_schema_extra=_FREE_FORM,
    )
    contract: ContractStatus | None = Field(
        default=None, description="The task contract's required and missing keys."
    )
