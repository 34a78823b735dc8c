"""The static validation rules, written once and used twice.

Each rule is enforced by the apiserver (as a CRD `x-kubernetes-validations` CEL rule) and by the
pydantic models (as a validator with the very same message), so `kubectl apply` and the operator's
offline `agentrun validate` reject the same manifests with the same words. A rule's `anchor` is its
section in docs/api.md; messages point there.

Every rule guards its field accesses with `has()`: a missing required field is already reported by
the schema, and an unguarded access would add a confusing "no such key" error next to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from .base import DOCS_API, MAX_ITERATIONS_SCHEMA, MAX_LOOP_INTERVAL_SECONDS, MAX_PARAMETERS

# FieldValueDuplicate is left out on purpose: the apiserver prints it as a bare "Duplicate value",
# dropping the rule's message.
Reason = Literal["FieldValueInvalid", "FieldValueRequired", "FieldValueForbidden"]


@dataclass(frozen=True)
class Rule:
    """One CEL rule of a CRD schema node plus the human message shared with the models."""

    anchor: str
    """docs/api.md anchor; also the rule's stable id."""
    rule: str
    """CEL, evaluated by the apiserver with `self` bound to the schema node the rule sits on."""
    text: str
    """What is wrong and how to fix it, naming the field."""
    field_path: str | None = None
    """Relative JSON path the apiserver reports the error at (so the error names the exact field)."""
    reason: Reason | None = None
    k8s_only: str | None = None
    """Why cel-python cannot evaluate the rule (Kubernetes CEL extensions), if it cannot."""

    @property
    def message(self) -> str:
        """The text with the docs anchor appended."""
        return f"{self.text} See {DOCS_API}#{self.anchor}"

    def crd(self) -> dict[str, Any]:
        """The `x-kubernetes-validations` entry."""
        out: dict[str, Any] = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        if self.reason:
            out["reason"] = self.reason
        return out


def validations(*rules: Rule) -> dict[str, Any]:
    """`json_schema_extra` fragment attaching rules to a model or field."""
    return {"x-kubernetes-validations": [r.crd() for r in rules]}


LOOP_MAX_ITERATIONS: Final = Rule(
    anchor="loop-maxiterations",
    rule=(
        f"!has(self.maxIterations) || "
        f"(self.maxIterations >= 1 && self.maxIterations <= {MAX_ITERATIONS_SCHEMA})"
    ),
    text=(
        f"loop.maxIterations must be between 1 and {MAX_ITERATIONS_SCHEMA} (the operator may cap it lower, "
        "default 20); set a value in that range, e.g. maxIterations: 3."
    ),
    field_path=".maxIterations",
)

STEP_NAME: Final = Rule(
    anchor="step-name",
    rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
    text=(
        "steps[].name must be a DNS label: 1-63 lowercase letters, digits or '-', starting and ending "
        "with a letter or digit; rename the step, e.g. name: implement-2."
    ),
)

STEP_NAMES_UNIQUE: Final = Rule(
    anchor="step-name",
    rule="self.all(s, !has(s.name) || self.exists_one(t, has(t.name) && t.name == s.name))",
    text="workflow.steps[].name must be unique within the workflow; rename one of the steps sharing a name.",
)

CONDITION_ONE_OF: Final = Rule(
    anchor="loop-condition",
    rule="has(self.expression) != has(self.until)",
    text=(
        "loop.condition must set exactly one of expression (continue while true) or until (stop when true); "
        "keep one of them."
    ),
)

SOURCE_PATH_ABSOLUTE: Final = Rule(
    anchor="loop-condition-source",
    rule="!has(self.path) || self.path.startsWith('/')",
    text=(
        "loop.condition.source.path must be an absolute path starting with '/', "
        "e.g. /workspace/.agentrun/loop-control.json."
    ),
    field_path=".path",
)

STATE_VOLUME_NAMES_UNIQUE: Final = Rule(
    anchor="loop-state",
    rule="self.all(n, self.exists_one(m, m == n))",
    text="loop.state.volumeNames must not list a volume twice; remove the duplicate name.",
)

STATE_REQUIRED_NEEDS_VOLUMES: Final = Rule(
    anchor="loop-state",
    rule="!(has(self.required) && self.required) || (has(self.volumeNames) && size(self.volumeNames) > 0)",
    text=(
        "loop.state.required is true but loop.state.volumeNames is empty; list the pvc volume(s) that carry "
        "state between iterations, e.g. volumeNames: [workspace]."
    ),
    field_path=".volumeNames",
    reason="FieldValueRequired",
)

