"""The AgentRun kind: a workflow of steps, each run as Jobs, optionally looping over a shared PVC.

Here: the spec, its steps, groups and switches. A step's `loop` is in `loop`, the status in `status`.
Field names, defaults and limits follow docs/design.md#api; the static rules live in `rules` and are checked
here and in the generated CRD alike.
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from . import rules
from .approval import MAX_APPROVALS as MAX_APPROVALS
from .approval import ApprovalDecision, StepApproval
from .base import (
    API_VERSION,
    DNS_LABEL_MAX,
    DNS_LABEL_PATTERN,
    MAX_CEL_LENGTH,
    MAX_NAME_LIST,
    MAX_PARAMETERS,
    MAX_STEPS,
    NAME_MAX,
    ApiModel,
    ApiVersion,
)
from .checkpoint import ResumeFrom
from .common import ObjectRef, SystemPromptRef
from .errors import format_validation_error
from .implementation import ImplementationFields
from .loop import StepLoop
from .status import AgentRunStatus
from .workload import Workload

_DNS_LABEL_RE: Final = re.compile(DNS_LABEL_PATTERN)

RuntimeType = Literal["workflow", "job", "temporal", "custom"]
SUPPORTED_RUNTIMES: Final = ("workflow", "job")
"""The runtime types this operator runs; temporal and custom are accepted by the schema (the original
API has them) and refused with InvalidSpec (docs/api.md#runtime-type)."""
VcsMode = Literal["read-write", "read-only", "none"]
MAX_SYSTEM_PROMPT: Final = 16384
MAX_GOAL_OBJECTIVE: Final = 8192
CancelMode = Literal["Graceful", "Immediate"]
DEFAULT_NESTING_DEPTH: Final = 5
MAX_NESTING_DEPTH: Final = 10
MAX_CASES: Final = 50
MAX_TERMINATION_GRACE_SECONDS: Final = 3600
"""Bound of a step's terminationGracePeriodSeconds (and the operator's default): an hour."""
JsonScalar = str | int | float | bool | None


Parameters = dict[str, str]


def _check_parameters(value: Parameters | None) -> Parameters | None:
    """Shared by run and step parameters: the bound keeps env and CEL contexts small, and `prompt` is
    refused as by the original API (the task text belongs in the implementation)."""
    if value is not None and len(value) > MAX_PARAMETERS:
        raise ValueError(rules.PARAMETERS_MAX.message)
    if value is not None and "prompt" in value:
        raise ValueError(rules.PARAMETERS_NO_PROMPT.message)
    return value


# maxProperties in the CRD has no CEL twin: the apiserver skips all CEL rules of an object that breaks
# a schema limit, so a CEL twin of this bound could never report; the models give the human message.
_PARAMETERS_SCHEMA: dict[str, Any] = {
    "maxProperties": MAX_PARAMETERS,
    **rules.validations(rules.PARAMETERS_NO_PROMPT),
}


class InlineImplementation(ImplementationFields):
    """Task given directly in the run (or a step): the fields of an ImplementationSpec's spec."""


class Implementation(ApiModel):
    """Task text given in the run instead of an ImplementationSpec."""

    inline: InlineImplementation = Field(
        description="The task: text plus optional summary, description, criteria, labels, source, contract."
    )


class Runtime(ApiModel):
    """How the run executes. Loops are only valid with the `workflow` runtime."""

    type: RuntimeType = Field(
        default="workflow",
        description=(
            "workflow (ordered steps, loops allowed) or job (single Job, no loops); temporal and custom "
            "are accepted and refused as not supported by this operator (InvalidSpec)."
        ),
    )
    config: dict[str, Any] | None = Field(
        default=None, description="Free-form runtime settings, passed through unchanged."
    )


def _check_child_names(value: list[WorkflowStep] | None) -> list[WorkflowStep] | None:
    """Sibling names key status entries, Job names and CEL `steps.<name>`."""
    if value is not None:
        names = [s.name for s in value]
        if len(set(names)) != len(names):
            raise ValueError(rules.STEP_NAMES_UNIQUE.message)
    return value


_CHILD_STEPS_DESCRIPTION: Final = (
    "Child steps, run in order; each has the fields of a step (the operator validates them before "
    "the first Job)."
)


class SwitchCase(ApiModel):
    """A branch of a switch: its steps run when `value` equals the switch expression's result."""

    value: Any = Field(description="A JSON scalar (string, number, boolean or null) compared with ==.")
    steps: list[WorkflowStep] = Field(
        min_length=1,
        max_length=MAX_STEPS,
        description=_CHILD_STEPS_DESCRIPTION,
    )

    @field_validator("value")
    @classmethod
    def _scalar(cls, value: Any) -> Any:
        if isinstance(value, dict | list):
            raise ValueError(rules.SWITCH_CASE_SCALAR_MESSAGE)
        return value

    @field_validator("steps")
    @classmethod
    def _unique(cls, value: list[WorkflowStep]) -> list[WorkflowStep]:
        _check_child_names(value)
        return value


class SwitchDefault(ApiModel):
    """What a switch runs when no case matches."""

    steps: list[WorkflowStep] = Field(
        min_length=1, max_length=MAX_STEPS, description=_CHILD_STEPS_DESCRIPTION
    )

    @field_validator("steps")
    @classmethod
    def _unique(cls, value: list[WorkflowStep]) -> list[WorkflowStep]:
        _check_child_names(value)
        return value


class StepSwitch(ApiModel):
    """Run the first case whose value equals the expression's result, else the default."""

    model_config = ConfigDict(json_schema_extra=rules.validations(rules.SWITCH_CASES))

    expression: str = Field(
        min_length=1, max_length=MAX_CEL_LENGTH, description="CEL giving a JSON scalar to match."
    )
    cases: list[SwitchCase] = Field(
        default_factory=list,
        max_length=MAX_CASES,
        description="Cases in order; the first whose value equals the result runs (at least one).",
    )
    default: SwitchDefault | None = Field(
        default=None, description="Runs when no case matches; without it no match fails with SwitchNoMatch."
    )

    @model_validator(mode="after")
    def _cases(self) -> StepSwitch:
        if not self.cases:
            raise ValueError(rules.SWITCH_CASES.message)
        seen: list[Any] = []
        for case in self.cases:
            if any(same_scalar(case.value, other) for other in seen):
                raise ValueError(rules.SWITCH_CASES_UNIQUE_MESSAGE)
            seen.append(case.value)
        return self


def same_scalar(a: Any, b: Any) -> bool:
    """CEL equality of JSON scalars: numbers by value (1 == 1.0), booleans never equal numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


class WorkflowStep(ApiModel):
    """One step of the workflow; runs as one Job per iteration attempt."""

    model_config = ConfigDict(
        json_schema_extra=rules.validations(
            rules.IMPLEMENTATION_ONE_OF, rules.STEP_KIND_ONE_OF, rules.SWITCH_NO_LOOP, rules.APPROVAL_NO_LOOP
        )
    )

    name: str = Field(
        description="DNS label, unique in the workflow; used in Job names and CEL (steps.<name>).",
        json_schema_extra={
            "maxLength": DNS_LABEL_MAX,
            "minLength": 1,
            "pattern": DNS_LABEL_PATTERN,
            **rules.validations(rules.STEP_NAME),
        },
    )
    implementation_spec_ref: ObjectRef | None = Field(
        default=None, description="ImplementationSpec with this step's task text (overrides the run's)."
    )
    implementation: Implementation | None = Field(
        default=None, description="Inline task text for this step (overrides the run's)."
    )
    parameters: Parameters | None = Field(
        default=None,
        description="Parameters merged over the run's (at most 100).",
        json_schema_extra=_PARAMETERS_SCHEMA,
    )
    workload: Workload | None = Field(
        default=None, description="Overrides the run's workload field by field (volumes as a whole)."
    )
    retries: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Extra attempts per iteration after a failure; default Agent defaults.retries, else 0.",
    )
    retry_backoff_seconds: int = Field(
        default=0,
        ge=0,
        le=86400,
        description="Seconds to wait before a retry attempt (default 0: retry at once, as the original API).",
    )
    timeout_seconds: int | None = Field(
        default=None,
        ge=0,
        description="Deadline of one attempt in seconds, 0 = none; default the Agent's defaults, else 0.",
    )
    termination_grace_period_seconds: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TERMINATION_GRACE_SECONDS,
        description=(
            "Seconds an attempt's pod gets between SIGTERM and SIGKILL when it is stopped (timeout, "
            "cancel, deletion); default the operator's (AGENTS_CONTROLLER_TERMINATION_GRACE_SECONDS), "
            "unset: Kubernetes' (30), and 3 for an immediate cancel."
        ),
    )
    when: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CEL_LENGTH,
        description="CEL; the step is Skipped when it evaluates to false.",
    )
    loop: StepLoop | None = Field(
        default=None, description="Run the step (a workload step or a group) as a loop of iterations."
    )
    steps: list[WorkflowStep] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_STEPS,
        description="Makes the step a group: child steps run in order (with loop, the loop body).",
    )
    switch: StepSwitch | None = Field(
        default=None, description="Makes the step a switch: runs the first matching case, else the default."
    )
    approval: StepApproval | None = Field(
        default=None,
        description="Makes the step an approval gate: no Job runs; it waits for agentrun approve|reject.",
    )
    always_run: bool | None = Field(
        default=None,
        description="In a group: run this child even after an earlier child failed (default false).",
    )

    @field_validator("steps")
    @classmethod
    def _child_names(cls, value: list[WorkflowStep] | None) -> list[WorkflowStep] | None:
        return _check_child_names(value)

    @property
    def kind(self) -> Literal["workload", "group", "switch", "approval"]:
        """What the step is: a switch, a group (`steps`), an approval gate, else a workload step (Jobs)."""
        if self.switch is not None:
            return "switch"
        if self.approval is not None:
            return "approval"
        return "group" if self.steps is not None else "workload"

    def children(self) -> list[tuple[str, WorkflowStep]]:
        """Child steps with their field path relative to this step (`steps[0]`, `switch.cases[1].steps[0]`).

        A switch lists every case's steps, then the default's."""
        out: list[tuple[str, WorkflowStep]] = []
        for i, child in enumerate(self.steps or []):
            out.append((f"steps[{i}]", child))
        if self.switch is not None:
            for c, case in enumerate(self.switch.cases):
                out += [(f"switch.cases[{c}].steps[{i}]", child) for i, child in enumerate(case.steps)]
            if self.switch.default is not None:
                out += [(f"switch.default.steps[{i}]", ch) for i, ch in enumerate(self.switch.default.steps)]
        return out

    @field_validator("name")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        """Mirror of the CRD's pattern/maxLength rule; the name ends up in Job names and labels."""
        if len(value) > DNS_LABEL_MAX or not _DNS_LABEL_RE.fullmatch(value):
            raise ValueError(rules.STEP_NAME.message)
        return value

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, value: Parameters | None) -> Parameters | None:
        """Mirror of the CRD's maxProperties, with the human message."""
        return _check_parameters(value)

    @model_validator(mode="after")
    def _implementation(self) -> WorkflowStep:
        """Mirror of the CRD rule: two task sources would be ambiguous."""
        if self.implementation_spec_ref is not None and self.implementation is not None:
            raise ValueError(rules.IMPLEMENTATION_ONE_OF.message)
        has_workload = any(
            v is not None for v in (self.workload, self.implementation, self.implementation_spec_ref)
        )
        kinds = (
            has_workload + (self.steps is not None) + (self.switch is not None) + (self.approval is not None)
        )
        if kinds > 1:
            raise ValueError(rules.STEP_KIND_ONE_OF.message)
        if self.switch is not None and self.loop is not None:
            raise ValueError(rules.SWITCH_NO_LOOP.message)
        if self.approval is not None and self.loop is not None:
            raise ValueError(rules.APPROVAL_NO_LOOP.message)
        return self

    def effective_retries(self, agent_default: int | None = None) -> int:
        """Retries for this step: its own, else the Agent's default, else 0."""
        if self.retries is not None:
            return self.retries
        return agent_default if agent_default is not None else 0

    def effective_grace_seconds(self, operator_default: int | None) -> int | None:
        """The pod's terminationGracePeriodSeconds: its own, else the operator's default (None: not
        set, Kubernetes' default)."""
        if self.termination_grace_period_seconds is not None:
            return self.termination_grace_period_seconds
        return operator_default

    def effective_timeout_seconds(self, agent_default: int | None = None) -> int:
        """Per-attempt timeout: its own, else the Agent's default, else 0 (none)."""
        if self.timeout_seconds is not None:
            return self.timeout_seconds
        return agent_default if agent_default is not None else 0


