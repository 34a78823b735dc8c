"""The rules of the original v1alpha1 API that this operator applies before the first Job.

Two groups, both pure:

- `static_problems(run)`: what needs only the run (runtime types this operator does not run) — part
  of `agentrun validate`;
- `reference_problems(run, refs)`: what needs the Agent, its provider and the ImplementationSpecs
  (the Agent's `security` allow lists, the task contract's `requiredKeys`, the provider's input
  files, a task for every workload step when the provider runs the runner contract) — checked once
  they resolved.

`provider_problems(spec)` holds the provider's own rules, for `agentrun validate` of a provider
manifest too. Every rule is documented in docs/api.md (anchors below) and docs/migration.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final

from agentrun_operator.api import AgentRun
from agentrun_operator.api.agentrun import SUPPORTED_RUNTIMES
from agentrun_operator.api.implementation import ImplementationFields
from agentrun_operator.api.resources import AgentProviderSpec, AgentSecurity
from agentrun_operator.planner.contract import contract_check
from agentrun_operator.planner.observed import Observed
from agentrun_operator.planner.tree import StepNode, walk
from agentrun_operator.problem import Problem
from agentrun_operator.problem import api as _api
from agentrun_operator.resolution import References, effective_parameters, effective_workload

TEMPLATE_ANNOTATION: Final = "agents.proompteng.ai/template"
REASON_TEMPLATE: Final = "Template"
REASON_RUNTIME_NOT_SUPPORTED: Final = "RuntimeNotSupported"
REASON_MISSING_REQUIRED_METADATA: Final = "MissingRequiredMetadata"
REASON_NOT_ALLOWED: Final = "NotAllowedByAgent"


def is_template(run: AgentRun) -> bool:
    """An AgentRun annotated `agents.proompteng.ai/template: "true"` is a template: it never runs."""
    annotations = run.metadata.get("annotations")
    if not isinstance(annotations, dict):
        return False
    value = annotations.get(TEMPLATE_ANNOTATION)
    return isinstance(value, str) and value.strip().lower() == "true"


def _workload_steps(run: AgentRun) -> Iterator[StepNode]:
    for node in walk(run):
        if node.step.kind == "workload":
            yield node


# ----------------------------------------------------------------------------------- static


def static_problems(run: AgentRun) -> Iterator[Problem]:
    """The run-only rules of the original API (docs/api.md#runtime-type)."""
    runtime = run.spec.runtime.type
    if runtime not in SUPPORTED_RUNTIMES:
        yield Problem(
            "spec.runtime.type",
            runtime,
            f"runtime.type {runtime} is not supported by this operator (it runs workflow and job)",
            "set spec.runtime.type: workflow (steps, loops) or job (one Job)",
            _api("runtime-type"),
            reason=REASON_RUNTIME_NOT_SUPPORTED,
        )


def _task_problems(run: AgentRun, provider_name: str) -> Iterator[Problem]:
    """The runner contract needs a task: every workload step gets one from the run or itself."""
    run_task = run.spec.implementation is not None or run.spec.implementation_spec_ref is not None
    for node in _workload_steps(run):
        step = node.step
        if run_task or step.implementation is not None or step.implementation_spec_ref is not None:
            continue
        yield Problem(
            "spec.implementationSpecRef"
            if run.spec.workflow is None
            else f"{node.field_path}.implementation",
            None,
            f"AgentProvider {provider_name!r} runs the runner contract, which needs a task, but step "
            f"{node.path!r} has none (spec.implementationSpecRef or spec.implementation is required)",
            "set spec.implementationSpecRef or spec.implementation (or the step's own)",
            _api("implementation"),
        )


# ----------------------------------------------------------------------------------- provider


def provider_problems(spec: AgentProviderSpec, path: str = "spec") -> Iterator[Problem]:
    """The provider's own rules: input files at absolute, distinct paths."""
    seen: dict[str, int] = {}
    for i, item in enumerate(spec.input_files or []):
        if not item.path.startswith("/") and "{{" not in item.path:
            yield Problem(
                f"{path}.inputFiles[{i}].path",
                item.path,
                "an input file's path must be absolute (it is mounted at that path in the container)",
                f"write it as an absolute path, e.g. /workspace/{item.path.lstrip('./')}",
                _api("agentprovider"),
            )
        if item.path in seen:
            yield Problem(
                f"{path}.inputFiles[{i}].path",
                item.path,
                f"inputFiles[{seen[item.path]}] has the same path",
                "give each input file its own path",
                _api("agentprovider"),
            )
        seen.setdefault(item.path, i)


def _collides(path: str, mount: str) -> bool:
    """A file at a volume's mount path, or a volume mounted inside the file's path."""
    path, mount = path.rstrip("/") or "/", mount.rstrip("/") or "/"
    return path == mount or mount.startswith(path + "/")


def _input_file_collisions(run: AgentRun, provider: AgentProviderSpec) -> Iterator[Problem]:
    """An input file mounted at (or inside) a volume's mount path would hide it or be hidden."""
    for node in _workload_steps(run):
        workload = effective_workload(run.spec.workload, node.step.workload)
        for volume in workload.volumes or []:
            for i, item in enumerate(provider.input_files or []):
                if item.path.startswith("/") and _collides(item.path, volume.mount_path):
                    yield Problem(
                        f"AgentProvider spec.inputFiles[{i}].path",
                        item.path,
                        f"the input file collides with the mount path of volume {volume.name!r} "
                        f"of step {node.path!r}",
                        "move the input file to another path, or mount the volume elsewhere",
                        _api("agentprovider"),
                    )


# ----------------------------------------------------------------------------------- references


def _allowed(allow: list[str] | None, value: str, *, fold: bool = False) -> bool:
    if allow is None:
        return True
    if fold:
        return value.strip().lower() in {a.strip().lower() for a in allow}
    return value in allow


def _secret_problems(run: AgentRun, agent_name: str, security: AgentSecurity | None) -> Iterator[Problem]:
    allow = security.allowed_secrets if security is not None else None
    for i, name in enumerate(run.spec.secrets or []):
        if allow is not None and name not in allow:
            yield Problem(
                f"spec.secrets[{i}]",
                name,
                f"Secret {name!r} is not allowed by Agent {agent_name!r} (security.allowedSecrets: "
                f"{sorted(allow) or 'none'})",
                f"add {name!r} to Agent {agent_name!r} spec.security.allowedSecrets, "
                "or remove it from spec.secrets",
                _api("secrets"),
                reason=REASON_NOT_ALLOWED,
            )


def _service_account_problems(run: AgentRun, refs: References, agent_name: str) -> Iterator[Problem]:
    security = refs.agent.security if refs.agent is not None else None
    allow = security.allowed_service_accounts if security is not None else None
    if allow is None:
        return
    provider_sa = None
    if refs.provider is not None and refs.provider.workload is not None:
        provider_sa = refs.provider.workload.service_account_name
    reported: set[str] = set()
    for node in _workload_steps(run):
        workload = effective_workload(run.spec.workload, node.step.workload)
        account = workload.service_account_name or provider_sa
        if account is None or account in allow or account in reported:
            continue
        reported.add(account)
        if node.step.workload is not None and node.step.workload.service_account_name is not None:
            where = f"{node.field_path}.workload.serviceAccountName"
        elif workload.service_account_name is not None:
            where = "spec.workload.serviceAccountName"
        else:
            where = "AgentProvider spec.workload.serviceAccountName"
        yield Problem(
            where,
            account,
            f"service account {account!r} is not allowed by Agent {agent_name!r} "
            f"(security.allowedServiceAccounts: {sorted(allow) or 'none'})",
            f"add {account!r} to Agent {agent_name!r} spec.security.allowedServiceAccounts, "
            "or use an allowed one",
            _api("secrets"),
            reason=REASON_NOT_ALLOWED,
        )


def step_tasks(
    run: AgentRun, refs: References
) -> Iterator[tuple[StepNode, str, ImplementationFields | None]]:
    """Each workload step's task (the step's, else the run's), with the field path it comes from;
    None when it names an ImplementationSpec that was not found (reported elsewhere) or has none."""
    specs: Mapping[str, ImplementationFields] = refs.implementation_specs
    for node in _workload_steps(run):
        step = node.step
        for inline, ref, where in (
            (step.implementation, step.implementation_spec_ref, node.field_path),
            (run.spec.implementation, run.spec.implementation_spec_ref, "spec"),
        ):
            if inline is not None:
                yield node, f"{where}.implementation.inline", inline.inline
                break
            if ref is not None:
                yield node, f"{where}.implementationSpecRef", specs.get(ref.name)
                break
        else:
            yield node, "", None


def _source_problems(run: AgentRun, refs: References, agent_name: str) -> Iterator[Problem]:
    security = refs.agent.security if refs.agent is not None else None
    allow = security.allowed_implementation_source_providers if security is not None else None
    if allow is None:
        return
    reported: set[str] = set()
    for _, where, task in step_tasks(run, refs):
        if task is None or task.source is None or where in reported:
            continue
        reported.add(where)
        if _allowed(allow, task.source.provider, fold=True):
            continue
        yield Problem(
            f"{where}.source.provider" if where.endswith(".inline") else where,
            task.source.provider,
            f"implementation source provider {task.source.provider!r} is not allowed by Agent {agent_name!r} "
            f"(security.allowedImplementationSourceProviders: {sorted(allow) or 'none'})",
            f"add {task.source.provider!r} to Agent {agent_name!r} "
            "spec.security.allowedImplementationSourceProviders, or use a task from an allowed source",
            _api("secrets"),
            reason=REASON_NOT_ALLOWED,
        )


def _contract_problems(run: AgentRun, refs: References) -> Iterator[Problem]:
    reported: set[tuple[str, tuple[str, ...]]] = set()
    for node, where, task in step_tasks(run, refs):
        if task is None or task.contract is None:
            continue
        check = contract_check(task, effective_parameters(run, node.step))
        key = (where, check.missing_keys)
        if not check.missing_keys or key in reported:
            continue
        reported.add(key)
        params = "spec.parameters" if node.step.parameters is None else f"{node.field_path}.parameters"
        yield Problem(
            params,
            list(check.missing_keys),
            f"missing required metadata keys: {', '.join(check.missing_keys)} (the task's "
            f"contract.requiredKeys, from {where}, for step {node.path!r})",
            "set them in spec.parameters (or the step's parameters), or under a name a contract mapping "
            "copies to them",
            _api("implementation-contract"),
            reason=REASON_MISSING_REQUIRED_METADATA,
        )


def _system_prompt_problems(agent_name: str, refs: References, observed: Observed) -> Iterator[Problem]:
    """The Agent's systemPromptRef names an existing ConfigMap or Secret with that key."""
    defaults = refs.agent.defaults if refs.agent is not None else None
    ref = defaults.system_prompt_ref if defaults is not None else None
    if ref is None or f"{ref.kind}/{ref.name}" not in observed.object_keys:
        return  # none, or not checked (no RBAC to read it)
    keys = observed.object_keys[f"{ref.kind}/{ref.name}"]
    path = f"Agent {agent_name} spec.defaults.systemPromptRef"
    if keys is None:
        yield Problem(
            f"{path}.name",
            ref.name,
            f"{ref.kind} {ref.name!r} (the system prompt of Agent {agent_name!r}) does not exist in the "
            "run's namespace",
            f"create {ref.kind} {ref.name!r} with the key {ref.key!r}, or correct systemPromptRef",
            _api("system-prompt"),
            missing=f"{ref.kind}/{ref.name}",
        )
    elif ref.key not in keys:
        yield Problem(
            f"{path}.key",
            ref.key,
            f"{ref.kind} {ref.name!r} (the system prompt of Agent {agent_name!r}) has no key {ref.key!r} "
            f"(it has {', '.join(sorted(keys)) or 'none'})",
            f"add the key {ref.key!r} to {ref.kind} {ref.name!r}, or name an existing key",
            _api("system-prompt"),
        )


def reference_problems(
    run: AgentRun, refs: References, observed: Observed | None = None
) -> Iterator[Problem]:
    """The rules that need the resolved Agent, provider and ImplementationSpecs (and, for the
    system prompt, the observed ConfigMap or Secret)."""
    agent_name = run.spec.agent_ref.name if run.spec.agent_ref is not None else ""
    if observed is not None:
        yield from _system_prompt_problems(agent_name, refs, observed)
    if refs.agent is not None:
        yield from _secret_problems(run, agent_name, refs.agent.security)
        yield from _service_account_problems(run, refs, agent_name)
        yield from _source_problems(run, refs, agent_name)
    yield from _contract_problems(run, refs)
    if refs.provider is not None:
        provider_name = ""
        if refs.agent is not None and refs.agent.provider_ref is not None:
            provider_name = refs.agent.provider_ref.name
        if refs.provider.uses_runner:
            yield from _task_problems(run, provider_name)
        yield from provider_problems(refs.provider, f"AgentProvider {provider_name} spec")
        yield from _input_file_collisions(run, refs.provider)
