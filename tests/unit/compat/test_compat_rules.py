"""The original API's semantics (docs/api.md, docs/migration.md), driven through the real planner and
the pure rules: templates, unsupported runtimes, the Agent's security allow lists, the task contract,
the runner contract's need of a task, input files, retryLimit, goal.tokenBudget, secrets as envFrom."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from pydantic import ValidationError

from agentrun_operator.api import parse_agentrun
from agentrun_operator.api.implementation import ImplementationFields
from agentrun_operator.api.resources import AgentDefaults, AgentProviderSpec
from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner import compat
from agentrun_operator.planner.contract import contract_check, task_metadata
from agentrun_operator.planner.template_paths import provider_template_warnings, unknown_reason
from agentrun_operator.planner.validate import validate_static
from agentrun_operator.resolution import References, step_retries
from tests.unit.planner.world import PlannerWorld, loop_step, manifest

PROVIDER = {"image": "busybox", "command": ["sh", "-c", "true"]}


def world_with(
    spec_manifest: dict[str, Any],
    agent: dict[str, Any] | None = None,
    provider: dict[str, Any] | None = None,
    impl: dict[str, Any] | None = None,
) -> PlannerWorld:
    spec_manifest["spec"]["agentRef"] = {"name": "agent"}
    world = PlannerWorld(spec_manifest)
    world.agents["agent"] = {"providerRef": {"name": "provider"}, **(agent or {})}
    world.providers["provider"] = provider if provider is not None else dict(PROVIDER)
    if impl is not None:
        world.implementation_specs["impl"] = impl
    return world


def _invalid(world: PlannerWorld) -> tuple[str | None, str]:
    world.plan()
    status = world.status
    assert status is not None and status.phase == "Failed" and world.created == []
    invalid = next(c for c in status.conditions if c.type == "InvalidSpec")
    assert invalid.status == "True"
    return status.reason, status.message or ""


def _main(world: PlannerWorld, job: str) -> dict[str, Any]:
    container: dict[str, Any] = world.manifests[job]["spec"]["template"]["spec"]["containers"][-1]
    return container


# ------------------------------------------------------------------------------ templates, runtimes


def test_a_template_never_runs_and_says_so() -> None:
    m = manifest()
    m["metadata"]["annotations"] = {"agents.proompteng.ai/template": "true"}
    world = PlannerWorld(m)
    for _ in range(3):
        world.plan()
        world.advance(60)
    assert world.status is not None and world.created == []
    assert (world.status.phase, world.status.reason) == ("Pending", "Template")
    assert "template" in (world.status.message or "") and "never runs" in (world.status.message or "")


def test_a_template_annotation_other_than_true_is_a_run() -> None:
    m = manifest()
    m["metadata"]["annotations"] = {"agents.proompteng.ai/template": "false"}
    world = PlannerWorld(m)
    world.plan()
    assert world.created


@pytest.mark.parametrize("runtime", ["temporal", "custom"])
def test_temporal_and_custom_runtimes_are_refused_naming_the_field(runtime: str) -> None:
    m = manifest(runtime={"type": runtime})
    problems = validate_static(parse_agentrun(m), OperatorConfig(loops_enabled=True))
    assert [p.path for p in problems] == ["spec.runtime.type"]
    assert "not supported by this operator" in problems[0].message
    reason, message = _invalid(PlannerWorld(m))
    assert reason == "RuntimeNotSupported" and "spec.runtime.type" in message


# ------------------------------------------------------------------------------ security allow lists


def test_a_secret_the_agent_does_not_allow_is_invalid_naming_secret_and_agent() -> None:
    world = world_with(
        manifest(secrets=["allowed", "forbidden"]), agent={"security": {"allowedSecrets": ["allowed"]}}
    )
    reason, message = _invalid(world)
    assert reason == "NotAllowedByAgent"
    assert "spec.secrets[1]" in message and "'forbidden'" in message and "Agent 'agent'" in message
    assert "allowedSecrets" in message


def test_allowed_secrets_reach_every_pod_as_env_from() -> None:
    world = world_with(manifest(secrets=["a", "b"]), agent={"security": {"allowedSecrets": ["a", "b"]}})
    world.plan()
    assert world.created
    assert _main(world, world.created[0])["envFrom"] == [
        {"secretRef": {"name": "a"}},
        {"secretRef": {"name": "b"}},
    ]


def test_no_secrets_no_env_from() -> None:
    world = world_with(manifest())
    world.plan()
    assert "envFrom" not in _main(world, world.created[0])


@pytest.mark.parametrize(
    ("run_account", "provider_account", "path"),
    [
        ("other", None, "spec.workload.serviceAccountName"),
        (None, "other", "AgentProvider spec.workload.serviceAccountName"),
    ],
)
def test_service_accounts_are_gated_by_the_agent(
    run_account: str | None, provider_account: str | None, path: str
) -> None:
    m = manifest()
    if run_account:
        m["spec"]["workload"]["serviceAccountName"] = run_account
    provider = dict(PROVIDER)
    if provider_account:
        provider["workload"] = {"serviceAccountName": provider_account}
    world = world_with(m, agent={"security": {"allowedServiceAccounts": ["runner"]}}, provider=provider)
    reason, message = _invalid(world)
    assert reason == "NotAllowedByAgent" and message.startswith(path) and "'other'" in message


def test_an_allowed_service_account_runs() -> None:
    m = manifest()
    m["spec"]["workload"]["serviceAccountName"] = "runner"
    world = world_with(m, agent={"security": {"allowedServiceAccounts": ["runner"]}})
    world.plan()
    assert world.created


def test_task_source_providers_are_gated_by_the_agent() -> None:
    inline = {"inline": {"text": "t", "source": {"provider": "linear", "externalId": "ENG-1"}}}
    agent = {"security": {"allowedImplementationSourceProviders": ["GitHub"]}}
    reason, message = _invalid(world_with(manifest(implementation=inline), agent=agent))
    assert reason == "NotAllowedByAgent"
    assert message.startswith("spec.implementation.inline.source.provider") and "'linear'" in message
    ok = {"inline": {"text": "t", "source": {"provider": "github"}}}
    world = world_with(manifest(implementation=ok), agent=agent)  # compared case-insensitively
    world.plan()
    assert world.created


def test_a_referenced_spec_s_source_is_gated_too() -> None:
    agent = {"security": {"allowedImplementationSourceProviders": ["manual"]}}
    impl = {"text": "t", "source": {"provider": "github"}}
    world = world_with(manifest(implementationSpecRef={"name": "impl"}), agent=agent, impl=impl)
    reason, message = _invalid(world)
    assert reason == "NotAllowedByAgent" and message.startswith("spec.implementationSpecRef")


# ------------------------------------------------------------------------------ the task contract


def _task(**fields: Any) -> ImplementationFields:
    return ImplementationFields.model_validate({"text": "the text", **fields})


def test_contract_required_keys_missing_are_invalid_naming_them() -> None:
    impl = {"text": "t", "contract": {"requiredKeys": ["repository", "issueNumber", "base"]}}
    world = world_with(
        manifest(implementationSpecRef={"name": "impl"}, parameters={"base": "main"}), impl=impl
    )
    reason, message = _invalid(world)
    assert reason == "MissingRequiredMetadata"
    assert (
        message.startswith("spec.parameters")
        and "missing required metadata keys: repository, issueNumber" in message
    )


def test_contract_mappings_then_the_task_fill_required_keys() -> None:
    task = _task(
        summary="the summary",
        source={"provider": "github", "externalId": "example/repo#42", "url": "https://x/42"},
        contract={
            "requiredKeys": ["repository", "ticketId", "issueTitle"],
            "mappings": [{"from": "ticket", "to": "ticketId"}],
        },
    )
    check = contract_check(task, {"ticket": " T-1 ", "empty": "  "})
    assert check.missing_keys == ()
    assert check.metadata["ticketId"] == "T-1" and "empty" not in check.metadata
    assert (check.metadata["repository"], check.metadata["issueNumber"]) == ("example/repo", "42")
    assert check.metadata["issueTitle"] == "the summary" and check.metadata["issueBody"] == "the text"
    assert check.metadata["issueUrl"] == check.metadata["url"] == "https://x/42"
    assert check.metadata["prompt"] == "the text"


def test_builtin_mappings_apply_first_and_never_overwrite() -> None:
    metadata = task_metadata(None, {"repo": "a/b", "baseRef": "dev", "base": "main"})
    assert metadata["repository"] == "a/b" and metadata["base"] == "main"


def test_contract_of_a_step_uses_the_step_s_parameters() -> None:
    impl = {"inline": {"text": "t", "contract": {"requiredKeys": ["stage"]}}}
    steps = [{"name": "a", "implementation": impl, "parameters": {"other": "x"}}]
    reason, message = _invalid(world_with(manifest(steps)))
    assert message.startswith("spec.workflow.steps[0].parameters") and reason == "MissingRequiredMetadata"
    steps[0]["parameters"] = {"stage": "plan"}
    world = world_with(manifest(steps))
    world.plan()
    assert world.created


# ------------------------------------------------------------------------------ runner contract, provider


def test_a_runner_contract_provider_needs_a_task_for_every_step() -> None:
    world = world_with(manifest(), provider={"binary": "/usr/local/bin/agent-runner"})
    reason, message = _invalid(world)
    assert reason == "InvalidSpec" and "needs a task" in message


def test_our_image_command_provider_runs_without_a_task() -> None:
    world = world_with(manifest())
    world.plan()
    assert world.created


def test_input_files_must_be_absolute_and_distinct() -> None:
    spec = AgentProviderSpec.model_validate(
        {
            "inputFiles": [
                {"path": "config.toml", "content": "x"},
                {"path": "/a", "content": ""},
                {"path": "/a", "content": ""},
            ]
        }
    )
    problems = list(compat.provider_problems(spec))
    assert [p.path for p in problems] == ["spec.inputFiles[0].path", "spec.inputFiles[2].path"]
    assert "absolute" in problems[0].message and problems[0].fix.endswith("/workspace/config.toml")


def test_an_input_file_at_a_volume_mount_is_invalid() -> None:
    provider = {**PROVIDER, "inputFiles": [{"path": "/workspace", "content": "x"}]}
    reason, message = _invalid(world_with(manifest(), provider=provider))
    assert reason == "InvalidSpec" and "inputFiles[0].path" in message and "'workspace'" in message


def test_provider_forms() -> None:
    assert AgentProviderSpec.model_validate({}).uses_runner
    assert AgentProviderSpec.model_validate({"binary": "/x"}).runner_binary == "/x"
    assert AgentProviderSpec.model_validate({}).runner_binary == "/usr/local/bin/agent-runner"
    assert not AgentProviderSpec.model_validate({"image": "i"}).uses_runner
    with pytest.raises(ValidationError, match="either command"):
        AgentProviderSpec.model_validate({"command": ["x"], "binary": "/y"})


# ------------------------------------------------------------------------------ Agent defaults


def test_retry_limit_is_retries() -> None:
    step = parse_agentrun(manifest()).spec.workflow.steps[0]  # type: ignore[union-attr]
    refs = References(agent=None)
    assert step_retries(step, refs) == 0
    from agentrun_operator.api.resources import AgentSpec

    assert (
        step_retries(step, References(agent=AgentSpec.model_validate({"defaults": {"retryLimit": 2}}))) == 2
    )
    assert (
        step_retries(step, References(agent=AgentSpec.model_validate({"defaults": {"retryLimit": 10**6}})))
        == 100
    )
    with pytest.raises(ValidationError, match="mean the same"):
        AgentDefaults.model_validate({"retries": 1, "retryLimit": 1})
    with pytest.raises(ValidationError, match="Only one of systemPrompt or systemPromptRef"):
        AgentDefaults.model_validate(
            {"systemPrompt": "a", "systemPromptRef": {"kind": "Secret", "name": "s", "key": "k"}}
        )


def test_retry_limit_drives_retries_in_the_planner() -> None:
    world = world_with(manifest([loop_step("a", 1)]), agent={"defaults": {"retryLimit": 1}})
    world.plan()
    world.fail(world.active())
    world.plan()
    assert len(world.created) == 2  # the retry, at once (retryBackoffSeconds defaults to 0)


# ------------------------------------------------------------------------------ goal


def _usage(tokens: int) -> dict[str, Any]:
    return {"continue": True, "usage": {"inputTokens": tokens, "outputTokens": 0, "costUSD": 0}}


def test_goal_objective_reaches_the_pod() -> None:
    world = PlannerWorld(manifest(goal={"objective": "make it green", "tokenBudget": 5}))
    world.plan()
    env = {e["name"]: e.get("value") for e in _main(world, world.created[0])["env"]}
    assert (env["AGENTRUN_GOAL_OBJECTIVE"], env["AGENTRUN_GOAL_TOKEN_BUDGET"]) == ("make it green", "5")


def test_goal_token_budget_stops_the_run_with_its_own_reason_and_condition() -> None:
    m = manifest(
        [loop_step("a", 10, expression="true"), loop_step("b", 1)], goal={"objective": "o", "tokenBudget": 25}
    )
    world = PlannerWorld(m)

    def outcome(w: PlannerWorld, job: str) -> None:
        w.succeed(job, control=_usage(10))

    world.drive(outcome)
    status = world.status
    assert status is not None
    assert (status.phase, status.reason) == ("Failed", "GoalTokenBudgetExhausted")
    assert "25" in (status.message or "") and "30" in (status.message or "")
    condition = next(c for c in status.conditions if c.type == "GoalTokenBudgetExhausted")
    assert condition.status == "True"
    assert len(world.created) == 3  # nothing started after the third iteration spent the budget
    assert world.step_status(0).loop.completed_iterations == 3
    assert world.step_status(1).phase in ("Pending", "Cancelled")


# ------------------------------------------------------------------------------ template paths


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("agentRun.name", True),
        ("agent.config.model.deep", True),
        ("parameters.anything", True),
        ("implementation.text", True),
        ("vcs.repository", True),
        ("agentRun.labels", False),
        ("run.name", False),
        ("implementation.prompt", False),
        ("a | upper", False),
    ],
)
def test_template_paths(path: str, ok: bool) -> None:
    assert (unknown_reason(path) is None) == ok


def test_provider_template_warnings_name_the_field() -> None:
    spec = AgentProviderSpec.model_validate(
        {
            "argsTemplate": ["{{ agentRun.name }}", "{{agentRun.nme}}"],
            "envTemplate": {"A": "{{ memory.x }}", "B": "{{ foo }}"},
            "inputFiles": [{"path": "/a", "content": "{{ implementation.txt }}"}],
        }
    )
    fields = [f for f, _ in provider_template_warnings(spec)]
    assert fields == ["spec.argsTemplate[1]", "spec.envTemplate.B", "spec.inputFiles[0].content"]


# ------------------------------------------------------------------------------ system prompt


def _pod(world: PlannerWorld) -> dict[str, Any]:
    template: dict[str, Any] = world.manifests[world.created[0]]["spec"]["template"]
    return template


def test_an_inline_system_prompt_is_a_file_from_a_pod_annotation() -> None:
    world = world_with(manifest(), agent={"defaults": {"systemPrompt": "be careful"}})
    world.plan()
    template = _pod(world)
    assert template["metadata"]["annotations"]["agents.proompteng.ai/system-prompt"] == "be careful"
    volume = next(v for v in template["spec"]["volumes"] if v["name"] == "agentrun-system-prompt")
    (item,) = volume["downwardAPI"]["items"]
    assert item == {
        "path": "system-prompt.md",
        "fieldRef": {"fieldPath": "metadata.annotations['agents.proompteng.ai/system-prompt']"},
    }
    main = template["spec"]["containers"][-1]
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["AGENTRUN_SYSTEM_PROMPT_PATH"] == "/var/run/agentrun/system-prompt/system-prompt.md"
    mount = next(m for m in main["volumeMounts"] if m["name"] == "agentrun-system-prompt")
    assert mount == {
        "name": "agentrun-system-prompt",
        "mountPath": "/var/run/agentrun/system-prompt",
        "readOnly": True,
    }
    job_annotations = world.manifests[world.created[0]]["metadata"]["annotations"]
    assert "agents.proompteng.ai/system-prompt" not in job_annotations  # the pod's only


@pytest.mark.parametrize(("kind", "source"), [("ConfigMap", "configMap"), ("Secret", "secret")])
def test_a_system_prompt_ref_is_a_volume_of_just_its_key(kind: str, source: str) -> None:
    ref = {"kind": kind, "name": "prompts", "key": "system.md"}
    world = world_with(manifest(), agent={"defaults": {"systemPromptRef": ref}})
    world.plan()
    volume = next(v for v in _pod(world)["spec"]["volumes"] if v["name"] == "agentrun-system-prompt")
    name_field = "secretName" if kind == "Secret" else "name"
    assert volume[source] == {
        name_field: "prompts",
        "items": [{"key": "system.md", "path": "system-prompt.md"}],
    }


def test_no_system_prompt_no_volume() -> None:
    world = world_with(manifest())
    world.plan()
    assert all(v["name"] != "agentrun-system-prompt" for v in _pod(world)["spec"]["volumes"])


def _prompt_world(keys: frozenset[str] | None, checked: bool = True) -> PlannerWorld:
    ref = {"kind": "ConfigMap", "name": "prompts", "key": "system.md"}
    world = world_with(manifest(), agent={"defaults": {"systemPromptRef": ref}})
    if checked:
        world.object_keys["ConfigMap/prompts"] = keys
    return world


def test_a_missing_key_of_the_system_prompt_ref_is_invalid_naming_it() -> None:
    reason, message = _invalid(_prompt_world(frozenset({"other.md"})))
    assert reason == "InvalidSpec"
    assert "Agent agent spec.defaults.systemPromptRef.key" in message and "has no key 'system.md'" in message
    assert "other.md" in message


def test_a_missing_system_prompt_config_map_is_waited_for_then_invalid() -> None:
    world = _prompt_world(None)
    world.plan()
    assert world.status is not None and world.status.reason == "WaitingForReferences"
    assert "ConfigMap/prompts" in (world.status.message or "")
    world.advance(3600)
    _, message = _invalid(world)
    assert "ConfigMap 'prompts'" in message and "does not exist" in message


def test_an_unchecked_system_prompt_ref_runs() -> None:
    world = _prompt_world(None, checked=False)  # no RBAC to read it: the pod finds out
    world.plan()
    assert world.created


# ------------------------------------------------------------------------------ status of the original


def test_spec_and_system_prompt_hashes_and_the_contract_are_recorded() -> None:
    impl = {"text": "t", "contract": {"requiredKeys": ["repository", "base"]}}
    m = manifest(implementationSpecRef={"name": "impl"}, parameters={"repo": "a/b", "base": "main"})
    world = world_with(m, agent={"defaults": {"systemPrompt": "p"}}, impl=impl)
    world.plan()
    status = world.status
    assert status is not None and world.created
    assert status.spec_hash is not None and status.spec_hash.startswith("sha256:")
    assert status.system_prompt_hash == "sha256:" + hashlib.sha256(b"p").hexdigest()
    assert status.contract is not None
    assert (status.contract.required_keys, status.contract.missing_keys) == (["repository", "base"], None)
    first = status.spec_hash
    world.plan()
    assert world.status is not None and world.status.spec_hash == first


def test_missing_keys_are_in_the_status_of_the_refused_run() -> None:
    impl = {"text": "t", "contract": {"requiredKeys": ["repository", "stage"]}}
    m = manifest(implementationSpecRef={"name": "impl"}, parameters={"repo": "a/b"})
    world = world_with(m, impl=impl)
    _invalid(world)
    assert world.status is not None and world.status.contract is not None
    assert world.status.contract.missing_keys == ["stage"]