class Workflow(ApiModel):
    """The ordered steps of the run."""

    steps: list[WorkflowStep] = Field(
        min_length=1,
        max_length=MAX_STEPS,
        description="Steps, run one after another (at most 50).",
        json_schema_extra=rules.validations(rules.STEP_NAMES_UNIQUE),
    )
    timeout_seconds: int = Field(
        default=0,
        ge=0,
        description="Deadline of the whole workflow in seconds, 0 = none; on expiry it stops like Graceful.",
    )
    max_nesting_depth: int | None = Field(
        default=None,
        description="How deep groups and switches may nest (top-level steps are depth 1); 1..10, default 5.",
        json_schema_extra=rules.validations(rules.NESTING_DEPTH_RANGE),
    )

    @field_validator("max_nesting_depth")
    @classmethod
    def _depth_range(cls, value: int | None) -> int | None:
        """Mirror of the CRD rule."""
        if value is not None and not 1 <= value <= MAX_NESTING_DEPTH:
            raise ValueError(rules.NESTING_DEPTH_RANGE.message)
        return value

    @field_validator("steps")
    @classmethod
    def _unique_names(cls, value: list[WorkflowStep]) -> list[WorkflowStep]:
        """Mirror of the CRD rule: names key status, Job names and CEL `steps.<name>`."""
        names = [s.name for s in value]
        if len(set(names)) != len(names):
            raise ValueError(rules.STEP_NAMES_UNIQUE.message)
        return value