PARAMETERS_MAX: Final = Rule(
    anchor="parameters",
    rule=f"self.size() <= {MAX_PARAMETERS}",
    text=(
        f"parameters may hold at most {MAX_PARAMETERS} entries; pass bulk data in the implementation text "
        "or a mounted volume instead."
    ),
)

LOOPS_NEED_WORKFLOW_RUNTIME: Final = Rule(
    anchor="runtime-type",
    rule=(
        "!has(self.runtime) || !has(self.runtime.type) || self.runtime.type == 'workflow' || "
        "!has(self.workflow) || !has(self.workflow.steps) || !self.workflow.steps.exists(s, has(s.loop))"
    ),
    text=(
        "spec.runtime.type must be workflow when a step has a loop; "
        "set runtime.type: workflow or remove the loop."
    ),
    field_path=".runtime.type",
)

IMPLEMENTATION_ONE_OF: Final = Rule(
    anchor="implementation",
    rule="!(has(self.implementationSpecRef) && has(self.implementation))",
    text="set at most one of implementationSpecRef and implementation (inline text); remove one of them.",
)

VOLUME_NAMES_UNIQUE: Final = Rule(
    anchor="workload-volumes",
    rule="self.all(v, !has(v.name) || self.exists_one(w, has(w.name) && w.name == v.name))",
    text="workload.volumes[].name must be unique; rename or remove the duplicate volume.",
)

VOLUME_NAME: Final = Rule(
    anchor="workload-volumes",
    rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
    text=(
        "workload.volumes[].name must be a DNS label, as Kubernetes requires of pod volume names: 1-63 "
        "lowercase letters, digits or '-', starting and ending with a letter or digit; rename the volume, "
        "e.g. name: workspace."
    ),
)

VOLUME_PVC_CLAIM: Final = Rule(
    anchor="workload-volumes",
    rule="!has(self.type) || self.type != 'pvc' || has(self.claimName)",
    text="a volume of type pvc needs claimName (the PersistentVolumeClaim to mount); add claimName.",
    field_path=".claimName",
    reason="FieldValueRequired",
)

VOLUME_SECRET_NAME: Final = Rule(
    anchor="workload-volumes",
    rule="!has(self.type) || self.type != 'secret' || has(self.secretName)",
    text="a volume of type secret needs secretName (the Secret to mount); add secretName.",
    field_path=".secretName",
    reason="FieldValueRequired",
)

VOLUME_MOUNT_PATH: Final = Rule(
    anchor="workload-volumes",
    rule="!has(self.mountPath) || self.mountPath.startsWith('/')",
    text="workload.volumes[].mountPath must be an absolute path starting with '/', e.g. /workspace.",
    field_path=".mountPath",
)

PARAMETERS_NO_PROMPT: Final = Rule(
    anchor="parameters",
    rule="!('prompt' in self)",
    text=(
        "parameters.prompt is not allowed (as in the original API); put the task text in "
        "ImplementationSpec.spec.text or implementation.inline.text."
    ),
)

RUN_SYSTEM_PROMPT: Final = Rule(
    anchor="system-prompt",
    rule="!has(self.systemPrompt) && !has(self.systemPromptRef)",
    text=(
        "AgentRun-level systemPrompt/systemPromptRef overrides are not allowed; configure "
        "Agent.spec.defaults instead (defaults.systemPrompt or defaults.systemPromptRef)."
    ),
)

DEFAULTS_SYSTEM_PROMPT_ONE_OF: Final = Rule(
    anchor="system-prompt",
    rule="!(has(self.systemPrompt) && has(self.systemPromptRef))",
    text="Only one of systemPrompt or systemPromptRef may be set in Agent.spec.defaults; remove one of them.",
)

DEFAULTS_RETRIES_ONE_OF: Final = Rule(
    anchor="agent-defaults",
    rule="!(has(self.retries) && has(self.retryLimit))",
    text=(
        "Agent.spec.defaults.retries and defaults.retryLimit mean the same (retryLimit is the original "
        "API's name); set only one of them."
    ),
)

PROVIDER_COMMAND_OR_BINARY: Final = Rule(
    anchor="agentprovider",
    rule="!(has(self.command) && has(self.binary))",
    text=(
        "an AgentProvider runs either command (with image, args, env) or binary (the runner contract, "
        "with argsTemplate, envTemplate); remove one of command and binary."
    ),
)

