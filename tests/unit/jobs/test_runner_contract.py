"""The runner contract in the iteration pod (docs/api.md#runner-contract), spec.secrets as envFrom,
version control in the pod (docs/api.md#version-control), and their validation before any Job."""

from __future__ import annotations

import json
from typing import Any

from agentrun_operator.api.resources import AgentProviderSpec, AgentSpec, ImplementationSpecSpec
from agentrun_operator.jobs import PlannedAttempt
from agentrun_operator.jobs.builder import build_iteration_objects
from agentrun_operator.jobs.runner_contract import RunnerContract, config_map_name
from agentrun_operator.planner.validate_compat import compat_problems
from agentrun_operator.resolution import References
from tests.unit.jobs.test_builder import CONFIG, PVC, run_of

PROVIDER = {
    "binary": "/usr/local/bin/agent-runner",
    "argsTemplate": [
        "--run",
        "{{ agentRun.name }}",
        "--repo={{ inputs.repository }}",
        "{{ agent.config }}",
        "{{ nope }}",
    ],
    "envTemplate": {
        "TASK": "{{ implementation.text }}",
        "NS": "{{agentRun.namespace}}",
        "BASE": "{{ vcs.baseBranch }}",
    },
    "inputFiles": [
        {"path": "/workspace/task-{{ agentRun.name }}.md", "content": "{{ implementation.text }}"},
        {"path": "/etc/skipped", "content": "{{ nothing }}"},
    ],
    "secretEnv": [{"name": "OPENAI_API_KEY", "secretName": "openai", "key": "key"}],
    "outputArtifacts": [{"name": "report", "path": "/workspace/out/report.md", "url": "https://x/report"}],
    "adapter": {"model": "o3"},
    "workload": {"image": "runner:contract"},
}
AGENT = {
    "providerRef": {"name": "codex"},
    "config": {"depth": 2},
    "env": [{"name": "TASK", "value": "agent wins"}],
}
VCS = {
    "provider": "github",
    "auth": {"method": "token", "token": {"secretRef": {"name": "gh", "key": "token"}}},
    "defaults": {"baseBranch": "main"},
}


def refs(provider: dict[str, Any] = PROVIDER, **kw: Any) -> References:
    return References(
        AgentSpec.model_validate(kw.get("agent", AGENT)),
        AgentProviderSpec.model_validate(provider),
        {"task": ImplementationSpecSpec.model_validate({"text": "fix the bug", "summary": "fix"})},
        agent_name="codex-agent",
        provider_name="codex",
        vcs_providers=kw.get("vcs_providers", {"gh": VCS}),
        secret_keys=kw.get("secret_keys", {"gh": frozenset({"token"})}),
    )


SPEC = {
    "agentRef": {"name": "codex-agent"},
    "implementationSpecRef": {"name": "task"},
    "parameters": {"repository": "acme/app", "head": "agent/x"},
    "secrets": ["openai", "extra"],
    "vcsRef": {"name": "gh"},
    "workload": {"volumes": [PVC]},
}


def build(
    spec: dict[str, Any] = SPEC, references: References | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return build_iteration_objects(
        run_of(json.loads(json.dumps(spec))), PlannedAttempt(1, 1, 1), references or refs(), CONFIG
    )


def main(job: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = job["spec"]["template"]["spec"]["containers"][-1]
    return container


def env_of(job: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in main(job)["env"]}


def test_binary_runs_with_rendered_args_and_env() -> None:
    job, _ = build()
    container = main(job)
    assert container["image"] == "runner:contract"
    assert container["command"] == ["/usr/local/bin/agent-runner"]
    assert container["args"] == ["--run", "demo", "--repo=acme/app", '{"depth":2}', ""]
    env = env_of(job)
    assert env["NS"] == "team" and env["BASE"] == "main"
    assert env["TASK"] == "agent wins"  # the Agent's env is over the provider's layer
    assert env["OPENAI_API_KEY"] == {"secretKeyRef": {"name": "openai", "key": "key"}}
    assert env["AGENT_RUN_SPEC"] == "/workspace/run.json"
    assert env["AGENT_RUNNER_SPEC_PATH"] == "/workspace/agent-runner.json"
    assert env["AGENT_PROVIDER"] == "codex"
    assert env["AGENTRUN_ITERATION"] == "1"  # ours stay


def test_secrets_are_env_from_and_vcs_reaches_the_pod() -> None:
    job, _ = build()
    assert main(job)["envFrom"] == [{"secretRef": {"name": "openai"}}, {"secretRef": {"name": "extra"}}]
    env = env_of(job)
    assert env["VCS_REPOSITORY"] == "acme/app" and env["VCS_HEAD_BRANCH"] == "agent/x"
    assert env["VCS_TOKEN"] == {"secretKeyRef": {"name": "gh", "key": "token"}}
    pod = job["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == [
        "reporter",
        "agent-runner",
    ]  # a run of the original's form, no loops
    reporter = pod["containers"][0]
    # the commit before main (--before-main) and after it, read by the one reporter
    checkout = reporter["args"].index("--checkout")
    assert reporter["args"][checkout + 1] == "/workspace/repo" and "--before-main" in reporter["args"]
    assert any(m["name"] == "workspace" for m in reporter["volumeMounts"])
    assert reporter["args"][-2:] == ["--artifact", "report=/workspace/out/report.md"]


def test_the_config_map_holds_run_json_runner_json_and_input_files() -> None:
    job, (config_map,) = build()
    data = config_map["data"]
    run = json.loads(data["run.json"])
    assert run["provider"] == "codex"
    assert run["agentRun"] == {"name": "demo", "uid": "uid-1", "namespace": "team"}
    assert run["implementation"]["text"] == "fix the bug"
    assert run["parameters"] == {"repository": "acme/app", "head": "agent/x"}
    assert run["artifacts"] == [
        {"name": "report", "path": "/workspace/out/report.md", "url": "https://x/report"}
    ]
    assert run["vcs"]["repository"] == "acme/app" and run["vcs"]["mode"] == "read-write"
    runner = json.loads(data["agent-runner.json"])
    assert runner["provider"] == "codex" and runner["adapter"] == {"model": "o3"}
    assert runner["payloads"]["eventFilePath"] == "/workspace/run.json"
    assert data["input-0"] == "fix the bug" and "input-1" not in data  # empty content: left out
    assert config_map["metadata"]["name"] == config_map_name("demo", data)
    assert config_map["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    mounts = {
        m["mountPath"]: m["subPath"] for m in main(job)["volumeMounts"] if m["name"] == "agentrun-runner"
    }
    assert mounts == {
        "/workspace/run.json": "run.json",
        "/workspace/agent-runner.json": "agent-runner.json",
        "/workspace/task-demo.md": "input-0",
    }
    volume = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "agentrun-runner")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]