class Goal(ApiModel):
    """The run's objective, and a token budget for the whole run."""

    objective: str = Field(
        min_length=1,
        max_length=MAX_GOAL_OBJECTIVE,
        description="What the run is for, in words; given to every pod (AGENTRUN_GOAL_OBJECTIVE).",
    )
    token_budget: int | None = Field(
        default=None,
        ge=1,
        json_schema_extra={"format": "int64"},
        description=(
            "Tokens (input + output, from the pods' reported usage) the whole run may use; when spent "
            "the run stops with GoalTokenBudgetExhausted."
        ),
    )


class VcsPolicy(ApiModel):
    """Whether the run needs a repository, and what access its pods get."""

    required: bool | None = Field(
        default=None,
        description="When true, a run with no usable VersionControlProvider is InvalidSpec (default false).",
    )
    mode: VcsMode | None = Field(
        default=None,
        description="read-write (default), read-only (no write credential) or none (no repository access).",
    )


PodGCStrategy = Literal["OnPodSuccess", "OnPodCompletion", "OnRunCompletion"]
MAX_POD_GC_RETENTION_SECONDS: Final = 90 * 24 * 3600
"""The longest a kept pod may be retained (90 days): longer is almost surely a unit mistake."""
MAX_POD_GC_KEPT_PODS: Final = 1000