CANCEL_STICKY: Final = Rule(
    anchor="immutability",
    rule="!has(oldSelf.cancel) || has(self.cancel)",
    text=(
        "spec.cancel cannot be removed once set (a cancelled run stays cancelled); "
        "you may only switch it between Graceful and Immediate."
    ),
    field_path=".cancel",
    reason="FieldValueForbidden",
)

STEP_KIND_ONE_OF: Final = Rule(
    anchor="step-kinds",
    rule=(
        "(has(self.steps) ? 1 : 0) + (has(self.switch) ? 1 : 0) + (has(self.approval) ? 1 : 0) + "
        "(has(self.workload) || has(self.implementation) || has(self.implementationSpecRef) ? 1 : 0) <= 1"
    ),
    text=(
        "a step is exactly one of a workload step (workload, implementation, implementationSpecRef), a group "
        "(steps), a switch or an approval gate; move the workload into a child step, or split the step in "
        "two."
    ),
)

APPROVAL_NO_LOOP: Final = Rule(
    anchor="approval",
    rule="!has(self.approval) || !has(self.loop)",
    text=(
        "loop is not allowed on an approval gate (it waits for one decision per iteration of the loop body "
        "holding it); put the gate in a group with the loop."
    ),
    field_path=".loop",
    reason="FieldValueForbidden",
)

APPROVAL_INPUT_NAME: Final = Rule(
    anchor="approval",
    rule="self.matches('^[A-Za-z_][A-Za-z0-9_]*$')",
    text=(
        "approval.inputs[].name must be an identifier (letters, digits, '_', not starting with a digit) so "
        "CEL can read it as steps.<gate>.control.outputs.<name>; rename it, e.g. name: verdict."
    ),
)

APPROVAL_INPUTS_UNIQUE: Final = Rule(
    anchor="approval",
    rule="!has(self.inputs) || self.inputs.all(i, self.inputs.exists_one(j, j.name == i.name))",
    text="approval.inputs[].name must be unique; rename or remove the duplicate input.",
    field_path=".inputs",
)

APPROVAL_TIMEOUT_APPROVE: Final = Rule(
    anchor="approval",
    rule=(
        "!has(self.onTimeout) || self.onTimeout != 'Approve' || !has(self.inputs) || "
        "!self.inputs.exists(i, has(i.required) && i.required)"
    ),
    text=(
        "approval.onTimeout: Approve cannot give a required input (nobody is there to give it); make the "
        "input optional with a default, or use onTimeout: Fail."
    ),
    field_path=".onTimeout",
)

REJECT_NEEDS_REASON: Final = Rule(
    anchor="approvals",
    rule="self.decision != 'Rejected' || (has(self.reason) && size(self.reason) > 0)",
    text=(
        "spec.approvals[].reason is required for a Rejected decision (the run's message and the next "
        "iteration show it); say why, e.g. agentrun reject NAME --step PATH --reason 'tests fail'."
    ),
    field_path=".reason",
    reason="FieldValueRequired",
)

APPROVALS_APPEND_ONLY: Final = Rule(
    anchor="approvals",
    rule="size(self) >= size(oldSelf) && oldSelf.all(i, old, self[i] == old)",
    text=(
        "spec.approvals is append-only: an earlier decision can never be changed, reordered or removed; "
        "append a new decision instead (agentrun approve|reject)."
    ),
    reason="FieldValueForbidden",
    k8s_only="two-variable comprehensions (Kubernetes >= 1.33)",
)

APPROVALS_STICKY: Final = Rule(
    anchor="approvals",
    rule="!has(oldSelf.approvals) || has(self.approvals)",
    text=("spec.approvals cannot be removed once set (it is append-only); append a new decision instead."),
    field_path=".approvals",
    reason="FieldValueForbidden",
)

SWITCH_NO_LOOP: Final = Rule(
    anchor="step-kinds",
    rule="!has(self.switch) || !has(self.loop)",
    text=(
        "loop is allowed on a workload step or a group, not on a switch; "
        "wrap the switch in a group with the loop."
    ),
    field_path=".loop",
    reason="FieldValueForbidden",
)

SWITCH_CASES: Final = Rule(
    anchor="switch",
    rule="has(self.cases) && size(self.cases) > 0",
    text="switch.cases must list at least one case; add a case {value, steps}, or use a group instead.",
    field_path=".cases",
    reason="FieldValueRequired",
)