def test_same_files_same_config_map_and_build_is_deterministic() -> None:
    first, (a,) = build()
    again, (b,) = build()
    assert first == again and a == b
    _, (c,) = build({**SPEC, "parameters": {"repository": "acme/other"}})
    assert c["metadata"]["name"] != a["metadata"]["name"]


def test_our_form_is_unchanged() -> None:
    ours = {"image": "agent:1", "command": ["codex"], "args": ["exec"]}
    job, companions = build(references=refs(ours))
    assert companions == [] and main(job)["command"] == ["codex"] and main(job)["image"] == "agent:1"
    assert "AGENT_RUN_SPEC" not in env_of(job)
    assert RunnerContract.of({"image": "x"}) is None and RunnerContract.of({}) is not None
    assert RunnerContract.of({"image": "x", "argsTemplate": ["a"]}) is not None


def test_bad_input_files_and_artifacts_are_invalid_before_any_job() -> None:
    bad = {
        **PROVIDER,
        "inputFiles": [
            {"path": "/workspace/run.json", "content": "x"},
            {"path": "/agentrun-meta/x", "content": "x"},
            {"path": "/workspace/fine.txt", "content": "x"},
        ],
        "outputArtifacts": [
            {"name": "lost", "path": "/out.txt"},
            {"name": "rel", "path": "out/ok.txt"},
            {"name": "homed", "path": "/tmp/out/x.txt"},
        ],
    }
    problems = compat_problems(run_of(json.loads(json.dumps(SPEC))), refs(bad))
    messages = [p.message for p in problems]
    assert len(problems) == 3, messages
    assert "inputFiles[0].path collides with a file the runner contract mounts itself" in messages[0]
    assert problems[0].path == "spec.agentRef.name"
    assert "the operator's own mount" in messages[1]
    assert "outputArtifacts[0] ('lost') is at /out.txt" in messages[2] and "'/'" in messages[2]
    assert problems[2].docs.endswith("#output-artifacts")
    assert all(p.fix for p in problems)


def test_vcs_problems_are_invalid_before_any_job() -> None:
    (problem,) = compat_problems(run_of(json.loads(json.dumps(SPEC))), refs(secret_keys={}))
    assert problem.missing == "Secret/gh"
    denied = {**VCS, "repositoryPolicy": {"deny": ["acme/*"]}}
    (problem,) = compat_problems(run_of(json.loads(json.dumps(SPEC))), refs(vcs_providers={"gh": denied}))
    assert problem.path == "spec.parameters.repository"
    assert not compat_problems(run_of(json.loads(json.dumps(SPEC))), refs())


def test_an_artifact_on_no_volume_gets_an_empty_dir_in_main_and_the_reporter() -> None:
    provider = {
        **PROVIDER,
        "outputArtifacts": [
            {"name": "log", "path": "/var/agent/run.log"},
            {"name": "deep", "path": "/var/agent/sub/deep.txt"},
            {"name": "report", "path": "/workspace/out/report.md"},
        ],
    }
    job, _ = build(references=refs(provider))
    pod = job["spec"]["template"]["spec"]
    assert {"name": "agentrun-artifacts-0", "emptyDir": {}} in pod["volumes"]
    assert not any(v["name"] == "agentrun-artifacts-1" for v in pod["volumes"])  # /var/agent holds both
    assert {"name": "agentrun-artifacts-0", "mountPath": "/var/agent"} in main(job)["volumeMounts"]
    reporter = next(c for c in pod["containers"] if c["name"] == "reporter")
    assert {"name": "agentrun-artifacts-0", "mountPath": "/var/agent", "readOnly": True} in reporter[
        "volumeMounts"
    ]
    assert [a for a in reporter["args"] if "=" in a and a.startswith(("log", "deep", "report"))] == [
        "log=/var/agent/run.log",
        "deep=/var/agent/sub/deep.txt",
        "report=/workspace/out/report.md",
    ]
    assert not compat_problems(run_of(json.loads(json.dumps(SPEC))), refs(provider))