class PodGC(ApiModel):
    """Which iteration pods stay after their attempt is recorded (docs/api.md#podgc)."""

    strategy: PodGCStrategy | None = Field(
        default=None,
        description=(
            "OnPodSuccess (default): failed attempts keep their pods, succeeded ones get the Job TTL; "
            "OnPodCompletion: every attempt gets the Job TTL; OnRunCompletion: every pod stays until "
            "the run finishes, then gets the Job TTL. Unset: the installation's "
            "(AGENTS_CONTROLLER_POD_GC_STRATEGY)."
        ),
    )
    retention_seconds: int | None = Field(
        default=None,
        ge=0,
        le=MAX_POD_GC_RETENTION_SECONDS,
        description=(
            "How long a kept pod stays after its attempt ended (0..7776000); unset: the installation's "
            "(AGENTS_CONTROLLER_POD_GC_RETENTION_SECONDS), where 0 means until the run is deleted."
        ),
    )
    max_kept_pods: int | None = Field(
        default=None,
        ge=0,
        le=MAX_POD_GC_KEPT_PODS,
        description=(
            "At most this many kept pods per run (0..1000); the oldest past it are released. Unset: "
            "the installation's (AGENTS_CONTROLLER_POD_GC_MAX_KEPT_PODS)."
        ),
    )