# Model-only messages: a case value is free-form JSON in the CRD, which CEL cannot inspect cheaply.
SWITCH_CASE_SCALAR_MESSAGE: Final = (
    "switch.cases[].value must be a JSON scalar (string, number, boolean or null), not an object or list; "
    "switch on a field of the object instead, e.g. expression: steps.triage.control.kind. "
    f"See {DOCS_API}#switch"
)

SWITCH_CASES_UNIQUE_MESSAGE: Final = (
    "switch.cases[].value must be unique (only the first of equal values could ever run); "
    f"remove or change the duplicate case. See {DOCS_API}#switch"
)

BUDGET_POSITIVE: Final = Rule(
    anchor="loop-budget",
    rule=(
        "(has(self.maxTokens) || has(self.maxCostUSD)) && (!has(self.maxTokens) || self.maxTokens > 0) && "
        "(!has(self.maxCostUSD) || self.maxCostUSD > 0.0)"
    ),
    text=(
        "loop.budget needs maxTokens and/or maxCostUSD, each greater than 0; "
        "set e.g. maxTokens: 200000, or remove the budget."
    ),
)

OUTPUT_NAME: Final = Rule(
    anchor="loop-output",
    rule="self.matches('^[A-Za-z_][A-Za-z0-9_]*$')",
    text=(
        "loop.output.name must be an identifier (letters, digits, '_', not starting with a digit) so CEL can "
        "read it as outputs.<name>; rename it, e.g. name: tasks."
    ),
)

STALL_WINDOW: Final = Rule(
    anchor="loop-stall",
    rule="self >= 2 && self <= 100",
    text=(
        "loop.stall.window must be between 2 and 100 (one value is always equal to itself, so it takes two "
        "equal values in a row to see a stall); set e.g. window: 3."
    ),
)

LOOP_INTERVAL: Final = Rule(
    anchor="loop-intervalseconds",
    rule=f"self >= 0 && self <= {MAX_LOOP_INTERVAL_SECONDS}",
    text=(
        f"loop.intervalSeconds must be between 0 and {MAX_LOOP_INTERVAL_SECONDS} seconds, one day (a longer "
        "wait is a schedule, better served by a CronJob that creates AgentRuns); set e.g. intervalSeconds: "
        "300, or 0 to start the next iteration at once."
    ),
)

CHECKPOINT_KEEP: Final = Rule(
    anchor="loop-checkpoint",
    rule="self >= 1 && self <= 100",
    text=(
        "loop.checkpoint.keep must be between 1 and 100 (each loop keeps at least its current "
        "iteration's checkpoint); set e.g. keep: 10."
    ),
)

CHECKPOINT_EXCLUDE_RELATIVE: Final = Rule(
    anchor="loop-checkpoint",
    rule=(
        "self.all(p, !p.startsWith('/') && p != '..' && !p.startsWith('../') && !p.endsWith('/..') "
        "&& !p.contains('/../'))"
    ),
    text=(
        "loop.checkpoint.exclude entries are paths relative to the state volume's mountPath, inside it "
        "(no leading '/', no '..'); write e.g. exclude: [node_modules, .cache]."
    ),
)

CANDIDATES_COUNT: Final = Rule(
    anchor="loop-candidates",
    rule="self >= 2 && self <= 8",
    text=(
        "loop.candidates.count must be between 2 and 8 (each candidate is a pod with its own copy of "
        "the workspace); set e.g. count: 3."
    ),
)

CANDIDATES_NEED_CHECKPOINT: Final = Rule(
    anchor="loop-candidates",
    rule="!has(self.candidates) || (has(self.checkpoint) && has(self.checkpoint.mode) && "
    "self.checkpoint.mode == 'Files')",
    text=(
        "loop.candidates needs loop.checkpoint.mode: Files (each candidate starts from the iteration's "
        "checkpoint, and the winner's files are kept as one); add checkpoint: {mode: Files}."
    ),
    field_path=".candidates",
)

WARM_IDLE_SECONDS: Final = Rule(
    anchor="loop-warm",
    rule="self >= 1 && self <= 3600",
    text=(
        "loop.warm.idleSeconds must be between 1 and 3600 (the warm pod waits that long for the next "
        "iteration, then ends); set e.g. idleSeconds: 300."
    ),
)

