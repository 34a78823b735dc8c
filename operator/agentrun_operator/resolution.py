"""Spec resolution: what a run's spec means once defaults and layers are applied.

The effective steps (the implicit step of a `runtime.type: job` run), a step's effective workload,
parameters, retries and per-attempt timeout (step, else the Agent's default), the control path, and
the referenced objects (`References`). Validation, the planner and the Job builder all read the spec
through these, so each rule has one home and validation does not depend on manifest building.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from agentrun_operator.api import DEFAULT_CONTROL_PATH, AgentRun, LoopCondition, WorkflowStep, Workload
from agentrun_operator.api.resources import AgentProviderSpec, AgentSpec, ImplementationSpecSpec
from agentrun_operator.config import IMMEDIATE_CANCEL_GRACE_SECONDS, OperatorConfig

IMPLICIT_STEP_NAME: Final = "main"
"""Name of the single implicit step of a `runtime.type: job` run without `spec.workflow`."""


@dataclass(frozen=True)
class References:
    """The referenced objects of a run, already looked up and parsed (by the planner, from Observed)."""

    agent: AgentSpec | None = None
    provider: AgentProviderSpec | None = None
    implementation_specs: Mapping[str, ImplementationSpecSpec] = field(default_factory=dict)
    agent_name: str = ""
    provider_name: str = ""
    vcs_providers: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    """VersionControlProvider specs (manifest form) by name; None: looked up and not found."""
    secret_keys: Mapping[str, frozenset[str] | None] | None = None
    """The keys of each Secret the run's version control reads (None: not found); None: not checked."""


def effective_steps(run: AgentRun) -> list[WorkflowStep]:
    """The steps that run: the workflow's, or the implicit `main` step of a `runtime.type: job` run."""
    if run.spec.workflow is not None:
        return list(run.spec.workflow.steps)
    return [WorkflowStep(name=IMPLICIT_STEP_NAME)]


def implementation_spec_refs(run: AgentRun) -> Iterator[tuple[str, str]]:
    """(field path, name) of every ImplementationSpec the run names, nested steps included.

    The shell looks these up for the planner on every reconcile, so this is a plain recursion over
    the specs (not the scoped tree walk of validation)."""
    if run.spec.implementation_spec_ref is not None:
        yield "spec.implementationSpecRef.name", run.spec.implementation_spec_ref.name
    pending = [(f"spec.workflow.steps[{i}]", step) for i, step in enumerate(effective_steps(run))]
    if run.spec.workflow is None:
        pending = [("spec", step) for _, step in pending]
    while pending:
        path, step = pending.pop(0)
        if step.implementation_spec_ref is not None:
            yield f"{path}.implementationSpecRef.name", step.implementation_spec_ref.name
        pending[:0] = [(f"{path}.{rel}", child) for rel, child in step.children()]


def effective_workload(run_workload: Workload | None, step_workload: Workload | None) -> Workload:
    """The step's workload laid field by field over the run's (a step's `volumes` replace the run's)."""
    base = run_workload if run_workload is not None else Workload()
    if step_workload is None:
        return base
    update = {
        name: getattr(step_workload, name)
        for name in Workload.model_fields
        if getattr(step_workload, name) is not None
    }
    return base.model_copy(update=update)


def control_path(step: WorkflowStep) -> str:
    """Where the step's pod leaves its control file: the loop's source path, else the default.

    Non-loop steps get the default path too, so `steps.<name>.control` works for every step.
    """
    loop = step.loop
    if loop is not None and loop.condition is not None:
        return loop.condition.source.path
    return DEFAULT_CONTROL_PATH


def condition_cel(condition: LoopCondition) -> tuple[Literal["expression", "until"], str]:
    """The condition's CEL and its field: `expression` continues while true, `until` stops once true.

    The model guarantees exactly one of them is set.
    """
    if condition.expression is not None:
        return "expression", condition.expression
    assert condition.until is not None
    return "until", condition.until


def effective_parameters(run: AgentRun, step: WorkflowStep) -> dict[str, str]:
    """The run's parameters with the step's laid over them."""
    return {**(run.spec.parameters or {}), **(step.parameters or {})}


def step_timeout_seconds(step: WorkflowStep, refs: References) -> int:
    """Per-attempt timeout: the step's, else the Agent's default, else 0 (none)."""
    defaults = refs.agent.defaults if refs.agent is not None else None
    return step.effective_timeout_seconds(defaults.timeout_seconds if defaults else None)


def step_grace_seconds(step: WorkflowStep, config: OperatorConfig) -> int | None:
    """terminationGracePeriodSeconds of the step's pods: the step's, else the operator's setting;
    None when neither asks (the pod gets Kubernetes' default, as the original controller's did)."""
    return step.effective_grace_seconds(config.termination_grace_seconds)


def cancel_grace_seconds(step: WorkflowStep, config: OperatorConfig) -> int:
    """The grace period an immediate cancel deletes the step's running pods with: the pod's own when
    the step or the installation set one, else `IMMEDIATE_CANCEL_GRACE_SECONDS`
    (docs/design.md#grace-period)."""
    asked = step_grace_seconds(step, config)
    return IMMEDIATE_CANCEL_GRACE_SECONDS if asked is None else asked


def step_retries(step: WorkflowStep, refs: References) -> int:
    """Retries per iteration: the step's, else the Agent's default (retries or retryLimit), else 0."""
    defaults = refs.agent.defaults if refs.agent is not None else None
    return step.effective_retries(defaults.effective_retries if defaults else None)