class AgentRunSpec(ApiModel):
    """Desired state of an AgentRun; immutable after creation except `cancel` and `approvals` (appended)."""

    model_config = ConfigDict(
        json_schema_extra=rules.validations(
            rules.LOOPS_NEED_WORKFLOW_RUNTIME, rules.IMPLEMENTATION_ONE_OF, rules.RUN_SYSTEM_PROMPT
        )
    )

    agent_ref: ObjectRef | None = Field(
        default=None, description="The Agent to run; optional when a workload gives image and command."
    )
    implementation_spec_ref: ObjectRef | None = Field(
        default=None, description="ImplementationSpec holding the task text."
    )
    implementation: Implementation | None = Field(
        default=None, description="Inline task text instead of an ImplementationSpec."
    )
    runtime: Runtime = Field(
        default_factory=Runtime,
        description="Execution runtime; loops need type workflow.",
        json_schema_extra={"default": {}},
    )
    parameters: Parameters | None = Field(
        default=None,
        description="String parameters for the task and CEL (run.parameters), at most 100.",
        json_schema_extra=_PARAMETERS_SCHEMA,
    )
    workload: Workload | None = Field(default=None, description="Default workload of every step.")
    workflow: Workflow | None = Field(default=None, description="The steps to run.")
    resume_from: ResumeFrom | None = Field(
        default=None,
        description=(
            "Start from another run's checkpoint: the workspace is the source run's state at the end "
            "of the named iteration before this run's first pod starts (agentrun resume)."
        ),
    )
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=NAME_MAX,
        description="At most one run per (namespace, agentRef, key) ever starts Jobs.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, description="Delete the AgentRun this many seconds after it finished."
    )
    pod_gc: PodGC | None = Field(
        default=None,
        alias="podGC",
        description="Which iteration pods are kept after their attempt (docs/api.md#podgc).",
    )
    cancel: CancelMode | None = Field(
        default=None,
        description="Graceful (finish the current iteration) or Immediate; may be set after creation.",
    )
    goal: Goal | None = Field(
        default=None, description="The run's objective (to every pod) and a run-wide token budget."
    )
    secrets: list[str] | None = Field(
        default=None,
        max_length=MAX_NAME_LIST,
        description=(
            "Secrets given to every pod of the run as envFrom; each must be listed in the Agent's "
            "security.allowedSecrets."
        ),
    )
    memory_ref: ObjectRef | None = Field(
        default=None, description="A Memory; accepted and passed on, not interpreted (docs/api.md#memoryref)."
    )
    vcs_ref: ObjectRef | None = Field(
        default=None, description="The VersionControlProvider of the run's repository (before the Agent's)."
    )
    vcs_policy: VcsPolicy | None = Field(
        default=None, description="Whether a repository is required, and the pods' access mode."
    )
    system_prompt: str | None = Field(
        default=None,
        max_length=MAX_SYSTEM_PROMPT,
        description="Not allowed on an AgentRun (as in the original); set Agent.spec.defaults.systemPrompt.",
    )
    system_prompt_ref: SystemPromptRef | None = Field(
        default=None,
        description="Not allowed on an AgentRun; set Agent.spec.defaults.systemPromptRef.",
    )
    approvals: list[ApprovalDecision] | None = Field(
        default=None,
        max_length=MAX_APPROVALS,
        description=(
            "Decisions about approval gates (agentrun approve|reject), append-only: earlier entries never "
            "change."
        ),
        json_schema_extra=rules.validations(rules.APPROVALS_APPEND_ONLY),
    )

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, value: Parameters | None) -> Parameters | None:
        """Mirror of the CRD's maxProperties, with the human message."""
        return _check_parameters(value)

    @model_validator(mode="after")
    def _rules(self) -> AgentRunSpec:
        """Mirrors of the CRD's spec-level rules."""
        if self.implementation_spec_ref is not None and self.implementation is not None:
            raise ValueError(rules.IMPLEMENTATION_ONE_OF.message)
        if self.runtime.type != "workflow" and self.has_loops():
            raise ValueError(rules.LOOPS_NEED_WORKFLOW_RUNTIME.message)
        if self.system_prompt is not None or self.system_prompt_ref is not None:
            raise ValueError(rules.RUN_SYSTEM_PROMPT.message)
        return self

    def has_loops(self) -> bool:
        """True when any step (at any depth) loops (the feature flag gates these runs)."""
        return self.workflow is not None and any(_loops(s) for s in self.workflow.steps)


def _loops(step: WorkflowStep) -> bool:
    return step.loop is not None or any(_loops(child) for _, child in step.children())


SwitchCase.model_rebuild()
SwitchDefault.model_rebuild()
StepSwitch.model_rebuild()
WorkflowStep.model_rebuild()


class AgentRun(ApiModel):
    """An AgentRun object as stored by the apiserver."""

    model_config = ConfigDict(extra="ignore")

    api_version: ApiVersion = Field(default=API_VERSION, description=API_VERSION)
    kind: Literal["AgentRun"] = Field(default="AgentRun", description="AgentRun")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: AgentRunSpec = Field(description="Desired state.")
    status: AgentRunStatus | None = Field(default=None, description="Observed state.")


def parse_agentrun(obj: dict[str, Any]) -> AgentRun:
    """Validate a manifest or API object into an AgentRun (raises pydantic.ValidationError)."""
    return AgentRun.model_validate(obj)


def agentrun_errors(obj: dict[str, Any]) -> list[str]:
    """Validation problems of a manifest as `field.path: message` lines; empty when valid."""
    try:
        parse_agentrun(obj)
    except ValidationError as err:
        return format_validation_error(err)
    return []