WARM_EXCLUSIVE: Final = Rule(
    anchor="loop-warm",
    rule="!has(self.warm) || (has(self.warm.enabled) && !self.warm.enabled) || "
    "(!has(self.candidates) && (!has(self.checkpoint) || !has(self.checkpoint.mode) || "
    "self.checkpoint.mode == 'None'))",
    text=(
        "loop.warm cannot be combined with loop.checkpoint or loop.candidates yet (a checkpoint is "
        "recorded, and a candidate copied, by a new pod before its main starts); remove loop.warm, or "
        "set checkpoint.mode: None and remove candidates."
    ),
    field_path=".warm",
)

RESUME_ITERATION: Final = Rule(
    anchor="resume",
    rule="self >= 1",
    text=(
        "resumeFrom.iteration names an iteration of the source run's loop, 1 or more; see its "
        "checkpoints with agentrun checkpoints SOURCE."
    ),
)

NESTING_DEPTH_RANGE: Final = Rule(
    anchor="nesting",
    rule="self >= 1 && self <= 10",
    text="spec.workflow.maxNestingDepth must be between 1 and 10; set e.g. maxNestingDepth: 5 (the default).",
)


def immutable_field(field: str) -> Rule:
    """Transition rule for one spec field: it may not change once set.

    Transition rules on an optional field only run when both the old and the new object have it,
    so adding or removing a field is caught by `immutable_presence` on the spec itself.
    """
    return Rule(
        anchor="immutability",
        rule="self == oldSelf",
        text=(
            f"spec.{field} is immutable after creation (only spec.cancel and spec.approvals may change); "
            "create a new AgentRun with the changed spec instead."
        ),
        reason="FieldValueForbidden",
    )


def immutable_presence(fields: list[str]) -> Rule:
    """Spec-level transition rule: no field other than `cancel` may be added or removed."""
    rule = " && ".join(f"has(self.{f}) == has(oldSelf.{f})" for f in fields)
    return Rule(
        anchor="immutability",
        rule=rule,
        text=(
            "spec fields other than spec.cancel and spec.approvals cannot be added or removed after "
            "creation; create a new AgentRun with the changed spec instead."
        ),
        reason="FieldValueForbidden",
    )


ALL_STATIC_RULES: Final[tuple[Rule, ...]] = (
    LOOP_MAX_ITERATIONS,
    STEP_NAME,
    STEP_NAMES_UNIQUE,
    CONDITION_ONE_OF,
    SOURCE_PATH_ABSOLUTE,
    STATE_VOLUME_NAMES_UNIQUE,
    STATE_REQUIRED_NEEDS_VOLUMES,
    PARAMETERS_MAX,
    LOOPS_NEED_WORKFLOW_RUNTIME,
    IMPLEMENTATION_ONE_OF,
    VOLUME_NAMES_UNIQUE,
    VOLUME_NAME,
    VOLUME_PVC_CLAIM,
    VOLUME_SECRET_NAME,
    VOLUME_MOUNT_PATH,
    STEP_KIND_ONE_OF,
    SWITCH_NO_LOOP,
    SWITCH_CASES,
    BUDGET_POSITIVE,
    OUTPUT_NAME,
    NESTING_DEPTH_RANGE,
    STALL_WINDOW,
    LOOP_INTERVAL,
    CHECKPOINT_KEEP,
    CHECKPOINT_EXCLUDE_RELATIVE,
    CANDIDATES_COUNT,
    CANDIDATES_NEED_CHECKPOINT,
    WARM_IDLE_SECONDS,
    WARM_EXCLUSIVE,
    RESUME_ITERATION,
    APPROVAL_NO_LOOP,
    APPROVAL_INPUT_NAME,
    APPROVAL_INPUTS_UNIQUE,
    APPROVAL_TIMEOUT_APPROVE,
    REJECT_NEEDS_REASON,
    PARAMETERS_NO_PROMPT,
    RUN_SYSTEM_PROMPT,
)
"""AgentRun rules that need only the new object (the models enforce these too)."""

OTHER_KIND_RULES: Final[tuple[Rule, ...]] = (
    DEFAULTS_SYSTEM_PROMPT_ONE_OF,
    DEFAULTS_RETRIES_ONE_OF,
    PROVIDER_COMMAND_OR_BINARY,
)
"""Rules of the Agent and AgentProvider schemas (the models enforce these too)."""

TRANSITION_RULES: Final[tuple[Rule, ...]] = (CANCEL_STICKY, APPROVALS_STICKY, APPROVALS_APPEND_ONLY)
"""Fixed transition rules (the per-field immutability rules are generated from the spec's fields)."""
